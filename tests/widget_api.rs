//! The website widget's HTTP API end to end, without a browser: widget
//! channels (admin API and `hub.toml`), the script and the demo page, visitor
//! sessions and their signed tokens, the visitor ↔ agent conversation live in
//! both directions, every `widget_api` call a page makes, CORS and
//! `allowed_origins`, two visitors kept apart, and a bot on a widget.

use std::time::Duration;

use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::support::{
    ADMIN_TOKEN, HubOptions, Integrator, Recorded, Reply, Sse, TestAgent, TestHub, eventually,
};

/// Generous: CI machines are slow and have two cores.
const WAIT: Duration = Duration::from_secs(10);
/// The visitor's stream looks at the agents' status every 5 s.
const MODE_WAIT: Duration = Duration::from_secs(20);
/// The widget id of the `Site`'s channel, as an operator would keep it.
const WIDGET_ID: &str = "shop-widget-01";
/// The site the `Site`'s pages are on.
const PAGE: &str = "https://shop.example.com/boots";

/// Fast webhook policies: the receiver hears within milliseconds.
const FAST_WEBHOOKS: &str = "[webhooks]\nsync_attempts = 2\nsync_timeout_ms = 500\n\
     sync_retry_interval_ms = 100\nattempts = 3\ntimeout_ms = 500\nretry_interval_ms = 100\n\
     backoff = 1.0\n";

/// Lets a request that should not happen have its chance to; only for
/// asserting that nothing arrives.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

/// An answer of the hub: status, headers and JSON body (`Null` if none).
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn status_body(self) -> (u16, Value) {
        (self.status, self.body)
    }
}

/// A request as a page's script makes it: an optional visitor token
/// (`Authorization: Bearer`), an optional `Origin`, an optional JSON body.
async fn request(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    token: Option<&str>,
    origin: Option<&str>,
    body: Option<&Value>,
) -> Answer {
    let mut req = http.request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("request to the hub");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

/// An admin request; the status and the JSON answer.
async fn admin(hub: &TestHub, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    hub.admin(method, path, body).await
}

/// Asserts the widget's refusal: the status and `{"result":"fail","reason"}`.
fn assert_fail(label: &str, (status, body): &(u16, Value), expected: u16) {
    assert_eq!(*status, expected, "{label}: {body}");
    assert_eq!(body["result"], "fail", "{label}: {body}");
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{label}: a fail result needs a reason: {body}"
    );
}

/// The page the `Site`'s sessions report.
fn page() -> Value {
    json!({ "url": PAGE, "title": "Winter boots", "referrer": "https://search.example/?q=boots" })
}

/// A hub with the widget channel `shop` (`WIDGET_ID`) answered by agent Ann,
/// whose event webhooks go to a loopback receiver.
struct Site {
    hub: TestHub,
    ann: TestAgent,
    /// The channel's `webhook_url`.
    receiver: Integrator,
}

impl Site {
    async fn open() -> Site {
        Site::with(json!({})).await
    }

    /// A site whose channel body also has `extra`'s fields.
    async fn with(extra: Value) -> Site {
        let receiver = Integrator::start().await;
        let hub = TestHub::start_with(HubOptions {
            extra_toml: FAST_WEBHOOKS.to_owned(),
            ..HubOptions::default()
        })
        .await;
        let ann = hub.create_agent("Ann", "ann@example.com").await;
        let mut body = json!({ "name": "shop", "type": "widget", "widget_id": WIDGET_ID,
                               "agents": ["ann@example.com"], "webhook_url": receiver.url });
        for (k, v) in extra.as_object().expect("extra fields") {
            body[k] = v.clone();
        }
        let (status, channel) = admin(&hub, Method::POST, "/admin/v1/channels", Some(body)).await;
        assert_eq!(status, 201, "widget channel creation: {channel}");
        Site { hub, ann, receiver }
    }

    /// The URL of `/widget/v1/<WIDGET_ID>/<endpoint>`.
    fn api(&self, endpoint: &str) -> String {
        self.hub.url(&format!("/widget/v1/{WIDGET_ID}/{endpoint}"))
    }

    /// `POST …/session`, with the visitor's token if the page has one.
    async fn session(&self, token: Option<&str>) -> Value {
        self.session_on(page(), token).await
    }

    async fn session_on(&self, page: Value, token: Option<&str>) -> Value {
        let mut body = json!({ "page": page });
        if let Some(t) = token {
            body["token"] = json!(t);
        }
        let answer = request(
            &self.hub.http,
            Method::POST,
            &self.api("session"),
            None,
            None,
            Some(&body),
        )
        .await;
        assert_eq!(answer.status, 200, "session: {}", answer.body);
        assert_eq!(answer.body["result"], "ok", "session: {}", answer.body);
        answer.body
    }

    /// A new visitor: a page opened without a token.
    async fn visitor(&self) -> Visitor {
        let session = self.session(None).await;
        Visitor::from_session(&self.hub, &self.api(""), &session)
    }

    /// The visitor's latest chat, as Ann finds it (a session would record
    /// a page view).
    async fn chat_of(&self, visitor: &Visitor) -> i64 {
        let (status, listed) = self.ann.get("/agent/v1/chats?state=all").await;
        assert_eq!(status, 200, "{listed}");
        let mut found = None;
        for chat in listed["chats"].as_array().expect("chats") {
            let id = chat["id"].as_i64().expect("chat id");
            if self.ann.chat(id).await["client"]["external_id"] == visitor.id {
                found = found.max(Some(id));
            }
        }
        found.unwrap_or_else(|| panic!("Ann finds no chat of visitor {}", visitor.id))
    }

    /// Webhooks named `name` the receiver got so far.
    fn webhooks(&self, name: &str) -> Vec<Value> {
        self.receiver
            .requests()
            .iter()
            .map(Recorded::json)
            .filter(|w| w["event_name"] == name)
            .collect()
    }

    /// Waits for a webhook named `name` that `matches`.
    async fn webhook(&self, name: &str, matches: impl Fn(&Value) -> bool) -> Value {
        eventually(WAIT, &format!("a matching {name} webhook"), || {
            let found = self.webhooks(name).into_iter().find(|w| matches(w));
            async move { found }
        })
        .await
    }

    async fn act(&self, chat: i64, action: &str) {
        let (status, v) = self
            .ann
            .post(&format!("/agent/v1/chats/{chat}/{action}"), json!({}))
            .await;
        assert_eq!(status, 200, "{action} chat {chat}: {v}");
    }

    /// Deliveries in `state` (`pending`, `failed`) as the admin API lists them.
    async fn deliveries(&self, state: &str) -> Vec<Value> {
        let (status, v) = admin(
            &self.hub,
            Method::GET,
            &format!("/admin/v1/deliveries?state={state}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{v}");
        v["deliveries"].as_array().cloned().unwrap_or_default()
    }

    /// A widget has no integrator: apart from webhooks, no delivery waits or failed.
    async fn assert_nothing_sent_to_an_integrator(&self) {
        for state in ["pending", "failed"] {
            let stuck: Vec<Value> = self
                .deliveries(state)
                .await
                .into_iter()
                .filter(|d| {
                    !d["kind"]
                        .as_str()
                        .is_some_and(|k| k.starts_with("webhook."))
                })
                .collect();
            assert!(stuck.is_empty(), "{state} deliveries: {stuck:?}");
        }
    }
}

/// A visitor's page: their token and the widget API's base URL.
struct Visitor {
    token: String,
    id: Value,
    number: i64,
    /// `<hub>/widget/v1/<widget_id>/`.
    base: String,
    http: reqwest::Client,
}

impl Visitor {
    fn from_session(hub: &TestHub, base: &str, session: &Value) -> Visitor {
        Visitor {
            token: session["token"].as_str().expect("a token").to_owned(),
            id: session["visitor"]["id"].clone(),
            number: session["visitor"]["number"]
                .as_i64()
                .expect("a visitor number"),
            base: base.to_owned(),
            http: hub.http.clone(),
        }
    }

    async fn call(&self, method: Method, endpoint: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{endpoint}", self.base);
        let a = request(
            &self.http,
            method,
            &url,
            Some(&self.token),
            None,
            body.as_ref(),
        )
        .await;
        (a.status, a.body)
    }

    async fn post(&self, endpoint: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, endpoint, Some(body)).await
    }

    /// A call that must succeed with `{"result":"ok"}`.
    async fn ok(&self, endpoint: &str, body: Value) {
        let answer = self.post(endpoint, body.clone()).await;
        assert_eq!(
            answer,
            (200, json!({ "result": "ok" })),
            "{endpoint} {body}"
        );
    }

    /// Sends `text`; returns the stored message.
    async fn say(&self, text: &str) -> Value {
        let (status, v) = self.post("messages", json!({ "text": text })).await;
        assert_eq!(status, 200, "message {text:?}: {v}");
        assert_eq!(v["result"], "ok", "{v}");
        v["message"].clone()
    }

    /// `GET …/messages`.
    async fn history(&self) -> Vec<Value> {
        let (status, v) = self.call(Method::GET, "messages", None).await;
        assert_eq!(status, 200, "history: {v}");
        assert_eq!(v["result"], "ok", "{v}");
        v["messages"].as_array().cloned().expect("messages")
    }

    /// The page's live stream, the token in the query as `EventSource` sends it.
    async fn stream(&self) -> Sse {
        Sse::open(&format!("{}stream?token={}", self.base, self.token)).await
    }
}

/// Texts of messages.
fn texts(messages: &[Value]) -> Vec<&str> {
    messages.iter().filter_map(|m| m["text"].as_str()).collect()
}

/// The next agent stream event `name` about `chat`; its `data`.
async fn desk_event(sse: &mut Sse, chat: i64, name: &str) -> Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match sse.next(left).await {
            Some((n, e)) if n == name && e["chat_id"] == chat => return e["data"].clone(),
            Some(_) => continue,
            None => panic!("no `{name}` about chat {chat} on the agent's stream"),
        }
    }
}

/// Reads a visitor's stream until a `message` with `text` arrives; returns
/// every event seen on the way, that one last.
async fn until_message(sse: &mut Sse, text: &str) -> Vec<(String, Value)> {
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some((name, data)) = sse.next(left).await else {
            panic!("no message {text:?} on the visitor's stream; saw {seen:?}");
        };
        let done = name == "message" && data["text"] == text;
        seen.push((name, data));
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn a_widget_channel_is_created_with_its_embed_code_and_custom_channels_refuse_widget_settings()
 {
    let hub = TestHub::start().await;
    let (status, ch) = admin(
        &hub,
        Method::POST,
        "/admin/v1/channels",
        Some(
            json!({ "name": "shop", "type": "widget", "widget_id": "shop-widget-01",
                     "color": "#ff5722", "allowed_origins": ["https://shop.example.com"],
                     "agents": [] }),
        ),
    )
    .await;
    assert_eq!(status, 201, "{ch}");
    assert_eq!(ch["type"], "widget", "{ch}");
    let host = hub.base.strip_prefix("http://").expect("an http base");
    assert_eq!(
        ch["widget"],
        json!({
            "widget_id": "shop-widget-01",
            "script_url": format!("{}/widget/shop-widget-01", hub.base),
            "embed": format!("<script src=\"//{host}/widget/shop-widget-01\" async></script>"),
            "demo_url": format!("{}/demo/shop-widget-01", hub.base),
            "color": "#ff5722",
            "allowed_origins": ["https://shop.example.com"],
        }),
        "{ch}"
    );

    // Without an id the hub picks one; the colour has its default.
    let (status, blog) = admin(
        &hub,
        Method::POST,
        "/admin/v1/channels",
        Some(json!({ "name": "blog", "type": "widget" })),
    )
    .await;
    assert_eq!(status, 201, "{blog}");
    let id = blog["widget"]["widget_id"]
        .as_str()
        .expect("a random widget id");
    assert!(id.len() >= 6, "{blog}");
    assert_eq!(blog["widget"]["color"], "#1e88e5", "{blog}");
    assert_eq!(blog["widget"]["allowed_origins"], json!([]), "{blog}");
    let script = hub
        .http
        .get(blog["widget"]["script_url"].as_str().expect("script_url"))
        .send()
        .await
        .expect("script request");
    assert_eq!(script.status(), 200, "the random id's script is served");

    let endpoint = "http://127.0.0.1:9/hub";
    for (label, body) in [
        (
            "a custom channel with a colour",
            json!({ "name": "c1", "customer_endpoint": endpoint, "color": "#ff5722" }),
        ),
        (
            "a custom channel with a widget id",
            json!({ "name": "c2", "customer_endpoint": endpoint, "widget_id": "abcdef123" }),
        ),
        (
            "a custom channel with allowed origins",
            json!({ "name": "c3", "customer_endpoint": endpoint,
                    "allowed_origins": ["https://shop.example.com"] }),
        ),
        (
            "a custom channel without an endpoint",
            json!({ "name": "c4" }),
        ),
        (
            "a widget id of 3 characters",
            json!({ "name": "w1", "type": "widget", "widget_id": "abc" }),
        ),
        (
            "a widget id with a slash",
            json!({ "name": "w2", "type": "widget", "widget_id": "abc/def/ghi" }),
        ),
        (
            "a colour by name",
            json!({ "name": "w3", "type": "widget", "color": "blue" }),
        ),
        (
            "an origin with a path",
            json!({ "name": "w4", "type": "widget",
                    "allowed_origins": ["https://shop.example.com/page"] }),
        ),
    ] {
        let (status, v) = admin(&hub, Method::POST, "/admin/v1/channels", Some(body)).await;
        assert_eq!(status, 400, "{label}: {v}");
    }
    let (status, v) = admin(
        &hub,
        Method::POST,
        "/admin/v1/channels",
        Some(json!({ "name": "shop2", "type": "widget", "widget_id": "shop-widget-01" })),
    )
    .await;
    assert_eq!(status, 409, "a widget id taken: {v}");

    let (_, listed) = admin(&hub, Method::GET, "/admin/v1/channels", None).await;
    let names: Vec<&str> = listed["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "only the two good channels exist: {names:?}"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn the_script_is_served_as_cacheable_javascript_with_the_widgets_configuration() {
    let site = Site::with(json!({ "color": "#ff5722" })).await;
    let hub = &site.hub;
    let mut etags = Vec::new();
    for path in [
        format!("/widget/{WIDGET_ID}"),
        format!("/script/widget/{WIDGET_ID}"),
    ] {
        let resp = hub.http.get(hub.url(&path)).send().await.expect("script");
        assert_eq!(resp.status(), 200, "{path}");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(
            header("content-type").as_deref(),
            Some("application/javascript; charset=utf-8"),
            "{path}"
        );
        assert_eq!(
            header("cache-control").as_deref(),
            Some("public, max-age=300"),
            "{path}"
        );
        let etag = header("etag").unwrap_or_else(|| panic!("{path} has no ETag"));
        let body = resp.text().await.expect("script text");
        let first = body.lines().next().unwrap_or_default();
        let config = first
            .strip_prefix("var HUB_WIDGET = ")
            .and_then(|c| c.strip_suffix(';'))
            .unwrap_or_else(|| panic!("{path} starts with {first:?}"));
        let config: Value = serde_json::from_str(config).expect("the configuration is JSON");
        assert_eq!(
            config,
            json!({ "widget_id": WIDGET_ID, "color": "#ff5722", "base": hub.base }),
            "{path}"
        );
        assert!(
            body.len() > first.len() + 1000,
            "{path}: the script follows its configuration"
        );

        // A page that has it revalidates for nothing.
        let again = hub
            .http
            .get(hub.url(&path))
            .header("if-none-match", &etag)
            .send()
            .await
            .expect("revalidation");
        assert_eq!(again.status(), 304, "{path} with its ETag");
        assert!(again.bytes().await.expect("body").is_empty());
        let stale = hub
            .http
            .get(hub.url(&path))
            .header("if-none-match", "\"stale\"")
            .send()
            .await
            .expect("revalidation");
        assert_eq!(stale.status(), 200, "{path} with another ETag");
        etags.push(etag);
    }
    assert_eq!(etags[0], etags[1], "both paths serve the same script");

    let demo = hub
        .http
        .get(hub.url(&format!("/demo/{WIDGET_ID}")))
        .send()
        .await
        .expect("demo page");
    assert_eq!(demo.status(), 200);
    assert!(
        demo.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/html")),
        "{:?}",
        demo.headers()
    );
    let html = demo.text().await.expect("demo html");
    assert!(
        html.contains(&format!("/widget/{WIDGET_ID}")),
        "the demo page embeds the widget: {html}"
    );

    // Neither an unknown id nor a custom channel's id is a widget.
    let integrator = Integrator::start().await;
    let custom = hub
        .create_channel("api", &integrator.url, false, &["ann@example.com"])
        .await;
    for path in [
        "/widget/no-such-widget".to_owned(),
        "/script/widget/no-such-widget".to_owned(),
        "/demo/no-such-widget".to_owned(),
        format!("/widget/{}", custom.public_id),
        format!("/demo/{}", custom.public_id),
    ] {
        let resp = hub.http.get(hub.url(&path)).send().await.expect("request");
        assert_eq!(resp.status(), 404, "{path}");
    }
    let (status, v) = request(
        &hub.http,
        Method::POST,
        &hub.url(&format!("/widget/v1/{}/session", custom.public_id)),
        None,
        None,
        Some(&json!({ "page": page() })),
    )
    .await
    .status_body();
    assert_eq!(status, 404, "a session on a custom channel: {v}");
    site.hub.shutdown().await;
}

#[tokio::test]
async fn a_widget_declared_in_hub_toml_serves_its_script_and_its_visitors_across_a_restart() {
    let hub = TestHub::start_with(HubOptions {
        extra_toml: "[[channels]]\nname = \"site\"\ntype = \"widget\"\n\
                     widget_id = \"declared-01\"\ncolor = \"#00aa55\"\n\
                     allowed_origins = [\"https://shop.example.com\"]\n\
                     agents = [\"ann@example.com\"]\n"
            .to_owned(),
        ..HubOptions::default()
    })
    .await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    let (_, listed) = admin(&hub, Method::GET, "/admin/v1/channels", None).await;
    let site = listed["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .find(|c| c["name"] == "site")
        .cloned()
        .unwrap_or_else(|| panic!("the declared widget is listed: {listed}"));
    assert_eq!(site["type"], "widget", "{site}");
    assert_eq!(site["widget"]["widget_id"], "declared-01", "{site}");
    assert_eq!(site["widget"]["color"], "#00aa55", "{site}");
    assert_eq!(
        site["widget"]["allowed_origins"],
        json!(["https://shop.example.com"])
    );
    let script = hub
        .http
        .get(hub.url("/widget/declared-01"))
        .send()
        .await
        .expect("script")
        .text()
        .await
        .expect("script text");
    assert!(
        script.starts_with("var HUB_WIDGET = {") && script.contains("\"#00aa55\""),
        "{}",
        &script[..script.len().min(200)]
    );

    let base = hub.url("/widget/v1/declared-01/");
    let first = request(
        &hub.http,
        Method::POST,
        &format!("{base}session"),
        None,
        Some("https://shop.example.com"),
        Some(&json!({ "page": page() })),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let session = first.body;
    assert_eq!(session["color"], "#00aa55", "{session}");
    assert_eq!(session["visitor"]["number"], 1, "{session}");
    let visitor = Visitor::from_session(&hub, &base, &session);
    visitor.say("Hello from a declared widget").await;
    eventually(WAIT, "Ann sees the visitor's chat", || {
        let ann = ann.clone();
        async move { (!ann.chats().await.is_empty()).then_some(()) }
    })
    .await;

    // The token outlives the process: the same visitor, history and all.
    let hub = hub.restart().await;
    let mut body = json!({ "page": page(), "token": visitor.token });
    body["page"]["title"] = json!("After a restart");
    let again = request(
        &hub.http,
        Method::POST,
        &hub.url("/widget/v1/declared-01/session"),
        None,
        None,
        Some(&body),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["token"], visitor.token.as_str());
    assert_eq!(again.body["visitor"]["id"], visitor.id);
    assert_eq!(again.body["visitor"]["number"], 1);
    assert_eq!(
        texts(again.body["messages"].as_array().expect("messages")),
        ["Hello from a declared widget"]
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn a_session_gives_a_signed_token_that_brings_the_same_visitor_back_and_nobody_else() {
    let site = Site::open().await;
    let first = site.session(None).await;
    let token = first["token"].as_str().expect("a token").to_owned();
    assert!(
        token.starts_with("v1.") && token.split('.').count() == 3,
        "{token}"
    );
    assert!(
        first["visitor"]["id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{first}"
    );
    assert_eq!(first["visitor"]["number"], 1, "{first}");
    assert_eq!(first["chat_mode"], "offline", "Ann is not online: {first}");
    assert_eq!(first["color"], "#1e88e5");
    assert_eq!(
        first["contact_info"],
        json!({ "client_name": null, "email": null, "phone": null, "description": null })
    );
    assert_eq!(first["chat"], Value::Null);
    assert_eq!(first["messages"], json!([]));
    assert_eq!(
        first["callback"],
        json!({ "result": "fail", "reason": "Callback disabled" })
    );
    assert_eq!(first["unread"], 0);

    let second = site.visitor().await;
    assert_eq!(second.number, 2, "numbers count visitors of the site");
    assert_ne!(second.token, token);
    assert_ne!(second.id, first["visitor"]["id"]);

    // The first visitor writes, then opens another page of the site.
    let visitor = Visitor::from_session(&site.hub, &site.api(""), &first);
    let sent = visitor.say("Do you have size 44?").await;
    let again = site.session(Some(&token)).await;
    assert_eq!(again["token"], token.as_str());
    assert_eq!(again["visitor"], first["visitor"]);
    assert_eq!(again["messages"], json!([sent]), "{again}");
    assert_eq!(again["chat"]["state"], "open", "{again}");
    assert!(again["chat"]["id"].is_i64(), "{again}");

    // A made-up or altered token is somebody new, who sees nothing.
    let mut forged = token.clone();
    let last = forged.pop().expect("a signature");
    forged.push(if last == '0' { '1' } else { '0' });
    let (key, _) = token.rsplit_once('.').expect("key and signature");
    let (_, other_sig) = second.token.rsplit_once('.').expect("key and signature");
    let borrowed = format!("{key}.{other_sig}");
    for (label, fake) in [
        ("an altered signature", forged.as_str()),
        ("another visitor's signature", borrowed.as_str()),
        ("garbage", "v1.v_anybody.00"),
    ] {
        let s = site.session(Some(fake)).await;
        assert_ne!(s["token"], fake, "{label}");
        assert_ne!(s["token"], token.as_str(), "{label}");
        assert_ne!(s["visitor"]["id"], first["visitor"]["id"], "{label}");
        assert_eq!(s["messages"], json!([]), "{label}: {s}");
        assert_eq!(s["chat"], Value::Null, "{label}: {s}");
    }

    // Another widget's genuine token means nothing here, and the reverse.
    let (status, v) = admin(
        &site.hub,
        Method::POST,
        "/admin/v1/channels",
        Some(json!({ "name": "blog", "type": "widget", "widget_id": "blog-widget-01" })),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let blog = request(
        &site.hub.http,
        Method::POST,
        &site.hub.url("/widget/v1/blog-widget-01/session"),
        None,
        None,
        Some(&json!({ "page": page(), "token": token })),
    )
    .await;
    assert_eq!(blog.status, 200, "{}", blog.body);
    assert_ne!(blog.body["token"], token.as_str());
    // One hub is one site: its visitors are numbered across its widgets.
    assert_eq!(
        blog.body["visitor"]["number"], 6,
        "after the shop's five visitors: {}",
        blog.body
    );
    assert_eq!(blog.body["messages"], json!([]));
    let blog_token = blog.body["token"].as_str().expect("token");
    let here = site.session(Some(blog_token)).await;
    assert_ne!(here["token"], blog_token);
    assert_eq!(here["messages"], json!([]));
    let answer = request(
        &site.hub.http,
        Method::GET,
        &site.api("messages"),
        Some(blog_token),
        None,
        None,
    )
    .await;
    assert_fail("another widget's token", &answer.status_body(), 401);
    site.hub.shutdown().await;
}

#[tokio::test]
async fn widget_calls_without_a_valid_visitor_token_are_refused_with_401() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    visitor.say("only mine").await;
    let mut forged = visitor.token.clone();
    let last = forged.pop().expect("a signature");
    forged.push(if last == 'a' { 'b' } else { 'a' });
    for token in [
        None,
        Some("v1.v_nobody.0000"),
        Some(forged.as_str()),
        Some(site.ann.token.as_str()),
        Some(ADMIN_TOKEN),
    ] {
        for (method, endpoint, body) in [
            (Method::GET, "messages", None),
            (
                Method::POST,
                "messages",
                Some(json!({ "text": "intruder" })),
            ),
            (Method::GET, "stream", None),
            (Method::POST, "typing", Some(json!({ "typing": true }))),
            (Method::POST, "contacts", Some(json!({ "name": "Mallory" }))),
            (
                Method::POST,
                "custom-data",
                Some(json!({ "fields": [{ "content": "x" }] })),
            ),
            (Method::POST, "user-token", Some(json!({ "token": "u-1" }))),
            (
                Method::POST,
                "page",
                Some(json!({ "url": "https://evil.example" })),
            ),
            (
                Method::POST,
                "attributes",
                Some(json!({ "attributes": { "a": 1 } })),
            ),
            (Method::POST, "clear", Some(json!({}))),
        ] {
            let answer = request(
                &site.hub.http,
                method,
                &site.api(endpoint),
                token,
                None,
                body.as_ref(),
            )
            .await;
            assert_fail(
                &format!("{endpoint} with {token:?}"),
                &answer.status_body(),
                401,
            );
        }
        // Nor in the query, where `EventSource` puts it.
        let query = format!("{}?token={}", site.api("stream"), token.unwrap_or(""));
        let answer = request(&site.hub.http, Method::GET, &query, None, None, None).await;
        assert_fail(
            &format!("stream?token={token:?}"),
            &answer.status_body(),
            401,
        );
    }

    // Nothing of that reached the visitor's chat.
    assert_eq!(texts(&visitor.history().await), ["only mine"]);
    let chat = site.chat_of(&visitor).await;
    let view = site.ann.chat(chat).await;
    assert_eq!(view["messages"].as_array().map(Vec::len), Some(1), "{view}");
    assert_ne!(view["client"]["name"], "Mallory", "{view}");
    assert_eq!(view["visitor"]["custom_data"], Value::Null, "{view}");
    // The genuine token in the query reads the history too.
    let answer = request(
        &site.hub.http,
        Method::GET,
        &format!("{}?token={}", site.api("messages"), visitor.token),
        None,
        None,
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    site.hub.shutdown().await;
}

#[tokio::test]
async fn a_visitor_and_an_agent_talk_live_and_the_replies_go_to_no_integrator() {
    let site = Site::open().await;
    site.ann.set_online(true).await;
    let session = site.session(None).await;
    assert_eq!(session["chat_mode"], "online", "Ann is online: {session}");
    let visitor = Visitor::from_session(&site.hub, &site.api(""), &session);
    let mut page = visitor.stream().await;
    let mut desk = site.ann.stream().await;

    let sent = visitor.say("Do you ship to Norway?").await;
    assert_eq!(sent["author"], "client", "{sent}");
    assert_eq!(sent["name"], Value::Null, "{sent}");
    assert_eq!(sent["text"], "Do you ship to Norway?");
    assert!(sent["id"].is_i64() && sent["created_at"].is_i64(), "{sent}");
    // Every open page of the site shows it.
    let own = page.expect("message", WAIT).await;
    assert_eq!(own, sent);

    // Ann gets it like any customer message.
    let chat = site.chat_of(&visitor).await;
    let opened = desk_event(&mut desk, chat, "chat.message").await;
    assert_eq!(opened["message"]["body"]["text"], "Do you ship to Norway?");
    assert!(
        site.ann.chats().await.iter().any(|c| c["id"] == chat),
        "Ann lists the chat"
    );

    for empty in ["", "   "] {
        let answer = visitor.post("messages", json!({ "text": empty })).await;
        assert_fail(&format!("text {empty:?}"), &answer, 400);
    }

    // The visitor types: Ann sees it.
    visitor.ok("typing", json!({ "typing": true })).await;
    let typing = desk_event(&mut desk, chat, "chat.typing").await;
    assert_eq!(typing["typing"], true, "{typing}");
    assert_eq!(typing["by"], "client", "{typing}");

    // Ann accepts, types, answers: the page sees each as it happens.
    site.act(chat, "accept").await;
    assert_eq!(
        page.expect("chat", WAIT).await,
        json!({ "state": "accepted", "agent": { "name": "Ann" } })
    );
    let (status, v) = site
        .ann
        .post(
            &format!("/agent/v1/chats/{chat}/messages"),
            json!({ "type": "typein" }),
        )
        .await;
    assert!(status == 200 || status == 202, "typein: {status} {v}");
    assert_eq!(
        page.expect("typing", WAIT).await,
        json!({ "typing": true, "name": "Ann" })
    );
    let reply = site.ann.reply(chat, "Yes, within 3 days.").await;
    assert_eq!(reply["delivery"], "delivered", "{reply}");
    let live = page.expect("message", WAIT).await;
    assert_eq!(live["author"], "agent", "{live}");
    assert_eq!(live["name"], "Ann", "{live}");
    assert_eq!(live["text"], "Yes, within 3 days.");
    assert_eq!(live["id"], reply["id"], "{live}");

    let history = visitor.history().await;
    assert_eq!(
        history
            .iter()
            .map(|m| (m["author"].clone(), m["name"].clone(), m["text"].clone()))
            .collect::<Vec<_>>(),
        [
            (
                json!("client"),
                Value::Null,
                json!("Do you ship to Norway?")
            ),
            (json!("agent"), json!("Ann"), json!("Yes, within 3 days.")),
        ]
    );

    site.act(chat, "close").await;
    assert_eq!(
        page.expect("chat", WAIT).await,
        json!({ "state": "closed", "agent": null })
    );
    let reload = site.session(Some(&visitor.token)).await;
    assert_eq!(reload["chat"], json!({ "id": chat, "state": "closed" }));
    assert_eq!(reload["messages"], json!(history));

    // Writing again opens a new chat; the open page follows it.
    visitor.say("One more thing").await;
    until_message(&mut page, "One more thing").await;
    let next = site.chat_of(&visitor).await;
    assert_ne!(next, chat, "a closed chat stays closed");
    site.ann.reply(next, "Go ahead").await;
    let seen = until_message(&mut page, "Go ahead").await;
    assert!(
        seen.iter()
            .any(|(n, d)| n == "chat" && d["state"] == "accepted"),
        "the answer accepted the new chat: {seen:?}"
    );

    // The widget has no integrator: nothing waits, fails or was posted.
    settle().await;
    let view = site.ann.chat(chat).await;
    let agent_messages: Vec<&Value> = view["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["author"] == "agent")
        .collect();
    assert_eq!(agent_messages.len(), 1, "{view}");
    assert_eq!(agent_messages[0]["delivery"], "delivered", "{view}");
    site.assert_nothing_sent_to_an_integrator().await;
    for r in site.receiver.requests() {
        assert!(
            r.json().get("event_name").is_some(),
            "only webhooks reach the receiver: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    site.hub.shutdown().await;
}

/// Reads a visitor's stream until its `mode` event, which ends what a
/// resumed stream sends first; returns the events before it, with their ids.
async fn until_mode(sse: &mut Sse) -> Vec<(String, Value, Option<String>)> {
    let mut seen = Vec::new();
    loop {
        let Some(event) = sse.next_with_id(WAIT).await else {
            panic!("no `mode` on the visitor's stream; saw {seen:?}");
        };
        if event.0 == "mode" {
            return seen;
        }
        seen.push(event);
    }
}

/// The texts of the `message` events among `events`, each checked to carry
/// its message's id as the SSE id, ids rising.
fn message_texts(events: &[(String, Value, Option<String>)]) -> Vec<String> {
    let mut last = 0;
    let mut texts = Vec::new();
    for (name, data, id) in events.iter().filter(|(n, _, _)| n == "message") {
        let n = data["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{name}: {data}"));
        assert_eq!(id.as_deref(), Some(n.to_string().as_str()), "{data}");
        assert!(n > last, "message ids rise: {events:?}");
        last = n;
        texts.push(data["text"].as_str().unwrap_or_default().to_owned());
    }
    texts
}

#[tokio::test]
async fn a_visitors_stream_resumes_after_its_last_event_id_in_order_and_once_across_a_restart() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    let mut page = visitor.stream().await;
    visitor.say("Where is my parcel?").await;
    let chat = site.chat_of(&visitor).await;
    site.act(chat, "accept").await;
    site.ann.reply(chat, "Let me look.").await;
    let mut seen = Vec::new();
    while !message_texts(&seen).contains(&"Let me look.".to_owned()) {
        seen.push(
            page.next_with_id(WAIT)
                .await
                .expect("the conversation, live"),
        );
    }
    assert_eq!(
        message_texts(&seen),
        ["Where is my parcel?", "Let me look."]
    );
    let last = page.next_with_id(Duration::ZERO).await;
    assert!(last.is_none(), "nothing else yet: {last:?}");
    let looked = seen
        .iter()
        .rev()
        .find_map(|(_, _, id)| id.clone())
        .expect("the reply's id");

    // The page loses its connection; Ann answers meanwhile; the hub restarts.
    drop(page);
    site.ann.reply(chat, "It left the depot.").await;
    site.ann.reply(chat, "It arrives tomorrow.").await;
    let Site { hub, ann, receiver } = site;
    let hub = hub.restart().await;
    let ann = TestAgent {
        base: hub.base.clone(),
        ..ann
    };
    let site = Site { hub, ann, receiver };
    let stream = format!("{}stream?token={}", site.api(""), visitor.token);

    // The browser reconnects with the id of the last event it saw: what it
    // missed comes first, in order, then the chat's state and the mode.
    let mut page = Sse::resume(&stream, &looked).await;
    let caught = until_mode(&mut page).await;
    assert_eq!(
        message_texts(&caught),
        ["It left the depot.", "It arrives tomorrow."]
    );
    assert!(
        caught.iter().any(|(n, d, _)| n == "chat"
            && *d == json!({ "state": "accepted", "agent": { "name": "Ann" } })),
        "{caught:?}"
    );
    let tomorrow = caught
        .iter()
        .rev()
        .find_map(|(_, _, id)| id.clone())
        .expect("the last reply's id");
    // Then live, nothing twice.
    site.ann.reply(chat, "Sorry for the wait.").await;
    let next = page.next_with_id(WAIT).await.expect("the next reply");
    assert_eq!(
        message_texts(std::slice::from_ref(&next)),
        ["Sorry for the wait."],
        "{next:?}"
    );

    // The script cannot set headers: `?after=` does the same; a browser's
    // `Last-Event-ID` (newer) wins over the URL it reconnects to.
    let mut script = Sse::open(&format!("{stream}&after={looked}")).await;
    assert_eq!(
        message_texts(&until_mode(&mut script).await),
        [
            "It left the depot.",
            "It arrives tomorrow.",
            "Sorry for the wait."
        ]
    );
    let mut browser = Sse::resume(&format!("{stream}&after={looked}"), &tomorrow).await;
    assert_eq!(
        message_texts(&until_mode(&mut browser).await),
        ["Sorry for the wait."]
    );
    // A stream without a resume point starts now.
    let mut fresh = Sse::open(&stream).await;
    site.ann.reply(chat, "Anything else?").await;
    let first = fresh.next_with_id(WAIT).await.expect("the new reply");
    assert_eq!(
        message_texts(std::slice::from_ref(&first)),
        ["Anything else?"],
        "{first:?}"
    );
    site.hub.shutdown().await;
}

/// A page's stream is open once its answer's headers arrive: whatever is
/// written after that reaches it, however soon (a starting point fixed
/// after answering would let a message written at once fall before it).
#[tokio::test]
async fn a_message_written_the_moment_a_stream_opens_still_reaches_it() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    visitor.say("Hello?").await;
    let chat = site.chat_of(&visitor).await;
    site.act(chat, "accept").await;
    for n in 0..25 {
        let mut page = visitor.stream().await;
        let text = format!("reply {n}");
        let by = if n % 2 == 0 {
            site.ann.reply(chat, &text).await;
            "agent"
        } else {
            visitor.say(&text).await;
            "visitor"
        };
        loop {
            let Some((name, data, _)) = page.next_with_id(WAIT).await else {
                panic!("the {by}'s {text:?}, written right after the stream opened, never came");
            };
            if name == "message" {
                assert_eq!(data["text"], text.as_str(), "{data}");
                break;
            }
        }
    }
    site.hub.shutdown().await;
}

#[tokio::test]
async fn the_visitors_page_hears_when_agents_go_online_and_offline() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    let mut page = visitor.stream().await;
    site.ann.set_online(true).await;
    assert_eq!(
        page.expect("mode", MODE_WAIT).await,
        json!({ "chat_mode": "online" })
    );
    let session = site.session(Some(&visitor.token)).await;
    assert_eq!(session["chat_mode"], "online");
    site.ann.set_online(false).await;
    assert_eq!(
        page.expect("mode", MODE_WAIT).await,
        json!({ "chat_mode": "offline" })
    );
    let session = site.session(Some(&visitor.token)).await;
    assert_eq!(session["chat_mode"], "offline");
    site.hub.shutdown().await;
}

#[tokio::test]
async fn two_visitors_never_see_each_others_messages_or_events() {
    let site = Site::open().await;
    let alice = site.visitor().await;
    let bob = site.visitor().await;
    let mut alice_page = alice.stream().await;
    let mut bob_page = bob.stream().await;

    alice.say("Alice asks about boots").await;
    bob.say("Bob asks about a refund").await;
    let alice_chat = site.chat_of(&alice).await;
    let bob_chat = site.chat_of(&bob).await;
    assert_ne!(alice_chat, bob_chat);

    // Everything happens in Bob's chat first, then Alice gets her answer.
    bob.ok(
        "contacts",
        json!({ "name": "Bob", "email": "bob@example.org" }),
    )
    .await;
    site.act(bob_chat, "accept").await;
    site.ann
        .post(
            &format!("/agent/v1/chats/{bob_chat}/messages"),
            json!({ "type": "typein" }),
        )
        .await;
    site.ann.reply(bob_chat, "Bob: refund approved").await;
    site.ann.reply(alice_chat, "Alice: boots in stock").await;

    let seen = until_message(&mut alice_page, "Alice: boots in stock").await;
    for (name, data) in &seen {
        let text = data.to_string();
        assert!(
            !text.contains("Bob") && !text.contains("refund"),
            "Alice's page got Bob's {name}: {data}"
        );
        assert_ne!(name, "typing", "Alice's page got Bob's typing: {data}");
    }
    assert!(
        seen.iter()
            .any(|(n, d)| n == "message" && d["text"] == "Alice asks about boots"),
        "{seen:?}"
    );
    let seen = until_message(&mut bob_page, "Bob: refund approved").await;
    assert!(
        !format!("{seen:?}").contains("Alice"),
        "Bob's page got Alice's events: {seen:?}"
    );

    assert_eq!(
        texts(&alice.history().await),
        ["Alice asks about boots", "Alice: boots in stock"]
    );
    assert_eq!(
        texts(&bob.history().await),
        ["Bob asks about a refund", "Bob: refund approved"]
    );
    let alice_session = site.session(Some(&alice.token)).await;
    assert_eq!(alice_session["contact_info"]["client_name"], Value::Null);
    assert_eq!(alice_session["chat"]["id"], alice_chat);
    site.hub.shutdown().await;
}

#[tokio::test]
async fn contact_info_reaches_the_agents_view_and_the_webhooks() {
    let site = Site::open().await;
    let visitor = site.visitor().await;

    // Before any chat: the client is updated.
    visitor
        .ok(
            "contacts",
            json!({ "name": "Eve", "email": "eve@example.com" }),
        )
        .await;
    let updated = site
        .webhook("client_updated", |w| w["visitor"]["name"] == "Eve")
        .await;
    assert_eq!(updated["visitor"]["email"], "eve@example.com", "{updated}");
    assert_eq!(updated["widget_id"], WIDGET_ID, "{updated}");
    let session = site.session(Some(&visitor.token)).await;
    assert_eq!(
        session["contact_info"],
        json!({ "client_name": "Eve", "email": "eve@example.com", "phone": null,
                "description": null })
    );

    // In a chat: the chat is updated, and Ann sees who she talks to.
    visitor.say("Where is my order?").await;
    let chat = site.chat_of(&visitor).await;
    visitor
        .ok(
            "contacts",
            json!({ "name": "Eve Adams", "email": "eve@example.com", "phone": "+4712345678",
                    "description": "Ordered on Monday" }),
        )
        .await;
    let event = site
        .webhook("chat_updated", |w| w["visitor"]["name"] == "Eve Adams")
        .await;
    assert_eq!(event["chat_id"], chat, "{event}");
    assert_eq!(event["visitor"]["phone"], "+4712345678", "{event}");
    assert_eq!(
        event["visitor"]["description"], "Ordered on Monday",
        "{event}"
    );
    let view = site.ann.chat(chat).await;
    assert_eq!(view["client"]["name"], "Eve Adams", "{view}");
    assert_eq!(view["client"]["email"], "eve@example.com", "{view}");
    assert_eq!(view["client"]["phone"], "+4712345678", "{view}");
    assert_eq!(
        view["visitor"]["description"], "Ordered on Monday",
        "{view}"
    );

    let answer = visitor
        .post("contacts", json!({ "email": "not-an-address" }))
        .await;
    assert_fail("a bad e-mail address", &answer, 400);
    let view = site.ann.chat(chat).await;
    assert_eq!(view["client"]["email"], "eve@example.com", "{view}");
    let session = site.session(Some(&visitor.token)).await;
    assert_eq!(
        session["contact_info"],
        json!({ "client_name": "Eve Adams", "email": "eve@example.com",
                "phone": "+4712345678", "description": "Ordered on Monday" })
    );
    site.hub.shutdown().await;
}

#[tokio::test]
async fn custom_data_reaches_the_agent_exactly_as_sent_and_live() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    visitor.say("I have a question about my plan").await;
    let chat = site.chat_of(&visitor).await;
    let mut desk = site.ann.stream().await;

    let fields = json!([
        { "content": "<b>Gold</b> member", "title": "Plan",
          "link": "https://shop.example.com/account", "key": "plan" },
        { "content": "3 items in the cart" },
    ]);
    visitor.ok("custom-data", json!({ "fields": fields })).await;
    let live = desk_event(&mut desk, chat, "chat.custom_data").await;
    assert_eq!(live["custom_data"], fields, "{live}");
    let view = site.ann.chat(chat).await;
    assert_eq!(
        view["visitor"]["custom_data"], fields,
        "the markup stays text: {view}"
    );

    let ten: Vec<Value> = (1..=10)
        .map(|i| json!({ "content": format!("field {i}") }))
        .collect();
    visitor.ok("custom-data", json!({ "fields": ten })).await;
    assert_eq!(
        desk_event(&mut desk, chat, "chat.custom_data").await["custom_data"],
        json!(ten)
    );

    for (label, body) in [
        ("a string", json!({ "fields": "plan: gold" })),
        ("an object", json!({ "fields": { "content": "x" } })),
    ] {
        let answer = visitor.post("custom-data", body).await;
        assert_eq!(
            answer,
            (
                400,
                json!({ "result": "fail", "reason": "fields must be an array" })
            ),
            "{label}"
        );
    }
    let eleven: Vec<Value> = (1..=11)
        .map(|i| json!({ "content": format!("field {i}") }))
        .collect();
    let answer = visitor
        .post("custom-data", json!({ "fields": eleven }))
        .await;
    assert_fail("11 fields", &answer, 400);
    let answer = visitor
        .post(
            "custom-data",
            json!({ "fields": [{ "title": "no content" }] }),
        )
        .await;
    assert_fail("a field without content", &answer, 400);
    let huge = "x".repeat(70_000);
    let answer = visitor
        .post("custom-data", json!({ "fields": [{ "content": huge }] }))
        .await;
    assert_fail("a body over the limit", &answer, 413);
    let view = site.ann.chat(chat).await;
    assert_eq!(
        view["visitor"]["custom_data"],
        json!(ten),
        "refused calls change nothing"
    );
    site.hub.shutdown().await;
}

#[tokio::test]
async fn the_user_token_is_echoed_and_carried_by_the_visitors_webhooks() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    assert_eq!(
        visitor.post("user-token", json!({ "token": "u-42" })).await,
        (200, json!({ "result": "ok", "token": "u-42" }))
    );
    for bad in [json!(42), json!(null), json!({ "id": "u-42" })] {
        let answer = visitor.post("user-token", json!({ "token": bad })).await;
        assert_fail(&format!("token {bad}"), &answer, 400);
    }

    visitor.say("Is my order shipped?").await;
    let chat = site.chat_of(&visitor).await;
    site.act(chat, "accept").await;
    let accepted = site
        .webhook("chat_accepted", |w| w["chat_id"] == chat)
        .await;
    assert_eq!(accepted["user_token"], "u-42", "{accepted}");
    assert_eq!(accepted["widget_id"], WIDGET_ID, "{accepted}");
    // The session the page reported travels with the visitor's webhooks.
    assert_eq!(accepted["page"]["url"], PAGE, "{accepted}");
    assert_eq!(accepted["page"]["title"], "Winter boots", "{accepted}");
    assert_eq!(accepted["session"]["ip_addr"], "127.0.0.1", "{accepted}");
    assert_eq!(accepted["agent"]["name"], "Ann", "{accepted}");

    visitor.ok("contacts", json!({ "name": "Uma" })).await;
    let updated = site
        .webhook("chat_updated", |w| w["visitor"]["name"] == "Uma")
        .await;
    assert_eq!(updated["user_token"], "u-42", "{updated}");
    site.hub.shutdown().await;
}

#[tokio::test]
async fn every_webhook_the_visitor_causes_carries_the_user_token_the_page_set() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    assert_eq!(
        visitor.post("user-token", json!({ "token": "u-7" })).await,
        (200, json!({ "result": "ok", "token": "u-7" }))
    );

    // No chat yet: contact details change the client.
    visitor.ok("contacts", json!({ "name": "Uma" })).await;
    let updated = site
        .webhook("client_updated", |w| w["visitor"]["name"] == "Uma")
        .await;
    assert_eq!(updated["user_token"], "u-7", "{updated}");
    assert_eq!(updated["widget_id"], WIDGET_ID, "{updated}");

    visitor
        .ok("attributes", json!({ "attributes": { "plan": "pro" } }))
        .await;
    let attributes = site
        .webhook("client_attribute_updated", |w| {
            w["attributes"]["plan"] == "pro"
        })
        .await;
    assert_eq!(attributes["user_token"], "u-7", "{attributes}");

    // The offline form, sent with the visitor's token as the widget sends
    // it: the visitor's own client, with what their page reported.
    let form = json!({ "name": "Uma Visitor", "email": "uma@example.com",
                       "message": "Please call me about size 44" });
    let answer = request(
        &site.hub.http,
        Method::POST,
        &site.api("offline-messages"),
        Some(&visitor.token),
        Some("https://shop.example.com"),
        Some(&form),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let offline = site
        .webhook("offline_message", |w| {
            w["message"] == "Please call me about size 44"
        })
        .await;
    assert_eq!(offline["user_token"], "u-7", "{offline}");
    assert_eq!(
        offline["visitor"]["number"],
        visitor.number.to_string(),
        "{offline}"
    );
    assert_eq!(offline["visitor"]["name"], "Uma Visitor", "{offline}");
    assert_eq!(offline["visitor"]["email"], "uma@example.com", "{offline}");
    assert_eq!(offline["page"]["url"], PAGE, "{offline}");
    assert_eq!(offline["page"]["title"], "Winter boots", "{offline}");
    assert_eq!(offline["session"]["ip_addr"], "127.0.0.1", "{offline}");
    let (_, listed) = site.ann.get("/agent/v1/chats?state=all").await;
    let chat = listed["chats"][0]["id"].as_i64().expect("the offline chat");
    let view = site.ann.chat(chat).await;
    assert_eq!(view["client"]["external_id"], visitor.id, "{view}");

    // A chat: accepted (with a CRM link to offer), linked, updated.
    let link = "https://crm.example.com/clients/7";
    site.receiver.set_default(Reply::json(
        200,
        &json!({ "result": "ok", "enable_assign": true, "crm_link": link }).to_string(),
    ));
    visitor.say("Is my order shipped?").await;
    let chat = site.chat_of(&visitor).await;
    site.act(chat, "accept").await;
    let accepted = site
        .webhook("chat_accepted", |w| w["chat_id"] == chat)
        .await;
    assert_eq!(accepted["user_token"], "u-7", "{accepted}");
    eventually(WAIT, "the CRM link offered to Ann", || {
        let ann = site.ann.clone();
        async move {
            let view = ann.chat(chat).await;
            (view["integration"]["crm_link"] == link).then_some(())
        }
    })
    .await;
    site.act(chat, "crm-link").await;
    let assigned = site
        .webhook("chat_assigned", |w| w["chat_id"] == chat)
        .await;
    assert_eq!(assigned["user_token"], "u-7", "{assigned}");
    assert_eq!(assigned["assign_to"], link, "{assigned}");
    visitor
        .ok("contacts", json!({ "phone": "+4712345678" }))
        .await;
    let chat_updated = site
        .webhook("chat_updated", |w| {
            w["chat_id"] == chat && w["visitor"]["phone"] == "+4712345678"
        })
        .await;
    assert_eq!(chat_updated["user_token"], "u-7", "{chat_updated}");

    // An offline form without a token (or with one the hub does not know)
    // is taken all the same, from nobody in particular.
    let anonymous = json!({ "email": "zed@example.com", "message": "Anyone there?" });
    for token in [None, Some("v1.forged.0000")] {
        let answer = request(
            &site.hub.http,
            Method::POST,
            &site.api("offline-messages"),
            token,
            None,
            Some(&anonymous),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let strangers: Vec<Value> = eventually(WAIT, "both anonymous offline messages", || {
        let found: Vec<Value> = site
            .webhooks("offline_message")
            .into_iter()
            .filter(|w| w["message"] == "Anyone there?")
            .collect();
        async move { (found.len() == 2).then_some(found) }
    })
    .await;
    for w in strangers {
        assert!(w["user_token"].is_null(), "{w}");
        assert_ne!(w["visitor"]["number"], visitor.number.to_string(), "{w}");
    }
    site.hub.shutdown().await;
}

#[tokio::test]
async fn page_reports_reach_the_agents_view_and_client_attributes_allow_ten_calls_an_hour() {
    let site = Site::open().await;
    let landing = json!({ "url": "https://shop.example.com/boots?utm_source=news&utm_campaign=spring",
                          "title": "Winter boots", "referrer": "https://search.example/?q=boots" });
    let session = site.session_on(landing, None).await;
    let visitor = Visitor::from_session(&site.hub, &site.api(""), &session);
    visitor.say("Are these waterproof?").await;
    let chat = site.chat_of(&visitor).await;
    let view = site.ann.chat(chat).await;
    assert_eq!(
        view["visitor"]["page"],
        json!({ "url": "https://shop.example.com/boots?utm_source=news&utm_campaign=spring",
                "title": "Winter boots" }),
        "{view}"
    );
    assert_eq!(
        view["visitor"]["utm_json"],
        json!({ "source": "news", "campaign": "spring" }),
        "{view}"
    );
    assert_eq!(
        view["visitor"]["referrer"], "https://search.example/?q=boots",
        "{view}"
    );
    assert_eq!(
        view["visitor"]["ip"], "127.0.0.1",
        "the address the visitor came from: {view}"
    );

    let mut desk = site.ann.stream().await;
    visitor
        .ok(
            "page",
            json!({ "url": "https://shop.example.com/cart", "title": "Your cart",
                    "referrer": "https://shop.example.com/boots" }),
        )
        .await;
    let live = desk_event(&mut desk, chat, "chat.page").await;
    assert_eq!(
        live["page"],
        json!({ "url": "https://shop.example.com/cart", "title": "Your cart" }),
        "{live}"
    );
    let view = site.ann.chat(chat).await;
    assert_eq!(
        view["visitor"]["page"],
        json!({ "url": "https://shop.example.com/cart", "title": "Your cart" }),
        "{view}"
    );
    // Another page of the same site minutes later is the same visit.
    let token = session["token"].as_str().expect("token");
    site.session_on(page(), Some(token)).await;
    assert_eq!(
        site.ann.chat(chat).await["visitor"]["visits_count"],
        1,
        "page loads within 30 minutes are one visit"
    );

    for bad in [json!("cart_total=3"), json!([1]), json!({})] {
        let answer = visitor
            .post("attributes", json!({ "attributes": bad }))
            .await;
        assert_fail(&format!("attributes {bad}"), &answer, 400);
    }
    for i in 1..=10 {
        visitor
            .ok("attributes", json!({ "attributes": { "cart_total": i } }))
            .await;
    }
    let event = site
        .webhook("client_attribute_updated", |w| {
            w["attributes"]["cart_total"] == 10
        })
        .await;
    assert_eq!(event["widget_id"], WIDGET_ID, "{event}");
    let answer = visitor
        .post("attributes", json!({ "attributes": { "cart_total": 11 } }))
        .await;
    assert_fail("the 11th call within an hour", &answer, 429);
    settle().await;
    assert!(
        site.webhooks("client_attribute_updated")
            .iter()
            .all(|w| w["attributes"]["cart_total"] != 11),
        "the refused call changed the attributes"
    );
    site.hub.shutdown().await;
}

#[tokio::test]
async fn clearing_the_history_hides_earlier_messages_from_the_visitor_but_not_from_agents() {
    let site = Site::open().await;
    let visitor = site.visitor().await;
    visitor.say("An old question").await;
    let chat = site.chat_of(&visitor).await;
    site.ann.reply(chat, "An old answer").await;
    assert_eq!(
        texts(&visitor.history().await),
        ["An old question", "An old answer"]
    );

    visitor.ok("clear", json!({})).await;
    let session = site.session(Some(&visitor.token)).await;
    assert_eq!(session["messages"], json!([]), "{session}");
    assert_eq!(visitor.history().await, Vec::<Value>::new());
    let view = site.ann.chat(chat).await;
    assert_eq!(
        view["messages"].as_array().map(Vec::len),
        Some(2),
        "agents keep the chat: {view}"
    );

    // No pause needed: the history starts at the clear's millisecond, and
    // a message stored after the clear is of that millisecond or later.
    visitor.say("A new question").await;
    assert_eq!(texts(&visitor.history().await), ["A new question"]);
    site.hub.shutdown().await;
}

#[tokio::test]
async fn the_offline_form_and_the_disabled_callback_answer_as_the_spec_says() {
    let site = Site::open().await;
    let form = |body: Value| {
        let site = &site;
        async move {
            request(
                &site.hub.http,
                Method::POST,
                &site.api("offline-messages"),
                None,
                Some("https://shop.example.com"),
                Some(&body),
            )
            .await
            .status_body()
        }
    };
    let (status, answer) = form(json!({ "name": "Eve", "email": "eve@example.com",
                                         "phone": "+4712345678", "description": "Boots",
                                         "message": "Please write me about size 44" }))
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"], "ok", "{answer}");
    assert!(answer["offline_message_id"].is_i64(), "{answer}");
    let (_, listed) = site.ann.get("/agent/v1/chats?state=all").await;
    let chat = listed["chats"][0]["id"].as_i64().expect("the offline chat");
    let view = site.ann.chat(chat).await;
    assert_eq!(
        view["messages"][0]["body"]["text"], "Please write me about size 44",
        "{view}"
    );

    for (label, body) in [
        (
            "no way to answer",
            json!({ "name": "Eve", "message": "hi" }),
        ),
        (
            "a bad e-mail address",
            json!({ "email": "eve-at-example", "message": "hi" }),
        ),
        (
            "an empty message",
            json!({ "email": "eve@example.com", "message": "" }),
        ),
        (
            "an unknown field",
            json!({ "email": "eve@example.com", "message": "hi", "fax": "1" }),
        ),
    ] {
        let (status, answer) = form(body).await;
        assert_eq!(status, 400, "{label}: {answer}");
        assert_eq!(answer["result"], "fail", "{label}: {answer}");
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{label}: sendOfflineMessage fails with `error`: {answer}"
        );
    }
    let (_, listed) = site.ann.get("/agent/v1/chats?state=all").await;
    assert_eq!(
        listed["chats"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );

    let callback = request(
        &site.hub.http,
        Method::GET,
        &site.api("callback"),
        None,
        None,
        None,
    )
    .await;
    assert_eq!(
        callback.status_body(),
        (
            200,
            json!({ "result": "fail", "reason": "Callback disabled" })
        )
    );
    let visitor = site.visitor().await;
    assert_eq!(
        visitor
            .post("calls", json!({ "phone": "+4712345678" }))
            .await,
        (
            409,
            json!({ "result": "fail", "reason": "Callback disabled" })
        )
    );
    site.hub.shutdown().await;
}

#[tokio::test]
async fn every_answer_carries_cors_headers_and_allowed_origins_keep_other_sites_out() {
    let site = Site::open().await;
    let http = &site.hub.http;
    let origin = "https://any-shop.example";
    let with_origin = request(
        http,
        Method::POST,
        &site.api("session"),
        None,
        Some(origin),
        Some(&json!({ "page": page() })),
    )
    .await;
    assert_eq!(with_origin.status, 200, "{}", with_origin.body);
    assert_eq!(
        with_origin.header("access-control-allow-origin"),
        Some(origin)
    );
    assert_eq!(with_origin.header("vary"), Some("Origin"));
    let token = with_origin.body["token"]
        .as_str()
        .expect("token")
        .to_owned();

    let without = request(
        http,
        Method::GET,
        &site.api("messages"),
        Some(&token),
        None,
        None,
    )
    .await;
    assert_eq!(without.status, 200, "{}", without.body);
    assert_eq!(without.header("access-control-allow-origin"), Some("*"));
    assert_eq!(without.header("vary"), Some("Origin"));

    // The page reads refusals too.
    let refused = request(
        http,
        Method::GET,
        &site.api("messages"),
        None,
        Some(origin),
        None,
    )
    .await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("access-control-allow-origin"), Some(origin));

    for endpoint in ["session", "messages", "contacts"] {
        let preflight = request(
            http,
            Method::OPTIONS,
            &site.api(endpoint),
            None,
            Some(origin),
            None,
        )
        .await;
        assert_eq!(preflight.status, 204, "OPTIONS {endpoint}");
        assert_eq!(
            preflight.header("access-control-allow-methods"),
            Some("GET, POST, OPTIONS")
        );
        assert_eq!(
            preflight.header("access-control-allow-headers"),
            Some("authorization, content-type")
        );
        assert_eq!(
            preflight.header("access-control-allow-origin"),
            Some(origin)
        );
        assert_eq!(preflight.header("vary"), Some("Origin"));
    }
    site.hub.shutdown().await;

    // A widget for one shop only.
    let site = Site::with(json!({ "allowed_origins": ["https://shop.example.com"] })).await;
    let http = &site.hub.http;
    let session = json!({ "page": page() });
    for (method, endpoint, body) in [
        (Method::POST, "session", Some(&session)),
        (Method::GET, "callback", None),
    ] {
        let foreign = request(
            http,
            method.clone(),
            &site.api(endpoint),
            None,
            Some("https://evil.example"),
            body,
        )
        .await;
        assert_eq!(
            foreign.status, 403,
            "{method} {endpoint} from another site: {}",
            foreign.body
        );
        assert_eq!(foreign.body["result"], "fail", "{}", foreign.body);
        // Readable by the foreign page, whose widget then stops asking.
        assert_eq!(
            foreign.header("access-control-allow-origin"),
            Some("https://evil.example")
        );
    }
    let listed = request(
        http,
        Method::POST,
        &site.api("session"),
        None,
        Some("https://shop.example.com"),
        Some(&session),
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(
        listed.header("access-control-allow-origin"),
        Some("https://shop.example.com")
    );
    let token = listed.body["token"].as_str().expect("token");
    let message = request(
        http,
        Method::POST,
        &site.api("messages"),
        Some(token),
        Some("https://shop.example.com"),
        Some(&json!({ "text": "Hello from the shop" })),
    )
    .await;
    assert_eq!(message.status, 200, "{}", message.body);
    let stolen = request(
        http,
        Method::GET,
        &site.api("messages"),
        Some(token),
        Some("https://evil.example"),
        None,
    )
    .await;
    assert_eq!(stolen.status, 403, "{}", stolen.body);
    assert!(
        !stolen.body.to_string().contains("Hello from the shop"),
        "{}",
        stolen.body
    );
    site.hub.shutdown().await;
}

#[tokio::test]
async fn a_bot_on_a_widget_talks_to_the_visitor_with_buttons_and_posts_to_no_integrator() {
    const TOKEN: &str = "prov-token-0001";
    let site = Site::open().await;
    let provider = Integrator::start().await;
    let (status, bot) = admin(
        &site.hub,
        Method::POST,
        "/admin/v1/bots",
        Some(
            json!({ "name": "Assistant", "endpoint": provider.url, "token": TOKEN,
                     "channels": ["shop"] }),
        ),
    )
    .await;
    assert_eq!(status, 201, "bot creation: {bot}");
    let webhooks_url = bot["webhooks_url"]
        .as_str()
        .expect("webhooks_url")
        .to_owned();

    let visitor = site.visitor().await;
    let mut page = visitor.stream().await;
    visitor.say("hello bot").await;
    let heard = provider.wait_for(1, WAIT).await.remove(0);
    assert_eq!(heard.path, format!("/hub/{TOKEN}"));
    let event = heard.json();
    assert_eq!(event["event"], "CLIENT_MESSAGE", "{event}");
    assert_eq!(event["message"]["text"], "hello bot", "{event}");
    assert_eq!(
        event["channel"],
        json!({ "id": WIDGET_ID, "type": "widget" }),
        "{event}"
    );
    let chat = event["chat_id"].as_str().expect("chat_id").to_owned();

    let post = |message: Value| {
        let http = site.hub.http.clone();
        let url = webhooks_url.clone();
        let chat = chat.clone();
        async move {
            let body = json!({ "id": uuid::Uuid::new_v4().to_string(), "event": "BOT_MESSAGE",
                               "chat_id": chat, "message": message });
            let resp = http.post(&url).json(&body).send().await.expect("bot post");
            let status = resp.status().as_u16();
            assert_eq!(status, 200, "{body}: {:?}", resp.text().await);
        }
    };
    post(json!({ "type": "TEXT", "text": "Hi! I am a bot.", "timestamp": 1583910736 })).await;
    let seen = until_message(&mut page, "Hi! I am a bot.").await;
    let (_, text) = seen.last().expect("the bot's message");
    assert_eq!(text["author"], "bot", "{text}");
    assert_eq!(text["name"], "Assistant", "{text}");
    assert!(text.get("buttons").is_none(), "{text}");

    let buttons = json!([{ "text": "Yes", "id": "1" }, { "text": "No", "id": "2" }]);
    post(
        json!({ "type": "BUTTONS", "title": "Call back?", "text": "Shall we call you back?",
                 "timestamp": 1583910737, "buttons": buttons }),
    )
    .await;
    let seen = until_message(&mut page, "Shall we call you back?").await;
    let (_, choice) = seen.last().expect("the buttons");
    assert_eq!(choice["author"], "bot", "{choice}");
    assert_eq!(choice["name"], "Assistant", "{choice}");
    assert_eq!(choice["buttons"], buttons, "{choice}");

    let history = visitor.history().await;
    assert_eq!(
        texts(&history),
        ["hello bot", "Hi! I am a bot.", "Shall we call you back?"]
    );
    assert_eq!(history[2]["buttons"], buttons, "{history:?}");

    // The page showed both; nobody was posted to.
    settle().await;
    let to_provider: Vec<Value> = provider.requests().iter().map(Recorded::json).collect();
    assert!(
        to_provider.iter().all(|e| e["event"] == "CLIENT_MESSAGE"),
        "the provider got only the visitor's message: {to_provider:?}"
    );
    for r in site.receiver.requests() {
        assert!(
            r.json().get("event_name").is_some(),
            "only webhooks reach the receiver: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let view = site.ann.chat(chat.parse().expect("chat id")).await;
    let bot_messages: Vec<&Value> = view["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["author"] == "bot")
        .collect();
    assert_eq!(bot_messages.len(), 2, "{view}");
    assert!(
        bot_messages.iter().all(|m| m["delivery"] == "delivered"),
        "{view}"
    );
    site.assert_nothing_sent_to_an_integrator().await;
    site.hub.shutdown().await;
}

#[tokio::test]
async fn a_visitor_flooding_messages_is_slowed_down_with_429_and_others_are_not() {
    let site = Site::open().await;
    let flooder = site.visitor().await;
    let mut statuses = Vec::new();
    for n in 0..40 {
        let (status, body) = flooder
            .post("messages", json!({ "text": format!("spam {n}") }))
            .await;
        if status == 429 {
            assert_fail("flood", &(status, body), 429);
        }
        statuses.push(status);
    }
    let accepted = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        (20..40).contains(&accepted),
        "a burst passes, then the visitor is slowed down: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        40 - accepted
    );
    // Another visitor on the same site is not held back by the flood.
    let other = site.visitor().await;
    other.say("I am not spam").await;
    site.hub.shutdown().await;
}

#[tokio::test]
async fn a_visitor_asks_for_a_callback_and_follows_the_call_the_agent_makes() {
    // Calls are taken at any hour here; the schedule itself has unit tests.
    let site = Site::with(json!({ "calls": { "enabled": true } })).await;
    let visitor = site.visitor().await;
    let (status, state) = visitor.call(Method::GET, "callback", None).await;
    assert_eq!((status, state), (200, json!({ "result": "ok" })));
    let answer = visitor.post("calls", json!({ "phone": "call me" })).await;
    assert_fail("a phone that is not one", &answer, 400);

    let mut desk = site.ann.stream().await;
    let mut page = visitor.stream().await;
    visitor
        .ok("calls", json!({ "phone": "+49 30 1234567" }))
        .await;
    let chat = site.chat_of(&visitor).await;
    let request = desk_event(&mut desk, chat, "chat.call").await;
    assert_eq!(
        request["call"],
        json!({ "type": "callback", "phone": "+49 30 1234567", "status": "start" })
    );
    let call_id = request["id"].as_i64().expect("call id");
    let started = site.webhook("call_event", |w| w["chat_id"] == chat).await;
    assert_eq!(started["call"]["status"], "start", "{started}");
    assert!(
        started.get("agent").is_none(),
        "nobody has taken the call yet: {started}"
    );
    // One request at a time.
    let again = visitor
        .post("calls", json!({ "phone": "+49 30 1234567" }))
        .await;
    assert_fail("a second request", &again, 409);
    assert_eq!(again.1["reason"], "A call is already in progress");

    // Ann takes the call: her status reports reach the visitor's page.
    let path = format!("/agent/v1/calls/{call_id}");
    let (status, v) = site
        .ann
        .send(
            Method::PUT,
            &path,
            Some(json!({ "status": "agent_connected" })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = site
        .ann
        .send(Method::PUT, &path, Some(json!({ "status": "end" })))
        .await;
    assert_eq!(status, 200, "{v}");
    let mut statuses = Vec::new();
    while statuses.last().map(String::as_str) != Some("end") {
        match page.next(WAIT).await {
            Some((name, data)) if name == "call" => {
                statuses.push(data["status"].as_str().unwrap_or_default().to_owned());
                if data["status"] == "end" {
                    assert_eq!(data["result"], "ok", "{data}");
                }
            }
            Some(_) => continue,
            None => panic!("the call's end did not reach the page: {statuses:?}"),
        }
    }
    assert_eq!(statuses, ["start", "agent_connected", "end"]);
    let ended = site
        .webhook("call_event", |w| w["call"]["status"] == "end")
        .await;
    assert_eq!(ended["agent"]["name"], "Ann", "{ended}");
    site.hub.shutdown().await;
}

#[tokio::test]
async fn outside_the_call_hours_the_page_is_told_why_and_nothing_is_asked() {
    // No day is open: the hours name none of them.
    let site = Site::with(json!({ "calls": { "enabled": true, "utc_offset": "+01:00",
        "hours": [{ "days": [], "from": "09:00", "to": "18:00" }] } }))
    .await;
    let visitor = site.visitor().await;
    let (_, state) = visitor.call(Method::GET, "callback", None).await;
    assert_eq!(
        state,
        json!({ "result": "fail", "reason": "Calls are not available at this time" })
    );
    let answer = visitor
        .post("calls", json!({ "phone": "+49 30 1234567" }))
        .await;
    assert_fail("outside the hours", &answer, 409);
    let (status, bad) = admin(
        &site.hub,
        Method::POST,
        "/admin/v1/channels",
        Some(json!({ "name": "bad", "type": "widget",
                     "calls": { "enabled": true, "utc_offset": "CET" } })),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("calls.utc_offset")),
        "{bad}"
    );
    site.hub.shutdown().await;
}

#[tokio::test]
async fn with_a_geoip_database_the_visitors_country_and_city_reach_the_agent_and_the_webhooks() {
    use hub::http::geoip::testing::{Place, database};
    let receiver = Integrator::start().await;
    // A database in MaxMind's format in which loopback is in Berlin.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("test-City.mmdb");
    let place = Place {
        country_code: "DE",
        country: "Germany",
        region_code: "BE",
        region: "Berlin",
        city: "Berlin",
        latitude: 52.5,
        longitude: 13.25,
    };
    std::fs::write(&path, database("127.0.0.0".parse().expect("ip"), 8, &place))
        .expect("write the database");
    let hub = TestHub::start_with_config(
        HubOptions {
            extra_toml: FAST_WEBHOOKS.to_owned(),
            ..HubOptions::default()
        },
        |config| config.geoip.database = Some(path.clone()),
    )
    .await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    let (status, channel) = admin(
        &hub,
        Method::POST,
        "/admin/v1/channels",
        Some(
            json!({ "name": "shop", "type": "widget", "widget_id": WIDGET_ID,
                     "agents": ["ann@example.com"], "webhook_url": receiver.url }),
        ),
    )
    .await;
    assert_eq!(status, 201, "{channel}");
    let site = Site { hub, ann, receiver };
    let visitor = site.visitor().await;
    visitor.say("Do you deliver to Berlin?").await;
    let chat = site.chat_of(&visitor).await;
    let expected = json!({ "country_code": "DE", "country": "Germany", "region_code": "BE",
                           "region": "Berlin", "city": "Berlin", "latitude": "52.5",
                           "longitude": "13.25" });
    let view = site.ann.chat(chat).await;
    assert_eq!(view["visitor"]["geoip"], expected, "{view}");
    site.act(chat, "accept").await;
    let accepted = site
        .webhook("chat_accepted", |w| w["chat_id"] == chat)
        .await;
    assert_eq!(accepted["session"]["geoip"], expected, "{accepted}");
    site.hub.shutdown().await;
}
