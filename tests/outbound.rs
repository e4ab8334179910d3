//! The outbound policy (`[outbound]`) end to end: URLs refused at the admin
//! API with the reason, and refused again where the hub connects, on the
//! address a host name resolves to, with the receiver never called.

use std::time::Duration;

use crate::support::{HubOptions, Integrator, TestHub, eventually};
use hub::core::provisioning::{self, ChannelSpec};
use reqwest::Method;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);
const STRICT: &str = "[outbound]\nprivate = \"deny\"\n";
const PRIVATE_RULE: &str = "refused by `[outbound] private = \"deny\"`";
const ALWAYS_RULE: &str = "refused unless `[outbound] allow` lists it";
const METADATA_URL: &str = "http://169.254.169.254/latest/meta-data";

async fn strict_hub() -> TestHub {
    TestHub::start_with(HubOptions {
        extra_toml: STRICT.to_owned(),
        ..HubOptions::default()
    })
    .await
}

/// `POST /admin/v1/channels` of a custom channel to `endpoint`.
async fn new_channel(hub: &TestHub, name: &str, endpoint: &str) -> (u16, Value) {
    hub.admin(
        Method::POST,
        "/admin/v1/channels",
        Some(json!({ "name": name, "customer_endpoint": endpoint })),
    )
    .await
}

/// Asserts a 400 `invalid_request` and returns its message.
fn refusal(label: &str, (status, body): &(u16, Value)) -> String {
    assert_eq!(*status, 400, "{label}: {body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{label}: {body}");
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{label}: no message: {body}"))
        .to_owned()
}

/// The message `uid` of the chat once its delivery is no longer pending.
async fn settled(agent: &crate::support::TestAgent, chat_id: i64, uid: &Value) -> Value {
    eventually(WAIT, "the reply settled", || async move {
        agent.chat(chat_id).await["messages"]
            .as_array()?
            .iter()
            .find(|m| m["uid"] == *uid && m["delivery"] != "pending")
            .cloned()
    })
    .await
}

#[tokio::test]
async fn a_strict_hub_refuses_private_and_metadata_urls_at_registration() {
    let hub = strict_hub().await;
    for (url, expected) in [
        (
            "http://127.0.0.1:9/x",
            format!("127.0.0.1 is loopback: {PRIVATE_RULE}"),
        ),
        (
            METADATA_URL,
            format!("169.254.169.254 is link-local (cloud metadata): {ALWAYS_RULE}"),
        ),
        (
            "http://2130706433/x",
            format!("127.0.0.1 is loopback: {PRIVATE_RULE}"),
        ),
        (
            "http://[::1]:9/x",
            format!("::1 is loopback: {PRIVATE_RULE}"),
        ),
        (
            "http://10.0.0.1/x",
            format!("10.0.0.1 is private (RFC 1918): {PRIVATE_RULE}"),
        ),
        (
            "http://evil@127.0.0.1/x",
            "URLs with user info (`user@host`) are refused".to_owned(),
        ),
        (
            "http://[64:ff9b::a9fe:a9fe]/x",
            format!(
                "64:ff9b::a9fe:a9fe is the NAT64 form of 169.254.169.254, \
                 which is link-local (cloud metadata): {ALWAYS_RULE}"
            ),
        ),
    ] {
        assert_eq!(
            refusal(url, &new_channel(&hub, "shop", url).await),
            format!("customer_endpoint: {expected}"),
            "{url}"
        );
    }
    // A host name is resolved to tell.
    let message = refusal(
        "localhost",
        &new_channel(&hub, "shop", "http://localhost:9/x").await,
    );
    assert!(
        message.starts_with("customer_endpoint: `localhost` resolves to ")
            && message.ends_with(PRIVATE_RULE),
        "{message}"
    );

    // A channel's webhook receiver and a bot provider's URLs too.
    let (status, widget) = hub
        .admin(
            Method::POST,
            "/admin/v1/channels",
            Some(json!({ "name": "w", "type": "widget" })),
        )
        .await;
    assert_eq!(status, 201, "{widget}");
    let path = format!(
        "/admin/v1/channels/{}/webhook",
        widget["public_id"].as_str().expect("public_id")
    );
    let answer = hub
        .admin(
            Method::PUT,
            &path,
            Some(json!({ "url": "http://192.168.1.10/hooks" })),
        )
        .await;
    assert_eq!(
        refusal("webhook_url", &answer),
        format!("webhook_url: 192.168.1.10 is private (RFC 1918): {PRIVATE_RULE}")
    );
    let answer = hub
        .admin(
            Method::POST,
            "/admin/v1/bots",
            Some(json!({ "name": "b", "endpoint": "http://100.64.0.1/bot", "token": "t0ken" })),
        )
        .await;
    assert_eq!(
        refusal("bot endpoint", &answer),
        format!(
            "endpoint: 100.64.0.1 is CGNAT shared address space (100.64.0.0/10): {PRIVATE_RULE}"
        )
    );
    let (_, channels) = hub.admin(Method::GET, "/admin/v1/channels", None).await;
    let names: Vec<&Value> = channels["channels"]
        .as_array()
        .map(|all| all.iter().map(|c| &c["name"]).collect())
        .unwrap_or_default();
    assert_eq!(names, vec!["w"], "only the widget was created: {channels}");
    hub.shutdown().await;
}

#[tokio::test]
async fn by_default_private_urls_are_accepted_and_metadata_is_not() {
    let hub = TestHub::start().await;
    for (name, url) in [
        ("loopback", "http://127.0.0.1:9/x"),
        ("by-name", "http://localhost:9/x"),
        ("rfc1918", "http://10.0.0.1/x"),
    ] {
        let (status, body) = new_channel(&hub, name, url).await;
        assert_eq!(status, 201, "{url}: {body}");
    }
    assert_eq!(
        refusal(
            "metadata",
            &new_channel(&hub, "metadata", METADATA_URL).await
        ),
        format!("customer_endpoint: 169.254.169.254 is link-local (cloud metadata): {ALWAYS_RULE}")
    );
    assert_eq!(
        refusal(
            "mapped metadata",
            &new_channel(&hub, "metadata", "http://[::ffff:169.254.169.254]/").await
        ),
        format!(
            "customer_endpoint: ::ffff:169.254.169.254 is the IPv4-mapped form of \
             169.254.169.254, which is link-local (cloud metadata): {ALWAYS_RULE}"
        )
    );
    hub.shutdown().await;
}

/// A channel registered while its endpoint's host name resolved elsewhere
/// (here: stored directly, past the admin API's check) is refused when the
/// hub connects: the agent's reply fails with the policy's reason, final at
/// the first attempt, and the receiver never hears of it.
#[tokio::test]
async fn a_name_resolving_to_a_refused_address_is_refused_at_connect_time() {
    let hub = strict_hub().await;
    let receiver = Integrator::start().await;
    let endpoint = format!("http://localhost:{}/hub", receiver.addr.port());
    let store = hub.store();
    let channel = provisioning::create_channel(
        store,
        &ChannelSpec {
            name: "shop".into(),
            customer_endpoint: endpoint,
            agents: vec!["ann@example.com".into()],
            ..ChannelSpec::default()
        },
        false,
        // As if the name had resolved to a public address at registration.
        &hub::outbound::Policy::default(),
    )
    .await
    .expect("channel stored");
    let secret = provisioning::path_secret(store).await.expect("path secret");
    let ingress = provisioning::view(channel, &hub.base, &secret).endpoint_url;
    let agent = hub.create_agent("Ann", "ann@example.com").await;

    let resp = hub
        .http
        .post(&ingress)
        .json(&json!({ "sender": { "id": 7 }, "message": { "type": "text", "text": "hi" } }))
        .send()
        .await
        .expect("customer message");
    assert_eq!(resp.status(), 200);
    let chat_id = eventually(WAIT, "the chat opened", || async {
        agent.chats().await.first().and_then(|c| c["id"].as_i64())
    })
    .await;
    let sent = agent.reply(chat_id, "hello").await;
    let uid = sent["uid"].clone();
    let settled = settled(&agent, chat_id, &uid).await;
    assert_eq!(settled["delivery"], "failed", "{settled}");
    let reason = settled["delivery_error"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("`localhost` resolves to ") && reason.ends_with(PRIVATE_RULE),
        "{reason}"
    );
    assert!(reason.contains("which is loopback"), "{reason}");
    // Final, not retried: nothing reached the receiver, even after the retry interval.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(receiver.requests().is_empty(), "the receiver was called");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_reload_puts_a_stricter_policy_in_force_for_registrations_and_deliveries() {
    let hub = TestHub::start().await;
    let receiver = Integrator::start().await;
    let agent = hub.create_agent("Ann", "ann@example.com").await;
    let (status, created) = hub
        .admin(
            Method::POST,
            "/admin/v1/channels",
            Some(json!({ "name": "shop", "customer_endpoint": receiver.url,
                         "agents": ["ann@example.com"] })),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let ch = crate::support::TestChannel::from_view(created);
    hub.say(&ch, json!(7), "hi").await;
    let chat_id = eventually(WAIT, "the chat opened", || async {
        agent.chats().await.first().and_then(|c| c["id"].as_i64())
    })
    .await;
    agent.reply(chat_id, "before").await;
    // Delivered, over a kept-alive connection the next reply could reuse.
    receiver.wait_for(1, WAIT).await;

    let config = hub.dir.path().join("hub.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{text}\n{STRICT}")).expect("write config");
    hub.running().reload().await.expect("reload");

    let refused = new_channel(&hub, "other", &receiver.url).await;
    assert!(refusal("after reload", &refused).ends_with(PRIVATE_RULE));
    let sent = agent.reply(chat_id, "after").await;
    let settled = settled(&agent, chat_id, &sent["uid"]).await;
    assert_eq!(settled["delivery"], "failed", "{settled}");
    let reason = settled["delivery_error"].as_str().unwrap_or_default();
    assert!(reason.ends_with(PRIVATE_RULE), "{reason}");
    assert_eq!(
        receiver.requests().len(),
        1,
        "only the reply before the reload arrived"
    );
    hub.shutdown().await;
}
