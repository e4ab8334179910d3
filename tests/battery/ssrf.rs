//! The outbound policy against SSRF: every forbidden address form is
//! refused when a URL is registered, with the reason; and a URL registered
//! while allowed, whose host name or address is forbidden when the hub
//! connects (as after a DNS change), is refused at delivery, dead-lettered
//! and never reached.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::Mode;
use crate::outcome::Outcome;
use crate::receivers::Recorder;
use crate::served::{Hub, Options, chat_of};

const AGENT: &str = "ann@battery.test";

/// Each form of a forbidden address the issue lists, and a few more.
const FORMS: [(&str, &str); 14] = [
    ("metadata", "http://169.254.169.254/latest/meta-data"),
    ("rfc1918", "http://10.0.0.1/"),
    ("ipv6_loopback", "http://[::1]:9/"),
    ("decimal", "http://2130706433/"),
    ("hex", "http://0x7f.1/"),
    ("userinfo", "http://evil@127.0.0.1/"),
    ("unspecified", "http://0.0.0.0/"),
    ("mapped_metadata", "http://[::ffff:169.254.169.254]/"),
    ("nat64_metadata", "http://[64:ff9b::a9fe:a9fe]/"),
    ("6to4_metadata", "http://[2002:a9fe:a9fe::1]/"),
    ("cgnat", "http://100.64.0.1/"),
    ("link_local_v6", "http://[fe80::1]/"),
    ("localhost_name", "http://localhost:9/"),
    ("scheme", "file:///etc/passwd"),
];

pub async fn ssrf(_mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let rec = Recorder::start().await?;
    let port = rec.url.rsplit(':').next().unwrap_or_default().to_owned();
    let dir = o.dir()?;
    let allowed = Options::default();
    let mut hub = Hub::start(&dir, &allowed).await?;
    o.watch_log(hub.log_path());
    let token = hub.create_agent("Ann", AGENT).await?;
    // Registered while private addresses are allowed; refused after.
    let by_name = hub
        .create_channel(
            "rebind-name",
            &format!("http://localhost:{port}/name"),
            &[AGENT],
        )
        .await?;
    let by_literal = hub
        .create_channel(
            "rebind-literal",
            &format!("http://127.0.0.1:{port}/literal"),
            &[AGENT],
        )
        .await?;
    hub.sigterm()?;
    if hub.wait_exit(Duration::from_secs(15)).await.is_none() {
        return Err("the hub did not stop on SIGTERM".to_owned());
    }
    hub.configure(&Options {
        private: "deny",
        ..allowed
    })?;
    hub.restart().await?;

    // Registration.
    let mut refused = 0;
    let mut reasons = Vec::new();
    for (form, url) in FORMS {
        let body =
            json!({ "name": format!("ssrf-{form}"), "customer_endpoint": url, "agents": [AGENT] });
        let (status, v) = hub
            .admin(Method::POST, "/admin/v1/channels", Some(&body))
            .await?;
        let reason = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if o.check(status == 400 && !reason.is_empty(), || {
            format!("customer_endpoint {url} ({form}): {status} {v}")
        }) {
            refused += 1;
            reasons.push(format!("{form}: {reason}"));
        }
    }
    let webhook = json!({ "url": "http://169.254.169.254/hook" });
    let (status, v) = hub
        .admin(
            Method::PUT,
            &format!("/admin/v1/channels/{}/webhook", by_literal.id),
            Some(&webhook),
        )
        .await?;
    o.check(status == 400, || {
        format!("webhook_url at the metadata address: {status} {v}")
    });
    let bot = json!({ "name": "ssrf-bot", "endpoint": "http://[::ffff:a9fe:a9fe]/bot",
                      "token": "bot-token-0123456789", "channels": [] });
    let (status, v) = hub
        .admin(Method::POST, "/admin/v1/bots", Some(&bot))
        .await?;
    o.check(
        status == 400 && v.to_string().contains("169.254.169.254"),
        || format!("bot endpoint at the metadata address: {status} {v}"),
    );
    let (_, channels) = hub.admin(Method::GET, "/admin/v1/channels", None).await?;
    o.check(!channels.to_string().contains("ssrf-"), || {
        "a refused channel was created".to_owned()
    });
    o.fig("registration_refused", format!("{refused}/{}", FORMS.len()));

    // Connect time.
    let mut outcomes = Vec::new();
    for (channel, customer) in [(&by_name, "rebind-name"), (&by_literal, "rebind-literal")] {
        match hub.say(channel, customer, "hello").await? {
            200 => {}
            other => return Err(format!("{customer}: the customer message got {other}")),
        }
        let chat = chat_of(&hub, &token, customer).await?;
        let (status, uid) = hub.reply(&token, chat, "to a forbidden address").await?;
        let uid = uid.ok_or_else(|| format!("{customer}: the reply got {status}"))?;
        let message = hub
            .settled(&token, chat, &uid, Duration::from_secs(15))
            .await?;
        let error = message["delivery_error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let dead = hub.dead_letters().await?;
        let letter = dead
            .iter()
            .find(|d| d["body"]["message"]["id"] == uid.as_str());
        let attempts = letter.map_or(0, |d| d["attempts"].as_u64().unwrap_or(0));
        outcomes.push(format!(
            "{customer}:{}@{attempts}",
            message["delivery"].as_str().unwrap_or("?")
        ));
        o.check(
            message["delivery"] == "failed" && error.contains("refused"),
            || format!("{customer}: {} ({error})", message["delivery"]),
        );
        o.check(letter.is_some() && attempts == 1, || {
            format!("{customer}: not a dead letter after one attempt ({attempts} attempts)")
        });
        reasons.push(format!("{customer}: {error}"));
    }
    let received = rec.count();
    o.fig("connect_time", outcomes.join(","));
    o.fig("received", received);
    o.check(received == 0, || {
        format!("the forbidden receiver got {received} requests")
    });
    let health = hub.healthz().await;
    o.check(health == Some(200), || "the hub is not healthy".to_owned());
    for reason in reasons {
        o.detail(reason);
    }
    Ok(())
}
