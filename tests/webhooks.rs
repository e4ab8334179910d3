//! Event webhooks end to end: a real loopback receiver as a channel's webhook
//! URL, the eight events with the spec's fields, replies shown to the agent,
//! retries and dead letters (API and CLI), Standard Webhooks signatures, and
//! plugins on `webhook.*` kinds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::{
    ADMIN_TOKEN, HubOptions, Integrator, Recorded, Reply, TestAgent, TestChannel, TestHub,
    eventually, plugin_toml, route_toml, serve,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::Sha256;

const WAIT: Duration = Duration::from_secs(3);

/// Fast versions of both webhook policies: 2 sync attempts 100 ms apart,
/// 3 async attempts 100 ms apart, 500 ms timeouts.
const FAST_POLICIES: &str = "[webhooks]\nsync_attempts = 2\nsync_timeout_ms = 500\n\
     sync_retry_interval_ms = 100\nattempts = 3\ntimeout_ms = 500\nretry_interval_ms = 100\n\
     backoff = 1.0\n";

/// A hub with fast webhook policies, channel `web` whose customer endpoint
/// and webhook receiver are two loopback integrators, and agent Ann.
struct Desk {
    hub: TestHub,
    /// The channel's `webhook_url`.
    receiver: Integrator,
    /// The channel's customer endpoint (agent messages).
    customer: Integrator,
    web: TestChannel,
    ann: TestAgent,
}

impl Desk {
    async fn open() -> Desk {
        Desk::start("", "").await
    }

    /// `webhook_keys` go into the `[webhooks]` table; `wiring` (plugins,
    /// routes) after it.
    async fn start(webhook_keys: &str, wiring: &str) -> Desk {
        Desk::start_toml(&format!("{FAST_POLICIES}{webhook_keys}\n\n{wiring}")).await
    }

    /// A desk whose hub gets `extra_toml` (no fast policies unless it has them).
    async fn start_toml(extra_toml: &str) -> Desk {
        let receiver = Integrator::start().await;
        let customer = Integrator::start().await;
        let hub = TestHub::start_with(HubOptions {
            extra_toml: extra_toml.to_owned(),
            ..HubOptions::default()
        })
        .await;
        let ann = hub.create_agent("Ann", "ann@example.com").await;
        let resp = hub
            .admin_post(
                "/admin/v1/channels",
                json!({ "name": "web", "customer_endpoint": customer.url,
                        "agents": ["ann@example.com"], "webhook_url": receiver.url }),
            )
            .await;
        assert_eq!(resp.status(), 201, "channel creation");
        let raw: Value = resp.json().await.expect("channel json");
        assert_eq!(raw["webhook_url"], json!(receiver.url));
        assert_eq!(raw["webhook_signed"], false);
        let web = TestChannel {
            public_id: raw["public_id"].as_str().expect("public_id").to_owned(),
            endpoint_url: raw["endpoint_url"].as_str().expect("endpoint").to_owned(),
            status_url: raw["status_url"].as_str().expect("status").to_owned(),
            raw,
        };
        Desk {
            hub,
            receiver,
            customer,
            web,
            ann,
        }
    }

    /// Customer `sender` (a JSON sender object) writes `text`; returns the chat id.
    async fn customer_says(&self, sender: Value, text: &str) -> i64 {
        let (status, body) = self
            .hub
            .customer(
                &self.web,
                json!({ "sender": sender, "message": { "type": "text", "text": text } }),
            )
            .await;
        assert_eq!(status, 200, "customer message refused: {body}");
        self.ann.chats().await[0]["id"]
            .as_i64()
            .expect("the chat's id")
    }

    async fn accept(&self, chat: i64) {
        let (status, v) = self
            .ann
            .send(
                Method::POST,
                &format!("/agent/v1/chats/{chat}/accept"),
                None,
            )
            .await;
        assert_eq!(status, 200, "accept: {v}");
    }

    async fn close(&self, chat: i64) {
        let (status, v) = self
            .ann
            .send(Method::POST, &format!("/agent/v1/chats/{chat}/close"), None)
            .await;
        assert_eq!(status, 200, "close: {v}");
    }

    /// The webhooks named `name` the receiver got so far, attempts included.
    fn got(&self, name: &str) -> Vec<Recorded> {
        self.receiver
            .requests()
            .into_iter()
            .filter(|r| r.json()["event_name"] == name)
            .collect()
    }

    /// Waits until the receiver got `n` requests of event `name`.
    async fn wait_for(&self, name: &str, n: usize) -> Vec<Recorded> {
        eventually(WAIT, &format!("{n} × {name}"), || {
            let got = self.got(name);
            async move { (got.len() >= n).then_some(got) }
        })
        .await
    }

    /// The body of the first `name` webhook.
    async fn event(&self, name: &str) -> Value {
        self.wait_for(name, 1).await[0].json()
    }

    /// `GET /admin/v1/deliveries?state=…`.
    async fn deliveries(&self, state: &str) -> Vec<Value> {
        let resp = self
            .hub
            .http
            .get(self.hub.url(&format!("/admin/v1/deliveries?state={state}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("deliveries request");
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.expect("deliveries json");
        v["deliveries"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until a delivery of `kind` (`webhook.chat_accepted`) is in `state`.
    async fn settled(&self, kind: &str, state: &str) -> Value {
        eventually(WAIT, &format!("{kind} {state}"), || async {
            self.deliveries(state)
                .await
                .into_iter()
                .find(|d| d["kind"] == kind)
        })
        .await
    }

    async fn chat_view(&self, chat: i64) -> Value {
        self.ann.chat(chat).await
    }

    /// The id of the chat's client.
    async fn client_of(&self, chat: i64) -> i64 {
        self.chat_view(chat).await["client"]["id"]
            .as_i64()
            .expect("client id")
    }

    /// Waits until the chat shows integration data and returns it.
    async fn integration(&self, chat: i64) -> Value {
        eventually(WAIT, "integration data", || async {
            let v = self.chat_view(chat).await;
            (!v["integration"].is_null()).then(|| v["integration"].clone())
        })
        .await
    }

    async fn admin_put(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .hub
            .http
            .put(self.hub.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .expect("admin request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn stop(self) {
        self.hub.shutdown().await;
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// The fields every chat event has, as the spec types them.
fn assert_chat_base(e: &Value, widget_id: &str, chat: i64) {
    assert_eq!(e["widget_id"], json!(widget_id), "widget_id: {e}");
    assert_eq!(e["chat_id"], json!(chat), "chat_id is a number: {e}");
    let v = &e["visitor"];
    assert!(
        v["number"]
            .as_str()
            .is_some_and(|n| n.parse::<u64>().is_ok()),
        "visitor.number: {v}"
    );
    assert!(v["chats_count"].is_u64(), "visitor.chats_count: {v}");
    assert!(v["description"].is_string(), "visitor.description: {v}");
    let object = e.as_object().expect("an object");
    for key in [
        "organization",
        "status",
        "assigned_agent",
        "tags",
        "user_token",
    ] {
        assert!(object.contains_key(key), "{key} is missing: {e}");
    }
    assert!(e["organization"].is_null());
    assert!(e["assigned_agent"].is_null());
    assert!(e["user_token"].is_null());
    assert_eq!(e["tags"], json!([]));
    assert!(e["status"]["id"].is_i64(), "status: {e}");
    assert_eq!(e["status"]["title"], "New", "the default category");
    assert!(e["session"].is_object(), "session: {e}");
    assert!(e["page"]["url"].is_string(), "page: {e}");
}

/// Checks the Standard Webhooks headers of `req` against `secret`.
fn assert_signed(req: &Recorded, secret: &str) {
    let id = req.header("webhook-id").expect("webhook-id");
    assert_eq!(Some(id), req.header("x-hub-delivery"));
    let timestamp = req.header("webhook-timestamp").expect("webhook-timestamp");
    let at: i64 = timestamp.parse().expect("a Unix time in seconds");
    assert!((at - now_secs()).abs() < 30, "timestamp {at}");
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").expect("whsec_ prefix"))
        .expect("base64 key");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(&req.body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    let header = req.header("webhook-signature").expect("webhook-signature");
    assert!(
        header.split(' ').any(|s| s == expected),
        "signature {header} is not {expected}"
    );
}

fn assert_unsigned(req: &Recorded) {
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert!(req.header(name).is_none(), "{name} without a secret");
    }
}

// ---------------------------------------------------------------- events

#[tokio::test]
async fn chat_accepted_describes_the_visitor_the_agent_and_the_page() {
    let d = Desk::open().await;
    let chat = d
        .customer_says(
            json!({ "id": 77, "name": "Bob Stone", "email": "bob@example.com",
                    "phone": "+15550100", "url": "https://shop.example.com/cart" }),
            "hello",
        )
        .await;
    d.accept(chat).await;
    let req = d.wait_for("chat_accepted", 1).await.remove(0);
    let e = req.json();
    assert_eq!(e["event_name"], "chat_accepted");
    assert_chat_base(&e, &d.web.public_id, chat);
    let v = &e["visitor"];
    assert_eq!(v["name"], "Bob Stone");
    assert_eq!(v["email"], "bob@example.com");
    assert_eq!(v["phone"], "+15550100");
    assert_eq!(v["chats_count"], 1);
    assert_eq!(e["page"]["url"], "https://shop.example.com/cart");
    assert_eq!(
        e["agent"],
        json!({ "id": d.ann.id, "name": "Ann", "email": "ann@example.com" })
    );
    assert!(
        req.header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
    );
    assert!(req.header("x-hub-delivery").is_some());
    assert_eq!(req.header("x-hub-attempt"), Some("1"));
    assert_eq!(req.path, "/hub", "posted to the webhook URL as given");
    assert_unsigned(&req);
    assert!(
        d.customer.requests().is_empty(),
        "webhooks do not go to the customer endpoint"
    );
    d.stop().await;
}

/// Agents' first replies to many open chats at once (written together, as
/// on a busy hub) accept each chat and send each its own `chat_accepted`,
/// once: its visitor, the agent, its sequence number of its own.
#[tokio::test]
async fn first_replies_to_many_chats_at_once_send_each_chat_its_own_chat_accepted() {
    const CHATS: i64 = 16;
    let d = Desk::open().await;
    for n in 0..CHATS {
        let (status, body) = d
            .hub
            .customer(
                &d.web,
                json!({ "sender": { "id": 900 + n, "name": format!("Visitor {n}") },
                        "message": { "type": "text", "text": "hello" } }),
            )
            .await;
        assert_eq!(status, 200, "customer {n}: {body}");
    }
    let chats: Vec<i64> = d
        .ann
        .chats()
        .await
        .iter()
        .filter_map(|c| c["id"].as_i64())
        .collect();
    assert_eq!(chats.len() as i64, CHATS);
    let mut names = std::collections::HashMap::new();
    for chat in &chats {
        let view = d.chat_view(*chat).await;
        names.insert(*chat, view["client"]["name"].clone());
    }
    let replies = chats.iter().map(|chat| d.ann.reply(*chat, "on it"));
    futures_util::future::join_all(replies).await;

    d.wait_for("chat_accepted", chats.len()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let accepted: Vec<Value> = d.got("chat_accepted").iter().map(Recorded::json).collect();
    let mut seen: Vec<i64> = accepted
        .iter()
        .map(|e| e["chat_id"].as_i64().expect("chat_id"))
        .collect();
    seen.sort_unstable();
    let mut expected = chats.clone();
    expected.sort_unstable();
    assert_eq!(seen, expected, "one chat_accepted per chat, each once");
    let mut sequences = Vec::new();
    for e in &accepted {
        let chat = e["chat_id"].as_i64().expect("chat_id");
        assert_chat_base(e, &d.web.public_id, chat);
        assert_eq!(
            e["visitor"]["name"], names[&chat],
            "chat {chat}'s own visitor"
        );
        assert_eq!(
            e["agent"],
            json!({ "id": d.ann.id, "name": "Ann", "email": "ann@example.com" })
        );
        sequences.push(e["sequence"].as_i64().expect("sequence"));
    }
    sequences.sort_unstable();
    sequences.dedup();
    assert_eq!(sequences.len(), chats.len(), "a number of its own each");
    for chat in &chats {
        let view = d.chat_view(*chat).await;
        assert_eq!(view["chat"]["state"], "accepted", "chat {chat}: {view}");
        assert_eq!(
            view["chat"]["agent_id"],
            json!(d.ann.id),
            "chat {chat}: {view}"
        );
    }
    d.stop().await;
}

#[tokio::test]
async fn chat_updated_fires_when_a_customer_message_brings_new_contact_details() {
    let d = Desk::open().await;
    let chat = d.customer_says(json!({ "id": "c-9" }), "hi").await;
    // Same sender, now with a name and an e-mail address.
    d.customer_says(
        json!({ "id": "c-9", "name": "Carol", "email": "carol@example.com" }),
        "I am Carol",
    )
    .await;
    let e = d.event("chat_updated").await;
    assert_chat_base(&e, &d.web.public_id, chat);
    assert_eq!(e["visitor"]["name"], "Carol");
    assert_eq!(e["visitor"]["email"], "carol@example.com");
    assert!(
        e.get("agent").is_none(),
        "nobody accepted the chat yet: {e}"
    );
    // Nothing new: no chat_updated. Accepting sends chat_accepted after it.
    d.customer_says(
        json!({ "id": "c-9", "name": "Carol", "email": "carol@example.com" }),
        "still me",
    )
    .await;
    d.accept(chat).await;
    d.wait_for("chat_accepted", 1).await;
    assert_eq!(d.got("chat_updated").len(), 1);
    let names: Vec<String> = d
        .receiver
        .requests()
        .iter()
        .map(|r| {
            r.json()["event_name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["chat_updated", "chat_accepted"]);
    d.stop().await;
}

#[tokio::test]
async fn chat_finished_carries_the_log_as_messages_plain_text_and_escaped_html() {
    let d = Desk::open().await;
    let chat = d
        .customer_says(
            json!({ "id": 5, "name": "Dan" }),
            "Is 1 < 2 & <b>bold</b> ok?",
        )
        .await;
    d.ann.reply(chat, "Yes").await;
    d.close(chat).await;
    let e = d.event("chat_finished").await;
    assert_eq!(e["widget_id"], json!(d.web.public_id));
    assert_eq!(e["chat_id"], json!(chat));
    assert_eq!(e["visitor"]["name"], "Dan");
    assert_eq!(
        e["agents"],
        json!([{ "id": d.ann.id, "name": "Ann", "email": "ann@example.com" }])
    );
    assert_eq!(e["status"]["title"], "New");
    assert_eq!(e["tags"], json!([]));
    assert!(e["organization"].is_null() && e["assigned_agent"].is_null());
    assert!(e["session"].is_object() && e["page"].is_object());
    assert_eq!(e["chat"]["blacklisted"], false);
    let messages = e["chat"]["messages"].as_array().expect("chat.messages");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["type"], "visitor");
    assert_eq!(messages[0]["message"], "Is 1 < 2 & <b>bold</b> ok?");
    assert!(
        messages[0].get("agent_id").is_none(),
        "agent_id only for agents"
    );
    assert_eq!(messages[1]["type"], "agent");
    assert_eq!(messages[1]["message"], "Yes");
    assert_eq!(messages[1]["agent_id"], json!(d.ann.id));
    for m in messages {
        let at = m["timestamp"].as_i64().expect("an integer timestamp");
        assert!((at - now_secs()).abs() < 60, "Unix seconds: {at}");
    }
    let plain = e["plain_messages"].as_str().expect("plain_messages");
    assert!(plain.contains("Is 1 < 2 & <b>bold</b> ok?"), "{plain}");
    assert!(plain.contains("Yes"), "{plain}");
    let html = e["html_messages"].as_str().expect("html_messages");
    assert!(
        html.contains("Is 1 &lt; 2 &amp; &lt;b&gt;bold&lt;/b&gt; ok?"),
        "{html}"
    );
    assert!(
        !html.contains("<b>bold"),
        "customer text became markup: {html}"
    );
    d.stop().await;
}

#[tokio::test]
async fn chat_finished_says_when_the_client_was_blocked() {
    let d = Desk::open().await;
    let chat = d.customer_says(json!({ "id": 6 }), "spam").await;
    let client = d.client_of(chat).await;
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/crm/clients/{client}/blacklist"),
            Some(json!({ "blocked": true })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    d.close(chat).await;
    let e = d.event("chat_finished").await;
    assert_eq!(e["chat"]["blacklisted"], true);
    assert!(e["agents"].as_array().is_some_and(Vec::is_empty), "{e}");
    d.stop().await;
}

#[tokio::test]
async fn client_attribute_updated_sends_all_attributes_of_the_client() {
    let d = Desk::open().await;
    let chat = d.customer_says(json!({ "id": 11 }), "hi").await;
    let path = format!("/agent/v1/chats/{chat}/attributes");
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &path,
            Some(json!({ "attributes": { "plan": "pro", "seats": 3, "vip": true } })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let e = d.event("client_attribute_updated").await;
    assert_eq!(e["widget_id"], json!(d.web.public_id));
    assert!(e["client_id"].is_i64(), "client_id is a number: {e}");
    assert!(e.as_object().is_some_and(|o| o.contains_key("user_token")));
    assert_eq!(
        e["attributes"],
        json!({ "plan": "pro", "seats": 3, "vip": true })
    );
    // null removes an attribute; the event lists what is left.
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &path,
            Some(json!({ "attributes": { "vip": null } })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["attributes"], json!({ "plan": "pro", "seats": 3 }));
    let second = d.wait_for("client_attribute_updated", 2).await[1].json();
    assert_eq!(second["attributes"], json!({ "plan": "pro", "seats": 3 }));
    d.stop().await;
}

#[tokio::test]
async fn client_updated_follows_a_change_of_the_client_in_the_crm() {
    let d = Desk::open().await;
    let chat = d
        .customer_says(json!({ "id": 13, "name": "Finn" }), "hi")
        .await;
    let client = d.client_of(chat).await;
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/crm/clients/{client}/assigned_agent"),
            Some(json!({ "agent_id": d.ann.id })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let e = d.event("client_updated").await;
    assert_eq!(e["widget_id"], json!(d.web.public_id));
    assert_eq!(e["client_id"], json!(client));
    assert_eq!(e["visitor"]["name"], "Finn");
    assert_eq!(
        e["assigned_agent"],
        json!({ "id": d.ann.id, "email": "ann@example.com", "name": "Ann" })
    );
    assert_eq!(e["status"]["title"], "New");
    assert!(e["organization"].is_null());
    assert_eq!(e["tags"], json!([]));
    d.stop().await;
}

#[tokio::test]
async fn offline_messages_reach_the_receiver_and_incomplete_forms_fail() {
    let d = Desk::open().await;
    let url = d
        .hub
        .url(&format!("/widget/v1/{}/offline-messages", d.web.public_id));
    let resp = d
        .hub
        .http
        .post(&url)
        .json(&json!({ "name": "Eve", "email": "eve@example.com",
                       "description": "came from the pricing page",
                       "message": "Please call me back" }))
        .send()
        .await
        .expect("offline form");
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(answer["result"], "ok");
    let id = answer["offline_message_id"].as_i64().expect("an id");

    let e = d.event("offline_message").await;
    assert_eq!(e["message"], "Please call me back");
    assert_eq!(e["offline_message_id"], json!(id));
    assert_eq!(e["widget_id"], json!(d.web.public_id));
    assert!(e["chat_id"].is_i64(), "{e}");
    assert_eq!(e["visitor"]["name"], "Eve");
    assert_eq!(e["visitor"]["email"], "eve@example.com");
    assert_eq!(e["visitor"]["description"], "came from the pricing page");
    assert!(e["session"].is_object() && e["page"].is_object());

    // Neither e-mail nor phone: the spec's `{result: fail, error}`.
    let resp = d
        .hub
        .http
        .post(&url)
        .json(&json!({ "name": "Eve", "message": "no way to answer" }))
        .send()
        .await
        .expect("offline form");
    assert_eq!(resp.status(), 400);
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(answer["result"], "fail");
    assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()));
    let resp = d
        .hub
        .http
        .post(d.hub.url("/widget/v1/no-such-widget/offline-messages"))
        .json(&json!({ "email": "eve@example.com", "message": "hi" }))
        .send()
        .await
        .expect("offline form");
    assert_eq!(resp.status(), 404);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(d.got("offline_message").len(), 1);
    d.stop().await;
}

#[tokio::test]
async fn call_events_follow_the_call_status() {
    let d = Desk::open().await;
    let chat = d
        .customer_says(json!({ "id": 12, "phone": "+15550111" }), "call me")
        .await;
    let (status, started) = d
        .ann
        .post(
            "/agent/v1/calls",
            json!({ "chat_id": chat, "type": "callback", "phone": "+15550111" }),
        )
        .await;
    assert_eq!(status, 201, "{started}");
    let call = started["id"].as_i64().expect("call id");
    let e = d.event("call_event").await;
    assert_eq!(e["chat_id"], json!(chat));
    assert_eq!(e["widget_id"], json!(d.web.public_id));
    assert_eq!(e["visitor"]["phone"], "+15550111");
    assert_eq!(e["agent"]["id"], json!(d.ann.id));
    assert!(e["session"].is_object() && e["page"].is_object());
    assert_eq!(
        e["call"],
        json!({ "type": "callback", "phone": "+15550111", "status": "start" })
    );

    let path = format!("/agent/v1/calls/{call}");
    let (status, _) = d
        .ann
        .send(Method::PUT, &path, Some(json!({ "status": "error" })))
        .await;
    assert_eq!(status, 400, "an error needs a reason");
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &path,
            Some(json!({ "status": "error", "reason": "line busy" })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let e = d.wait_for("call_event", 2).await[1].json();
    assert_eq!(e["call"]["status"], "error");
    assert_eq!(e["call"]["reason"], "line busy");
    assert!(e["call"].get("record_url").is_none());

    let (_, second) = d
        .ann
        .post(
            "/agent/v1/calls",
            json!({ "chat_id": chat, "type": "incoming", "phone": "+15550111" }),
        )
        .await;
    let second = second["id"].as_i64().expect("call id");
    let (status, _) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/calls/{second}"),
            Some(json!({ "status": "end", "record_url": "https://rec.example.com/1.mp3" })),
        )
        .await;
    assert_eq!(status, 200);
    let e = d.wait_for("call_event", 4).await[3].json();
    assert_eq!(
        e["call"],
        json!({ "type": "incoming", "phone": "+15550111", "status": "end",
                "record_url": "https://rec.example.com/1.mp3" })
    );
    d.stop().await;
}

#[tokio::test]
async fn chat_assigned_follows_the_crm_link_offered_by_the_chat_accepted_reply() {
    let d = Desk::open().await;
    let link = "https://crm.example.com/clients/77";
    d.receiver.script([Reply::json(
        200,
        &json!({ "result": "ok", "enable_assign": true, "crm_link": link }).to_string(),
    )]);
    let chat = d
        .customer_says(json!({ "id": 77, "name": "Bob" }), "hi")
        .await;
    let crm_link = format!("/agent/v1/chats/{chat}/crm-link");
    let (status, v) = d.ann.send(Method::POST, &crm_link, None).await;
    assert_eq!(status, 409, "no link offered yet: {v}");
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(shown["crm_link"], link);
    assert_eq!(shown["enable_assign"], true);

    let (status, v) = d.ann.send(Method::POST, &crm_link, None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["crm_link"], link);
    let e = d.event("chat_assigned").await;
    assert_eq!(e["assign_to"], link);
    assert_chat_base(&e, &d.web.public_id, chat);
    assert_eq!(e["visitor"]["name"], "Bob");
    assert_eq!(e["agent"]["id"], json!(d.ann.id));
    d.stop().await;
}

#[tokio::test]
async fn declared_channels_take_their_receiver_and_secret_from_hub_toml() {
    let receiver = Integrator::start().await;
    let customer = Integrator::start().await;
    let secret = format!("whsec_{}", STANDARD.encode([7u8; 32]));
    let hub = TestHub::start_with(HubOptions {
        extra_toml: format!(
            "{FAST_POLICIES}\n[[channels]]\nname = \"declared\"\ncustomer_endpoint = \"{}\"\n\
             webhook_url = \"{}\"\nwebhook_secret = \"{secret}\"\n",
            customer.url, receiver.url
        ),
        ..HubOptions::default()
    })
    .await;
    let resp = hub
        .http
        .get(hub.url("/admin/v1/channels"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("channels");
    let channels: Value = resp.json().await.expect("json");
    let ch = &channels["channels"][0];
    assert_eq!(ch["webhook_url"], json!(receiver.url));
    assert_eq!(ch["webhook_signed"], true);
    assert!(
        !channels.to_string().contains(&secret),
        "the secret is never shown"
    );
    let public_id = ch["public_id"].as_str().expect("public_id");
    let resp = hub
        .http
        .post(hub.url(&format!("/widget/v1/{public_id}/offline-messages")))
        .json(&json!({ "phone": "+15550123", "message": "call me" }))
        .send()
        .await
        .expect("offline form");
    assert_eq!(resp.status(), 200);
    let req = receiver.wait_for(1, WAIT).await.remove(0);
    assert_eq!(req.json()["event_name"], "offline_message");
    assert_signed(&req, &secret);
    hub.shutdown().await;
}

// --------------------------------------------------------------- replies

#[tokio::test]
async fn an_ok_reply_is_shown_to_the_agent_live_and_names_the_client() {
    let d = Desk::open().await;
    let reply = json!({
        "result": "OK",
        "custom_data": [{ "title": "Orders", "content": "3 open",
                          "link": "https://crm.example.com/orders" }],
        "contact_info": { "name": "Jane Roe", "email": "jane@example.com", "phone": "+15550101" },
        "enable_assign": true,
        "crm_link": "https://crm.example.com/c/1",
        "page": { "url": "https://shop.example.com/checkout", "title": "Checkout" }
    });
    d.receiver.script([Reply::json(200, &reply.to_string())]);
    let chat = d.customer_says(json!({ "id": 21 }), "hi").await;
    let mut stream = d.ann.stream().await;
    d.accept(chat).await;
    let expected = json!({
        "custom_data": [{ "content": "3 open", "title": "Orders",
                          "link": "https://crm.example.com/orders" }],
        "contact_info": { "name": "Jane Roe", "phone": "+15550101", "email": "jane@example.com" },
        "enable_assign": true,
        "crm_link": "https://crm.example.com/c/1",
        "page": { "url": "https://shop.example.com/checkout", "title": "Checkout" }
    });
    let live = stream.expect("chat.integration", WAIT).await;
    assert_eq!(live["chat_id"], json!(chat));
    assert_eq!(live["data"]["integration"], expected);
    let view = d.chat_view(chat).await;
    assert_eq!(view["integration"], expected);
    assert_eq!(view["client"]["name"], "Jane Roe");
    assert_eq!(view["client"]["email"], "jane@example.com");
    assert_eq!(view["client"]["phone"], "+15550101");
    let delivery = d.settled("webhook.chat_accepted", "delivered").await;
    assert_eq!(delivery["response"], json!(reply.to_string()));
    // Later events carry what the reply said.
    d.close(chat).await;
    let e = d.event("chat_finished").await;
    assert_eq!(e["visitor"]["name"], "Jane Roe");
    assert_eq!(e["page"]["url"], "https://shop.example.com/checkout");
    d.stop().await;
}

#[tokio::test]
async fn a_failure_reply_applies_nothing() {
    let d = Desk::open().await;
    d.receiver.script([Reply::json(
        200,
        r#"{"result":"FAILURE","crm_link":"https://crm.example.com/c/1",
            "contact_info":{"name":"Not Applied"},
            "custom_data":[{"title":"t","content":"c"}]}"#,
    )]);
    let chat = d
        .customer_says(json!({ "id": 22, "name": "Kim" }), "hi")
        .await;
    d.accept(chat).await;
    // A 2xx answer is a delivery whatever its result says.
    d.settled("webhook.chat_accepted", "delivered").await;
    let view = d.chat_view(chat).await;
    assert!(view["integration"].is_null(), "{view}");
    assert_eq!(view["client"]["name"], "Kim");
    let (status, _) = d
        .ann
        .send(
            Method::POST,
            &format!("/agent/v1/chats/{chat}/crm-link"),
            None,
        )
        .await;
    assert_eq!(status, 409, "no crm_link was applied");
    d.stop().await;
}

#[tokio::test]
async fn a_json_reply_served_as_text_html_is_still_read() {
    let d = Desk::open().await;
    d.receiver.script([Reply::json(
        200,
        r#"  {"result":"ok","crm_link":"https://crm.example.com/c/9"}
"#,
    )
    .with_content_type("text/html; charset=utf-8")]);
    let chat = d.customer_says(json!({ "id": 23 }), "hi").await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(shown["crm_link"], "https://crm.example.com/c/9");
    d.stop().await;
}

#[tokio::test]
async fn custom_data_is_cut_to_ten_fields_of_text() {
    let d = Desk::open().await;
    let fields: Vec<Value> = (0..12)
        .map(|i| json!({ "title": format!("t{i}"), "content": format!("<i>{i}</i>") }))
        .collect();
    d.receiver.script([Reply::json(
        200,
        &json!({ "result": "ok", "custom_data": fields }).to_string(),
    )]);
    let chat = d.customer_says(json!({ "id": 24 }), "hi").await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    let data = shown["custom_data"].as_array().expect("custom_data");
    assert_eq!(data.len(), 10, "{data:?}");
    assert_eq!(data[0]["title"], "t0");
    assert_eq!(data[0]["content"], "&lt;i&gt;0&lt;/i&gt;", "shown as text");
    assert_eq!(data[9]["title"], "t9");
    d.stop().await;
}

#[tokio::test]
async fn a_chat_updated_reply_is_applied_like_a_chat_accepted_one() {
    let d = Desk::open().await;
    let chat = d.customer_says(json!({ "id": 25 }), "hi").await;
    d.receiver.script([Reply::json(
        200,
        r#"{"result":"ok","custom_data":[{"title":"Tier","content":"Gold"}]}"#,
    )]);
    d.customer_says(json!({ "id": 25, "email": "z@example.com" }), "my mail")
        .await;
    d.wait_for("chat_updated", 1).await;
    let shown = d.integration(chat).await;
    assert_eq!(
        shown["custom_data"],
        json!([{ "content": "Gold", "title": "Tier" }])
    );
    d.stop().await;
}

#[tokio::test]
async fn with_safe_url_links_to_other_hosts_are_dropped() {
    let d = Desk::start("safe_url = true", "").await;
    // The receiver is http://127.0.0.1:<port>/hub: its host is 127.0.0.1.
    let reply = json!({ "result": "ok", "custom_data": [
        { "content": "same host", "link": "http://127.0.0.1:1/card/1" },
        { "content": "other host", "link": "https://evil.example.com/x" },
        { "content": "not a web link", "link": "javascript:alert(1)" },
        // Browsers go to evil.example.com: `\` ends the host like `/`.
        { "content": "backslash", "link": "http://evil.example.com\\@127.0.0.1/x" }
    ]});
    d.receiver.script([Reply::json(200, &reply.to_string())]);
    let chat = d.customer_says(json!({ "id": 26 }), "hi").await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(
        shown["custom_data"],
        json!([
            { "content": "same host", "link": "http://127.0.0.1:1/card/1" },
            { "content": "other host" },
            { "content": "not a web link" },
            { "content": "backslash" }
        ])
    );
    d.stop().await;
}

#[tokio::test]
async fn without_safe_url_links_to_other_hosts_are_kept() {
    let d = Desk::open().await;
    let reply = json!({ "result": "ok", "custom_data": [
        { "content": "other host", "link": "https://crm.example.com/x" }
    ]});
    d.receiver.script([Reply::json(200, &reply.to_string())]);
    let chat = d.customer_says(json!({ "id": 27 }), "hi").await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(shown["custom_data"][0]["link"], "https://crm.example.com/x");
    d.stop().await;
}

// ------------------------------------------------- retries, dead letters

#[tokio::test]
async fn a_failing_receiver_gets_sync_events_sync_attempts_times() {
    let d = Desk::open().await;
    d.receiver
        .set_default(Reply::json(503, "down for maintenance"));
    let chat = d.customer_says(json!({ "id": 31 }), "hi").await;
    let asked = Instant::now();
    d.accept(chat).await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "accepting does not wait for the receiver"
    );
    let dead = d.settled("webhook.chat_accepted", "dead").await;
    let tries = d.got("chat_accepted");
    assert_eq!(tries.len(), 2, "sync_attempts = 2");
    let id = dead["id"].as_str().expect("delivery id");
    assert!(tries.iter().all(|r| r.header("x-hub-delivery") == Some(id)));
    assert_eq!(tries[0].header("x-hub-attempt"), Some("1"));
    assert_eq!(tries[1].header("x-hub-attempt"), Some("2"));
    assert!(
        tries[1].at.duration_since(tries[0].at) >= Duration::from_millis(80),
        "sync_retry_interval_ms apart"
    );
    assert_eq!(dead["attempts"], 2);
    assert_eq!(dead["state"], "failed");
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("down for maintenance")),
        "{dead}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(d.got("chat_accepted").len(), 2, "no attempt after the last");
    d.stop().await;
}

#[tokio::test]
async fn a_4xx_answer_is_final() {
    let d = Desk::open().await;
    d.receiver.set_default(Reply::json(410, "gone"));
    let chat = d.customer_says(json!({ "id": 32 }), "hi").await;
    d.close(chat).await;
    let dead = d.settled("webhook.chat_finished", "dead").await;
    assert_eq!(dead["attempts"], 1);
    assert_eq!(d.got("chat_finished").len(), 1);
    d.stop().await;
}

#[tokio::test]
async fn dead_letters_are_listed_and_replayed_with_the_same_delivery_id() {
    let d = Desk::open().await;
    d.receiver.set_default(Reply::json(503, ""));
    let chat = d.customer_says(json!({ "id": 33 }), "hi").await;
    d.close(chat).await;
    let dead = d.settled("webhook.chat_finished", "dead").await;
    let id = dead["id"].as_str().expect("delivery id").to_owned();
    assert_eq!(dead["attempts"], 3, "attempts = 3");
    assert_eq!(dead["body"]["event_name"], "chat_finished");
    assert_eq!(dead["chat_id"], json!(chat));
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("503"))
    );
    let tries = d.got("chat_finished");
    assert_eq!(tries.len(), 3);
    assert!(
        tries
            .iter()
            .all(|r| r.header("x-hub-delivery") == Some(id.as_str()))
    );

    d.receiver.set_default(Reply::ok());
    let resp = d
        .hub
        .admin_post(&format!("/admin/v1/deliveries/{id}/replay"), json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["replayed"], json!([id]));
    let again = d.wait_for("chat_finished", 4).await.remove(3);
    assert_eq!(again.header("x-hub-delivery"), Some(id.as_str()));
    assert_eq!(again.header("x-hub-attempt"), Some("1"));
    assert_eq!(again.body, tries[0].body, "the same body");
    let delivered = d.settled("webhook.chat_finished", "delivered").await;
    assert_eq!(delivered["id"], json!(id));

    // Only dead letters can be replayed.
    let resp = d
        .hub
        .admin_post(&format!("/admin/v1/deliveries/{id}/replay"), json!({}))
        .await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "not_found");
    let resp = d
        .hub
        .http
        .get(d.hub.url("/admin/v1/deliveries?state=lost"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("deliveries");
    assert_eq!(resp.status(), 400);
    d.stop().await;
}

#[tokio::test]
async fn replaying_all_dead_letters_over_the_api() {
    let d = Desk::open().await;
    d.receiver.set_default(Reply::json(503, ""));
    let chat = d.customer_says(json!({ "id": 34 }), "hi").await;
    d.accept(chat).await;
    d.close(chat).await;
    d.settled("webhook.chat_accepted", "dead").await;
    d.settled("webhook.chat_finished", "dead").await;
    d.receiver.set_default(Reply::ok());
    let resp = d
        .hub
        .admin_post("/admin/v1/deliveries/replay", json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["replayed"].as_array().map(Vec::len), Some(2), "{v}");
    d.settled("webhook.chat_accepted", "delivered").await;
    d.settled("webhook.chat_finished", "delivered").await;
    assert!(d.deliveries("dead").await.is_empty());
    d.stop().await;
}

/// `hub --config <file> <args…>` as a child process.
async fn hub_cli(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_hub"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run hub")
}

#[tokio::test]
async fn the_cli_lists_and_replays_dead_letters() {
    let d = Desk::open().await;
    d.receiver.set_default(Reply::json(503, ""));
    let chat = d.customer_says(json!({ "id": 35 }), "hi").await;
    d.accept(chat).await;
    d.close(chat).await;
    d.settled("webhook.chat_accepted", "dead").await;
    d.settled("webhook.chat_finished", "dead").await;
    let config = d.hub.dir.path().join("hub.toml");

    let out = hub_cli(&config, &["deliveries", "list", "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let listed = listed.as_array().expect("an array");
    let mut kinds: Vec<&str> = listed.iter().filter_map(|d| d["kind"].as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["webhook.chat_accepted", "webhook.chat_finished"]);
    assert!(listed.iter().all(|d| d["state"] == "failed"));
    let ids: Vec<String> = listed
        .iter()
        .filter_map(|d| d["id"].as_str().map(str::to_owned))
        .collect();

    let out = hub_cli(&config, &["deliveries", "replay"]).await;
    assert!(!out.status.success(), "replay needs ids or --all");

    d.receiver.set_default(Reply::ok());
    let out = hub_cli(&config, &["deliveries", "replay", "--all"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "replayed 2 deliveries"
    );
    // The running hub picks them up on its next look at the outbox.
    let finished = d.wait_for("chat_finished", 4).await.remove(3);
    let accepted = d.wait_for("chat_accepted", 3).await.remove(2);
    for req in [&finished, &accepted] {
        let id = req.header("x-hub-delivery").expect("delivery id");
        assert!(ids.iter().any(|i| i == id), "{id} is a replayed id");
    }
    d.settled("webhook.chat_finished", "delivered").await;
    let out = hub_cli(
        &config,
        &["deliveries", "list", "--state", "delivered", "--json"],
    )
    .await;
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(
        listed
            .as_array()
            .is_some_and(|l| l.iter().any(|d| d["kind"] == "webhook.chat_finished"))
    );
    d.stop().await;
}

// --------------------------------------------------------------- signing

#[tokio::test]
async fn a_generated_secret_signs_every_attempt_and_removing_it_stops_signing() {
    let d = Desk::open().await;
    let path = format!("/admin/v1/channels/{}/webhook", d.web.public_id);
    let (status, v) = d
        .admin_put(
            &path,
            json!({ "url": d.receiver.url, "generate_secret": true }),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["signed"], true);
    assert_eq!(v["url"], json!(d.receiver.url));
    let secret = v["secret"].as_str().expect("the new secret").to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");

    // One failed attempt, then success: each attempt is signed, same id.
    d.receiver.script([Reply::json(503, "")]);
    let chat = d.customer_says(json!({ "id": 41 }), "hi").await;
    d.accept(chat).await;
    let tries = d.wait_for("chat_accepted", 2).await;
    for req in &tries {
        assert_signed(req, &secret);
    }
    assert_eq!(
        tries[0].header("webhook-id"),
        tries[1].header("webhook-id"),
        "a retry keeps its id"
    );

    // By numeric id, without a secret: unsigned from now on.
    let numeric = format!("/admin/v1/channels/{}/webhook", d.web.raw["id"]);
    let (status, v) = d
        .admin_put(&numeric, json!({ "url": d.receiver.url }))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["signed"], false);
    assert!(v["secret"].is_null());
    d.close(chat).await;
    let finished = d.wait_for("chat_finished", 1).await.remove(0);
    assert_unsigned(&finished);
    d.stop().await;
}

#[tokio::test]
async fn webhook_settings_are_checked() {
    let d = Desk::open().await;
    let path = format!("/admin/v1/channels/{}/webhook", d.web.public_id);
    for bad in [
        json!({ "url": "ftp://files.example.com" }),
        json!({ "url": d.receiver.url, "secret": "not-a-secret" }),
        json!({ "url": d.receiver.url, "secret": "whsec_c2hvcnQ=" }),
        json!({ "url": d.receiver.url, "colour": "blue" }),
    ] {
        let (status, v) = d.admin_put(&path, bad.clone()).await;
        assert_eq!(status, 400, "{bad} → {v}");
        assert_eq!(v["error"]["code"], "invalid_request");
    }
    let (status, _) = d
        .admin_put(
            "/admin/v1/channels/no-such-channel/webhook",
            json!({ "url": d.receiver.url }),
        )
        .await;
    assert_eq!(status, 404);
    // A secret of one's own is accepted, and not shown back.
    let own = format!("whsec_{}", STANDARD.encode([3u8; 24]));
    let (status, v) = d
        .admin_put(&path, json!({ "url": d.receiver.url, "secret": own }))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["signed"], true);
    assert!(v["secret"].is_null());
    d.close(d.customer_says(json!({ "id": 42 }), "hi").await)
        .await;
    assert_signed(&d.wait_for("chat_finished", 1).await[0], &own);

    // No receiver: events are recorded as not sent.
    let (status, v) = d.admin_put(&path, json!({ "url": null })).await;
    assert_eq!(status, 200, "{v}");
    let chat = d.customer_says(json!({ "id": 43 }), "again").await;
    d.close(chat).await;
    let dropped = d.settled("webhook.chat_finished", "dropped").await;
    assert_eq!(dropped["chat_id"], json!(chat));
    assert_eq!(d.got("chat_finished").len(), 1);
    d.stop().await;
}

// --------------------------------------------------------------- plugins

#[tokio::test]
async fn a_plugin_reply_stands_in_for_the_receiver() {
    let wiring = plugin_toml(
        "answer",
        "fault",
        "",
        "fault = \"reply\"\npayload = { result = \"ok\", custom_data = [{ title = \"Plan\", content = \"Gold\" }] }",
    ) + &route_toml("\"webhook.chat_accepted\"", "\"answer\"", "skip");
    let d = Desk::start("", &wiring).await;
    let chat = d.customer_says(json!({ "id": 51 }), "hi").await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(
        shown["custom_data"],
        json!([{ "content": "Gold", "title": "Plan" }])
    );
    let delivered = d.settled("webhook.chat_accepted", "delivered").await;
    let answer: Value =
        serde_json::from_str(delivered["response"].as_str().expect("the plugin's answer"))
            .expect("JSON");
    assert_eq!(answer["result"], "ok");
    // Other events still reach the receiver; chat_accepted never did.
    d.close(chat).await;
    d.wait_for("chat_finished", 1).await;
    assert!(d.got("chat_accepted").is_empty());
    d.stop().await;
}

#[tokio::test]
async fn a_plugin_drop_means_the_receiver_gets_nothing() {
    let wiring = plugin_toml("mute", "fault", "", "fault = \"drop\"\nreason = \"muted\"")
        + &route_toml("\"webhook.chat_*\"", "\"mute\"", "skip");
    let d = Desk::start("", &wiring).await;
    let chat = d.customer_says(json!({ "id": 52 }), "hi").await;
    d.accept(chat).await;
    d.close(chat).await;
    let dropped = d.settled("webhook.chat_finished", "dropped").await;
    assert!(
        dropped["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("muted")),
        "{dropped}"
    );
    d.settled("webhook.chat_accepted", "dropped").await;
    assert!(d.receiver.requests().is_empty(), "the receiver was called");
    // The outcome is an event plugins can watch: webhook.delivery_result.
    let events = d.hub.store().events_of_chat(chat).await.expect("event log");
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e.kind.as_str() == "webhook.delivery_result")
        .map(|e| &e.payload)
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results.iter().all(|r| r["state"] == "dropped"));
    assert!(results.iter().any(|r| r["kind"] == "webhook.chat_finished"));
    d.stop().await;
}

// --------------------------------------------------------- lenient replies

/// `GET /admin/v1/deliveries/{id}`.
async fn delivery_by_id(d: &Desk, id: &str) -> (u16, Value) {
    let resp = d
        .hub
        .http
        .get(d.hub.url(&format!("/admin/v1/deliveries/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("delivery request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_php_reply_with_an_empty_array_for_contact_info_is_still_applied() {
    let d = Desk::open().await;
    // PHP's json_encode writes an empty array as `[]`, whatever it stands for.
    let php = r#"{"result":"ok","custom_data":[{"title":"Lead","content":"x"}],"contact_info":[],"enable_assign":false,"crm_link":"https://crm.example.com/c/1"}"#;
    d.receiver.script([Reply::json(200, php)]);
    let chat = d
        .customer_says(json!({ "id": 61, "name": "Kim" }), "hi")
        .await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(
        shown,
        json!({ "custom_data": [{ "content": "x", "title": "Lead" }],
                "enable_assign": false, "crm_link": "https://crm.example.com/c/1" })
    );
    assert_eq!(d.chat_view(chat).await["client"]["name"], "Kim");
    let listed = d.settled("webhook.chat_accepted", "delivered").await;
    let id = listed["id"].as_str().expect("delivery id");
    let (status, one) = delivery_by_id(&d, id).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["id"], id);
    assert_eq!(one["kind"], "webhook.chat_accepted");
    assert_eq!(one["state"], "delivered");
    assert_eq!(one["response"], php);
    assert_eq!(one["notes"], json!([]), "nothing was malformed");
    // The CRM link the reply offered can be followed.
    let (status, v) = d
        .ann
        .send(
            Method::POST,
            &format!("/agent/v1/chats/{chat}/crm-link"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // An unknown id is the API's 404.
    let (status, v) = delivery_by_id(&d, "00000000-0000-0000-0000-000000000000").await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "not_found");
    d.stop().await;
}

#[tokio::test]
async fn malformed_reply_fields_are_skipped_alone_noted_on_the_delivery_and_counted() {
    let d = Desk::open().await;
    let reply = json!({
        "result": "ok",
        "custom_data": [{ "title": "Visits", "content": 3 },
                        { "title": "Bad", "content": { "n": 1 } }],
        "contact_info": {},
        "enable_assign": 1,
        "crm_link": false,
        "page": []
    });
    d.receiver.script([Reply::json(200, &reply.to_string())]);
    let chat = d.customer_says(json!({ "id": 62 }), "hi").await;
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(
        shown,
        json!({ "custom_data": [{ "content": "3", "title": "Visits" }], "enable_assign": true })
    );
    let listed = d.settled("webhook.chat_accepted", "delivered").await;
    let id = listed["id"].as_str().expect("delivery id");
    let (status, one) = delivery_by_id(&d, id).await;
    assert_eq!(status, 200, "{one}");
    // Notes name only the bad fields; `{}`, `[]` and `1` were fine.
    assert_eq!(
        one["notes"],
        json!([
            "custom_data[1].content: expected text, got an object",
            "crm_link: expected text, got false"
        ])
    );
    // Counted per hub, by event and field.
    for field in ["custom_data", "crm_link"] {
        let series = format!(
            "hub_webhook_reply_fields_skipped_total{{event=\"chat_accepted\",field=\"{field}\"}}"
        );
        eventually(WAIT, &series, || async {
            d.hub
                .metrics()
                .await
                .get(&series)
                .is_some_and(|n| *n == 1.0)
                .then_some(())
        })
        .await;
    }
    d.stop().await;
}

#[tokio::test]
async fn contact_info_without_a_name_keeps_the_name_and_sets_what_it_gives() {
    let d = Desk::open().await;
    let chat = d
        .customer_says(json!({ "id": 63, "name": "Kim" }), "hi")
        .await;
    d.receiver.script([Reply::json(
        200,
        r#"{"result":"ok","contact_info":{"phone":15550101,"email":"kim@example.com"},
            "enable_assign":"0","page":{"url":"https://shop.example.com/p/7","title":7}}"#,
    )]);
    d.accept(chat).await;
    let shown = d.integration(chat).await;
    assert_eq!(
        shown,
        json!({ "contact_info": { "phone": "15550101", "email": "kim@example.com" },
                "enable_assign": false,
                "page": { "url": "https://shop.example.com/p/7", "title": "7" } })
    );
    let view = d.chat_view(chat).await;
    assert_eq!(view["client"]["name"], "Kim");
    assert_eq!(view["client"]["phone"], "15550101");
    assert_eq!(view["client"]["email"], "kim@example.com");
    let listed = d.settled("webhook.chat_accepted", "delivered").await;
    assert_eq!(listed["notes"], json!([]));
    d.close(chat).await;
    let e = d.event("chat_finished").await;
    assert_eq!(e["page"]["url"], "https://shop.example.com/p/7");
    d.stop().await;
}

/// A desk whose `[webhooks]` table is exactly `policies` (no fast defaults).
async fn desk_with_policies(policies: &str) -> Desk {
    Desk::start_toml(&format!("[webhooks]\n{policies}\n")).await
}

/// Customer `id` opens a chat; the agent starts a call whose first
/// `call_event` the receiver refuses once with 500, then ends the call (a
/// second `call_event` of the same call). Returns the chat.
async fn fail_a_call_event_then_end_the_call(d: &Desk, id: i64) -> i64 {
    let chat = d
        .customer_says(json!({ "id": id, "phone": "+15550111" }), "call me")
        .await;
    d.receiver.script([Reply::json(500, "receiver bug")]);
    let (status, started) = d
        .ann
        .post(
            "/agent/v1/calls",
            json!({ "chat_id": chat, "type": "callback", "phone": "+15550111" }),
        )
        .await;
    assert_eq!(status, 201, "{started}");
    let call = started["id"].as_i64().expect("call id");
    d.wait_for("call_event", 1).await;
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/calls/{call}"),
            Some(json!({ "status": "end" })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    chat
}

/// The `sequence` of a webhook body.
fn sequence_of(r: &Recorded) -> i64 {
    let body = r.json();
    body["sequence"]
        .as_i64()
        .unwrap_or_else(|| panic!("no sequence in {body}"))
}

/// The call statuses the receiver got, attempts included, in arrival order.
fn call_statuses(d: &Desk) -> Vec<String> {
    d.got("call_event")
        .iter()
        .map(|r| {
            r.json()["call"]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn one_failing_event_holds_the_later_events_of_its_order_only_for_the_order_hold() {
    // The failed call_event is retried 4 s later; the order hold is 300 ms.
    let d = desk_with_policies(
        "sync_attempts = 2\nsync_timeout_ms = 500\nsync_retry_interval_ms = 100\n\
         attempts = 3\ntimeout_ms = 500\nretry_interval_ms = 4000\nbackoff = 1.0\n\
         order_hold_ms = 300\n",
    )
    .await;
    fail_a_call_event_then_end_the_call(&d, 21).await;
    let calls = d.wait_for("call_event", 2).await;
    assert_eq!(
        call_statuses(&d),
        ["start", "end"],
        "the call's end went out after the hold, while its failed start waits for its retry"
    );
    let ended = calls[1].clone();
    // The failed event goes on retrying on its own and arrives.
    let calls = eventually(Duration::from_secs(8), "the call_event retry", || {
        let got = d.got("call_event");
        async move { (got.len() >= 3).then_some(got) }
    })
    .await;
    assert_eq!(
        calls[2].header("x-hub-delivery"),
        calls[0].header("x-hub-delivery")
    );
    // Receivers can put them back in order.
    assert!(sequence_of(&calls[2]) < sequence_of(&ended));
    assert_eq!(
        sequence_of(&calls[2]),
        sequence_of(&calls[0]),
        "a retry keeps its number"
    );
    d.stop().await;
}

#[tokio::test]
async fn a_failing_event_still_holds_the_next_event_of_its_order_within_the_order_hold() {
    // Hold longer than the retry: order is kept exactly.
    let d = desk_with_policies(
        "sync_attempts = 2\nsync_timeout_ms = 500\nsync_retry_interval_ms = 100\n\
         attempts = 3\ntimeout_ms = 500\nretry_interval_ms = 500\nbackoff = 1.0\n\
         order_hold_ms = 10000\n",
    )
    .await;
    fail_a_call_event_then_end_the_call(&d, 22).await;
    d.wait_for("call_event", 3).await;
    assert_eq!(call_statuses(&d), ["start", "start", "end"]);
    d.stop().await;
}

#[tokio::test]
async fn a_refused_call_event_does_not_hold_the_chats_conversation_back() {
    // Receivers written before calls refuse call_event; with the default
    // two-minute hold and a retry a minute away, chat_finished must not wait.
    let d = desk_with_policies(
        "sync_attempts = 2\nsync_timeout_ms = 500\nsync_retry_interval_ms = 100\n\
         attempts = 3\ntimeout_ms = 500\nretry_interval_ms = 60000\nbackoff = 1.0\n",
    )
    .await;
    let chat = fail_a_call_event_then_end_the_call(&d, 24).await;
    d.close(chat).await;
    let finished = d.wait_for("chat_finished", 1).await.remove(0);
    assert_eq!(finished.json()["chat_id"], json!(chat));
    assert_eq!(
        call_statuses(&d),
        ["start"],
        "the call's own order still waits behind its failed start"
    );
    d.stop().await;
}

/// A webhook receiver that answers 500 to one event kind and ok to every
/// other, like a receiver library written before that kind existed; it
/// keeps the event names it got, attempts included.
#[derive(Clone, Default)]
struct Refuser {
    got: Arc<Mutex<Vec<Value>>>,
}

impl Refuser {
    async fn start(refused: &'static str) -> (Refuser, String) {
        let refuser = Refuser::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let url = format!("http://{}/hooks", listener.local_addr().expect("addr"));
        let this = refuser.clone();
        serve(listener, move |req| {
            let this = this.clone();
            async move {
                let body = req.into_body().collect().await.expect("body").to_bytes();
                let event: Value = serde_json::from_slice(&body).unwrap_or_default();
                let status = if event["event_name"] == refused {
                    500
                } else {
                    200
                };
                this.got.lock().expect("got").push(event);
                let mut resp = http::Response::new(Full::new(Bytes::from(
                    json!({ "result": if status == 200 { "ok" } else { "unknown event" } })
                        .to_string(),
                )));
                *resp.status_mut() = http::StatusCode::from_u16(status).expect("status");
                resp
            }
        });
        (refuser, url)
    }

    fn got(&self, name: &str) -> Vec<Value> {
        self.got
            .lock()
            .expect("got")
            .iter()
            .filter(|e| e["event_name"] == name)
            .cloned()
            .collect()
    }
}

#[tokio::test]
async fn a_client_snapshot_kind_the_receiver_refuses_does_not_stall_the_other_kind() {
    // The default two-minute hold; the refused kind retries a minute later.
    let d = desk_with_policies(
        "sync_attempts = 2\nsync_timeout_ms = 500\nsync_retry_interval_ms = 100\n\
         attempts = 3\ntimeout_ms = 500\nretry_interval_ms = 60000\nbackoff = 1.0\n",
    )
    .await;
    let (refuser, url) = Refuser::start("client_attribute_updated").await;
    let path = format!("/admin/v1/channels/{}/webhook", d.web.raw["id"]);
    let (status, v) = d.admin_put(&path, json!({ "url": url })).await;
    assert_eq!(status, 200, "{v}");
    let chat = d
        .customer_says(json!({ "id": 25, "name": "Hal" }), "hi")
        .await;
    let client = d.client_of(chat).await;
    let attributes = format!("/agent/v1/chats/{chat}/attributes");
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &attributes,
            Some(json!({ "attributes": { "plan": "pro" } })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    eventually(WAIT, "the refused client_attribute_updated", || {
        let got = refuser.got("client_attribute_updated");
        async move { (!got.is_empty()).then_some(()) }
    })
    .await;
    // Later snapshots of both kinds: the other kind's go out at once, the
    // refused kind's wait behind its failed one.
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &attributes,
            Some(json!({ "attributes": { "plan": "team" } })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/crm/clients/{client}/assigned_agent"),
            Some(json!({ "agent_id": d.ann.id })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (_, lead) = d
        .ann
        .post(
            "/agent/v1/crm/statuses",
            json!({"title": "Lead", "color": "#FFCC00"}),
        )
        .await;
    let lead = lead["status_id"].as_i64().expect("status id");
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/crm/clients/{client}/status"),
            Some(json!({ "status_id": lead })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let updates = eventually(Duration::from_secs(10), "the newest client_updated", || {
        let got = refuser.got("client_updated");
        async move {
            got.last()
                .is_some_and(|u| u["status"]["id"] == json!(lead))
                .then_some(got)
        }
    })
    .await;
    assert!(
        updates
            .iter()
            .any(|u| u["assigned_agent"]["id"] == json!(d.ann.id)
                && u["status"]["id"] != json!(lead)),
        "the snapshot after the agent was assigned came first: {updates:#?}"
    );
    let refused = refuser.got("client_attribute_updated");
    assert_eq!(
        refused.len(),
        1,
        "the refused kind keeps its own order: its next snapshot waits: {refused:?}"
    );
    assert_eq!(refused[0]["attributes"], json!({ "plan": "pro" }));
    d.stop().await;
}

#[tokio::test]
async fn snapshots_of_one_client_arrive_in_order_with_growing_sequence_numbers() {
    let d = Desk::open().await;
    let chat = d
        .customer_says(json!({ "id": 23, "name": "Gus" }), "hi")
        .await;
    let client = d.client_of(chat).await;
    let (_, lead) = d
        .ann
        .post(
            "/agent/v1/crm/statuses",
            json!({"title": "Lead", "color": "#FFCC00"}),
        )
        .await;
    let lead = lead["status_id"].as_i64().expect("status id");
    // Let anything queued so far go out, then fail the first snapshot once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.receiver.script([Reply::json(500, "busy")]);
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/crm/clients/{client}/assigned_agent"),
            Some(json!({ "agent_id": d.ann.id })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = d
        .ann
        .send(
            Method::PUT,
            &format!("/agent/v1/crm/clients/{client}/status"),
            Some(json!({ "status_id": lead })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    d.wait_for("client_updated", 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let updates: Vec<Value> = d.got("client_updated").iter().map(Recorded::json).collect();
    assert_eq!(updates.len(), 3, "{updates:?}");
    assert!(
        updates[..2]
            .iter()
            .all(|u| u["status"]["id"] != json!(lead)),
        "the older snapshot (tried twice) first: {updates:#?}"
    );
    assert_eq!(
        updates[2]["status"]["id"],
        json!(lead),
        "the receiver ends with the newest snapshot, not the retried older one"
    );
    let seq = |v: &Value| v["sequence"].as_i64().expect("sequence");
    assert!(seq(&updates[0]) == seq(&updates[1]) && seq(&updates[1]) < seq(&updates[2]));
    let ts = updates[2]["event_ts"].as_i64().expect("event_ts");
    let now = now_secs();
    assert!(
        (now - 60..=now + 1).contains(&ts),
        "event_ts {ts} is the change's time"
    );
    d.stop().await;
}

#[tokio::test]
async fn visitor_numbers_count_one_two_three_whatever_the_messages() {
    let d = Desk::open().await;
    // Six visitors; some write several times (each write upserts the client).
    let mut numbers = Vec::new();
    for (i, id) in [31, 32, 33, 34, 35, 36].into_iter().enumerate() {
        for n in 0..=(i % 3) {
            let (status, body) = d
                .hub
                .customer(
                    &d.web,
                    json!({ "sender": { "id": id }, "message": { "type": "text", "text": format!("m{n}") } }),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
        let chats = d.ann.chats().await;
        let chat = chats
            .iter()
            .find(|c| c["state"] != "closed" && !numbers.iter().any(|(c2, _)| *c2 == c["id"]))
            .expect("the visitor's chat")["id"]
            .clone();
        let view = d.chat_view(chat.as_i64().expect("chat id")).await;
        numbers.push((chat, view["client"]["visitor_number"].clone()));
    }
    let shown: Vec<Value> = numbers.iter().map(|(_, n)| n.clone()).collect();
    assert_eq!(shown, [1, 2, 3, 4, 5, 6].map(|n| json!(n)), "agent view");
    // Webhooks carry the same numbers (as text, per the spec's field table).
    for (chat, number) in &numbers {
        d.accept(chat.as_i64().expect("chat id")).await;
        let accepted = eventually(WAIT, "chat_accepted of the chat", || {
            let found = d
                .got("chat_accepted")
                .into_iter()
                .map(|r| r.json())
                .find(|e| e["chat_id"] == *chat);
            async move { found }
        })
        .await;
        assert_eq!(accepted["visitor"]["number"], json!(number.to_string()));
    }
    d.stop().await;
}
