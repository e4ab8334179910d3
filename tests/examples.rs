//! The runnable setups of `examples/`, so they cannot rot: each test loads an
//! example's own `hub.toml` (it must pass the checks `hub serve` runs), changes
//! only what a test must (a port chosen by the OS, the database and plugin
//! cache in a temporary directory, the integrator's or receiver's URL to a
//! loopback test server on the same path, an admin token to create the agent
//! with, where the README uses `hub agent create`), and then does what the
//! example's README promises.

use std::path::PathBuf;
use std::time::Duration;

use hub::config::{Config, Env};
use serde_json::{Value, json};

use crate::support::{
    ADMIN_TOKEN, HubOptions, Integrator, TestAgent, TestChannel, TestHub, eventually, plugin_wasm,
    repo_root,
};

const WAIT: Duration = Duration::from_secs(10);

/// `examples/<name>/hub.toml`, loaded as `hub serve` loads it, with `env` as
/// the process environment.
fn load(name: &str, env: &Env) -> Config {
    let file: PathBuf = repo_root().join("examples").join(name).join("hub.toml");
    Config::load_with(&file, env).unwrap_or_else(|e| panic!("examples/{name}/hub.toml: {e}"))
}

/// `url` with its scheme and authority replaced by `server`'s: the example's
/// path is kept, so the test sees what the README's script would.
fn same_path_on(url: &str, server: &Integrator) -> String {
    let path = url
        .strip_prefix("http://")
        .and_then(|rest| rest.find('/').map(|i| &rest[i..]))
        .unwrap_or("/");
    format!("http://{}{path}", server.addr)
}

/// An example's hub in this process, its declared channel and agent Ann.
struct Example {
    hub: TestHub,
    website: TestChannel,
    ann: TestAgent,
}

impl Example {
    async fn start(mut config: Config) -> Example {
        let dir = tempfile::tempdir().expect("temp dir");
        config.storage.url = crate::support::storage_url(dir.path());
        config.runtime.cache_dir = dir.path().join("plugin-cache");
        config.admin.token = Some(ADMIN_TOKEN.to_owned());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a port for the hub");
        let running = hub::app::start_on(listener, config)
            .await
            .expect("the example's hub starts");
        let hub = TestHub {
            base: running.base_url().to_owned(),
            running: Some(running),
            databases: crate::support::take_database(dir.path())
                .into_iter()
                .collect(),
            dir,
            opts: HubOptions::default(),
            http: reqwest::Client::new(),
        };
        // `hub agent create --name Ann --email ann@example.com`
        let ann = hub.create_agent("Ann", "ann@example.com").await;
        // `hub channel list`
        let resp = hub
            .http
            .get(hub.url("/admin/v1/channels"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("list channels");
        assert_eq!(resp.status(), 200);
        let listed: Value = resp.json().await.expect("channels json");
        let raw = listed["channels"]
            .as_array()
            .and_then(|all| all.iter().find(|c| c["name"] == "website"))
            .cloned()
            .expect("the declared channel `website`");
        let text = |key: &str| raw[key].as_str().expect(key).to_owned();
        let website = TestChannel {
            public_id: text("public_id"),
            endpoint_url: text("endpoint_url"),
            status_url: text("status_url"),
            raw: raw.clone(),
        };
        assert_eq!(raw["agents"], json!(["ann@example.com"]));
        Example { hub, website, ann }
    }

    /// The id of the one chat Ann sees.
    async fn only_chat(&self) -> i64 {
        let chats = self.ann.chats().await;
        assert_eq!(chats.len(), 1, "{chats:?}");
        chats[0]["id"].as_i64().expect("chat id")
    }
}

/// examples/custom-channel: a customer message reaches the agent, and the
/// agent's reply reaches the integrator's endpoint.
#[tokio::test]
async fn custom_channel_integrator_talks_with_an_agent() {
    let mut config = load("custom-channel", &Env::empty());
    assert!(config.plugins.is_empty() && config.routes.is_empty());
    let integrator = Integrator::start().await;
    let endpoint = &mut config.channels[0].customer_endpoint;
    assert_eq!(
        endpoint, "http://127.0.0.1:9000/replies",
        "where integrator.py listens"
    );
    *endpoint = same_path_on(endpoint, &integrator);
    let ex = Example::start(config).await;

    // The agent goes online: the channel's status says so.
    ex.ann.set_online(true).await;
    let status = ex
        .hub
        .http
        .get(&ex.website.status_url)
        .send()
        .await
        .expect("status");
    assert_eq!(status.text().await.expect("status body"), "1");

    // `python3 integrator.py say <endpoint> 42 'Hello!' --name Bob`
    ex.hub
        .customer(
            &ex.website,
            json!({ "sender": { "id": 42, "name": "Bob" },
                    "message": { "type": "text", "text": "Hello!" } }),
        )
        .await;
    let chat = ex.only_chat().await;
    let view = ex.ann.chat(chat).await;
    assert_eq!(view["messages"][0]["body"]["text"], "Hello!");

    let sent = ex.ann.reply(chat, "Hi Bob, how can I help?").await;
    let got = integrator.wait_for(1, WAIT).await;
    assert_eq!(got[0].path, format!("/replies/{}", ex.website.public_id));
    let body = got[0].json();
    assert_eq!(body["sender"]["name"], "Ann");
    assert_eq!(body["recipient"]["id"], 42);
    assert_eq!(body["message"]["text"], "Hi Bob, how can I help?");
    // integrator.py answers {"result":"ok"}: the reply is delivered.
    eventually(WAIT, "the reply marked delivered", || async {
        let view = ex.ann.chat(chat).await;
        let messages = view["messages"].as_array().cloned().unwrap_or_default();
        messages
            .iter()
            .any(|m| m["uid"] == sent["uid"] && m["delivery"] == "delivered")
            .then_some(())
    })
    .await;
    ex.hub.shutdown().await;
}

/// examples/crm-forward: customer and agent messages are forwarded to the
/// destination, with its headers.
#[tokio::test]
async fn crm_forward_sends_messages_to_the_crm_receiver() {
    plugin_wasm("crm_forward"); // built by scripts/build-plugins.sh, as the README says
    let env = Env::fixed([("CRM_TOKEN", "example-crm-token")]);
    let mut config = load("crm-forward", &env);
    let receiver = Integrator::start().await;
    let integrator = Integrator::start().await;
    let crm = &mut config.destinations[0];
    assert_eq!(
        crm.url, "http://127.0.0.1:9100/hub-events",
        "where receiver.py listens"
    );
    crm.url = same_path_on(&crm.url, &receiver);
    let endpoint = &mut config.channels[0].customer_endpoint;
    *endpoint = same_path_on(endpoint, &integrator);
    let ex = Example::start(config).await;

    ex.hub
        .customer(
            &ex.website,
            json!({ "sender": { "id": 42, "name": "Bob", "email": "bob@example.com" },
                    "message": { "type": "text", "text": "Hello!" } }),
        )
        .await;
    let got = receiver.wait_for(1, WAIT).await;
    assert_eq!(got[0].path, "/hub-events");
    assert_eq!(
        got[0].header("authorization"),
        Some("Bearer example-crm-token")
    );
    assert!(got[0].header("x-hub-delivery").is_some());
    let record = got[0].json();
    assert_eq!(record["source"], "hub");
    assert_eq!(record["event"], "channel.customer_message");
    assert_eq!(record["channel"], "website");
    assert_eq!(record["contact"]["external_id"], 42);
    assert_eq!(record["contact"]["name"], "Bob");
    assert_eq!(record["message"]["text"], "Hello!");

    // The agent's answer is forwarded too.
    let chat = ex.only_chat().await;
    ex.ann.reply(chat, "Hi Bob").await;
    let got = receiver.wait_for(2, WAIT).await;
    let record = got[1].json();
    assert_eq!(record["event"], "channel.agent_message");
    assert_eq!(record["message"]["text"], "Hi Bob");
    assert_eq!(record["chat_id"], chat);
    ex.hub.shutdown().await;
}

/// examples/webhook-enrichment: when the agent accepts the chat, crm-enrich
/// answers `chat_accepted` and the agent sees its custom data and CRM link,
/// with no webhook receiver at all.
#[tokio::test]
async fn webhook_enrichment_shows_custom_data_to_the_agent() {
    plugin_wasm("crm_enrich"); // built by scripts/build-plugins.sh, as the README says
    let config = load("webhook-enrichment", &Env::empty());
    assert!(
        config.channels.iter().all(|c| c.webhook_url.is_none()),
        "the example runs without a webhook receiver"
    );
    let ex = Example::start(config).await;

    ex.hub.say(&ex.website, json!(42), "Hello!").await;
    let chat = ex.only_chat().await;
    let (status, v) = ex
        .ann
        .post(&format!("/agent/v1/chats/{chat}/accept"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    let view = eventually(WAIT, "the enrichment in the chat", || async {
        let view = ex.ann.chat(chat).await;
        view["integration"]["crm_link"].is_string().then_some(view)
    })
    .await;
    let integration = &view["integration"];
    assert_eq!(
        integration["custom_data"],
        json!([
            { "title": "Visitor", "content": "#1" },
            { "title": "Chats", "content": "1" },
        ])
    );
    assert_eq!(
        integration["crm_link"],
        "https://crm.example.com/visitors/1"
    );
    assert_eq!(integration["enable_assign"], true);
    ex.hub.shutdown().await;
}

/// examples/faq-bot: the plugin bot greets with its menu, answers a keyword,
/// and hands the chat to Ann when asked for a person; Ann's reply reaches
/// the integrator.
#[tokio::test]
async fn faq_bot_answers_and_hands_the_chat_to_an_agent() {
    plugin_wasm("faq_bot"); // built by scripts/build-plugins.sh, as the README says
    let mut config = load("faq-bot", &Env::empty());
    let integrator = Integrator::start().await;
    let endpoint = &mut config.channels[0].customer_endpoint;
    *endpoint = same_path_on(endpoint, &integrator);
    let ex = Example::start(config).await;

    ex.hub.say(&ex.website, json!(42), "Hello").await;
    let greeting = integrator.wait_for(1, WAIT).await[0].json();
    assert_eq!(greeting["sender"]["name"], "Help", "{greeting}");
    assert_eq!(greeting["recipient"]["id"], 42);
    assert_eq!(
        greeting["message"]["text"],
        "Hi! I am the shop's assistant.\n- Prices\n- Opening hours\n- Shipping"
    );

    ex.hub
        .say(&ex.website, json!(42), "What are your opening hours?")
        .await;
    let answer = integrator.wait_for(2, WAIT).await[1].json();
    assert_eq!(
        answer["message"]["text"],
        "We are open 9:00 to 17:00, Monday to Friday."
    );

    ex.hub
        .say(&ex.website, json!(42), "Can I talk to a person?")
        .await;
    let chat = ex.only_chat().await;
    let waiting = eventually(WAIT, "the chat handed to agents", || async {
        let chats = ex.ann.chats().await;
        let c = chats.into_iter().find(|c| c["id"] == chat)?;
        (c["bot"]["state"] == "unavailable").then_some(c)
    })
    .await;
    assert_eq!(waiting["bot"]["name"], "Help");
    assert_eq!(waiting["state"], "open", "waiting for an agent");
    let view = ex.ann.chat(chat).await;
    let authors: Vec<&str> = view["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["author"].as_str())
        .collect();
    assert_eq!(
        authors,
        ["client", "bot", "client", "bot", "client"],
        "{view}"
    );

    let (status, v) = ex
        .ann
        .post(&format!("/agent/v1/chats/{chat}/accept"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    ex.ann.reply(chat, "Hi Bob, Ann here.").await;
    let reply = integrator.wait_for(3, WAIT).await[2].json();
    assert_eq!(reply["sender"]["name"], "Ann");
    assert_eq!(reply["message"]["text"], "Hi Bob, Ann here.");
    // The bot is done with the chat: the customer's next message stays with Ann.
    ex.hub.say(&ex.website, json!(42), "thanks").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        integrator.requests().len(),
        3,
        "no bot answer after Ann joined"
    );
    ex.hub.shutdown().await;
}

/// examples/shadow-redact: the live route keeps the e-mail address, the
/// shadow `redact-v2` would mask it; the difference is counted and shown,
/// and nothing of it reaches the stored message.
#[tokio::test]
async fn shadow_redact_shows_what_the_changed_redact_would_do() {
    plugin_wasm("redact"); // built by scripts/build-plugins.sh, as the README says
    let mut config = load("shadow-redact", &Env::empty());
    let integrator = Integrator::start().await;
    let endpoint = &mut config.channels[0].customer_endpoint;
    *endpoint = same_path_on(endpoint, &integrator);
    let ex = Example::start(config).await;
    for text in ["Where is my order?", "Mail me at bob@example.com"] {
        let (status, body) = ex
            .hub
            .customer(
                &ex.website,
                json!({ "sender": { "id": 42 }, "message": { "type": "text", "text": text } }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let report = eventually(WAIT, "both messages shadowed", || async {
        let (_, r) = ex
            .hub
            .admin(
                reqwest::Method::GET,
                "/admin/v1/plugins/redact-v2/shadow",
                None,
            )
            .await;
        (r["counts"]["same"] == 1 && r["counts"]["changed"] == 1).then_some(r)
    })
    .await;
    let d = &report["recent"][0];
    assert_eq!(d["live"]["message"]["text"], "Mail me at bob@example.com");
    assert_eq!(d["shadow"]["message"]["text"], "Mail me at [email]");
    let stored = ex
        .hub
        .store()
        .events_of_kind("channel.customer_message", 1)
        .await
        .expect("events");
    assert_eq!(
        stored[0].payload["message"]["text"],
        "Mail me at bob@example.com"
    );
    let m = ex.hub.metrics().await;
    assert_eq!(
        m.get(
            "hub_shadow_outcomes_total{route=\"routes[0]\",plugin=\"redact-v2\",result=\"changed\"}"
        ),
        Some(&1.0),
        "{m:?}"
    );
    ex.hub.shutdown().await;
}
