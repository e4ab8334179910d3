//! The channel's inbound side: endpoint URLs, the status endpoint, and every
//! rule for customer messages.

use std::time::Duration;

use crate::support::{ADMIN_TOKEN, HubOptions, Integrator, TestAgent, TestChannel, TestHub};
use bytes::Bytes;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(5);

/// Where agent replies would go; these tests never send one.
const NOWHERE: &str = "http://127.0.0.1:9/integrator";

/// What the hub answered to a request.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

async fn answer(resp: reqwest::Response) -> Answer {
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Answer {
        status: resp.status().as_u16(),
        content_type,
        body: resp.text().await.unwrap_or_default(),
    }
}

/// A hub with agent Ann working on channel `web`.
struct Desk {
    hub: TestHub,
    agent: TestAgent,
    ch: TestChannel,
}

impl Desk {
    async fn open() -> Desk {
        Desk::open_with(HubOptions::default()).await
    }

    async fn open_with(opts: HubOptions) -> Desk {
        let hub = TestHub::start_with(opts).await;
        let agent = hub.create_agent("Ann", "ann@example.com").await;
        let ch = hub
            .create_channel("web", NOWHERE, false, &["ann@example.com"])
            .await;
        Desk { hub, agent, ch }
    }

    /// Posts `body` to `url` as a customer message.
    async fn post_to(&self, url: &str, body: impl Into<reqwest::Body>) -> Answer {
        let resp = self
            .hub
            .http
            .post(url)
            .header("content-type", "application/json; charset=utf-8")
            .body(body)
            .send()
            .await
            .expect("customer request");
        answer(resp).await
    }

    async fn post(&self, body: impl Into<reqwest::Body>) -> Answer {
        self.post_to(&self.ch.endpoint_url, body).await
    }

    /// Posts a customer message that must be accepted.
    async fn accepted(&self, body: impl Into<reqwest::Body>) {
        let a = self.post(body).await;
        assert_eq!(a.status, 200, "message refused: {a:?}");
    }

    /// Checks the status endpoint answers 200 with exactly `body`.
    async fn assert_status(&self, body: &str, when: &str) {
        let a = self.get(&self.ch.status_url).await;
        assert_eq!((a.status, a.body.as_str()), (200, body), "{when}: {a:?}");
    }

    async fn get(&self, url: &str) -> Answer {
        answer(self.hub.http.get(url).send().await.expect("request")).await
    }

    /// Every chat the agent can see, closed ones included, oldest first.
    async fn all_chats(&self) -> Vec<Value> {
        let (status, v) = self.agent.get("/agent/v1/chats?state=all").await;
        assert_eq!(status, 200, "{v}");
        let mut chats = v["chats"].as_array().cloned().unwrap_or_default();
        chats.sort_by_key(|c| c["id"].as_i64());
        chats
    }

    /// Every stored message of every chat, in chat order.
    async fn messages(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for chat in self.all_chats().await {
            let view = self.agent.chat(id_of(&chat)).await;
            out.extend(view["messages"].as_array().cloned().unwrap_or_default());
        }
        out
    }

    /// The view of the one chat there is.
    async fn only_chat(&self) -> Value {
        let chats = self.all_chats().await;
        assert_eq!(chats.len(), 1, "expected one chat: {chats:?}");
        self.agent.chat(id_of(&chats[0])).await
    }

    /// The body of the one stored message there is.
    async fn only_message(&self) -> Value {
        let messages = self.messages().await;
        assert_eq!(messages.len(), 1, "expected one message: {messages:?}");
        messages[0]["body"].clone()
    }
}

fn id_of(chat: &Value) -> i64 {
    chat["id"].as_i64().expect("chat id")
}

/// A customer message body.
fn from(id: Value, message: Value) -> Value {
    json!({ "sender": { "id": id }, "message": message })
}

/// A valid message of a file-carrying type.
fn media(kind: &str) -> Value {
    json!({ "type": kind, "file": "https://files.example.com/a.bin",
            "file_name": "a.bin", "file_size": 1024 })
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn without(mut v: Value, key: &str) -> Value {
    v.as_object_mut().expect("object").remove(key);
    v
}

fn assert_refused(label: &str, a: &Answer) {
    assert!(
        (400..500).contains(&a.status),
        "{label}: expected a 4xx, got {a:?}"
    );
    assert!(
        a.content_type.starts_with("text/plain"),
        "{label}: reason is not text/plain: {a:?}"
    );
    assert!(!a.body.trim().is_empty(), "{label}: empty reason");
}

/// Opens a chat with one message from customer 1, posts every bad body, checks
/// each is refused with a plain-text reason and that nothing was stored.
async fn assert_all_refused(cases: Vec<(String, String)>) {
    let desk = Desk::open().await;
    desk.hub.say(&desk.ch, json!(1), "first").await;
    for (label, body) in cases {
        let a = desk.post(body).await;
        assert_refused(&label, &a);
    }
    assert_eq!(
        desk.all_chats().await.len(),
        1,
        "a refused message opened a chat"
    );
    assert_eq!(
        desk.messages().await.len(),
        1,
        "a refused message was stored"
    );
    desk.hub.shutdown().await;
}

/// Cases whose message part is `message`, sent by customer 1.
fn message_cases(cases: Vec<(String, Value)>) -> Vec<(String, String)> {
    cases
        .into_iter()
        .map(|(label, m)| (label, from(json!(1), m).to_string()))
        .collect()
}

/// The `<random_string>` and `<public_id>` of a channel's endpoint URL.
fn url_parts(hub: &TestHub, ch: &TestChannel) -> (String, String) {
    let rest = ch
        .endpoint_url
        .strip_prefix(&format!("{}/", hub.base))
        .unwrap_or_else(|| panic!("{} is not under {}", ch.endpoint_url, hub.base));
    let parts: Vec<&str> = rest.split('/').collect();
    assert_eq!(parts.len(), 2, "endpoint URL {}", ch.endpoint_url);
    (parts[0].to_owned(), parts[1].to_owned())
}

fn assert_unguessable(what: &str, s: &str) {
    assert!(
        s.len() >= 24 && s.chars().all(|c| c.is_ascii_hexdigit()),
        "{what} `{s}` is not at least 24 hex characters"
    );
}

#[tokio::test]
async fn a_customer_message_opens_a_chat_the_agent_sees() {
    let hub = TestHub::start().await;
    let integrator = Integrator::start().await;
    let agent = hub.create_agent("Ann", "ann@example.com").await;
    let ch = hub
        .create_channel("web", &integrator.url, false, &["ann@example.com"])
        .await;
    let mut stream = agent.stream().await;
    hub.say(&ch, json!(42), "hello").await;
    let opened = stream.expect("chat.opened", WAIT).await;
    let chats = agent.chats().await;
    assert_eq!(chats.len(), 1);
    assert_eq!(opened["chat_id"], chats[0]["id"]);
    assert_eq!(chats[0]["client_name"], "Anonymous");
    hub.shutdown().await;
}

#[tokio::test]
async fn created_channels_get_unguessable_endpoint_urls_and_are_listed() {
    let hub = TestHub::start().await;
    let web = hub.create_channel("web", NOWHERE, false, &[]).await;
    let app = hub.create_channel("app", NOWHERE, true, &[]).await;
    for ch in [&web, &app] {
        let (secret, public_id) = url_parts(&hub, ch);
        assert_unguessable("random string", &secret);
        assert_unguessable("public id", &public_id);
        assert_eq!(public_id, ch.public_id);
        assert_ne!(secret, public_id);
        assert_eq!(ch.status_url, format!("{}/status", ch.endpoint_url));
    }
    assert_ne!(web.public_id, app.public_id);

    let listed = admin_channels(&hub).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    for ch in [&web, &app] {
        let found = listed
            .iter()
            .find(|c| c["public_id"] == ch.public_id.as_str())
            .unwrap_or_else(|| panic!("{} not listed", ch.public_id));
        assert_eq!(found["endpoint_url"], ch.endpoint_url.as_str());
        assert_eq!(found["status_url"], ch.status_url.as_str());
        assert_eq!(found["name"], ch.raw["name"]);
    }
    hub.shutdown().await;
}

/// The channels the admin API lists.
async fn admin_channels(hub: &TestHub) -> Vec<Value> {
    let req = hub.http.get(hub.url("/admin/v1/channels"));
    let a = answer(req.bearer_auth(ADMIN_TOKEN).send().await.expect("admin")).await;
    assert_eq!(a.status, 200, "{a:?}");
    let v: Value = serde_json::from_str(&a.body).expect("channel list");
    v["channels"].as_array().cloned().unwrap_or_default()
}

/// An answer of the admin API: `expected` status with `{"error":{code,message}}`.
fn assert_json_error(label: &str, a: &Answer, expected: u16) {
    let v: Value = serde_json::from_str(&a.body).unwrap_or(Value::Null);
    let filled = |ptr: &str| {
        v.pointer(ptr)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    assert!(
        a.status == expected && filled("/error/code") && filled("/error/message"),
        "{label}: expected {expected} with a JSON error, got {a:?}"
    );
}

#[tokio::test]
async fn the_admin_api_requires_the_admin_token() {
    let hub = TestHub::start().await;
    let body = json!({ "name": "web", "customer_endpoint": NOWHERE });
    for token in [
        None,
        Some("wrong-token"),
        Some("test-admin-token-012345678"),
    ] {
        let mut post = hub.http.post(hub.url("/admin/v1/channels")).json(&body);
        let mut list = hub.http.get(hub.url("/admin/v1/channels"));
        if let Some(t) = token {
            post = post.bearer_auth(t);
            list = list.bearer_auth(t);
        }
        for req in [post, list] {
            let a = answer(req.send().await.expect("admin request")).await;
            assert_json_error(&format!("token {token:?}"), &a, 401);
        }
    }
    // Nothing was created by the refused requests.
    assert!(admin_channels(&hub).await.is_empty());
    hub.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_refuses_bad_and_duplicate_channels() {
    let hub = TestHub::start().await;
    let cases = [
        ("missing name", json!({ "customer_endpoint": NOWHERE })),
        (
            "empty name",
            json!({ "name": " ", "customer_endpoint": NOWHERE }),
        ),
        (
            "ftp endpoint",
            json!({ "name": "a", "customer_endpoint": "ftp://example.com/hub" }),
        ),
        (
            "relative endpoint",
            json!({ "name": "b", "customer_endpoint": "/hub" }),
        ),
        ("missing endpoint", json!({ "name": "c" })),
    ];
    for (label, body) in cases {
        let resp = hub.admin_post("/admin/v1/channels", body).await;
        let a = answer(resp).await;
        assert_json_error(label, &a, 400);
    }
    let req = hub
        .http
        .post(hub.url("/admin/v1/channels"))
        .body("{not json");
    let a = answer(req.bearer_auth(ADMIN_TOKEN).send().await.expect("admin")).await;
    assert_json_error("malformed JSON", &a, 400);

    let first = hub.create_channel("web", NOWHERE, false, &[]).await;
    let resp = hub
        .admin_post(
            "/admin/v1/channels",
            json!({ "name": "web", "customer_endpoint": "https://other.example.com/hub" }),
        )
        .await;
    let a = answer(resp).await;
    assert_json_error("duplicate name", &a, 409);

    // The first channel is untouched and is the only one.
    let listed = admin_channels(&hub).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["public_id"], first.public_id.as_str());
    assert_eq!(listed[0]["customer_endpoint"], NOWHERE);
    hub.shutdown().await;
}

#[tokio::test]
async fn status_follows_the_assigned_agents_presence() {
    let desk = Desk::open().await;
    let stranger = desk.hub.create_agent("Bob", "bob@example.com").await;
    desk.assert_status("0", "nobody online").await;

    stranger.set_online(true).await;
    desk.assert_status("0", "an agent of no channel is online")
        .await;

    desk.agent.set_online(true).await;
    desk.assert_status("1", "Ann is online").await;

    desk.agent.set_online(false).await;
    desk.assert_status("0", "Ann went offline").await;
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn unknown_channel_addresses_answer_404() {
    let desk = Desk::open().await;
    desk.agent.set_online(true).await;
    let (secret, public_id) = url_parts(&desk.hub, &desk.ch);
    let other_id = "0123456789abcdef0123456789abcdef";
    let other_secret = "fedcba9876543210fedcba9876543210";
    assert_ne!(public_id, other_id);
    assert_ne!(secret, other_secret);
    let valid = from(json!(1), json!({ "type": "text", "text": "hi" })).to_string();
    for endpoint in [
        format!("{}/{secret}/{other_id}", desk.hub.base),
        format!("{}/{other_secret}/{public_id}", desk.hub.base),
        format!("{}/{public_id}/{secret}", desk.hub.base),
    ] {
        let a = desk.get(&format!("{endpoint}/status")).await;
        assert_eq!(a.status, 404, "status at {endpoint}: {a:?}");
        let a = desk.post_to(&endpoint, valid.clone()).await;
        assert_eq!(a.status, 404, "message to {endpoint}: {a:?}");
    }
    assert!(
        desk.all_chats().await.is_empty(),
        "a misaddressed message was stored"
    );
    // The right address works.
    desk.assert_status("1", "the right address").await;
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn malformed_bodies_are_refused() {
    let text = json!({ "type": "text", "text": "hi" });
    assert_all_refused(vec![
        ("malformed JSON".into(), "{\"sender\": {\"id\": 1},".into()),
        ("empty body".into(), String::new()),
        (
            "array body".into(),
            json!([from(json!(1), text.clone())]).to_string(),
        ),
        ("string body".into(), json!("hello").to_string()),
        ("number body".into(), "1".into()),
        (
            "missing sender".into(),
            json!({ "message": text }).to_string(),
        ),
        (
            "sender not an object".into(),
            json!({ "sender": 1, "message": text }).to_string(),
        ),
        (
            "missing message".into(),
            json!({ "sender": { "id": 1 } }).to_string(),
        ),
        (
            "message not an object".into(),
            json!({ "sender": { "id": 1 }, "message": "hi" }).to_string(),
        ),
    ])
    .await;
}

#[tokio::test]
async fn a_sender_without_a_usable_id_is_refused() {
    let text = json!({ "type": "text", "text": "hi" });
    let mut cases = vec![(
        "sender.id absent".to_owned(),
        json!({ "sender": { "name": "Eve" }, "message": text }).to_string(),
    )];
    for id in [
        json!(""),
        json!("   "),
        json!(null),
        json!([1]),
        json!({ "id": 1 }),
        json!(true),
        json!(1.5),
    ] {
        cases.push((
            format!("sender.id {id}"),
            from(id, text.clone()).to_string(),
        ));
    }
    assert_all_refused(cases).await;
}

#[tokio::test]
async fn a_message_without_a_known_type_or_text_is_refused() {
    assert_all_refused(message_cases(vec![
        ("type absent".into(), json!({ "text": "hi" })),
        (
            "type gif".into(),
            json!({ "type": "gif", "file": "https://x.example/a.gif" }),
        ),
        ("type number".into(), json!({ "type": 1, "text": "hi" })),
        ("text without text".into(), json!({ "type": "text" })),
        ("text null".into(), json!({ "type": "text", "text": null })),
        ("text a number".into(), json!({ "type": "text", "text": 5 })),
    ]))
    .await;
}

const MEDIA_TYPES: [&str; 6] = ["video", "audio", "voice", "photo", "sticker", "document"];

#[tokio::test]
async fn media_messages_need_file_name_and_size() {
    let mut cases = Vec::new();
    for kind in MEDIA_TYPES {
        for field in ["file", "file_name", "file_size"] {
            cases.push((
                format!("{kind} without {field}"),
                without(media(kind), field),
            ));
        }
    }
    assert_all_refused(message_cases(cases)).await;
}

#[tokio::test]
async fn media_sizes_and_dimensions_must_be_positive_integers() {
    let mut cases = Vec::new();
    for field in ["file_size", "duration", "width", "height"] {
        for bad in [json!(0), json!(-1), json!(1.5), json!("10"), json!(true)] {
            cases.push((
                format!("{field} {bad}"),
                with(media("video"), field, bad.clone()),
            ));
        }
    }
    assert_all_refused(message_cases(cases)).await;
}

#[tokio::test]
async fn links_must_be_http_or_https() {
    let mut cases = Vec::new();
    for bad in [
        "ftp://files.example.com/a.bin",
        "javascript:alert(1)",
        "file:///etc/passwd",
        "files.example.com/a.bin",
        "https://",
    ] {
        cases.push((
            format!("file {bad}"),
            with(media("photo"), "file", json!(bad)),
        ));
        cases.push((
            format!("file_url {bad}"),
            with(without(media("photo"), "file"), "file_url", json!(bad)),
        ));
        cases.push((
            format!("thumb {bad}"),
            with(media("photo"), "thumb", json!(bad)),
        ));
    }
    let mut cases = message_cases(cases);
    for bad in [
        "ftp://img.example.com/me.png",
        "javascript:alert(1)",
        "me.png",
    ] {
        cases.push((
            format!("sender.photo {bad}"),
            json!({ "sender": { "id": 1, "photo": bad },
                    "message": { "type": "text", "text": "hi" } })
            .to_string(),
        ));
    }
    assert_all_refused(cases).await;
}

#[tokio::test]
async fn a_location_needs_both_coordinates() {
    assert_all_refused(message_cases(vec![
        (
            "no latitude".into(),
            json!({ "type": "location", "longitude": 30.3 }),
        ),
        (
            "no longitude".into(),
            json!({ "type": "location", "latitude": 59.9 }),
        ),
        ("no coordinates".into(), json!({ "type": "location" })),
        (
            "latitude not a number".into(),
            json!({ "type": "location", "latitude": "north", "longitude": 30.3 }),
        ),
    ]))
    .await;
}

#[tokio::test]
async fn sender_id_may_be_an_integer_or_a_string() {
    let desk = Desk::open().await;
    for id in [json!(42), json!("user-42")] {
        desk.accepted(from(id.clone(), json!({ "type": "text", "text": "hi" })).to_string())
            .await;
    }
    let mut ids = Vec::new();
    for chat in desk.all_chats().await {
        ids.push(desk.agent.chat(id_of(&chat)).await["client"]["external_id"].clone());
    }
    assert_eq!(ids, vec![json!(42), json!("user-42")]);
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn every_media_type_is_accepted_and_stored() {
    let desk = Desk::open().await;
    for kind in MEDIA_TYPES {
        let message = json!({
            "type": kind, "id": format!("m-{kind}"),
            "file": format!("https://files.example.com/{kind}.bin"),
            "file_name": format!("{kind}.bin"), "file_size": 2048,
            "thumb": "http://files.example.com/thumb.png", "emoji": "🎵",
            "duration": 12, "width": 320, "height": 240,
            "text": "look", "performer": "Band", "title": "Song",
        });
        desk.accepted(from(json!(7), message).to_string()).await;
    }
    let bodies: Vec<Value> = desk
        .only_chat()
        .await
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m["body"].clone())
        .collect();
    assert_eq!(bodies.len(), MEDIA_TYPES.len());
    for (kind, body) in MEDIA_TYPES.iter().zip(&bodies) {
        assert_eq!(body["type"], *kind);
        assert_eq!(
            body["file"],
            format!("https://files.example.com/{kind}.bin")
        );
        assert_eq!(body["file_name"], format!("{kind}.bin"));
        assert_eq!(body["file_size"], 2048);
        assert_eq!(body["thumb"], "http://files.example.com/thumb.png");
        assert_eq!(
            (&body["duration"], &body["width"], &body["height"]),
            (&json!(12), &json!(320), &json!(240))
        );
        assert_eq!(body["text"], "look");
    }
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn a_location_is_accepted_and_stored() {
    let desk = Desk::open().await;
    desk.accepted(
        from(
            json!(7),
            json!({ "type": "location", "latitude": 59.93, "longitude": -30.5,
                        "title": "Office" }),
        )
        .to_string(),
    )
    .await;
    let body = desk.only_message().await;
    assert_eq!(body["type"], "location");
    assert_eq!(body["latitude"], 59.93);
    assert_eq!(body["longitude"], -30.5);
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn file_url_is_accepted_in_place_of_file() {
    let desk = Desk::open().await;
    let message = with(
        without(media("photo"), "file"),
        "file_url",
        json!("https://files.example.com/cat.jpg"),
    );
    desk.accepted(from(json!(7), message).to_string()).await;
    let body = desk.only_message().await;
    assert_eq!(body["type"], "photo");
    assert_eq!(body["file"], "https://files.example.com/cat.jpg");
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn long_text_is_cut_to_1000_characters() {
    let desk = Desk::open().await;
    for (sender, ch) in [(1, 'ж'), (2, '😀'), (3, 'a')] {
        let long: String = std::iter::repeat_n(ch, 1500).collect();
        desk.hub.say(&desk.ch, json!(sender), &long).await;
    }
    let short = "ж".repeat(1000);
    desk.hub.say(&desk.ch, json!(4), &short).await;
    let messages = desk.messages().await;
    assert_eq!(messages.len(), 4);
    for (m, ch) in messages.iter().zip(['ж', '😀', 'a', 'ж']) {
        let text = m["body"]["text"].as_str().expect("stored text");
        assert_eq!(
            text.chars().count(),
            1000,
            "stored {} chars",
            text.chars().count()
        );
        assert!(text.chars().all(|c| c == ch), "text was altered");
    }
    desk.hub.shutdown().await;
}

/// A text message from customer `id` whose JSON is `bytes` long (ASCII text).
fn message_of_size(id: i64, bytes: usize) -> String {
    let frame = from(json!(id), json!({ "type": "text", "text": "" })).to_string();
    let text = "x".repeat(bytes - frame.len());
    let body = from(json!(id), json!({ "type": "text", "text": text })).to_string();
    assert_eq!(body.len(), bytes);
    body
}

/// A body sent with `Transfer-Encoding: chunked`, in small pieces.
fn chunked(body: String) -> reqwest::Body {
    let pieces: Vec<Result<Bytes, std::io::Error>> = body
        .into_bytes()
        .chunks(100)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(pieces))
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_with_413() {
    let desk = Desk::open_with(HubOptions {
        max_body_bytes: 4096,
        ..HubOptions::default()
    })
    .await;
    let a = desk.post(message_of_size(1, 6000)).await;
    assert_eq!(a.status, 413, "Content-Length body: {a:?}");
    assert!(a.content_type.starts_with("text/plain"), "{a:?}");
    let a = desk.post(chunked(message_of_size(1, 6000))).await;
    assert_eq!(a.status, 413, "chunked body: {a:?}");
    assert!(
        desk.all_chats().await.is_empty(),
        "an oversized body was stored"
    );

    // Just under the limit passes, either way.
    desk.accepted(message_of_size(1, 4000)).await;
    desk.accepted(chunked(message_of_size(1, 4000))).await;
    assert_eq!(desk.messages().await.len(), 2);
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn chunked_and_content_length_bodies_are_both_stored() {
    let desk = Desk::open().await;
    let plain = from(json!(1), json!({ "type": "text", "text": "with length" })).to_string();
    desk.accepted(plain).await;
    let streamed = from(
        json!(1),
        json!({ "type": "text", "text": format!("chunked {}", "ж".repeat(300)) }),
    )
    .to_string();
    desk.accepted(chunked(streamed)).await;
    let texts: Vec<Value> = desk
        .messages()
        .await
        .iter()
        .map(|m| m["body"]["text"].clone())
        .collect();
    assert_eq!(
        texts,
        vec![
            json!("with length"),
            json!(format!("chunked {}", "ж".repeat(300)))
        ]
    );
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn typing_reaches_the_agent_but_is_not_stored() {
    let desk = Desk::open().await;
    desk.hub.say(&desk.ch, json!(5), "hello").await;
    let chat_id = id_of(&desk.all_chats().await[0]);
    let mut stream = desk.agent.stream().await;

    let typein = json!({ "type": "typein", "text": 5, "file": "ftp://x", "file_size": -1 });
    for (message, typing) in [(typein, true), (json!({ "type": "typeout" }), false)] {
        desk.accepted(from(json!("5"), message).to_string()).await;
        let ev = stream.expect("chat.typing", WAIT).await;
        assert_eq!(ev["chat_id"], chat_id);
        assert_eq!(ev["data"]["typing"], typing);
        assert_eq!(ev["data"]["by"], "client");
    }
    // Typing by a customer without a chat opens none.
    desk.accepted(from(json!(6), json!({ "type": "typein" })).to_string())
        .await;

    assert_eq!(desk.all_chats().await.len(), 1);
    let messages = desk.messages().await;
    assert_eq!(messages.len(), 1, "typing was stored: {messages:?}");
    assert_eq!(messages[0]["body"]["text"], "hello");
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn messages_are_grouped_into_chats_by_sender_id() {
    let desk = Desk::open().await;
    let other = desk
        .hub
        .create_channel("app", NOWHERE, false, &["ann@example.com"])
        .await;
    desk.hub.say(&desk.ch, json!(7), "one").await;
    desk.hub.say(&desk.ch, json!("7"), "two").await;
    desk.hub.say(&desk.ch, json!(7), "three").await;
    desk.hub.say(&desk.ch, json!(8), "other customer").await;
    desk.hub.say(&other, json!(7), "other channel").await;

    let chats = desk.all_chats().await;
    assert_eq!(chats.len(), 3, "{chats:?}");
    let mut texts = Vec::new();
    for chat in &chats {
        let view = desk.agent.chat(id_of(chat)).await;
        let t: Vec<Value> = view["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| m["body"]["text"].clone())
            .collect();
        texts.push(t);
    }
    assert_eq!(
        texts,
        vec![
            vec![json!("one"), json!("two"), json!("three")],
            vec![json!("other customer")],
            vec![json!("other channel")],
        ]
    );
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn a_message_after_the_chat_was_closed_opens_a_new_chat() {
    let desk = Desk::open().await;
    desk.hub.say(&desk.ch, json!(7), "first visit").await;
    let first = id_of(&desk.all_chats().await[0]);
    let (status, v) = desk
        .agent
        .post(&format!("/agent/v1/chats/{first}/close"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    desk.hub.say(&desk.ch, json!("7"), "second visit").await;

    let open = desk.agent.chats().await;
    assert_eq!(open.len(), 1, "{open:?}");
    let second = id_of(&open[0]);
    assert_ne!(second, first);
    let view = desk.agent.chat(second).await;
    assert_eq!(view["chat"]["state"], "open");
    let messages = view["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["body"]["text"], "second visit");
    let old = desk.agent.chat(first).await;
    assert_eq!(old["chat"]["state"], "closed");
    assert_eq!(old["messages"].as_array().map(Vec::len), Some(1));
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn the_senders_profile_reaches_the_agent_and_updates() {
    let desk = Desk::open().await;
    let mut stream = desk.agent.stream().await;
    let profile = json!({
        "id": "c-1", "name": "Maria", "phone": "+1 555 0100", "email": "maria@example.com",
        "photo": "https://img.example.com/maria.png", "url": "https://shop.example.com/cart",
        "invite": "Need help with your order?",
    });
    let text = json!({ "type": "text", "text": "hi" });
    desk.accepted(json!({ "sender": profile, "message": text }).to_string())
        .await;
    let opened = stream.expect("chat.opened", WAIT).await;
    assert_eq!(
        opened["data"]["client"]["invite"],
        "Need help with your order?"
    );
    assert_eq!(opened["data"]["client"]["name"], "Maria");

    let client = desk.only_chat().await["client"].clone();
    for key in ["name", "phone", "email", "photo", "url", "invite"] {
        assert_eq!(client[key], profile[key], "client.{key}");
    }
    assert_eq!(desk.agent.chats().await[0]["client_name"], "Maria");

    // A new name replaces the old one; fields left out keep their values.
    let renamed = json!({ "id": "c-1", "name": "Maria K." });
    desk.accepted(json!({ "sender": renamed, "message": text }).to_string())
        .await;
    desk.hub.say(&desk.ch, json!("c-1"), "bare").await;
    let client = desk.only_chat().await["client"].clone();
    assert_eq!(client["name"], "Maria K.");
    for key in ["phone", "email", "photo", "url", "invite"] {
        assert_eq!(client[key], profile[key], "client.{key} was lost");
    }
    assert_eq!(desk.agent.chats().await[0]["client_name"], "Maria K.");
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn a_customer_without_a_name_appears_as_anonymous() {
    let desk = Desk::open().await;
    desk.hub.say(&desk.ch, json!(1), "no name").await;
    desk.accepted(
        json!({ "sender": { "id": 2, "name": "" },
                    "message": { "type": "text", "text": "empty name" } })
        .to_string(),
    )
    .await;
    let chats = desk.all_chats().await;
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert_eq!(chat["client_name"], "Anonymous");
        let view = desk.agent.chat(id_of(chat)).await;
        assert_eq!(view["client"]["name"], "Anonymous");
    }
    desk.hub.shutdown().await;
}

/// A hub whose `[server]` read timeouts are short enough for a test.
async fn desk_with_timeouts(header_timeout_ms: u64, body_timeout_ms: u64) -> Desk {
    let hub = TestHub::start_with_config(HubOptions::default(), |c| {
        c.server.header_timeout_ms = header_timeout_ms;
        c.server.body_timeout_ms = body_timeout_ms;
    })
    .await;
    let agent = hub.create_agent("Ann", "ann@example.com").await;
    let ch = hub
        .create_channel("web", NOWHERE, false, &["ann@example.com"])
        .await;
    Desk { hub, agent, ch }
}

/// What a raw TCP client saw of a request it sent slowly.
#[derive(Debug)]
struct Slow {
    /// Everything the hub sent back.
    response: String,
    /// From the connection to the end of the answer.
    elapsed: Duration,
    /// The hub closed the connection (a read returned 0), rather than the
    /// client giving up waiting or the connection being reset.
    closed: bool,
}

/// Connects to the hub, sends `head`, then one byte of `trickle` every
/// `every` until the hub starts answering, and reads until the hub closes the
/// connection (or 10 s pass).
async fn slow_request(hub: &TestHub, head: &str, trickle: &[u8], every: Duration) -> Slow {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let addr = hub.base.trim_start_matches("http://");
    let started = std::time::Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the hub");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send the head");
    let mut response = Vec::new();
    let mut pending = trickle.iter();
    let mut tick = tokio::time::interval(every);
    tick.tick().await; // the first tick is immediate
    let give_up = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(give_up);
    let mut buf = [0u8; 1024];
    let closed = loop {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) => break true,
                Ok(n) => response.extend_from_slice(&buf[..n]),
                Err(_) => break false,
            },
            _ = tick.tick(), if response.is_empty() => {
                if let Some(byte) = pending.next() {
                    // The hub may have closed already; the read says so.
                    let _ = stream.write_all(&[*byte]).await;
                }
            }
            _ = &mut give_up => break false,
        }
    };
    Slow {
        response: String::from_utf8_lossy(&response).into_owned(),
        elapsed: started.elapsed(),
        closed,
    }
}

fn path_of(url: &str) -> &str {
    let rest = url.trim_start_matches("http://");
    rest.find('/').map_or("/", |i| &rest[i..])
}

#[tokio::test]
async fn a_body_sent_too_slowly_gets_408_and_a_closed_connection() {
    let desk = desk_with_timeouts(10_000, 1500).await;
    let body = from(json!("slow"), json!({ "type": "text", "text": "trickled" })).to_string();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: hub\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n",
        path_of(&desk.ch.endpoint_url)
    );
    let slow = slow_request(&desk.hub, &head, body.as_bytes(), Duration::from_secs(1)).await;
    assert!(slow.response.starts_with("HTTP/1.1 408"), "{slow:?}");
    assert!(
        slow.response
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{slow:?}"
    );
    assert!(slow.response.contains("text/plain"), "{slow:?}");
    assert!(slow.closed, "the connection stayed open: {slow:?}");
    assert!(
        slow.elapsed >= Duration::from_millis(1400) && slow.elapsed < Duration::from_secs(5),
        "answered after {:?}",
        slow.elapsed
    );
    assert!(desk.all_chats().await.is_empty(), "a slow body was stored");

    // The hub goes on serving others.
    desk.hub.say(&desk.ch, json!("fast"), "hello").await;
    assert_eq!(desk.messages().await.len(), 1);
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn headers_sent_too_slowly_get_408_and_a_closed_connection() {
    let desk = desk_with_timeouts(1000, 30_000).await;
    // Part of a head, then the rest a byte at a time: arriving bytes do not
    // extend the deadline.
    let head = format!("POST {} HTTP/1.1\r\n", path_of(&desk.ch.endpoint_url));
    let rest = b"Host: hub\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let slow = slow_request(&desk.hub, &head, rest, Duration::from_millis(200)).await;
    assert!(slow.response.starts_with("HTTP/1.1 408"), "{slow:?}");
    assert!(
        slow.response
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{slow:?}"
    );
    assert!(slow.closed, "the connection stayed open: {slow:?}");
    assert!(
        slow.elapsed >= Duration::from_millis(900) && slow.elapsed < Duration::from_secs(5),
        "answered after {:?}",
        slow.elapsed
    );

    // A connection that never sends a byte is closed too, without an answer
    // (it may be an idle keep-alive connection about to send a request).
    let idle = slow_request(&desk.hub, "", b"", Duration::from_secs(1)).await;
    assert!(idle.closed, "an idle connection stayed open: {idle:?}");
    assert_eq!(idle.response, "", "{idle:?}");
    assert!(idle.elapsed < Duration::from_secs(5), "{idle:?}");

    assert!(
        desk.all_chats().await.is_empty(),
        "a slow request was stored"
    );
    desk.hub.shutdown().await;
}

#[tokio::test]
async fn duplicate_keys_are_refused_with_400_naming_the_key() {
    let desk = Desk::open().await;
    for (body, reason) in [
        (
            r#"{"sender":{"id":"a"},"sender":{"id":"b"},"message":{"type":"text","text":"hi"}}"#,
            r#"duplicate key "sender""#,
        ),
        (
            r#"{"sender":{"id":"a","id":"b"},"message":{"type":"text","text":"hi"}}"#,
            r#"duplicate key "id" in sender"#,
        ),
        (
            r#"{"sender":{"id":"a"},"message":{"type":"text","text":"hi","\u0074ext":"bye"}}"#,
            r#"duplicate key "text" in message"#,
        ),
    ] {
        let a = desk.post(body).await;
        assert_eq!(a.status, 400, "{body}: {a:?}");
        assert!(a.content_type.starts_with("text/plain"), "{a:?}");
        assert_eq!(a.body.trim_end(), reason, "{body}");
    }
    assert!(
        desk.all_chats().await.is_empty(),
        "a duplicate-key body was stored"
    );

    // The same key in two different objects is no duplicate.
    desk.accepted(r#"{"sender":{"id":"a"},"message":{"type":"text","text":"hi","id":"a"}}"#)
        .await;
    desk.hub.shutdown().await;
}

// ------------------------------------------------- concurrent customer messages

/// How many customer requests the concurrency tests keep in flight at once.
const IN_FLIGHT: usize = 32;

/// Every chat with its view, keyed by the sender's external id (as text);
/// fails if one sender has two chats.
async fn chat_per_sender(desk: &Desk) -> std::collections::BTreeMap<String, Value> {
    let mut by_sender = std::collections::BTreeMap::new();
    for chat in desk.all_chats().await {
        let view = desk.agent.chat(id_of(&chat)).await;
        let sender = match &view["client"]["external_id"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if let Some(earlier) = by_sender.insert(sender.clone(), view) {
            panic!(
                "sender {sender} has two chats: {} and {}",
                earlier["chat"]["id"],
                id_of(&chat)
            );
        }
    }
    by_sender
}

/// The texts of a chat view's messages, in the order the agent sees them.
fn texts_of(view: &Value) -> Vec<String> {
    view["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| m["body"]["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_senders_each_get_one_chat_holding_their_messages_in_order() {
    const SENDERS: usize = 20;
    const PER_SENDER: usize = 10;
    /// Each new sender's first messages go out together, so that a sender
    /// unknown to the database can have several messages in one batch.
    const OPENING: usize = 2;
    let desk = Desk::open().await;
    let gate = tokio::sync::Semaphore::new(IN_FLIGHT);
    let text = |s: usize, n: usize| format!("s{s:02} #{n:02}");
    let say = |s: usize, n: usize| {
        let (gate, desk) = (&gate, &desk);
        async move {
            let _permit = gate.acquire().await.expect("semaphore open");
            let a = desk
                .post(
                    from(
                        json!(format!("s{s:02}")),
                        json!({ "type": "text", "text": text(s, n) }),
                    )
                    .to_string(),
                )
                .await;
            assert_eq!(a.status, 200, "{}: {a:?}", text(s, n));
        }
    };
    let senders = (0..SENDERS).map(|s| async move {
        futures_util::future::join_all((0..OPENING).map(|n| say(s, n))).await;
        for n in OPENING..PER_SENDER {
            say(s, n).await;
        }
    });
    futures_util::future::join_all(senders).await;

    let chats = chat_per_sender(&desk).await;
    let expected: Vec<String> = (0..SENDERS).map(|s| format!("s{s:02}")).collect();
    assert_eq!(
        chats.keys().cloned().collect::<Vec<_>>(),
        expected,
        "one chat per sender"
    );
    for (s, (sender, view)) in chats.iter().enumerate() {
        let texts = texts_of(view);
        assert_eq!(texts.len(), PER_SENDER, "{sender}'s chat: {texts:?}");
        // The opening messages were sent together: any order among them.
        let mut opening = texts[..OPENING].to_vec();
        opening.sort();
        let sent: Vec<String> = (0..OPENING).map(|n| text(s, n)).collect();
        assert_eq!(
            opening, sent,
            "{sender}'s chat starts with its opening messages"
        );
        let sent: Vec<String> = (OPENING..PER_SENDER).map(|n| text(s, n)).collect();
        assert_eq!(
            texts[OPENING..],
            sent[..],
            "{sender}'s chat holds its messages in the order sent"
        );
        assert_eq!(view["chat"]["state"], "open", "{sender}: {}", view["chat"]);
    }
    desk.hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn visitor_numbers_stay_unique_and_consecutive_when_new_senders_write_at_once() {
    const SENDERS: usize = 40;
    let desk = Desk::open().await;
    let gate = tokio::sync::Semaphore::new(IN_FLIGHT);
    // Every message at once, a sender's own ones included: some senders write
    // two or three times (each write upserts the client).
    let sends = (0..SENDERS).flat_map(|s| (0..=s % 3).map(move |n| (s, n)));
    futures_util::future::join_all(sends.map(|(s, n)| {
        let (gate, desk) = (&gate, &desk);
        async move {
            let _permit = gate.acquire().await.expect("semaphore open");
            let body = from(
                json!(format!("v{s:02}")),
                json!({ "type": "text", "text": format!("m{n}") }),
            );
            let a = desk.post(body.to_string()).await;
            assert_eq!(a.status, 200, "v{s:02} m{n}: {a:?}");
        }
    }))
    .await;

    let chats = chat_per_sender(&desk).await;
    assert_eq!(
        chats.len(),
        SENDERS,
        "one chat per sender: {:?}",
        chats.keys()
    );
    let mut numbers: Vec<i64> = chats
        .values()
        .map(|view| {
            view["client"]["visitor_number"]
                .as_i64()
                .unwrap_or_else(|| panic!("no visitor number: {}", view["client"]))
        })
        .collect();
    numbers.sort_unstable();
    let expected: Vec<i64> = (1..=SENDERS as i64).collect();
    assert_eq!(
        numbers, expected,
        "visitor numbers of {SENDERS} new senders"
    );

    // The sequence went on from there: the next new sender is SENDERS + 1,
    // and a known sender keeps its number.
    desk.hub.say(&desk.ch, json!("late"), "hello").await;
    desk.hub.say(&desk.ch, json!("v00"), "again").await;
    let chats = chat_per_sender(&desk).await;
    assert_eq!(
        chats["late"]["client"]["visitor_number"],
        json!(SENDERS + 1),
        "the sender after the burst"
    );
    let numbers: std::collections::BTreeSet<i64> = chats
        .values()
        .filter_map(|v| v["client"]["visitor_number"].as_i64())
        .collect();
    assert_eq!(numbers.len(), SENDERS + 1, "numbers stay unique");
    desk.hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_profile_change_in_a_burst_still_sends_chat_updated() {
    let receiver = Integrator::start().await;
    let hub = TestHub::start().await;
    let agent = hub.create_agent("Ann", "ann@example.com").await;
    let resp = hub
        .admin_post(
            "/admin/v1/channels",
            json!({ "name": "web", "customer_endpoint": NOWHERE,
                    "agents": ["ann@example.com"], "webhook_url": receiver.url }),
        )
        .await;
    assert_eq!(resp.status(), 201, "channel creation");
    let raw: Value = resp.json().await.expect("channel json");
    let ch = TestChannel {
        public_id: raw["public_id"].as_str().expect("public_id").to_owned(),
        endpoint_url: raw["endpoint_url"].as_str().expect("endpoint").to_owned(),
        status_url: raw["status_url"].as_str().expect("status").to_owned(),
        raw,
    };
    let desk = Desk { hub, agent, ch };

    // Ten customers with chats: r0..r4 will give a new name, k0..k4 will
    // send the profile they have.
    let known = |p: &'static str| (0..5).map(move |i| format!("{p}{i}"));
    for id in known("r").chain(known("k")) {
        let body = json!({ "sender": { "id": id, "name": format!("old {id}") },
                           "message": { "type": "text", "text": "hi" } });
        desk.accepted(body.to_string()).await;
    }
    // The burst: the renames among the others' messages and new customers'.
    let mut burst = Vec::new();
    for i in 0..5 {
        for n in 0..3 {
            burst.push(
                json!({ "sender": { "id": format!("n{i}-{n}"), "name": "New" },
                               "message": { "type": "text", "text": "first" } }),
            );
            burst.push(
                json!({ "sender": { "id": format!("k{i}"), "name": format!("old k{i}") },
                               "message": { "type": "text", "text": format!("same {n}") } }),
            );
        }
        burst.push(
            json!({ "sender": { "id": format!("r{i}"), "name": format!("new r{i}") },
                           "message": { "type": "text", "text": "call me by my new name" } }),
        );
    }
    let gate = tokio::sync::Semaphore::new(IN_FLIGHT);
    futures_util::future::join_all(burst.iter().map(|body| {
        let (gate, desk) = (&gate, &desk);
        async move {
            let _permit = gate.acquire().await.expect("semaphore open");
            let a = desk.post(body.to_string()).await;
            assert_eq!(a.status, 200, "{body}: {a:?}");
        }
    }))
    .await;

    let chats = chat_per_sender(&desk).await;
    let renamed: std::collections::BTreeMap<i64, String> = known("r")
        .map(|id| (id_of(&chats[&id]["chat"]), format!("new {id}")))
        .collect();
    receiver.wait_for(renamed.len(), WAIT).await;
    // Time for a wrong extra one to arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut updated = std::collections::BTreeMap::new();
    for r in receiver.requests() {
        let e = r.json();
        assert_eq!(
            e["event_name"], "chat_updated",
            "only renames send webhooks: {e}"
        );
        let chat = e["chat_id"].as_i64().expect("chat_id");
        let name = e["visitor"]["name"].as_str().unwrap_or_default().to_owned();
        if let Some(twice) = updated.insert(chat, name) {
            panic!("chat {chat} got chat_updated twice (first named {twice}): {e}");
        }
    }
    assert_eq!(
        updated, renamed,
        "one chat_updated per renamed chat, with the new name"
    );
    desk.hub.shutdown().await;
}
