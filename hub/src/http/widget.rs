//! The widget's HTTP edge: the script pages embed (`/widget/<widget_id>`),
//! the demo page, and the API the script calls (`/widget/v1/<widget_id>/…`):
//! the visitor's session, messages, live stream and `widget_api` calls,
//! with CORS by the channel's `allowed_origins`, visitor tokens the hub
//! signed, and `{result: ok}` / `{result: fail, reason | error}` answers.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, ETAG, IF_NONE_MATCH, USER_AGENT};
use http::{HeaderValue, Method, Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::widget::{ContactInfo, CustomDataField, OfflineMessageInput};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::core::error::CoreError;
use crate::core::messages::Ingested;
use crate::core::offline::OfflineOutcome;
use crate::core::widget::WidgetAction;
use crate::core::{Handled, Inbound};
use crate::http::layer::{Visitor, VisitorNeed, no_visitor};
use crate::http::problem::{Dialect, Problem, widget_fail as fail};
use crate::http::respond::{Resp, full, json, parse_json, query_pairs, read_body, text, with_type};
use crate::http::{App, live_stream};
use crate::store::widget::PageReport;
use crate::store::{Author, Channel, Client, MessageRow};

/// The script, served with its configuration prepended.
const SCRIPT: &str = include_str!("../../assets/widget.js");
/// The demo page; `{{WIDGET_SRC}}` is the script's URL.
const DEMO: &str = include_str!("../../assets/demo.html");

/// `GET /widget/<widget_id>` and `/script/widget/<widget_id>`.
pub async fn script(app: &App, req: &Request<Incoming>, widget_id: &str) -> Resp {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return crate::http::respond::method_not_allowed();
    }
    let channel = match widget(app, widget_id).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let config = json!({
        "widget_id": channel.public_id,
        "color": color_of(&channel),
        "base": app.base,
    });
    let body = format!("var HUB_WIDGET = {config};\n{SCRIPT}");
    let etag = format!(
        "\"{}\"",
        &hex::encode(Sha256::digest(body.as_bytes()))[..32]
    );
    let fresh = req
        .headers()
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if fresh {
        with_type(
            StatusCode::NOT_MODIFIED,
            "application/javascript; charset=utf-8",
            full(Bytes::new()),
        )
    } else {
        with_type(
            StatusCode::OK,
            "application/javascript; charset=utf-8",
            full(body),
        )
    };
    let headers = resp.headers_mut();
    // Short: a colour changed by the operator reaches pages within minutes;
    // the ETag makes the revalidation cheap.
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    if let Ok(v) = HeaderValue::from_str(&etag) {
        headers.insert(ETAG, v);
    }
    resp
}

/// `GET /demo/<widget_id>`: a page embedding the widget, for trying it.
pub async fn demo(app: &App, req: &Request<Incoming>, widget_id: &str) -> Resp {
    if *req.method() != Method::GET {
        return crate::http::respond::method_not_allowed();
    }
    let channel = match widget(app, widget_id).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let src = format!("/widget/{}", channel.public_id);
    with_type(
        StatusCode::OK,
        "text/html; charset=utf-8",
        full(DEMO.replace("{{WIDGET_SRC}}", &src)),
    )
}

async fn widget(app: &App, widget_id: &str) -> Result<Channel, Resp> {
    match app.store.channel_by_public_id(widget_id).await {
        Ok(Some(c)) if c.is_widget() => Ok(c),
        Ok(_) => Err(text(StatusCode::NOT_FOUND, "no such widget")),
        Err(e) => {
            tracing::error!(error = %e, "widget lookup failed");
            Err(Problem::unavailable().answer(Dialect::Widget))
        }
    }
}

fn color_of(channel: &Channel) -> String {
    channel
        .color
        .clone()
        .unwrap_or_else(|| crate::core::provisioning::DEFAULT_WIDGET_COLOR.to_owned())
}

/// What each widget endpoint asks of the layer: the visitor's token on the
/// visitor's endpoints (and the visitor's message rate on a message),
/// optionally on the callback state and the offline form.
pub fn needs(channel: &Channel, method: &Method, endpoint: &[&str]) -> VisitorNeed {
    match endpoint {
        // The widget sends its visitor token; the form is taken without one
        // (or with one the hub no longer knows) as well, from anyone.
        ["offline-messages"] if *method == Method::POST && channel.is_widget() => {
            VisitorNeed::Optional
        }
        _ if !channel.is_widget() => VisitorNeed::None,
        // With a token, a call under way counts.
        ["callback"] if *method == Method::GET => VisitorNeed::Optional,
        ["messages"] if *method == Method::POST => VisitorNeed::Messaging,
        [name] if WIDGET_ENDPOINTS.contains(name) => VisitorNeed::Required,
        _ => VisitorNeed::None,
    }
}

/// Routes `/widget/v1/<widget_id>/...` once the layer admitted it.
pub async fn handle(app: &App, req: Request<Incoming>, admitted: Visitor<'_>) -> Resp {
    let channel = &admitted.channel;
    let method = req.method().clone();
    let visitor = admitted.client.as_ref();
    // The offline form predates widget channels: any channel takes it.
    let resp = if admitted.endpoint == ["offline-messages"] {
        match method {
            Method::POST => offline_message(app, req, channel, visitor).await,
            _ => crate::http::respond::method_not_allowed(),
        }
    } else if !channel.is_widget() {
        fail(StatusCode::NOT_FOUND, "no such widget")
    } else {
        match (method, admitted.endpoint) {
            (Method::POST, ["session"]) => session(app, req, channel).await,
            (Method::GET, ["callback"]) => {
                match app.conversations.callback_state(channel, visitor).await {
                    Ok(state) => json(StatusCode::OK, &callback_answer(state)),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the callback state");
                        Problem::unavailable().answer(Dialect::Widget)
                    }
                }
            }
            (m, [name]) if WIDGET_ENDPOINTS.contains(name) => {
                // The layer asked for the token on these.
                let Some(visitor) = visitor else {
                    return admitted.answer(no_visitor());
                };
                match (m, *name) {
                    (Method::GET, "stream") => stream(app, &req, channel, visitor.clone()).await,
                    (Method::GET, "messages") => history(app, visitor).await,
                    (Method::POST, "messages") => send(app, req, channel, visitor).await,
                    (Method::POST, "typing") => typing(app, req, channel, visitor).await,
                    (Method::POST, "calls") => start_call(app, req, channel, visitor).await,
                    (Method::POST, action) => widget_call(app, req, channel, visitor, action).await,
                    _ => crate::http::respond::method_not_allowed(),
                }
            }
            _ => fail(StatusCode::NOT_FOUND, "no such endpoint"),
        }
    };
    admitted.answer(resp)
}

/// Endpoints that need the visitor's token.
const WIDGET_ENDPOINTS: [&str; 11] = [
    "stream",
    "messages",
    "typing",
    "contacts",
    "custom-data",
    "user-token",
    "page",
    "attributes",
    "calls",
    "clear",
    "history",
];

fn ok() -> Resp {
    json(StatusCode::OK, &json!({ "result": "ok" }))
}

/// The query parameter `name`, decoded.
fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    query_pairs(req.uri().query()?).find_map(|(k, v)| (k == name).then_some(v))
}

async fn body<T: for<'de> Deserialize<'de>>(app: &App, req: Request<Incoming>) -> Result<T, Resp> {
    let bytes = read_body(req, &app.config.server)
        .await
        .map_err(|e| fail(e.status(), e.reason()))?;
    parse_json(&bytes).map_err(|e| fail(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))
}

#[derive(Deserialize, Default)]
struct PageBody {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    referrer: Option<String>,
}

#[derive(Deserialize)]
struct SessionBody {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    page: PageBody,
}

/// Longest page field kept (URLs, titles from the page are untrusted).
const MAX_PAGE_FIELD: usize = 2048;

fn bounded(v: Option<String>) -> Option<String> {
    v.map(|s| s.chars().take(MAX_PAGE_FIELD).collect::<String>())
        .filter(|s| !s.is_empty())
}

async fn session(app: &App, req: Request<Incoming>, channel: &Channel) -> Resp {
    let ip =
        crate::http::client_ip(&req, &app.config.server.trusted_proxies).map(|a| a.to_string());
    let user_agent = req
        .headers()
        .get(USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(512).collect::<String>());
    let b: SessionBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let url = bounded(b.page.url);
    let title = bounded(b.page.title);
    let referrer = bounded(b.page.referrer);
    let utm = url.as_deref().and_then(utm_of).map(|u| u.to_string());
    let geoip = match (&app.geoip, ip.as_deref().and_then(|i| i.parse().ok())) {
        (Some(db), Some(addr)) => db.lookup(addr).map(|g| g.to_string()),
        _ => None,
    };
    let page = PageReport {
        url: url.as_deref(),
        title: title.as_deref(),
        referrer: referrer.as_deref(),
        ip: ip.as_deref(),
        user_agent: user_agent.as_deref(),
        utm_json: utm.as_deref(),
        geoip_json: geoip.as_deref(),
    };
    let started = app
        .conversations
        .handle(Inbound::WidgetSession {
            channel,
            keys: &app.visitor_keys,
            token: b.token.as_deref(),
            page,
        })
        .await;
    let s = match started {
        Ok(Handled::Session(s)) => s,
        Ok(_) => return core_fail(CoreError::Unavailable("not a session".into())),
        Err(e) => return core_fail(e),
    };
    let names = agent_names(app, &s.messages).await;
    let callback = match app
        .conversations
        .callback_state(channel, Some(&s.client))
        .await
    {
        Ok(state) => state,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the callback state");
            Err(crate::config::CALLBACK_DISABLED.to_owned())
        }
    };
    let extras = app
        .store
        .visitor_extras(s.client.id)
        .await
        .unwrap_or_default();
    let messages: Vec<Value> = s.messages.iter().map(|m| message_view(m, &names)).collect();
    json(
        StatusCode::OK,
        &json!({
            "result": "ok",
            "token": s.token,
            "visitor": { "id": s.client.external_id.as_key(), "number": s.client.visitor_number },
            "chat_mode": if s.online { "online" } else { "offline" },
            "color": color_of(channel),
            "contact_info": {
                "client_name": s.client.name,
                "email": s.client.email,
                "phone": s.client.phone,
                "description": extras.description,
            },
            "chat": s.chat.map(|(id, state, _)| json!({ "id": id, "state": state })),
            "messages": messages,
            "callback": callback_answer(callback),
            "unread": 0,
        }),
    )
}

/// `utm_json` from a page URL's `utm_*` parameters; `None` without any.
fn utm_of(url: &str) -> Option<Value> {
    let query = url.split_once('?')?.1.split('#').next().unwrap_or("");
    let mut utm = Map::new();
    for (k, v) in query_pairs(query) {
        if let Some(name) = k.strip_prefix("utm_")
            && ["source", "medium", "campaign", "content", "term"].contains(&name)
        {
            utm.insert(name.to_owned(), Value::from(v));
        }
    }
    (!utm.is_empty()).then_some(Value::Object(utm))
}

/// `isCallbackEnabled`'s result.
fn callback_answer(state: Result<(), String>) -> Value {
    match state {
        Ok(()) => json!({ "result": "ok" }),
        Err(reason) => json!({ "result": "fail", "reason": reason }),
    }
}

#[derive(Deserialize)]
pub(crate) struct CallBody {
    pub(crate) phone: Value,
}

/// `startCall(phone)`: a callback request agents see and take.
async fn start_call(
    app: &App,
    req: Request<Incoming>,
    channel: &Channel,
    visitor: &Client,
) -> Resp {
    let b: CallBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let phone = match b.phone {
        Value::String(p) if crate::core::widget::is_phone(&p) => p,
        _ => return fail(StatusCode::BAD_REQUEST, "invalid phone number"),
    };
    match app
        .conversations
        .callback_state(channel, Some(visitor))
        .await
    {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => return fail(StatusCode::CONFLICT, reason),
        Err(e) => {
            tracing::error!(error = %e, "cannot read the callback state");
            return Problem::unavailable().answer(Dialect::Widget);
        }
    }
    let action = WidgetAction::StartCall(phone);
    match app
        .conversations
        .handle(Inbound::Widget {
            channel,
            visitor,
            action,
        })
        .await
    {
        Ok(_) => ok(),
        Err(e) => core_fail(e),
    }
}

/// Agent names by id, for the messages' `name`.
async fn agent_names(app: &App, messages: &[MessageRow]) -> HashMap<i64, String> {
    let ids: HashSet<i64> = messages.iter().filter_map(|m| m.agent_id).collect();
    let mut names = HashMap::new();
    for id in ids {
        if let Ok(Some(agent)) = app.store.agent_by_id(id).await {
            names.insert(id, agent.name);
        }
    }
    names
}

/// A message as the visitor's page shows it.
fn message_view(m: &MessageRow, agents: &HashMap<i64, String>) -> Value {
    let author = match m.author {
        Author::Client => "client",
        Author::Agent => "agent",
        Author::Auto => "auto",
        Author::Bot => "bot",
    };
    let name = match m.author {
        Author::Agent => m.agent_id.and_then(|id| agents.get(&id).cloned()),
        Author::Bot => m.author_name.clone(),
        _ => None,
    };
    let mut view = json!({
        "id": m.id,
        "author": author,
        "name": name,
        "created_at": m.created_at,
    });
    if m.author == Author::Bot {
        if let Ok(bot) = serde_json::from_value::<plugin_api::bot::Message>(m.body.clone()) {
            view["text"] = json!(match &bot {
                plugin_api::bot::Message::Buttons(b) if !b.text.is_empty() => b.text.clone(),
                plugin_api::bot::Message::Buttons(b) => b.title.clone(),
                other => other.display_text(),
            });
            if let plugin_api::bot::Message::Buttons(b) = &bot {
                view["buttons"] = json!(b.buttons);
            }
        }
    } else if let Ok(msg) = serde_json::from_value::<plugin_api::channel::Message>(m.body.clone()) {
        view["text"] = json!(match &msg {
            plugin_api::channel::Message::Text(t) => t.text.clone(),
            other => other.preview(),
        });
        if let Some(file) = m.body.get("file") {
            view["file"] = file.clone();
        }
    }
    view
}

async fn history(app: &App, visitor: &Client) -> Resp {
    let from = app
        .store
        .visitor_extras(visitor.id)
        .await
        .map(|e| e.history_from.unwrap_or(0))
        .unwrap_or(0);
    match app.store.visitor_messages(visitor.id, from, 200).await {
        Ok(messages) => {
            let names = agent_names(app, &messages).await;
            let views: Vec<Value> = messages.iter().map(|m| message_view(m, &names)).collect();
            json(
                StatusCode::OK,
                &json!({ "result": "ok", "messages": views }),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read a visitor's history");
            Problem::unavailable().answer(Dialect::Widget)
        }
    }
}

#[derive(Deserialize)]
struct TextBody {
    text: String,
}

/// The visitor writes: a customer message of the widget's channel.
async fn send(app: &App, req: Request<Incoming>, channel: &Channel, visitor: &Client) -> Resp {
    let b: TextBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    if b.text.trim().is_empty() {
        return fail(StatusCode::BAD_REQUEST, "the message is empty");
    }
    let sent = ingest(
        app,
        channel,
        visitor,
        json!({ "type": "text", "text": b.text }),
    )
    .await;
    match sent {
        Ok(Some(m)) => json(
            StatusCode::OK,
            &json!({ "result": "ok", "message": message_view(&m, &HashMap::new()) }),
        ),
        // Dropped by a plugin (a spam filter is not revealed).
        Ok(None) => ok(),
        Err(resp) => resp,
    }
}

/// A customer message of `visitor` (a text or a typing notice), checked by
/// the channel's rules and taken through the door like an integrator's:
/// the stored message, if one was stored.
async fn ingest(
    app: &App,
    channel: &Channel,
    visitor: &Client,
    message: Value,
) -> Result<Option<MessageRow>, Resp> {
    let value = json!({ "sender": { "id": visitor.external_id }, "message": message });
    let message = plugin_api::channel::customer_message_from_value(value)
        .map_err(|e| fail(StatusCode::BAD_REQUEST, e.0))?;
    match app
        .conversations
        .handle(Inbound::CustomerMessage { channel, message })
        .await
    {
        Ok(Handled::Customer(Ingested::Stored { message, .. })) => Ok(message),
        Ok(_) => Ok(None),
        Err(e) => Err(core_fail(e)),
    }
}

#[derive(Deserialize)]
struct TypingBody {
    typing: bool,
}

async fn typing(app: &App, req: Request<Incoming>, channel: &Channel, visitor: &Client) -> Resp {
    let b: TypingBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let kind = if b.typing { "typein" } else { "typeout" };
    match ingest(app, channel, visitor, json!({ "type": kind })).await {
        Ok(_) => ok(),
        Err(resp) => resp,
    }
}

#[derive(Deserialize)]
struct FieldsBody {
    fields: Value,
}

#[derive(Deserialize)]
struct UserTokenBody {
    token: Value,
}

#[derive(Deserialize)]
struct AttributesBody {
    attributes: Value,
}

/// `setContactInfo`, `setCustomData`, `setUserToken`, `sendPageTitle`,
/// `setClientAttributes`, `clearHistory`.
async fn widget_call(
    app: &App,
    req: Request<Incoming>,
    channel: &Channel,
    visitor: &Client,
    endpoint: &str,
) -> Resp {
    let bytes = match read_body(req, &app.config.server).await {
        Ok(b) => b,
        Err(e) => return fail(e.status(), e.reason()),
    };
    let action = match parse_call(endpoint, &bytes) {
        Ok(a) => a,
        Err(reason) => return fail(StatusCode::BAD_REQUEST, reason),
    };
    let token = match &action {
        WidgetAction::UserToken(t) => Some(t.clone()),
        _ => None,
    };
    let done = app
        .conversations
        .handle(Inbound::Widget {
            channel,
            visitor,
            action,
        })
        .await;
    match (done, token) {
        (Ok(_), Some(token)) => json(StatusCode::OK, &json!({ "result": "ok", "token": token })),
        (Ok(_), None) => ok(),
        (Err(CoreError::Conflict(m)), _) if m.contains("per hour") => {
            fail(StatusCode::TOO_MANY_REQUESTS, m)
        }
        (Err(e), _) => core_fail(e),
    }
}

/// Reads the body of a `widget_api` call to `endpoint` (an empty body is
/// `{}`); the reason is the fail result's.
pub(crate) fn parse_call(endpoint: &str, b: &[u8]) -> Result<WidgetAction, String> {
    let b = if b.is_empty() { &b"{}"[..] } else { b };
    Ok(match endpoint {
        "contacts" => WidgetAction::Contacts(parse_json::<ContactInfo>(b)?),
        "custom-data" => {
            let FieldsBody { fields } = parse_json(b)?;
            if !fields.is_array() {
                return Err("fields must be an array".to_owned());
            }
            let fields: Vec<CustomDataField> =
                crate::http::respond::from_value(fields).map_err(|e| {
                    // `[3].key: …` reads as `fields[3].key: …`.
                    let sep = if e.starts_with('[') { "" } else { ": " };
                    format!("fields{sep}{e}")
                })?;
            WidgetAction::CustomData(fields)
        }
        "user-token" => {
            let UserTokenBody { token } = parse_json(b)?;
            match token {
                Value::String(t) => WidgetAction::UserToken(t),
                _ => return Err("the user token must be a string".to_owned()),
            }
        }
        "page" => {
            let p: PageBody = parse_json(b)?;
            WidgetAction::Page {
                url: bounded(p.url),
                title: bounded(p.title),
                referrer: bounded(p.referrer),
            }
        }
        "attributes" => {
            let AttributesBody { attributes } = parse_json(b)?;
            match attributes {
                Value::Object(m) => WidgetAction::Attributes(m),
                _ => return Err("attributes must be an object".to_owned()),
            }
        }
        "clear" => WidgetAction::ClearHistory,
        _ => return Err("no such endpoint".to_owned()),
    })
}

/// A core refusal as the fail result; the hub's own faults as a 503.
fn core_fail(e: CoreError) -> Resp {
    let problem = Problem::core(e, "no such chat", "a widget call");
    json(
        problem.status,
        &json!({ "result": "fail", "reason": problem.message }),
    )
}

/// The visitor's live stream: their chats' messages (their own too, so every
/// open page of the site shows them), agent typing, the chat accepted or
/// closed, and the channel going on- or offline.
///
/// Messages carry their id as the SSE `id`. A stream opened with a resume
/// point (`Last-Event-ID`, which the browser sends when it reconnects by
/// itself, or `?after=`, which the script sends: `EventSource` takes no
/// headers) first sends the messages after it, in order, then the chat's
/// state and the channel's mode: what a page missed while it was not
/// connected, also across a restart of the hub, since ids are the
/// database's.
async fn stream(app: &App, req: &Request<Incoming>, channel: &Channel, visitor: Client) -> Resp {
    // Listening before the chats are read: a chat opened in between is heard.
    let listening = live_stream::listen(app);
    let mut chats = match app.store.visitor_chats(visitor.id).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot open a visitor stream");
            return Problem::unavailable().answer(Dialect::Widget);
        }
    };
    let latest = chats.last().cloned();
    let online = app
        .store
        .channel_has_online_agent(channel.id)
        .await
        .unwrap_or(false);
    let history_from = app
        .store
        .visitor_extras(visitor.id)
        .await
        .map(|e| e.history_from.unwrap_or(0))
        .unwrap_or(0);
    live_stream::open(
        app,
        listening,
        VisitorFrames {
            store: app.store.clone(),
            channel_id: channel.id,
            visitor_id: visitor.id,
            chats: chats.drain(..).map(|(id, _, _)| id).collect(),
            names: HashMap::new(),
            online,
            resume: resume_point(req),
            latest,
            sent: None,
            history_from,
        },
    )
    .await
}

/// The id of the last message the page has, if it says: `Last-Event-ID`,
/// else `?after=`.
fn resume_point(req: &Request<Incoming>) -> Option<i64> {
    let header = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    header
        .or_else(|| query_param(req, "after").and_then(|v| v.trim().parse().ok()))
        .filter(|id| *id >= 0)
}

/// Missed messages read per query while catching a stream up.
const CATCH_UP_PAGE: i64 = 200;

/// A visitor's stream: the events of their own chats, and the channel's mode.
struct VisitorFrames {
    store: crate::store::Store,
    channel_id: i64,
    visitor_id: i64,
    chats: HashSet<i64>,
    /// Agent names by id, read once per stream.
    names: HashMap<i64, String>,
    online: bool,
    /// The id of the last message the page had when it (re)connected.
    resume: Option<i64>,
    /// The visitor's latest chat when the stream opened: id, state, agent.
    latest: Option<(i64, String, Option<i64>)>,
    /// The id of the last message sent (or had by the page); `None` until
    /// known.
    sent: Option<i64>,
    /// Messages before this time were cleared from the visitor's window.
    history_from: i64,
}

impl VisitorFrames {
    /// The `mode` frame if the channel's availability changed.
    fn mode(&mut self, now: bool) -> Option<Bytes> {
        if now == self.online {
            return None;
        }
        self.online = now;
        Some(mode_frame(now))
    }

    /// The visitor's messages after the last one sent, in order. Read from
    /// the database rather than taken from the broadcast: a message
    /// published out of order, missed while the stream lagged, or written
    /// while the page was away comes all the same, and none twice.
    async fn missed(&mut self) -> Result<Vec<Bytes>, crate::store::StoreError> {
        let Some(mut after) = self.sent else {
            return Ok(Vec::new());
        };
        let mut frames = Vec::new();
        loop {
            let page = self
                .store
                .visitor_messages_after(self.visitor_id, after, self.history_from, CATCH_UP_PAGE)
                .await?;
            for m in &page {
                learn_agent(&self.store, &mut self.names, m.agent_id).await;
                frames.push(message_frame(m, &self.names));
                after = m.id;
            }
            self.sent = Some(after);
            if i64::try_from(page.len()).unwrap_or(i64::MAX) < CATCH_UP_PAGE {
                return Ok(frames);
            }
        }
    }

    /// What a page that was away needs besides messages: its chat's state
    /// and the channel's mode (both are states, so sending them again is
    /// harmless).
    async fn states(&mut self) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if let Some((_, state, agent)) = self.latest.clone()
            && let Some(frame) = chat_frame(&self.store, &mut self.names, &state, agent).await
        {
            frames.push(frame);
        }
        frames.push(mode_frame(self.online));
        frames
    }

    /// A message of the visitor's chats was published: what the page has
    /// not had yet, up to it.
    async fn message(&mut self, data: &Value) -> Option<Bytes> {
        let m: MessageRow = serde_json::from_value(data.get("message")?.clone()).ok()?;
        if self.sent.is_some_and(|sent| m.id <= sent) {
            return None;
        }
        if self.sent.is_some() {
            match self.missed().await {
                Ok(frames) => return joined(frames),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a visitor's messages; sending the one published")
                }
            }
        }
        self.sent = Some(m.id);
        learn_agent(&self.store, &mut self.names, m.agent_id).await;
        Some(message_frame(&m, &self.names))
    }

    /// After the stream fell behind the broadcast: the visitor's chats and
    /// what they missed, read again.
    async fn catch_up(&mut self) -> Option<Bytes> {
        if let Ok(chats) = self.store.visitor_chats(self.visitor_id).await {
            self.chats = chats.iter().map(|(id, _, _)| *id).collect();
            self.latest = chats.last().cloned();
        }
        let mut frames = self.missed().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read a visitor's missed messages");
            Vec::new()
        });
        frames.extend(self.states().await);
        joined(frames)
    }
}

impl live_stream::Frames for VisitorFrames {
    fn tick(&self) -> Option<Duration> {
        // Agents of this hub going on- or offline arrive as events at once;
        // another hub on the same database is only seen by looking now and then.
        Some(Duration::from_secs(15))
    }

    async fn start(&mut self) -> Vec<Bytes> {
        let Some(after) = self.resume else {
            // No resume point: from the visitor's latest message on.
            self.sent = self
                .store
                .visitor_last_message_id(self.visitor_id)
                .await
                .ok();
            return Vec::new();
        };
        self.sent = Some(after);
        let mut frames = self.missed().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read a visitor's missed messages");
            Vec::new()
        });
        frames.extend(self.states().await);
        frames
    }

    async fn frame(&mut self, update: live_stream::Update) -> Option<Bytes> {
        match update {
            live_stream::Update::Event(ev) if ev.channel_id != self.channel_id => None,
            live_stream::Update::Event(ev) if ev.kind == "channel.availability" => {
                let now = ev.data["online"].as_bool().unwrap_or(self.online);
                self.mode(now)
            }
            live_stream::Update::Event(ev) => {
                if ev.kind == "chat.opened"
                    && ev.data["client"]["id"].as_i64() == Some(self.visitor_id)
                {
                    self.chats.insert(ev.chat_id);
                }
                if !self.chats.contains(&ev.chat_id) {
                    return None;
                }
                if ev.kind == "chat.message" {
                    return self.message(&ev.data).await;
                }
                visitor_frame(&self.store, &mut self.names, ev.kind, &ev.data).await
            }
            live_stream::Update::Lagged(_) => self.catch_up().await,
            live_stream::Update::Tick => {
                let now = self
                    .store
                    .channel_has_online_agent(self.channel_id)
                    .await
                    .unwrap_or(self.online);
                self.mode(now)
            }
        }
    }
}

/// Frames sent as one write; nothing if there are none.
fn joined(frames: Vec<Bytes>) -> Option<Bytes> {
    match frames.len() {
        0 => None,
        1 => frames.into_iter().next(),
        _ => Some(Bytes::from(frames.concat())),
    }
}

/// The page's `message` event, with the message's id as the event's id.
fn message_frame(m: &MessageRow, names: &HashMap<i64, String>) -> Bytes {
    live_stream::frame_with_id(m.id, "message", &message_view(m, names))
}

/// The page's `mode` event: whether an agent is there.
fn mode_frame(online: bool) -> Bytes {
    let m = if online { "online" } else { "offline" };
    live_stream::frame("mode", &json!({ "chat_mode": m }))
}

/// The page's `chat` event for a chat accepted (by `agent`) or closed.
async fn chat_frame(
    store: &crate::store::Store,
    names: &mut HashMap<i64, String>,
    state: &str,
    agent: Option<i64>,
) -> Option<Bytes> {
    let payload = match state {
        "accepted" => {
            learn_agent(store, names, agent).await;
            let agent = agent
                .and_then(|id| names.get(&id))
                .map(|name| json!({ "name": name }));
            json!({ "state": "accepted", "agent": agent })
        }
        "closed" => json!({ "state": "closed", "agent": null }),
        _ => return None,
    };
    Some(live_stream::frame("chat", &payload))
}

/// What a live event of the visitor's chat (other than a message) tells
/// their page, if anything.
async fn visitor_frame(
    store: &crate::store::Store,
    names: &mut HashMap<i64, String>,
    kind: &str,
    data: &Value,
) -> Option<Bytes> {
    let (event, payload) = match kind {
        "chat.typing" if data["by"] == "agent" => (
            "typing",
            json!({ "typing": data["typing"], "name": data["name"] }),
        ),
        "chat.accepted" => {
            return chat_frame(store, names, "accepted", data["agent_id"].as_i64()).await;
        }
        "chat.closed" => return chat_frame(store, names, "closed", None).await,
        "chat.call" => {
            let call = data.get("call")?;
            let status = call["status"].as_str().unwrap_or("start");
            let result = if status == "error" { "fail" } else { "ok" };
            (
                "call",
                json!({ "status": status, "result": result, "reason": call["reason"] }),
            )
        }
        _ => return None,
    };
    Some(live_stream::frame(event, &payload))
}

/// Remembers agent `id`'s name, read once per stream.
async fn learn_agent(
    store: &crate::store::Store,
    names: &mut HashMap<i64, String>,
    id: Option<i64>,
) {
    if let Some(id) = id
        && !names.contains_key(&id)
        && let Ok(Some(agent)) = store.agent_by_id(id).await
    {
        names.insert(id, agent.name);
    }
}

async fn offline_message(
    app: &App,
    req: Request<Incoming>,
    channel: &Channel,
    visitor: Option<&Client>,
) -> Resp {
    // The method's own dialect: `{result: fail, error}`.
    let refuse =
        |status, error: String| Problem::new(status, "fail", error).answer(Dialect::Widget);
    let body = match read_body(req, &app.config.server).await {
        Ok(b) => b,
        Err(e) => return Problem::body(&e).answer(Dialect::Widget),
    };
    let form: OfflineMessageInput = match parse_json(&body) {
        Ok(f) => f,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("invalid form: {e}")),
    };
    let done = app
        .conversations
        .handle(Inbound::OfflineMessage {
            channel,
            form,
            visitor,
        })
        .await;
    match done {
        Ok(Handled::Offline(OfflineOutcome::Stored { id })) => json(
            StatusCode::OK,
            &json!({ "result": "ok", "offline_message_id": id }),
        ),
        // A spam filter's drop is not told to the sender.
        Ok(_) => ok(),
        Err(e) => Problem::core(e, "no such widget", "offline message").answer(Dialect::Widget),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utm_parameters_come_from_the_page_url() {
        assert_eq!(
            utm_of(
                "https://shop.example.com/?utm_source=google&utm_medium=cpc&x=1&utm_term=a%20b#top"
            ),
            Some(json!({ "source": "google", "medium": "cpc", "term": "a b" }))
        );
        assert_eq!(utm_of("https://shop.example.com/?x=1"), None);
        assert_eq!(utm_of("https://shop.example.com/"), None);
    }

    #[test]
    fn percent_decoding_is_lenient() {
        let utm = utm_of("https://x.example/?utm_source=a%2Eb+c&utm_term=bad%zz%");
        assert_eq!(
            utm,
            Some(serde_json::json!({ "source": "a.b c", "term": "bad%zz%" }))
        );
    }
}
