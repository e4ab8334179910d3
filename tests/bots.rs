//! The bot exchange end to end: loopback bot providers (an `Integrator`, and
//! one that posts back before answering), the admin API, every row of the
//! spec's flow table, the exchange's timing and error statuses, the optional
//! authorization, and the `faq-bot` plugin as a channel's bot.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{
    ADMIN_TOKEN, EARLY_WINDOW, HubOptions, HubProcess, Integrator, Recorded, Reply, Sse, TestAgent,
    TestChannel, TestHub, eventually, move_clock_to, plugin_toml, serve, write_config,
};
use hub::clock::ManualClock;

/// Generous: CI machines are slow and have two cores.
const WAIT: Duration = Duration::from_secs(10);
/// Long enough for the spec's 3 attempts 3 s apart and what follows them.
const SLOW_WAIT: Duration = Duration::from_secs(30);
/// The provider's token: the last segment of every URL in both directions.
const TOKEN: &str = "prov-token-0001";

/// Lets a request that should not happen have its chance to (the deliverer
/// needs milliseconds for one); only for asserting that nothing arrives.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A bot `TEXT` message as providers post it.
fn text_message(text: &str) -> Value {
    json!({ "type": "TEXT", "text": text, "timestamp": now_secs() })
}

/// `BOT_MESSAGE` for `chat` with a fresh event id.
fn bot_message(chat: i64, message: Value) -> Value {
    json!({ "id": uuid(), "event": "BOT_MESSAGE", "chat_id": chat.to_string(),
            "message": message })
}

fn invite_agent(chat: i64) -> Value {
    json!({ "id": uuid(), "event": "INVITE_AGENT", "chat_id": chat.to_string() })
}

/// Asserts the spec's error answer: the status and `{"error":{"code","message"}}`.
fn assert_refused(label: &str, (status, body): &(u16, Value), expected: u16, code: &str) {
    assert_eq!(*status, expected, "{label}: {body}");
    assert_eq!(body["error"]["code"], code, "{label}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{label}: the error needs a message: {body}"
    );
}

/// An admin request; the status and the JSON answer.
async fn admin(hub: &TestHub, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    hub.admin(method, path, body).await
}

async fn create_bot(hub: &TestHub, body: Value) -> Value {
    let (status, bot) = admin(hub, Method::POST, "/admin/v1/bots", Some(body)).await;
    assert_eq!(status, 201, "bot creation: {bot}");
    bot
}

/// A channel named `name` whose agent messages go to `customer` and whose
/// event webhooks go to `receiver`.
async fn channel(
    hub: &TestHub,
    name: &str,
    customer: &Integrator,
    receiver: Option<&Integrator>,
    agents: &[&str],
) -> TestChannel {
    let mut body = json!({ "name": name, "customer_endpoint": customer.url, "agents": agents });
    if let Some(r) = receiver {
        body["webhook_url"] = json!(r.url);
    }
    let (status, raw) = admin(hub, Method::POST, "/admin/v1/channels", Some(body)).await;
    assert_eq!(status, 201, "channel creation: {raw}");
    TestChannel {
        public_id: raw["public_id"].as_str().expect("public_id").to_owned(),
        endpoint_url: raw["endpoint_url"]
            .as_str()
            .expect("endpoint_url")
            .to_owned(),
        status_url: raw["status_url"].as_str().expect("status_url").to_owned(),
        raw,
    }
}

/// A POST (or another method) of a raw body to a URL, with an optional
/// `Authorization` header value; the status and the JSON answer.
async fn call(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    body: &str,
    authorization: Option<&str>,
) -> (u16, Value) {
    let mut req = http.request(method, url);
    if !body.is_empty() {
        req = req
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.expect("request to the hub");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The events of one name among a provider's requests, in arrival order.
fn events_named(requests: &[Recorded], path: &str, event: &str) -> Vec<Recorded> {
    requests
        .iter()
        .filter(|r| r.path == path && r.json()["event"] == event)
        .cloned()
        .collect()
}

/// A hub whose channel `web` starts its chats with the bot `Assistant`,
/// created through the admin API, whose provider is a loopback integrator.
struct Bay {
    hub: TestHub,
    /// The bot provider: the hub posts to `<provider.url>/<TOKEN>`.
    provider: Integrator,
    /// The channel's customer endpoint: what reaches the customer.
    customer: Integrator,
    /// The channel's event webhook receiver.
    receiver: Integrator,
    web: TestChannel,
    ann: TestAgent,
    /// The bot as the admin API shows it.
    bot: Value,
}

impl Bay {
    async fn open() -> Bay {
        Bay::open_with(HubOptions::default()).await
    }

    /// A bay whose hub runs on `clock`, which also stamps what the provider gets.
    async fn open_on(clock: &ManualClock) -> Bay {
        let bay = Bay::open_with(HubOptions {
            clock: Some(clock.clone()),
            ..HubOptions::default()
        })
        .await;
        bay.provider.on_clock(clock);
        bay
    }

    async fn open_with(opts: HubOptions) -> Bay {
        let provider = Integrator::start().await;
        let customer = Integrator::start().await;
        let receiver = Integrator::start().await;
        let hub = TestHub::start_with(opts).await;
        let ann = hub.create_agent("Ann", "ann@example.com").await;
        let web = channel(
            &hub,
            "web",
            &customer,
            Some(&receiver),
            &["ann@example.com"],
        )
        .await;
        let bot = create_bot(
            &hub,
            json!({ "name": "Assistant", "endpoint": provider.url, "token": TOKEN,
                    "channels": ["web"] }),
        )
        .await;
        Bay {
            hub,
            provider,
            customer,
            receiver,
            web,
            ann,
            bot,
        }
    }

    fn webhooks_url(&self) -> String {
        self.bot["webhooks_url"]
            .as_str()
            .expect("webhooks_url")
            .to_owned()
    }

    fn provider_path(&self) -> String {
        format!("/hub/{TOKEN}")
    }

    /// Posts a provider event to the hub's `/webhooks/...` URL.
    async fn send(&self, event: Value) -> (u16, Value) {
        call(
            &self.hub.http,
            Method::POST,
            &self.webhooks_url(),
            &event.to_string(),
            None,
        )
        .await
    }

    /// Posts a provider event that must be taken.
    async fn send_ok(&self, event: Value) {
        let answer = self.send(event.clone()).await;
        assert_eq!(answer.0, 200, "{event} refused: {}", answer.1);
        assert_eq!(answer.1, json!({ "result": "ok" }));
    }

    /// The hub's requests to the provider of event `name`, so far.
    fn to_bot(&self, name: &str) -> Vec<Recorded> {
        events_named(&self.provider.requests(), &self.provider_path(), name)
    }

    /// Waits until the hub recorded the provider's answer to its notice
    /// `kind` (`bot.agent_joined`, `bot.chat_closed`) for `chat`: the
    /// provider has the request before the hub has its answer, and the hub
    /// takes a bot's message as overtaken until then (see
    /// `an_agent_joining_while_the_bot_hands_off_does_not_fail_the_bots_answer`).
    async fn told(&self, chat: i64, kind: &str) {
        eventually(
            WAIT,
            &format!("{kind} for chat {chat} recorded as delivered"),
            || async {
                let (status, list) = admin(
                    &self.hub,
                    Method::GET,
                    "/admin/v1/deliveries?state=delivered&limit=1000",
                    None,
                )
                .await;
                assert_eq!(status, 200, "{list}");
                list["deliveries"]
                    .as_array()?
                    .iter()
                    .any(|d| d["chat_id"] == json!(chat) && d["kind"] == kind)
                    .then_some(())
            },
        )
        .await;
    }

    /// Waits until the provider got `n` requests of event `name`.
    async fn wait_bot(&self, name: &str, n: usize, timeout: Duration) -> Vec<Recorded> {
        eventually(timeout, &format!("{n} × {name} to the bot"), || {
            let got = self.to_bot(name);
            async move { (got.len() >= n).then_some(got) }
        })
        .await
    }

    /// The CLIENT_MESSAGE whose text is `text`, once it arrives.
    async fn client_message(&self, text: &str) -> Value {
        eventually(WAIT, &format!("CLIENT_MESSAGE {text:?}"), || {
            let found = self
                .to_bot("CLIENT_MESSAGE")
                .into_iter()
                .map(|r| r.json())
                .find(|e| e["message"]["text"] == text);
            async move { found }
        })
        .await
    }

    /// Customer `customer` writes `text`; the bot must hear it. Returns the
    /// CLIENT_MESSAGE.
    async fn says(&self, customer: i64, text: &str) -> Value {
        self.hub.say(&self.web, json!(customer), text).await;
        self.client_message(text).await
    }

    /// A new chat with the bot: customer `customer` writes `text`. Returns the chat id.
    async fn start_chat(&self, customer: i64, text: &str) -> i64 {
        let event = self.says(customer, text).await;
        event["chat_id"]
            .as_str()
            .expect("chat_id is a string")
            .parse()
            .expect("chat_id is the hub's chat id")
    }

    /// What reached the customer (the channel's customer endpoint).
    fn to_customer(&self) -> Vec<Value> {
        self.customer
            .requests()
            .iter()
            .map(Recorded::json)
            .collect()
    }

    async fn wait_customer(&self, n: usize) -> Vec<Value> {
        self.customer
            .wait_for(n, WAIT)
            .await
            .iter()
            .map(Recorded::json)
            .collect()
    }

    /// The chat as Ann's chat list shows it.
    async fn listed(&self, chat: i64) -> Value {
        self.ann
            .chats()
            .await
            .into_iter()
            .find(|c| c["id"] == chat)
            .unwrap_or_else(|| panic!("Ann does not see chat {chat}"))
    }

    /// Waits until Ann's list shows the chat's bot in `state`.
    async fn wait_state(&self, chat: i64, state: &str, timeout: Duration) -> Value {
        eventually(
            timeout,
            &format!("chat {chat} in bot state {state}"),
            || async move {
                let c = self.listed(chat).await;
                (c["bot"]["state"] == state).then_some(c)
            },
        )
        .await
    }

    async fn act(&self, chat: i64, action: &str) -> (u16, Value) {
        self.ann
            .post(&format!("/agent/v1/chats/{chat}/{action}"), json!({}))
            .await
    }

    async fn accept(&self, chat: i64) {
        let (status, v) = self.act(chat, "accept").await;
        assert_eq!(status, 200, "accept: {v}");
    }

    async fn close(&self, chat: i64) {
        let (status, v) = self.act(chat, "close").await;
        assert_eq!(status, 200, "close: {v}");
    }

    /// The bot's messages as the agent's chat view shows them.
    async fn bot_messages(&self, chat: i64) -> Vec<Value> {
        self.ann.chat(chat).await["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["author"] == "bot")
            .cloned()
            .collect()
    }
}

/// The next stream event `name` about `chat`.
async fn stream_event(sse: &mut Sse, chat: i64, name: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match sse.next(left).await {
            Some((n, data)) if n == name && data["chat_id"] == chat => return data,
            Some(_) => continue,
            None => panic!("no `{name}` about chat {chat} on the stream"),
        }
    }
}

/// The notice (`AGENT_JOINED`, `AGENT_UNAVAILABLE`, `CHAT_CLOSED`) names the chat and client.
fn assert_notice(event: &Value, name: &str, chat: i64, client_id: &Value) {
    assert_eq!(event["event"], name, "{event}");
    assert_eq!(event["chat_id"], chat.to_string(), "{event}");
    assert_eq!(&event["client_id"], client_id, "{event}");
    let id = event["id"].as_str().expect("a notice has a string id");
    uuid::Uuid::parse_str(id).expect("the event id is a UUID");
}

#[tokio::test]
async fn bots_are_managed_through_the_admin_api_and_a_deleted_bot_lets_go_of_its_channel() {
    let provider = Integrator::start().await;
    let customer = Integrator::start().await;
    let hub = TestHub::start().await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;

    // Without the admin token nothing about bots is shown or changed.
    for (method, path) in [
        (Method::POST, "/admin/v1/bots"),
        (Method::GET, "/admin/v1/bots"),
        (Method::GET, "/admin/v1/bots/1"),
        (Method::DELETE, "/admin/v1/bots/1"),
    ] {
        let resp = hub
            .http
            .request(method.clone(), hub.url(path))
            .json(&json!({ "name": "X", "endpoint": provider.url, "token": TOKEN }))
            .send()
            .await
            .expect("request");
        assert_eq!(
            resp.status(),
            401,
            "{method} {path} without the admin token"
        );
    }

    // The bot's channel does not exist yet: channels are named, not looked up.
    let bot = create_bot(
        &hub,
        json!({ "name": "Assistant", "endpoint": provider.url, "token": TOKEN,
                "channels": ["web"] }),
    )
    .await;
    assert!(bot["id"].is_i64(), "{bot}");
    assert_eq!(bot["name"], "Assistant");
    assert_eq!(bot["endpoint"], json!(provider.url));
    assert_eq!(bot["channels"], json!(["web"]));
    assert_eq!(bot["authorized"], false);
    assert_eq!(bot["declared"], false);
    assert!(bot["created_at"].is_i64(), "{bot}");
    assert!(bot.get("token").is_none(), "the token is not shown: {bot}");
    let provider_id = bot["provider_id"].as_str().expect("provider_id");
    assert!(
        provider_id.len() >= 12
            && provider_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "a generated provider id has at least 12 URL-safe characters: {provider_id}"
    );
    let webhooks_url = format!("{}/webhooks/{provider_id}/{TOKEN}", hub.base);
    let providers_url = format!("{}/providers/{provider_id}/{TOKEN}", hub.base);
    assert_eq!(bot["webhooks_url"], json!(webhooks_url));
    assert_eq!(bot["providers_url"], json!(providers_url));

    let other = create_bot(
        &hub,
        json!({ "name": "Other", "endpoint": provider.url, "token": "other-token",
                "provider_id": "acme-bot-0001", "channels": ["shop"] }),
    )
    .await;
    assert_eq!(other["provider_id"], "acme-bot-0001");
    assert_ne!(other["id"], bot["id"]);

    let (status, v) = admin(
        &hub,
        Method::POST,
        "/admin/v1/bots",
        Some(json!({ "name": "Assistant", "endpoint": provider.url, "token": TOKEN })),
    )
    .await;
    assert_eq!(status, 409, "a second bot named Assistant: {v}");

    for (label, body) in [
        (
            "a plugin that is not loaded",
            json!({ "name": "P", "plugin": "nope", "channels": ["x"] }),
        ),
        (
            "both a provider and a plugin",
            json!({ "name": "P", "endpoint": provider.url, "token": TOKEN, "plugin": "nope" }),
        ),
        ("no target", json!({ "name": "P", "channels": ["x"] })),
        (
            "a token that is no path segment",
            json!({ "name": "P", "endpoint": provider.url, "token": "a/b" }),
        ),
    ] {
        let (status, v) = admin(&hub, Method::POST, "/admin/v1/bots", Some(body)).await;
        assert_eq!(status, 400, "{label}: {v}");
    }

    let (status, list) = admin(&hub, Method::GET, "/admin/v1/bots", None).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = list["bots"]
        .as_array()
        .expect("bots")
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert_eq!(names, ["Assistant", "Other"]);
    let bot_id = bot["id"].as_i64().expect("id");
    for key in [
        bot_id.to_string(),
        "Assistant".to_owned(),
        provider_id.to_owned(),
    ] {
        let (status, found) =
            admin(&hub, Method::GET, &format!("/admin/v1/bots/{key}"), None).await;
        assert_eq!(status, 200, "GET bot by {key}: {found}");
        assert_eq!(found["id"], bot_id, "GET bot by {key}");
        assert_eq!(found["webhooks_url"], json!(webhooks_url));
    }
    let (status, _) = admin(&hub, Method::GET, "/admin/v1/bots/nobody", None).await;
    assert_eq!(status, 404);

    // Created at once, in effect at once, for a channel created after it.
    let web = hub
        .create_channel("web", &customer.url, false, &["ann@example.com"])
        .await;
    hub.say(&web, json!(1), "before the delete").await;
    let first = provider.wait_for(1, WAIT).await;
    assert_eq!(first[0].path, format!("/hub/{TOKEN}"));
    assert_eq!(first[0].json()["event"], "CLIENT_MESSAGE");
    assert_eq!(first[0].json()["message"]["text"], "before the delete");

    let (status, deleted) = admin(&hub, Method::DELETE, "/admin/v1/bots/Assistant", None).await;
    assert_eq!(status, 200, "delete: {deleted}");
    assert_eq!(deleted["deleted"]["id"], bot_id);
    assert_eq!(deleted["deleted"]["name"], "Assistant");
    let (status, _) = admin(&hub, Method::GET, &format!("/admin/v1/bots/{bot_id}"), None).await;
    assert_eq!(status, 404, "the deleted bot is gone");
    let (status, _) = admin(
        &hub,
        Method::DELETE,
        &format!("/admin/v1/bots/{bot_id}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "deleting it again");
    let (_, list) = admin(&hub, Method::GET, "/admin/v1/bots", None).await;
    assert_eq!(list["bots"].as_array().map(Vec::len), Some(1), "{list}");

    // Its URLs no longer exist.
    let event = json!({ "event": "BOT_MESSAGE", "chat_id": "1",
                        "message": { "type": "TEXT", "text": "late", "timestamp": now_secs() } })
    .to_string();
    for url in [&webhooks_url, &providers_url] {
        let answer = call(&hub.http, Method::POST, url, &event, None).await;
        assert_refused(url, &answer, 404, "invalid_request");
    }

    // A new chat on its channel goes to agents only.
    hub.say(&web, json!(2), "after the delete").await;
    let chats = ann.chats().await;
    assert_eq!(chats.len(), 2, "{chats:?}");
    let newest = chats
        .iter()
        .max_by_key(|c| c["id"].as_i64())
        .expect("the new chat");
    assert!(
        newest.get("bot").is_none_or(Value::is_null),
        "the new chat has no bot: {newest}"
    );
    // The chat the bot held waits for agents: no bot will answer it again.
    let held = chats
        .iter()
        .min_by_key(|c| c["id"].as_i64())
        .expect("the bot's chat");
    assert_eq!(held["bot"]["state"], "invited", "{held}");
    assert_eq!(held["state"], "open", "{held}");
    settle().await;
    assert_eq!(
        provider.requests().len(),
        1,
        "nothing more went to the deleted bot's provider"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn a_customer_message_reaches_the_bot_as_a_client_message_in_the_real_shape() {
    let bay = Bay::open().await;
    let (status, body) = bay
        .hub
        .customer(
            &bay.web,
            json!({ "sender": { "id": 1233, "name": "John Smith", "url": "https://test.com/page" },
                    "message": { "type": "text", "text": "Can you help me?" } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let req = bay.wait_bot("CLIENT_MESSAGE", 1, WAIT).await.remove(0);
    assert_eq!(
        req.path,
        format!("/hub/{TOKEN}"),
        "posted to {{endpoint}}/{{token}}"
    );
    assert!(
        req.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{:?}",
        req.header("content-type")
    );
    let e = req.json();
    assert_eq!(e["event"], "CLIENT_MESSAGE");
    uuid::Uuid::parse_str(e["id"].as_str().expect("id is a string")).expect("id is a UUID");
    assert_eq!(e["site_id"], "1", "the CRM site_id, as a string");
    let chat: i64 = e["chat_id"]
        .as_str()
        .expect("chat_id is a string")
        .parse()
        .expect("the hub's chat id");
    let client: i64 = e["client_id"]
        .as_str()
        .expect("client_id is a string")
        .parse()
        .expect("the hub's client id");
    assert_eq!(e["agents_online"], false);
    assert_eq!(
        e["sender"],
        json!({ "id": client, "name": "John Smith", "url": "https://test.com/page",
                "has_contacts": false }),
        "{e}"
    );
    assert_eq!(e["message"]["type"], "TEXT");
    assert_eq!(e["message"]["text"], "Can you help me?");
    assert!(e["message"].get("button_id").is_none(), "{e}");
    let ts = e["message"]["timestamp"]
        .as_i64()
        .expect("a numeric timestamp");
    assert!(
        (ts - now_secs()).abs() < 120,
        "timestamp {ts} is now, in seconds"
    );
    assert_eq!(
        e["channel"],
        json!({ "id": bay.web.public_id, "type": "custom" })
    );

    // Agents see the chat, held by the bot, with the same ids.
    let listed = bay.listed(chat).await;
    assert_eq!(
        listed["bot"],
        json!({ "name": "Assistant", "state": "bot" })
    );
    let view = bay.ann.chat(chat).await;
    assert_eq!(view["client"]["id"], client);
    assert_eq!(
        view["bot"],
        json!({ "id": bay.bot["id"], "name": "Assistant", "state": "bot" })
    );

    // Once an agent is online the bot is told so; each event has its own id.
    bay.ann.set_online(true).await;
    bay.hub.say(&bay.web, json!(1233), "Still there?").await;
    let second = bay.client_message("Still there?").await;
    assert_eq!(second["agents_online"], true);
    assert_eq!(second["chat_id"], e["chat_id"]);
    assert_eq!(second["client_id"], e["client_id"]);
    assert_ne!(second["id"], e["id"]);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn customer_media_reach_the_bot_as_text_with_the_file_url() {
    let bay = Bay::open().await;
    for (kind, url) in [
        ("photo", "https://files.example.com/p.jpg"),
        ("document", "https://files.example.com/invoice.pdf"),
    ] {
        let (status, body) = bay
            .hub
            .customer(
                &bay.web,
                json!({ "sender": { "id": 5 },
                        "message": { "type": kind, "file": url, "file_name": "f", "file_size": 1 } }),
            )
            .await;
        assert_eq!(status, 200, "{kind}: {body}");
        let found = eventually(WAIT, &format!("the {kind} at the bot"), || {
            let found = bay
                .to_bot("CLIENT_MESSAGE")
                .into_iter()
                .map(|r| r.json())
                .find(|e| {
                    e["message"]["text"]
                        .as_str()
                        .is_some_and(|t| t.contains(url))
                });
            async move { found }
        })
        .await;
        assert_eq!(found["message"]["type"], "TEXT", "{kind}: {found}");
    }
    assert_eq!(bay.to_bot("CLIENT_MESSAGE").len(), 2);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn a_bot_text_message_reaches_the_customer_and_the_agents_live() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(7, "hello bot").await;
    let client_id = bay.to_bot("CLIENT_MESSAGE")[0].json()["client_id"].clone();
    let mut sse = bay.ann.stream().await;
    bay.send_ok(
        json!({ "id": uuid(), "client_id": client_id, "chat_id": chat.to_string(),
                        "event": "BOT_MESSAGE",
                        "message": { "type": "TEXT", "text": "Hello! I am a bot.",
                                     "timestamp": 1583910736 } }),
    )
    .await;

    let wire = bay.wait_customer(1).await.remove(0);
    assert_eq!(
        bay.customer.requests()[0].path,
        format!("/hub/{}", bay.web.public_id)
    );
    assert_eq!(wire["sender"], json!({ "name": "Assistant" }), "{wire}");
    assert_eq!(wire["recipient"], json!({ "id": 7 }), "{wire}");
    assert_eq!(wire["message"]["type"], "text");
    assert_eq!(wire["message"]["text"], "Hello! I am a bot.");
    assert!(
        wire["message"]["id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{wire}"
    );

    let live = stream_event(&mut sse, chat, "chat.message").await;
    assert_eq!(live["data"]["message"]["author"], "bot", "{live}");
    assert_eq!(
        live["data"]["message"]["author_name"], "Assistant",
        "{live}"
    );
    assert_eq!(
        live["data"]["message"]["body"]["text"],
        "Hello! I am a bot."
    );

    let shown = bay.bot_messages(chat).await;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["author_name"], "Assistant");
    assert_eq!(
        shown[0]["body"],
        json!({ "type": "TEXT", "text": "Hello! I am a bot.", "timestamp": 1583910736 })
    );
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn provider_ids_may_be_numbers_or_strings() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(8, "numbers please").await;
    let client: i64 = bay.to_bot("CLIENT_MESSAGE")[0].json()["client_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("client id");
    bay.send_ok(
        json!({ "id": 4242, "client_id": client, "chat_id": chat, "event": "BOT_MESSAGE",
                        "message": { "type": "TEXT", "text": "numeric ids", "timestamp": now_secs(),
                                     "button_id": 3 } }),
    )
    .await;
    let wire = bay.wait_customer(1).await;
    assert_eq!(wire[0]["message"]["text"], "numeric ids");
    // The same id as a string is the same event: not applied twice.
    bay.send_ok(
        json!({ "id": "4242", "chat_id": chat.to_string(), "event": "BOT_MESSAGE",
                        "message": text_message("numeric ids") }),
    )
    .await;
    bay.send_ok(
        json!({ "id": 4243, "client_id": client, "chat_id": chat, "event": "INVITE_AGENT" }),
    )
    .await;
    bay.wait_state(chat, "unavailable", WAIT).await;
    settle().await;
    assert_eq!(bay.to_customer().len(), 1, "{:?}", bay.to_customer());
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn buttons_reach_the_customer_as_text_and_an_answer_carries_the_button_id() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(9, "I want a call").await;
    let buttons = json!({ "type": "BUTTONS", "title": "Call back?", "text": "Do you want a call back?",
                          "timestamp": now_secs(),
                          "buttons": [{ "text": "Yes", "id": "1" }, { "text": "No", "id": "2" }] });
    bay.send_ok(bot_message(chat, buttons.clone())).await;

    let wire = bay.wait_customer(1).await.remove(0);
    assert_eq!(wire["message"]["type"], "text");
    assert_eq!(
        wire["message"]["text"], "Do you want a call back?\n- Yes\n- No",
        "the button texts come in the same message as the text"
    );
    let shown = bay.bot_messages(chat).await;
    assert_eq!(shown[0]["body"], buttons, "agents see the buttons as sent");

    // The customer answers with a button's text, in any case.
    let answer = bay.says(9, "yes").await;
    assert_eq!(answer["message"]["text"], "yes");
    assert_eq!(answer["message"]["button_id"], "1", "{answer}");
    let other = bay.says(9, "No thanks").await;
    assert!(
        other["message"].get("button_id").is_none(),
        "not a button's text: {other}"
    );
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn markdown_or_buttons_without_text_are_shown_to_agents_but_not_sent() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(10, "show me markdown").await;
    bay.send_ok(bot_message(
        chat,
        json!({ "type": "MARKDOWN", "content": "**Bold** and [a link](https://x.example)",
                "timestamp": now_secs() }),
    ))
    .await;
    bay.send_ok(bot_message(
        chat,
        json!({ "type": "BUTTONS", "title": "Pick one", "timestamp": now_secs(),
                "buttons": [{ "text": "A", "id": "a" }] }),
    ))
    .await;
    bay.send_ok(bot_message(
        chat,
        json!({ "type": "MARKDOWN", "content": "*plain* enough", "text": "plain enough",
                "timestamp": now_secs() }),
    ))
    .await;
    let wire = bay.wait_customer(1).await;
    assert_eq!(wire[0]["message"]["text"], "plain enough");
    settle().await;
    assert_eq!(
        bay.to_customer().len(),
        1,
        "only the message with a text was sent: {:?}",
        bay.to_customer()
    );
    let shown = bay.bot_messages(chat).await;
    assert_eq!(shown.len(), 3, "agents see all three: {shown:?}");
    assert_eq!(
        shown[0]["body"]["content"],
        "**Bold** and [a link](https://x.example)"
    );
    assert_eq!(shown[1]["body"]["title"], "Pick one");
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn provider_requests_get_the_spec_error_statuses() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(11, "errors ahead").await;
    let http = &bay.hub.http;
    let url = bay.webhooks_url();
    let provider_id = bay.bot["provider_id"].as_str().expect("provider_id");
    let good = bot_message(chat, text_message("fine")).to_string();

    // A second bot with its own channel and chat; and a channel without a bot.
    let other_provider = Integrator::start().await;
    create_bot(
        &bay.hub,
        json!({ "name": "Other", "endpoint": other_provider.url, "token": "other-token",
                "channels": ["shop"] }),
    )
    .await;
    let shop = channel(&bay.hub, "shop", &bay.customer, None, &["ann@example.com"]).await;
    bay.hub.say(&shop, json!(12), "for the other bot").await;
    let other_chat: i64 = other_provider.wait_for(1, WAIT).await[0].json()["chat_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("the other bot's chat");
    let plain = channel(&bay.hub, "plain", &bay.customer, None, &["ann@example.com"]).await;
    bay.hub.say(&plain, json!(13), "no bot here").await;
    let botless: i64 = bay
        .ann
        .chats()
        .await
        .iter()
        .filter(|c| c["channel"] == "plain")
        .find_map(|c| c["id"].as_i64())
        .expect("the chat without a bot");

    let base = &bay.hub.base;
    for (label, url, status, code) in [
        (
            "unknown provider id",
            format!("{base}/webhooks/nobody-here/{TOKEN}"),
            404,
            "invalid_request",
        ),
        (
            "malformed path",
            format!("{base}/webhooks/x"),
            404,
            "invalid_request",
        ),
        (
            "too long a path",
            format!("{url}/extra"),
            404,
            "invalid_request",
        ),
        (
            "wrong token",
            format!("{base}/webhooks/{provider_id}/wrong-token"),
            401,
            "invalid_client",
        ),
        (
            "wrong token on /providers",
            format!("{base}/providers/{provider_id}/wrong-token"),
            401,
            "invalid_client",
        ),
    ] {
        let answer = call(http, Method::POST, &url, &good, None).await;
        assert_refused(label, &answer, status, code);
    }

    let answer = call(http, Method::GET, &url, "", None).await;
    assert_eq!(answer.0, 405, "GET: {}", answer.1);
    assert!(answer.1["error"]["code"].is_string(), "{}", answer.1);

    let refusals: [(&str, String, u16); 11] = [
        (
            "CLIENT_MESSAGE posted to the hub",
            json!({ "id": uuid(), "event": "CLIENT_MESSAGE", "chat_id": chat.to_string(),
                    "client_id": "1", "message": text_message("me?") })
            .to_string(),
            405,
        ),
        (
            "AGENT_JOINED posted to the hub",
            json!({ "id": uuid(), "event": "AGENT_JOINED", "chat_id": chat.to_string(),
                    "client_id": "1" })
            .to_string(),
            405,
        ),
        (
            "an unknown event",
            json!({ "id": uuid(), "event": "TYPING", "chat_id": chat.to_string() }).to_string(),
            405,
        ),
        ("bad JSON", "{\"event\": \"BOT_MESSAGE\", ".to_owned(), 400),
        (
            "no event",
            json!({ "chat_id": chat.to_string(), "message": text_message("x") }).to_string(),
            400,
        ),
        (
            "no chat_id",
            json!({ "id": uuid(), "event": "BOT_MESSAGE", "message": text_message("x") })
                .to_string(),
            400,
        ),
        (
            "an unknown chat",
            bot_message(999_999, text_message("x")).to_string(),
            400,
        ),
        (
            "a chat_id that is not a number",
            json!({ "id": uuid(), "event": "BOT_MESSAGE", "chat_id": "abc",
                    "message": text_message("x") })
            .to_string(),
            400,
        ),
        (
            "another bot's chat",
            bot_message(other_chat, text_message("not mine")).to_string(),
            400,
        ),
        (
            "a chat without a bot",
            bot_message(botless, text_message("not a bot chat")).to_string(),
            400,
        ),
        (
            "BUTTONS with 4 buttons",
            bot_message(
                chat,
                json!({ "type": "BUTTONS", "title": "Too many", "text": "Pick",
                        "timestamp": now_secs(),
                        "buttons": [{ "text": "1" }, { "text": "2" }, { "text": "3" },
                                    { "text": "4" }] }),
            )
            .to_string(),
            400,
        ),
    ];
    for (label, body, status) in refusals {
        let answer = call(http, Method::POST, &url, &body, None).await;
        assert_refused(label, &answer, status, "invalid_request");
    }
    // Nothing of the above reached a customer; the good event still works.
    settle().await;
    assert!(bay.to_customer().is_empty(), "{:?}", bay.to_customer());
    bay.send_ok(bot_message(chat, text_message("fine"))).await;
    assert_eq!(bay.wait_customer(1).await[0]["message"]["text"], "fine");
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn a_repeated_event_id_has_no_second_effect() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(14, "say it twice").await;
    let message = bot_message(chat, text_message("Only once, please."));
    bay.send_ok(message.clone()).await;
    bay.send_ok(message).await;
    bay.wait_customer(1).await;

    // No agent online: the invitation is answered with AGENT_UNAVAILABLE, once.
    let invite = invite_agent(chat);
    bay.send_ok(invite.clone()).await;
    bay.send_ok(invite).await;
    bay.wait_bot("AGENT_UNAVAILABLE", 1, WAIT).await;
    settle().await;
    assert_eq!(
        bay.to_customer().len(),
        1,
        "a retried BOT_MESSAGE is delivered once"
    );
    assert_eq!(bay.bot_messages(chat).await.len(), 1);
    assert_eq!(bay.to_bot("AGENT_UNAVAILABLE").len(), 1);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn sloppy_events_without_id_or_client_id_are_accepted() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(15, "sloppy provider").await;
    let sloppy = json!({ "event": "BOT_MESSAGE", "chat_id": chat.to_string(),
                         "message": text_message("No id, no client id.") });
    bay.send_ok(sloppy.clone()).await;
    // Without an id there is nothing to de-duplicate on: both are messages.
    bay.send_ok(sloppy).await;
    let wire = bay.wait_customer(2).await;
    assert!(
        wire.iter()
            .all(|w| w["message"]["text"] == "No id, no client id."),
        "{wire:?}"
    );
    // Nor a timestamp: the message still reaches the customer.
    bay.send_ok(json!({ "event": "BOT_MESSAGE", "chat_id": chat,
                        "message": { "type": "TEXT", "text": "No time either." } }))
        .await;
    assert_eq!(
        bay.wait_customer(3).await[2]["message"]["text"],
        "No time either."
    );
    bay.send_ok(json!({ "event": "INVITE_AGENT", "chat_id": chat.to_string() }))
        .await;
    bay.wait_state(chat, "unavailable", WAIT).await;
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn an_invited_chat_goes_to_the_agent_who_accepts_and_the_bot_is_done_with_it() {
    let bay = Bay::open().await;
    bay.ann.set_online(true).await;
    let chat = bay.start_chat(16, "I need a human").await;
    let client_id = bay.to_bot("CLIENT_MESSAGE")[0].json()["client_id"].clone();
    let mut sse = bay.ann.stream().await;
    bay.send_ok(invite_agent(chat)).await;

    let invited = stream_event(&mut sse, chat, "chat.invited").await;
    assert_eq!(invited["data"]["bot"]["state"], "invited", "{invited}");
    let listed = bay.listed(chat).await;
    assert_eq!(
        listed["bot"],
        json!({ "name": "Assistant", "state": "invited" })
    );
    assert_eq!(
        listed["state"], "open",
        "the chat waits for an agent: {listed}"
    );

    bay.accept(chat).await;
    let joined = bay.wait_bot("AGENT_JOINED", 1, WAIT).await.remove(0).json();
    assert_notice(&joined, "AGENT_JOINED", chat, &client_id);
    assert_eq!(bay.listed(chat).await["bot"]["state"], "joined");
    bay.told(chat, "bot.agent_joined").await;

    // The customer now talks to Ann only; the bot's messages are refused.
    bay.hub.say(&bay.web, json!(16), "thanks, human").await;
    let answer = bay
        .send(bot_message(chat, text_message("I am still here!")))
        .await;
    assert_refused(
        "BOT_MESSAGE after AGENT_JOINED",
        &answer,
        400,
        "invalid_request",
    );
    settle().await;
    assert_eq!(
        bay.to_bot("CLIENT_MESSAGE").len(),
        1,
        "after AGENT_JOINED the customer's messages do not go to the bot"
    );
    assert!(bay.to_bot("AGENT_UNAVAILABLE").is_empty());
    assert!(
        bay.to_customer().is_empty(),
        "nothing of the bot reached the customer"
    );
    assert!(bay.bot_messages(chat).await.is_empty());
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn with_no_agent_online_the_bot_hears_agent_unavailable_and_keeps_the_customer() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(17, "anyone there?").await;
    let client_id = bay.to_bot("CLIENT_MESSAGE")[0].json()["client_id"].clone();
    bay.send_ok(invite_agent(chat)).await;
    let unavailable = bay
        .wait_bot("AGENT_UNAVAILABLE", 1, WAIT)
        .await
        .remove(0)
        .json();
    assert_notice(&unavailable, "AGENT_UNAVAILABLE", chat, &client_id);
    let listed = bay.listed(chat).await;
    assert_eq!(
        listed["bot"],
        json!({ "name": "Assistant", "state": "unavailable" })
    );

    // The bot collects contacts meanwhile: it still hears the customer and may answer.
    bay.says(17, "my phone is 555-0100").await;
    bay.send_ok(bot_message(
        chat,
        text_message("Thanks, an agent will call you."),
    ))
    .await;
    assert_eq!(
        bay.wait_customer(1).await[0]["message"]["text"],
        "Thanks, an agent will call you."
    );

    bay.accept(chat).await;
    let joined = bay.wait_bot("AGENT_JOINED", 1, WAIT).await.remove(0).json();
    assert_notice(&joined, "AGENT_JOINED", chat, &client_id);
    bay.hub.say(&bay.web, json!(17), "hello Ann").await;
    settle().await;
    assert_eq!(bay.to_bot("CLIENT_MESSAGE").len(), 2);
    assert_eq!(bay.to_bot("AGENT_UNAVAILABLE").len(), 1);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn closing_a_chat_tells_the_bot_and_refuses_its_later_messages() {
    let bay = Bay::open().await;
    // A chat the bot still holds: agents see it and may close it.
    let held = bay.start_chat(18, "close me").await;
    let held_client = bay.client_message("close me").await["client_id"].clone();
    bay.close(held).await;
    let closed = bay.wait_bot("CHAT_CLOSED", 1, WAIT).await.remove(0).json();
    assert_notice(&closed, "CHAT_CLOSED", held, &held_client);
    bay.told(held, "bot.chat_closed").await;
    let answer = bay.send(bot_message(held, text_message("bye?"))).await;
    assert_refused(
        "BOT_MESSAGE after CHAT_CLOSED",
        &answer,
        400,
        "invalid_request",
    );

    // A chat an agent joined: CHAT_CLOSED too when it closes.
    let joined = bay.start_chat(19, "join then close").await;
    let joined_client = bay.client_message("join then close").await["client_id"].clone();
    bay.send_ok(invite_agent(joined)).await;
    bay.accept(joined).await;
    bay.wait_bot("AGENT_JOINED", 1, WAIT).await;
    bay.close(joined).await;
    let closed = eventually(WAIT, "CHAT_CLOSED of the joined chat", || {
        let found = bay
            .to_bot("CHAT_CLOSED")
            .into_iter()
            .map(|r| r.json())
            .find(|e| e["chat_id"].as_str() == Some(joined.to_string().as_str()));
        async move { found }
    })
    .await;
    assert_notice(&closed, "CHAT_CLOSED", joined, &joined_client);
    bay.told(joined, "bot.chat_closed").await;
    let answer = bay.send(bot_message(joined, text_message("bye?"))).await;
    assert_refused("BOT_MESSAGE after close", &answer, 400, "invalid_request");
    settle().await;
    assert!(bay.to_customer().is_empty(), "{:?}", bay.to_customer());
    assert_eq!(bay.to_bot("CHAT_CLOSED").len(), 2);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn an_agent_replying_to_a_handed_off_chat_takes_it_and_the_bot_hears_agent_joined() {
    let bay = Bay::open().await;
    bay.ann.set_online(true).await;
    let chat = bay.start_chat(20, "talk to a human").await;
    let client_id = bay.to_bot("CLIENT_MESSAGE")[0].json()["client_id"].clone();
    bay.send_ok(invite_agent(chat)).await;
    bay.wait_state(chat, "invited", WAIT).await;

    // Replying to the open chat accepts it, as POST .../accept would.
    bay.ann.reply(chat, "Hi, Ann here.").await;
    assert_eq!(bay.ann.chat(chat).await["chat"]["state"], "accepted");
    let joined = bay.wait_bot("AGENT_JOINED", 1, WAIT).await.remove(0).json();
    assert_notice(&joined, "AGENT_JOINED", chat, &client_id);
    bay.told(chat, "bot.agent_joined").await;
    let answer = bay.send(bot_message(chat, text_message("me too"))).await;
    assert_refused(
        "BOT_MESSAGE after the agent's reply",
        &answer,
        400,
        "invalid_request",
    );
    bay.hub.say(&bay.web, json!(20), "hi Ann").await;
    settle().await;
    assert_eq!(bay.to_bot("CLIENT_MESSAGE").len(), 1);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn client_info_updates_the_client_and_the_next_client_message() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(21, "I am new here").await;
    bay.send_ok(
        json!({ "id": uuid(), "event": "CLIENT_INFO", "chat_id": chat.to_string(),
                        "client_info": { "name": "Jane Roe", "email": "jane@example.com",
                                         "phone": "+15550100", "description": "wants a refund" } }),
    )
    .await;
    let client = bay.ann.chat(chat).await["client"].clone();
    assert_eq!(client["name"], "Jane Roe", "{client}");
    assert_eq!(client["email"], "jane@example.com");
    assert_eq!(client["phone"], "+15550100");

    let next = bay.says(21, "so, my refund?").await;
    assert_eq!(next["sender"]["name"], "Jane Roe", "{next}");
    assert_eq!(next["sender"]["has_contacts"], true, "{next}");
    assert_eq!(next["sender"]["email"], "jane@example.com", "{next}");
    assert_eq!(next["sender"]["phone"], "+15550100", "{next}");

    // The webhooks see the update as they do a customer's own introduction.
    let updated = eventually(WAIT, "chat_updated at the webhook receiver", || {
        let found = bay
            .receiver
            .requests()
            .iter()
            .map(Recorded::json)
            .find(|w| w["event_name"] == "chat_updated");
        async move { found }
    })
    .await;
    assert_eq!(updated["visitor"]["name"], "Jane Roe", "{updated}");

    // Under `contact_info`, as some providers send it.
    bay.send_ok(
        json!({ "id": uuid(), "event": "CLIENT_INFO", "chat_id": chat.to_string(),
                        "contact_info": { "name": "Jane R." } }),
    )
    .await;
    assert_eq!(bay.ann.chat(chat).await["client"]["name"], "Jane R.");
    bay.hub.shutdown().await;
}

/// The spec's bot exchange timing, 3 s per request and 2 retries, so the
/// hand-off comes 9 s after the first attempt: `requests` of event `name`
/// reach the provider at `from`, `from` + 3 s and `from` + 6 s of the hub's
/// clock, the clock moved on by the test; returns them.
async fn three_attempts_3_s_apart(
    bay: &Bay,
    clock: &ManualClock,
    name: &str,
    from: i64,
) -> Vec<Recorded> {
    let first = bay.wait_bot(name, 1, WAIT).await;
    assert_eq!(first[0].hub_ms, Some(from), "the first {name} at once");
    for n in 2..=3 {
        let due = from + 3000 * (n as i64 - 1);
        move_clock_to(clock, due).await;
        let got = bay.wait_bot(name, n, WAIT).await;
        assert_eq!(
            got[n - 1].hub_ms,
            Some(due),
            "{name} attempt {n} 3 s after the one before"
        );
        assert_eq!(
            got[n - 1].body,
            got[0].body,
            "attempt {n} is the same request"
        );
    }
    bay.to_bot(name)
}

#[tokio::test]
async fn a_provider_answering_errors_gets_three_attempts_3_s_apart_then_the_chat_goes_to_agents_once()
 {
    let clock = ManualClock::new();
    let bay = Bay::open_on(&clock).await;
    // 500 at once, then a 4xx: neither is a regular answer, neither is final.
    let down = Reply::json(500, r#"{"error":{"code":"server_error","message":"down"}}"#);
    bay.provider.script([
        down.clone(),
        Reply::json(
            400,
            r#"{"error":{"code":"invalid_request","message":"no"}}"#,
        ),
    ]);
    bay.provider.set_default(down);
    let said_at = clock.now_ms();
    bay.hub.say(&bay.web, json!(22), "is anybody home?").await;
    let attempts = three_attempts_3_s_apart(&bay, &clock, "CLIENT_MESSAGE", said_at).await;
    let chat: i64 = attempts[0].json()["chat_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("chat id");

    // No agent is online: 9 s after the first attempt, the hand-off tells
    // the (still failing) provider so.
    move_clock_to(&clock, said_at + 9000).await;
    let unavailable = bay.wait_bot("AGENT_UNAVAILABLE", 1, WAIT).await;
    assert_eq!(
        unavailable[0].hub_ms,
        Some(said_at + 9000),
        "the hand-off 9 s after the first attempt"
    );
    assert_eq!(bay.listed(chat).await["bot"]["state"], "unavailable");

    // AGENT_UNAVAILABLE is retried like every request to the provider, with
    // the same id; nothing is handed off twice.
    let notices = three_attempts_3_s_apart(&bay, &clock, "AGENT_UNAVAILABLE", said_at + 9000).await;
    let ids: HashSet<String> = notices.iter().map(|r| r.json()["id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one AGENT_UNAVAILABLE, retried: {ids:?}");
    clock.advance(Duration::from_secs(60));
    settle().await;
    assert_eq!(bay.to_bot("CLIENT_MESSAGE").len(), 3, "3 attempts, no more");
    assert_eq!(bay.to_bot("AGENT_UNAVAILABLE").len(), 3);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn a_provider_that_times_out_gets_three_attempts_then_the_chat_waits_for_the_online_agent() {
    let clock = ManualClock::new();
    let bay = Bay::open_on(&clock).await;
    bay.ann.set_online(true).await;
    // Never in time: only the hub's clock, moved on by the test, ends each attempt.
    bay.provider
        .set_default(Reply::ok().delayed(Duration::from_secs(600)));
    let said_at = clock.now_ms();
    bay.hub.say(&bay.web, json!(23), "slow bot?").await;
    let attempts = three_attempts_3_s_apart(&bay, &clock, "CLIENT_MESSAGE", said_at).await;
    let chat: i64 = attempts[0].json()["chat_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("chat id");

    // The third attempt runs out 9 s after the first: not a moment before,
    // the chat goes to the online agent.
    clock.advance(Duration::from_millis(2999));
    tokio::time::sleep(EARLY_WINDOW).await;
    assert_eq!(
        bay.listed(chat).await["bot"]["state"],
        "bot",
        "handed off before 9 s"
    );
    clock.advance(Duration::from_millis(1));
    eventually(WAIT, "the hand-off to the online agent", || async {
        (bay.listed(chat).await["bot"]["state"] == "invited").then_some(())
    })
    .await;
    clock.advance(Duration::from_secs(60));
    settle().await;
    assert_eq!(
        bay.provider.requests().len(),
        3,
        "an agent is online: no AGENT_UNAVAILABLE, nothing else"
    );
    bay.hub.shutdown().await;
}

/// What the eager provider did about one request of the hub.
#[derive(Clone, Debug)]
struct Exchange {
    event: Value,
    /// Its own post to the hub while the hub's request was open: status, time taken.
    posted: Option<(u16, Duration)>,
}

/// A bot provider as many real ones are: on `CLIENT_MESSAGE` it posts its
/// answer to the hub (an `INVITE_AGENT` when the text asks for an agent, a
/// `BOT_MESSAGE` otherwise) and waits for the hub's answer before answering
/// the hub's own request.
#[derive(Clone)]
struct EagerProvider {
    url: String,
    /// The hub's `/webhooks/...` URL, known once the bot exists.
    hub_url: Arc<OnceLock<String>>,
    log: Arc<Mutex<Vec<Exchange>>>,
}

impl EagerProvider {
    async fn start() -> EagerProvider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind provider");
        let addr = listener.local_addr().expect("provider addr");
        let provider = EagerProvider {
            url: format!("http://{addr}/bot"),
            hub_url: Arc::new(OnceLock::new()),
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let this = provider.clone();
        serve(listener, move |req| {
            let this = this.clone();
            async move { this.answer(req).await }
        });
        provider
    }

    async fn answer(
        &self,
        req: http::Request<hyper::body::Incoming>,
    ) -> http::Response<Full<Bytes>> {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut posted = None;
        if event["event"] == "CLIENT_MESSAGE" {
            let text = event["message"]["text"].as_str().unwrap_or_default();
            let reply = if text.contains("agent") {
                json!({ "id": uuid(), "event": "INVITE_AGENT", "client_id": event["client_id"],
                        "chat_id": event["chat_id"] })
            } else {
                json!({ "id": uuid(), "event": "BOT_MESSAGE", "client_id": event["client_id"],
                        "chat_id": event["chat_id"],
                        "message": text_message(&format!("You said: {text}")) })
            };
            let started = Instant::now();
            let hub_url = self.hub_url.get().expect("the hub's URL is set").clone();
            // A real provider gives up after its own 3 s.
            let status = reqwest::Client::new()
                .post(hub_url)
                .json(&reply)
                .timeout(Duration::from_secs(3))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            posted = Some((status, started.elapsed()));
        }
        self.log
            .lock()
            .expect("provider log")
            .push(Exchange { event, posted });
        let mut resp = http::Response::new(Full::new(Bytes::from_static(b"{\"result\":\"ok\"}")));
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }

    fn log(&self) -> Vec<Exchange> {
        self.log.lock().expect("provider log").clone()
    }
}

#[tokio::test]
async fn a_provider_may_post_its_answer_while_the_hubs_request_is_still_open() {
    let provider = EagerProvider::start().await;
    let customer = Integrator::start().await;
    let hub = TestHub::start().await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    let web = channel(&hub, "web", &customer, None, &["ann@example.com"]).await;
    let bot = create_bot(
        &hub,
        json!({ "name": "Echo", "endpoint": provider.url, "token": TOKEN, "channels": ["web"] }),
    )
    .await;
    provider
        .hub_url
        .set(bot["webhooks_url"].as_str().expect("url").to_owned())
        .expect("set once");

    hub.say(&web, json!(24), "ping").await;
    let wire = customer.wait_for(1, WAIT).await[0].json();
    assert_eq!(wire["message"]["text"], "You said: ping");
    assert_eq!(wire["sender"]["name"], "Echo");

    hub.say(&web, json!(24), "an agent, please").await;
    let chat = eventually(WAIT, "the hand-off", || async {
        ann.chats()
            .await
            .into_iter()
            .find(|c| c["bot"]["state"] == "unavailable")
    })
    .await;
    let chat_id = chat["id"].as_i64().expect("chat id");
    eventually(WAIT, "AGENT_UNAVAILABLE at the provider", || {
        let seen = provider
            .log()
            .iter()
            .any(|x| x.event["event"] == "AGENT_UNAVAILABLE");
        async move { seen.then_some(()) }
    })
    .await;

    settle().await;
    let log = provider.log();
    let asked: Vec<&Exchange> = log
        .iter()
        .filter(|x| x.event["event"] == "CLIENT_MESSAGE")
        .collect();
    assert_eq!(
        asked.len(),
        2,
        "each CLIENT_MESSAGE got its 200 in time, so none was retried: {log:?}"
    );
    for x in asked {
        let (status, took) = x.posted.expect("the provider posted back");
        assert_eq!(status, 200, "the hub took the event at once: {x:?}");
        assert!(
            took < Duration::from_millis(2500),
            "the hub answered the provider in {took:?}, while its own request was open"
        );
        assert_eq!(x.event["chat_id"], chat_id.to_string());
    }
    assert_eq!(customer.requests().len(), 1);
    hub.shutdown().await;
}

/// What the hand-off provider did about one `CLIENT_MESSAGE`.
#[derive(Clone, Debug)]
struct Answered {
    event: Value,
    /// Its posts to the hub, in order: event name and the hub's status.
    posts: Vec<(String, u16)>,
    /// Its answer to the hub's request.
    status: u16,
}

/// A bot provider written like vangerfulll/fractal-chatbot: on each
/// `CLIENT_MESSAGE` it posts a `BOT_MESSAGE`, and when the customer asks for
/// an operator an `INVITE_AGENT` after it, each while the hub's request is
/// open; if the hub refuses either post, its answer failed and it answers
/// the hub's request with 502. Between the two posts of a hand-off, `agent`
/// (once set) accepts the chat: an agent joins while the bot is answering.
#[derive(Clone)]
struct HandOffProvider {
    url: String,
    hub_url: Arc<OnceLock<String>>,
    agent: Arc<OnceLock<TestAgent>>,
    log: Arc<Mutex<Vec<Answered>>>,
}

impl HandOffProvider {
    async fn start() -> HandOffProvider {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind provider");
        let addr = listener.local_addr().expect("provider addr");
        let provider = HandOffProvider {
            url: format!("http://{addr}/bot"),
            hub_url: Arc::new(OnceLock::new()),
            agent: Arc::new(OnceLock::new()),
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let this = provider.clone();
        serve(listener, move |req| {
            let this = this.clone();
            async move { this.answer(req).await }
        });
        provider
    }

    async fn post(&self, event: Value) -> u16 {
        let hub_url = self.hub_url.get().expect("the hub's URL is set").clone();
        // A client of its own per post, as that provider makes them.
        reqwest::Client::new()
            .post(hub_url)
            .json(&event)
            .timeout(Duration::from_secs(3))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    }

    async fn answer(
        &self,
        req: http::Request<hyper::body::Incoming>,
    ) -> http::Response<Full<Bytes>> {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut posts = Vec::new();
        if event["event"] == "CLIENT_MESSAGE" {
            let text = event["message"]["text"].as_str().unwrap_or_default();
            let (chat, client) = (event["chat_id"].clone(), event["client_id"].clone());
            let hand_off = text.contains("operator");
            let reply = if hand_off {
                "Transferring you to an operator...".to_owned()
            } else {
                format!("You said: {text}")
            };
            let message = json!({ "id": uuid(), "client_id": client, "chat_id": chat,
                                  "message": text_message(&reply), "event": "BOT_MESSAGE" });
            posts.push(("BOT_MESSAGE".to_owned(), self.post(message).await));
            if hand_off && posts[0].1 == 200 {
                if let (Some(agent), Some(id)) = (
                    self.agent.get(),
                    chat.as_str().and_then(|c| c.parse::<i64>().ok()),
                ) {
                    let (status, v) = agent
                        .post(&format!("/agent/v1/chats/{id}/accept"), json!({}))
                        .await;
                    assert_eq!(status, 200, "the agent joins: {v}");
                }
                let invite = json!({ "id": uuid(), "client_id": client, "chat_id": chat,
                                     "event": "INVITE_AGENT" });
                posts.push(("INVITE_AGENT".to_owned(), self.post(invite).await));
            }
        }
        let failed = posts.iter().any(|(_, status)| *status != 200);
        let status = if failed { 502 } else { 200 };
        self.log.lock().expect("provider log").push(Answered {
            event,
            posts,
            status,
        });
        let body = if failed {
            r#"{"detail":"Jivo event processing failed"}"#
        } else {
            r#"{"result":"ok"}"#
        };
        let mut resp = http::Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *resp.status_mut() = http::StatusCode::from_u16(status).expect("status");
        resp
    }

    fn log(&self) -> Vec<Answered> {
        self.log.lock().expect("provider log").clone()
    }
}

#[tokio::test]
async fn an_agent_joining_while_the_bot_hands_off_does_not_fail_the_bots_answer() {
    let provider = HandOffProvider::start().await;
    let customer = Integrator::start().await;
    let hub = TestHub::start().await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    ann.set_online(true).await;
    let web = channel(&hub, "web", &customer, None, &["ann@example.com"]).await;
    let bot = create_bot(
        &hub,
        json!({ "name": "Fractal", "endpoint": provider.url, "token": TOKEN,
                "channels": ["web"] }),
    )
    .await;
    let hub_url = bot["webhooks_url"].as_str().expect("url").to_owned();
    provider.hub_url.set(hub_url).expect("set once");
    provider.agent.set(ann.clone()).ok();

    // The dialogue: five answers, then the customer asks for an operator and
    // Ann joins between the bot's message and its INVITE_AGENT.
    let said = [
        "hello",
        "yes",
        "maths",
        "grade 5",
        "online",
        "call an operator",
    ];
    for (n, text) in said.iter().enumerate() {
        hub.say(&web, json!(35), text).await;
        customer.wait_for(n + 1, WAIT).await;
    }
    let chat = eventually(WAIT, "the chat Ann joined", || async {
        ann.chats()
            .await
            .into_iter()
            .find(|c| c["bot"]["state"] == "joined")
    })
    .await;
    let chat_id = chat["id"].as_i64().expect("chat id");
    let webhooks_url = provider.hub_url.get().expect("url").clone();

    // The bot hears AGENT_JOINED after its answer, which was taken.
    eventually(SLOW_WAIT, "AGENT_JOINED at the provider", || {
        let heard = provider
            .log()
            .iter()
            .any(|x| x.event["event"] == "AGENT_JOINED");
        async move { heard.then_some(()) }
    })
    .await;
    let log = provider.log();
    let hand_off = log
        .iter()
        .find(|x| x.event["message"]["text"] == "call an operator")
        .expect("the hand-off request");
    assert_eq!(
        hand_off.posts,
        [
            ("BOT_MESSAGE".to_owned(), 200),
            ("INVITE_AGENT".to_owned(), 200)
        ],
        "the bot's answer to a message it got before Ann joined is taken: {log:#?}"
    );
    let asked: Vec<&Answered> = log
        .iter()
        .filter(|x| x.event["event"] == "CLIENT_MESSAGE")
        .collect();
    assert_eq!(asked.len(), said.len(), "no request was retried: {log:#?}");
    assert!(asked.iter().all(|x| x.status == 200), "{log:#?}");
    assert_eq!(
        log.last().map(|x| x.event["event"].clone()),
        Some(json!("AGENT_JOINED")),
        "{log:#?}"
    );

    // Ann has the chat; the bot's message from before she joined reached the
    // customer, nothing after it did.
    let view = ann.chat(chat_id).await;
    assert_eq!(view["chat"]["state"], "accepted", "{view}");
    assert_eq!(view["chat"]["agent_id"], json!(ann.id));
    let to_customer = customer.requests();
    assert_eq!(to_customer.len(), said.len(), "{to_customer:?}");
    assert_eq!(
        to_customer[said.len() - 1].json()["message"]["text"],
        "Transferring you to an operator..."
    );

    // Told it is done, the bot's later messages are refused.
    let later = call(
        &hub.http,
        Method::POST,
        &webhooks_url,
        &bot_message(chat_id, text_message("still here")).to_string(),
        None,
    )
    .await;
    assert_refused(
        "BOT_MESSAGE after AGENT_JOINED",
        &later,
        400,
        "invalid_request",
    );
    hub.shutdown().await;
}

/// `name{labels} value` lines of a `/metrics` scrape of a `hub serve` child.
async fn scrape(base: &str) -> HashMap<String, f64> {
    let resp = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("metrics request");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("metrics body");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn a_refused_provider_request_is_logged_and_counted_by_reason() {
    // A `hub serve` child: counters are per process.
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = HubOptions {
        extra_toml: format!(
            "[[channels]]\nname = \"web\"\ncustomer_endpoint = \"http://127.0.0.1:9/customer\"\n\n\
             [[bots]]\nname = \"Counted\"\nendpoint = \"http://127.0.0.1:9/bot\"\n\
             token = \"{TOKEN}\"\nprovider_id = \"counted\"\nchannels = [\"web\"]\n"
        ),
        ..HubOptions::default()
    };
    let config = write_config(dir.path(), &opts, "127.0.0.1:0");
    let hub = tokio::task::spawn_blocking(move || HubProcess::spawn(&config))
        .await
        .expect("hub process");
    let reason = |r: &str| format!("hub_bot_refusals_total{{reason=\"{r}\"}}");
    let before = scrape(&hub.base).await;
    assert_eq!(
        before.get(&reason("unknown_chat")),
        Some(&0.0),
        "{before:?}"
    );

    let http = reqwest::Client::new();
    let url = format!("{}/webhooks/counted/{TOKEN}", hub.base);
    let answer = call(
        &http,
        Method::POST,
        &url,
        &bot_message(4242, text_message("hello?")).to_string(),
        None,
    )
    .await;
    assert_refused(
        "a chat the bot does not have",
        &answer,
        400,
        "invalid_request",
    );
    let wrong = format!("{}/webhooks/counted/not-the-token", hub.base);
    let answer = call(
        &http,
        Method::POST,
        &wrong,
        &invite_agent(1).to_string(),
        None,
    )
    .await;
    assert_refused("a wrong token", &answer, 401, "invalid_client");

    let after = scrape(&hub.base).await;
    assert_eq!(after.get(&reason("unknown_chat")), Some(&1.0), "{after:?}");
    assert_eq!(after.get(&reason("credentials")), Some(&1.0), "{after:?}");
    assert_eq!(after.get(&reason("chat_done")), Some(&0.0), "{after:?}");
    let log = hub.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("bot exchange request refused"))
        .collect();
    assert_eq!(refused.len(), 2, "one line per refusal:\n{log}");
    for field in [
        "INFO",
        "bot=Counted",
        "chat=4242",
        "event=BOT_MESSAGE",
        "status=400",
        "unknown_chat",
    ] {
        assert!(refused[0].contains(field), "{field} in {}", refused[0]);
    }
    assert!(refused[1].contains("credentials"), "{}", refused[1]);
    assert!(
        !log.contains("not-the-token"),
        "a presented token is never logged:\n{log}"
    );
}

#[tokio::test]
async fn the_bot_authorizes_with_client_credentials_and_the_providers_url_needs_the_token_back() {
    let provider = Integrator::start().await;
    let tokens = Integrator::start().await;
    tokens.set_default(Reply::json(
        200,
        r#"{"access_token":"tok-1","token_type":"Bearer","expires_in":3600}"#,
    ));
    let customer = Integrator::start().await;
    // Declared in hub.toml this time.
    let hub = TestHub::start_with(HubOptions {
        extra_toml: format!(
            "[[bots]]\nname = \"Secure\"\nendpoint = \"{}\"\ntoken = \"{TOKEN}\"\n\
             provider_id = \"secure-bot-0001\"\nchannels = [\"web\"]\n\
             auth = {{ token_url = \"{}\", client_id = \"hub-client\", secret = \"s3cret\" }}\n",
            provider.url, tokens.url
        ),
        ..HubOptions::default()
    })
    .await;
    let (status, bot) = admin(&hub, Method::GET, "/admin/v1/bots/Secure", None).await;
    assert_eq!(status, 200, "{bot}");
    assert_eq!(bot["authorized"], true);
    assert_eq!(bot["declared"], true);
    assert_eq!(bot["provider_id"], "secure-bot-0001");
    assert!(
        !bot.to_string().contains("s3cret"),
        "the secret is not shown"
    );
    let _ann = hub.create_agent("Ann", "ann@example.com").await;
    let web = channel(&hub, "web", &customer, None, &["ann@example.com"]).await;

    for (n, text) in ["one", "two", "three"].iter().enumerate() {
        hub.say(&web, json!(25), text).await;
        let got = provider.wait_for(n + 1, WAIT).await;
        assert_eq!(got[n].json()["message"]["text"], *text);
    }
    let chat = provider.requests()[0].json()["chat_id"]
        .as_str()
        .expect("chat id")
        .to_owned();
    for req in provider.requests() {
        assert_eq!(
            req.header("authorization"),
            Some("Bearer tok-1"),
            "every request to the provider carries the token"
        );
    }
    let asked = tokens.requests();
    assert_eq!(
        asked.len(),
        1,
        "the token is cached, not asked for per event"
    );
    assert!(
        asked[0]
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded")),
        "{:?}",
        asked[0].header("content-type")
    );
    let form: HashSet<(String, String)> = String::from_utf8_lossy(&asked[0].body)
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for pair in [
        ("grant_type", "client_credentials"),
        ("client_id", "hub-client"),
        ("client_secret", "s3cret"),
    ] {
        assert!(
            form.contains(&(pair.0.to_owned(), pair.1.to_owned())),
            "the token request has {pair:?}: {form:?}"
        );
    }

    let event = |text: &str| {
        json!({ "id": uuid(), "event": "BOT_MESSAGE", "chat_id": chat,
                "message": text_message(text) })
        .to_string()
    };
    let providers_url = format!("{}/providers/secure-bot-0001/{TOKEN}", hub.base);
    let webhooks_url = format!("{}/webhooks/secure-bot-0001/{TOKEN}", hub.base);
    for (label, header) in [
        ("no Authorization", None),
        ("a wrong token", Some("Bearer tok-2")),
        ("no Bearer scheme", Some("tok-1")),
    ] {
        let answer = call(
            &hub.http,
            Method::POST,
            &providers_url,
            &event(label),
            header,
        )
        .await;
        assert_refused(label, &answer, 401, "unauthorized_client");
    }
    let answer = call(
        &hub.http,
        Method::POST,
        &providers_url,
        &event("authorized"),
        Some("Bearer tok-1"),
    )
    .await;
    assert_eq!(answer.0, 200, "with the token: {}", answer.1);
    let answer = call(
        &hub.http,
        Method::POST,
        &webhooks_url,
        &event("plain"),
        None,
    )
    .await;
    assert_eq!(answer.0, 200, "/webhooks needs no header: {}", answer.1);
    let wire = customer.wait_for(2, WAIT).await;
    let texts: Vec<Value> = wire
        .iter()
        .map(|r| r.json()["message"]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("authorized"), json!("plain")]);
    assert_eq!(tokens.requests().len(), 1, "still one token request");
    hub.shutdown().await;
}

#[tokio::test]
async fn the_chat_finished_transcript_names_the_bot_as_the_author() {
    let bay = Bay::open().await;
    let chat = bay.start_chat(26, "what are your hours?").await;
    bay.send_ok(bot_message(chat, text_message("We are open 9 to 5.")))
        .await;
    bay.wait_customer(1).await;
    bay.close(chat).await;
    let finished = eventually(WAIT, "chat_finished at the webhook receiver", || {
        let found = bay
            .receiver
            .requests()
            .iter()
            .map(Recorded::json)
            .find(|w| w["event_name"] == "chat_finished");
        async move { found }
    })
    .await;
    let plain = finished["plain_messages"].as_str().expect("plain_messages");
    assert!(
        plain.contains("Assistant: We are open 9 to 5."),
        "the transcript names the bot: {plain:?}"
    );
    assert!(plain.contains("what are your hours?"), "{plain:?}");
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn a_conversation_goes_from_the_bot_through_buttons_to_the_agent_who_joins() {
    let bay = Bay::open().await;
    bay.ann.set_online(true).await;
    let chat = bay.start_chat(27, "Hi, my order is late").await;
    bay.send_ok(bot_message(
        chat,
        json!({ "type": "BUTTONS", "title": "Order help", "timestamp": now_secs(),
                "text": "Sorry to hear that. What next?",
                "buttons": [{ "text": "Track it", "id": "track" },
                            { "text": "Talk to a human", "id": "human" }] }),
    ))
    .await;
    let wire = bay.wait_customer(1).await;
    assert_eq!(
        wire[0]["message"]["text"],
        "Sorry to hear that. What next?\n- Track it\n- Talk to a human"
    );

    let answer = bay.says(27, "Talk to a human").await;
    assert_eq!(answer["message"]["button_id"], "human");
    bay.send_ok(invite_agent(chat)).await;
    let waiting = bay.wait_state(chat, "invited", WAIT).await;
    assert_eq!(waiting["state"], "open", "{waiting}");

    bay.accept(chat).await;
    bay.wait_bot("AGENT_JOINED", 1, WAIT).await;
    // The webhooks see the hand-off end as any accepted chat.
    eventually(WAIT, "chat_accepted at the webhook receiver", || {
        let seen = bay
            .receiver
            .requests()
            .iter()
            .any(|w| w.json()["event_name"] == "chat_accepted");
        async move { seen.then_some(()) }
    })
    .await;
    bay.ann
        .reply(chat, "Hello, Ann here. Let me check your order.")
        .await;
    let wire = bay.wait_customer(2).await;
    assert_eq!(wire[1]["sender"]["name"], "Ann", "{:?}", wire[1]);
    assert_eq!(wire[1]["recipient"], json!({ "id": 27 }));
    assert_eq!(
        wire[1]["message"]["text"],
        "Hello, Ann here. Let me check your order."
    );
    settle().await;
    assert!(bay.to_bot("AGENT_UNAVAILABLE").is_empty());
    assert_eq!(bay.to_bot("CLIENT_MESSAGE").len(), 2);
    bay.hub.shutdown().await;
}

#[tokio::test]
async fn the_faq_bot_plugin_greets_answers_and_hands_the_chat_to_an_agent() {
    let customer = Integrator::start().await;
    let config = format!(
        "{}[[bots]]\nname = \"Help\"\nplugin = \"faq-bot\"\nchannels = [\"website\"]\n",
        plugin_toml(
            "faq-bot",
            "faq_bot",
            "kv = true",
            "greeting = \"Hi! I am the shop's assistant.\"\n\
             menu = [\"Prices\", \"Shipping\"]\n\
             [plugins.config.answers]\n\
             price = \"Everything is listed at https://shop.example.com/prices.\"\n\
             shipping = \"Orders ship within two working days.\"",
        )
    );
    let hub = TestHub::start_with(HubOptions {
        extra_toml: config,
        ..HubOptions::default()
    })
    .await;
    let (status, bot) = admin(&hub, Method::GET, "/admin/v1/bots/Help", None).await;
    assert_eq!(status, 200, "{bot}");
    assert_eq!(bot["plugin"], "faq-bot");
    assert!(
        bot.get("webhooks_url").is_none(),
        "a plugin bot takes no requests: {bot}"
    );
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    ann.set_online(true).await;
    let website = channel(&hub, "website", &customer, None, &["ann@example.com"]).await;

    // Each turn: the customer writes, the bot's answer reaches the customer.
    for (n, (text, answer, what)) in [
        (
            "hello",
            "Hi! I am the shop's assistant.\n- Prices\n- Shipping",
            "the greeting with the menu",
        ),
        (
            "How much is SHIPPING to Oslo?",
            "Orders ship within two working days.",
            "the keyword's answer, whatever its case",
        ),
        (
            "do you sell hats",
            "Choose a topic\n- Prices\n- Shipping",
            "the menu after a miss",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        hub.say(&website, json!(28), text).await;
        let got = customer.wait_for(n + 1, WAIT).await;
        assert_eq!(got[n].json()["message"]["text"], answer, "{what}");
        assert_eq!(got[n].json()["sender"]["name"], "Help");
    }
    hub.say(&website, json!(28), "blue ones").await;

    // Two misses in a row: the chat waits for Ann, who sees it held by Help.
    let chat = eventually(WAIT, "the hand-off to agents", || async {
        ann.chats()
            .await
            .into_iter()
            .find(|c| c["bot"]["state"] == "invited")
    })
    .await;
    assert_eq!(chat["bot"]["name"], "Help");
    let chat_id = chat["id"].as_i64().expect("chat id");
    let view = ann.chat(chat_id).await;
    let answers: Vec<&Value> = view["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["author"] == "bot")
        .collect();
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(answers.iter().all(|m| m["author_name"] == "Help"));
    assert_eq!(answers[0]["body"]["type"], "BUTTONS");

    let (status, v) = ann
        .post(&format!("/agent/v1/chats/{chat_id}/accept"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    ann.reply(chat_id, "Ann here: we sell blue hats.").await;
    let got = customer.wait_for(4, WAIT).await;
    assert_eq!(got[3].json()["sender"]["name"], "Ann");
    assert_eq!(
        got[3].json()["message"]["text"],
        "Ann here: we sell blue hats."
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn an_expiring_provider_token_is_renewed_before_it_runs_out() {
    let provider = Integrator::start().await;
    let tokens = Integrator::start().await;
    tokens.script([Reply::json(
        200,
        r#"{"access_token":"tok-1","expires_in":10}"#,
    )]);
    tokens.set_default(Reply::json(
        200,
        r#"{"access_token":"tok-2","expires_in":3600}"#,
    ));
    let customer = Integrator::start().await;
    let clock = ManualClock::new();
    let hub = TestHub::start_with(HubOptions {
        clock: Some(clock.clone()),
        ..HubOptions::default()
    })
    .await;
    let _ann = hub.create_agent("Ann", "ann@example.com").await;
    let web = channel(&hub, "web", &customer, None, &["ann@example.com"]).await;
    let bot = create_bot(
        &hub,
        json!({ "name": "Secure", "endpoint": provider.url, "token": TOKEN, "channels": ["web"],
                "auth": { "token_url": tokens.url, "client_id": "hub", "secret": "s3cret" } }),
    )
    .await;
    assert_eq!(bot["authorized"], true);
    let providers_url = bot["providers_url"].as_str().expect("providers_url");
    let present = |token: &'static str, chat: Value| {
        let event = json!({ "event": "BOT_MESSAGE", "chat_id": chat,
                            "message": text_message("from the provider") })
        .to_string();
        let http = hub.http.clone();
        async move {
            call(
                &http,
                Method::POST,
                providers_url,
                &event,
                Some(&format!("Bearer {token}")),
            )
            .await
        }
    };

    // The `n`th request to the provider, for the customer's `text`: its
    // bearer token and chat. Once done: moving the clock on while it is
    // under way would time it out.
    let send = |n: usize, text: &'static str| {
        let (hub, web, provider) = (&hub, &web, &provider);
        async move {
            hub.say(web, json!(29), text).await;
            let got = provider.wait_for(n, WAIT).await.remove(n - 1);
            hub.delivery_done(got.header("x-hub-delivery").expect("delivery id"))
                .await;
            let token = got.header("authorization").map(str::to_owned);
            (token, got.json()["chat_id"].clone())
        }
    };

    let (token, chat) = send(1, "first").await;
    assert_eq!(token.as_deref(), Some("Bearer tok-1"));
    // The token lives 10 s; until 80 % of that it is the one sent.
    clock.advance(Duration::from_millis(7999));
    let (token, _) = send(2, "second").await;
    assert_eq!(token.as_deref(), Some("Bearer tok-1"));
    assert_eq!(tokens.requests().len(), 1, "renewed too early");
    // From 80 % on, the hub asks for a new one.
    clock.advance(Duration::from_millis(1));
    let (token, _) = send(3, "third").await;
    assert_eq!(token.as_deref(), Some("Bearer tok-2"));
    assert_eq!(tokens.requests().len(), 2);

    // The old token is still taken back until it runs out, not after.
    clock.advance(Duration::from_millis(1999));
    let answer = present("tok-1", chat.clone()).await;
    assert_eq!(
        answer.0, 200,
        "the replaced token before it expired: {}",
        answer.1
    );
    clock.advance(Duration::from_millis(1));
    let answer = present("tok-1", chat.clone()).await;
    assert_refused("an expired token", &answer, 401, "unauthorized_client");
    let answer = present("tok-2", chat).await;
    assert_eq!(answer.0, 200, "the current token: {}", answer.1);
    hub.shutdown().await;
}

#[tokio::test]
async fn a_declared_bot_keeps_its_generated_provider_id_across_restarts() {
    let provider = Integrator::start().await;
    let hub = TestHub::start_with(HubOptions {
        extra_toml: format!(
            "[[bots]]\nname = \"Assistant\"\nendpoint = \"{}\"\ntoken = \"{TOKEN}\"\n\
             channels = [\"web\"]\n",
            provider.url
        ),
        ..HubOptions::default()
    })
    .await;
    let (status, before) = admin(&hub, Method::GET, "/admin/v1/bots/Assistant", None).await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(before["declared"], true);
    let hub = hub.restart().await;
    let (status, after) = admin(&hub, Method::GET, "/admin/v1/bots/Assistant", None).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(
        after["provider_id"], before["provider_id"],
        "providers keep the URLs they were given"
    );
    assert_eq!(after["id"], before["id"]);
    let (_, list) = admin(&hub, Method::GET, "/admin/v1/bots", None).await;
    assert_eq!(list["bots"].as_array().map(Vec::len), Some(1), "{list}");
    // The old URL still takes events (an unknown chat: 400, not 404).
    let url = after["webhooks_url"].as_str().expect("webhooks_url");
    let body = bot_message(999_999, text_message("x")).to_string();
    let answer = call(&hub.http, Method::POST, url, &body, None).await;
    assert_refused("after the restart", &answer, 400, "invalid_request");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_plugin_bot_that_fails_hands_the_chat_to_agents() {
    let customer = Integrator::start().await;
    let config = format!(
        "{}[[bots]]\nname = \"Broken\"\nplugin = \"broken\"\nchannels = [\"web\"]\n",
        plugin_toml("broken", "fault", "", "fault = \"trap\"")
    );
    let hub = TestHub::start_with(HubOptions {
        extra_toml: config,
        ..HubOptions::default()
    })
    .await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    let web = channel(&hub, "web", &customer, None, &["ann@example.com"]).await;
    hub.say(&web, json!(30), "help me").await;
    let chat = eventually(WAIT, "the hand-off after the trap", || async {
        ann.chats()
            .await
            .into_iter()
            .find(|c| c["bot"]["state"] == "unavailable")
    })
    .await;
    assert_eq!(chat["bot"]["name"], "Broken");
    assert_eq!(chat["state"], "open");
    let chat_id = chat["id"].as_i64().expect("chat id");
    hub.say(&web, json!(30), "hello?").await;
    let view = ann.chat(chat_id).await;
    assert_eq!(view["messages"].as_array().map(Vec::len), Some(2), "{view}");
    assert!(customer.requests().is_empty());
    hub.shutdown().await;
}

#[tokio::test]
async fn a_token_url_the_outbound_policy_refuses_ends_the_bot_request_at_once() {
    // The provider and the customer's integrator on 127.0.0.2, which the
    // strict policy below allows; the token endpoint behind `localhost`,
    // which resolves to addresses it refuses.
    let provider = Integrator::start_on("127.0.0.2:0").await;
    let customer = Integrator::start_on("127.0.0.2:0").await;
    let tokens = Integrator::start().await;
    let token_url = format!("http://localhost:{}/token", tokens.addr.port());
    let hub = TestHub::start().await;
    let _ann = hub.create_agent("Ann", "ann@example.com").await;
    let web = channel(&hub, "web", &customer, None, &["ann@example.com"]).await;
    create_bot(
        &hub,
        json!({ "name": "Secure", "endpoint": provider.url, "token": TOKEN, "channels": ["web"],
                "auth": { "token_url": token_url, "client_id": "hub", "secret": "s3cret" } }),
    )
    .await;
    let config = hub.dir.path().join("hub.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        format!("{text}\n[outbound]\nprivate = \"deny\"\nallow = [\"127.0.0.2\"]\n"),
    )
    .expect("write config");
    hub.running().reload().await.expect("reload");

    hub.say(&web, json!(31), "hello").await;
    let dead = eventually(WAIT, "the bot request dead-lettered", || async {
        let (_, list) = admin(&hub, Method::GET, "/admin/v1/deliveries?state=dead", None).await;
        list["deliveries"]
            .as_array()?
            .iter()
            .find(|d| {
                d["target_url"]
                    .as_str()
                    .is_some_and(|u| u.starts_with(&provider.url))
            })
            .cloned()
    })
    .await;
    // Final at the first attempt: a refused address does not come back in 3 s.
    assert_eq!(dead["attempts"], 1, "{dead}");
    let error = dead["last_error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("token request failed: `localhost` resolves to")
            && error.ends_with("refused by `[outbound] private = \"deny\"`"),
        "{error}"
    );
    assert!(
        tokens.requests().is_empty(),
        "the token endpoint was called"
    );
    assert!(provider.requests().is_empty(), "the provider was called");
    hub.shutdown().await;
}
