//! The agent API: status, chats, accept/close, replies and the live stream.

pub mod crm;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::channel::agent_message_body_from_value;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::core::error::CoreError;
use crate::core::live::client_view;
use crate::core::{Handled, Inbound};
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, error, json, method_not_allowed, parse_json, read_body};
use crate::http::{App, live_stream};
use crate::store::Agent;

/// Routes `/agent/v1/...` for the agent the layer authenticated; `rest` is
/// the path after `v1`.
pub async fn handle(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Resp {
    let method = req.method().clone();
    match (method, rest) {
        (Method::PUT, ["status"]) => set_status(app, req, agent).await,
        (Method::GET, ["me"]) => json(StatusCode::OK, agent),
        (Method::GET, ["chats"]) => list_chats(app, &req, agent).await,
        (Method::GET, ["chats", id]) => with_chat_id(id, |id| chat_view(app, agent, id)).await,
        (Method::POST, ["chats", id, "accept"]) => {
            with_chat_id(id, |id| async move {
                let done = app
                    .conversations
                    .handle(Inbound::Accept { agent, chat_id: id })
                    .await;
                core_answer(done.map(handled_json))
            })
            .await
        }
        (Method::POST, ["chats", id, "close"]) => {
            with_chat_id(id, |id| async move {
                let done = app
                    .conversations
                    .handle(Inbound::Close { agent, chat_id: id })
                    .await;
                core_answer(done.map(handled_json))
            })
            .await
        }
        (Method::POST, ["chats", id, "messages"]) => {
            let Ok(id) = id.parse::<i64>() else {
                return error(StatusCode::NOT_FOUND, "not_found", "no such chat");
            };
            send_message(app, req, agent, id).await
        }
        (Method::POST, ["chats", id, "crm-link"]) => {
            with_chat_id(id, |id| async move {
                let done = app
                    .conversations
                    .handle(Inbound::LinkCrm { agent, chat_id: id })
                    .await;
                core_answer(done.map(handled_json))
            })
            .await
        }
        (Method::PUT, ["chats", id, "attributes"]) => {
            let Ok(id) = id.parse::<i64>() else {
                return error(StatusCode::NOT_FOUND, "not_found", "no such chat");
            };
            set_attributes(app, req, agent, id).await
        }
        (Method::POST, ["calls"]) => start_call(app, req, agent).await,
        (Method::PUT, ["calls", id]) => {
            let Ok(id) = id.parse::<i64>() else {
                return error(StatusCode::NOT_FOUND, "not_found", "no such call");
            };
            update_call(app, req, agent, id).await
        }
        (_, ["calls"] | ["calls", _]) => method_not_allowed(),
        (Method::GET, ["stream"]) => stream(app, agent).await,
        (_, ["crm", rest @ ..]) => crate::http::agents::crm::handle(app, req, agent, rest).await,
        (_, ["status"] | ["me"] | ["chats"] | ["stream"] | ["chats", _, ..]) => {
            method_not_allowed()
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
    }
}

fn unavailable() -> Resp {
    Problem::unavailable().answer(Dialect::Api)
}

async fn with_chat_id<F, Fut>(id: &str, f: F) -> Resp
where
    F: FnOnce(i64) -> Fut,
    Fut: Future<Output = Resp>,
{
    match id.parse::<i64>() {
        Ok(id) => f(id).await,
        Err(_) => error(StatusCode::NOT_FOUND, "not_found", "no such chat"),
    }
}

fn core_answer(result: Result<serde_json::Value, CoreError>) -> Resp {
    match result {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => core_error(e),
    }
}

fn core_error(e: CoreError) -> Resp {
    Problem::core(e, "no such chat", "agent action").answer(Dialect::Api)
}

/// Parses a JSON body into `T`, answering 400/413 with the reason.
async fn json_body<T: for<'de> Deserialize<'de>>(
    app: &App,
    req: Request<Incoming>,
) -> Result<T, Resp> {
    let body = read_body(req, &app.config.server)
        .await
        .map_err(|e| Problem::body(&e).answer(Dialect::Api))?;
    parse_json(&body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("invalid JSON body: {e}"),
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusBody {
    online: bool,
}

async fn set_status(app: &App, req: Request<Incoming>, agent: &Agent) -> Resp {
    let body: StatusBody = match json_body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    match app.conversations.set_agent_online(agent, body.online).await {
        Ok(()) => json(StatusCode::OK, &json!({ "online": body.online })),
        Err(e) => {
            tracing::error!(error = %e, "cannot set agent status");
            unavailable()
        }
    }
}

async fn list_chats(app: &App, req: &Request<Incoming>, agent: &Agent) -> Resp {
    let include_closed = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "state=all" || p == "closed=true"));
    match app
        .store
        .chats_for_agent(&agent.email, include_closed, 500)
        .await
    {
        Ok(chats) => json(StatusCode::OK, &json!({ "chats": chats })),
        Err(e) => {
            tracing::error!(error = %e, "cannot list chats");
            unavailable()
        }
    }
}

async fn chat_view(app: &App, agent: &Agent, chat_id: i64) -> Resp {
    let chat = match app.conversations.visible_chat(agent, chat_id).await {
        Ok(c) => c,
        Err(e) => return core_error(e),
    };
    let client = app.store.client_by_id(chat.client_id).await;
    let messages = app.store.messages_of_chat(chat.id).await;
    let integration = app.store.chat_integration(chat.id).await;
    let bot = app.store.chat_bot(chat.id).await;
    let extras = app.store.visitor_extras(chat.client_id).await;
    let calls = app.store.calls_of_chat(chat.id).await.unwrap_or_default();
    match (client, messages, integration, bot, extras) {
        (Ok(Some(client)), Ok(messages), Ok(integration), Ok(bot), Ok(extras)) => json(
            StatusCode::OK,
            &json!({ "chat": chat, "client": client_view(&client), "messages": messages,
                     "integration": integration,
                     "attributes": extras.attributes.as_deref()
                         .and_then(|t| serde_json::from_str::<Value>(t).ok())
                         .unwrap_or_else(|| json!({})),
                     "bot": bot.map(|b| json!({ "id": b.bot_id, "name": b.name, "state": b.state })),
                     "visitor": visitor_view(&client, extras), "calls": calls }),
        ),
        (Ok(None), ..) => error(StatusCode::NOT_FOUND, "not_found", "no such chat"),
        (Err(e), ..)
        | (_, Err(e), ..)
        | (_, _, Err(e), ..)
        | (_, _, _, Err(e), _)
        | (.., Err(e)) => {
            tracing::error!(error = %e, "cannot read a chat");
            unavailable()
        }
    }
}

/// What the visitor's page told the hub (widget channels): custom data as
/// the page set it (untrusted: shown as text), the page, where they came
/// from, their address and browser, visits.
fn visitor_view(client: &crate::store::Client, x: crate::store::widget::VisitorExtras) -> Value {
    let parse = |t: Option<String>| t.and_then(|t| serde_json::from_str::<Value>(&t).ok());
    json!({
        "custom_data": parse(x.custom_data),
        "page": { "url": client.url, "title": x.page_title },
        "referrer": x.referrer,
        "utm_json": parse(x.utm_json),
        "user_agent": x.user_agent,
        "ip": x.ip,
        "geoip": parse(x.geoip_json),
        "visits_count": x.visits_count,
        "description": x.description,
        "user_token": x.user_token,
    })
}

async fn send_message(app: &App, req: Request<Incoming>, agent: &Agent, chat_id: i64) -> Resp {
    let body: serde_json::Value = match json_body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let message = match agent_message_body_from_value(body) {
        Ok(m) => m,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", e.0),
    };
    let done = app
        .conversations
        .handle(Inbound::AgentMessage {
            agent,
            chat_id,
            message,
        })
        .await;
    match done {
        Ok(Handled::AgentMessage(Some(stored))) => {
            json(StatusCode::CREATED, &json!({ "message": stored }))
        }
        Ok(_) => json(StatusCode::ACCEPTED, &json!({ "result": "ok" })),
        Err(e) => core_error(e),
    }
}

/// Server-Sent Events for the chats of the agent's channels.
async fn stream(app: &App, agent: &Agent) -> Resp {
    let listening = live_stream::listen(app);
    let channels = match app.store.agent_channel_ids(&agent.email).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the stream");
            return unavailable();
        }
    };
    live_stream::open(
        app,
        listening,
        AgentFrames {
            channels,
            agent_id: agent.id,
        },
    )
    .await
}

/// An agent's stream: every event of the agent's channels.
struct AgentFrames {
    channels: Vec<i64>,
    agent_id: i64,
}

impl live_stream::Frames for AgentFrames {
    async fn frame(&mut self, update: live_stream::Update) -> Option<Bytes> {
        match update {
            live_stream::Update::Event(ev) if self.channels.contains(&ev.channel_id) => {
                let data =
                    json!({ "chat_id": ev.chat_id, "channel_id": ev.channel_id, "data": ev.data });
                Some(live_stream::frame(ev.kind, &data))
            }
            live_stream::Update::Lagged(n) => {
                tracing::warn!(
                    agent = self.agent_id,
                    missed = n,
                    "agent stream fell behind"
                );
                Some(live_stream::frame("lagged", &json!({ "missed": n })))
            }
            _ => None,
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AttributesBody {
    attributes: serde_json::Map<String, serde_json::Value>,
}

async fn set_attributes(app: &App, req: Request<Incoming>, agent: &Agent, chat_id: i64) -> Resp {
    let body: AttributesBody = match json_body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let done = app
        .conversations
        .handle(Inbound::SetAttributes {
            agent,
            chat_id,
            changes: body.attributes,
        })
        .await;
    core_answer(done.map(handled_json))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StartCallBody {
    chat_id: i64,
    #[serde(rename = "type")]
    kind: plugin_api::webhook::CallType,
    phone: String,
}

async fn start_call(app: &App, req: Request<Incoming>, agent: &Agent) -> Resp {
    let b: StartCallBody = match json_body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let report = crate::core::integration::CallReport::Start {
        chat_id: b.chat_id,
        kind: b.kind,
        phone: b.phone,
    };
    match app
        .conversations
        .handle(Inbound::Call { agent, report })
        .await
    {
        Ok(done) => json(StatusCode::CREATED, &handled_json(done)),
        Err(e) => core_error(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CallStatusBody {
    status: plugin_api::webhook::CallStatus,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    record_url: Option<String>,
}

async fn update_call(app: &App, req: Request<Incoming>, agent: &Agent, call_id: i64) -> Resp {
    let b: CallStatusBody = match json_body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let report = crate::core::integration::CallReport::Status {
        call_id,
        status: b.status,
        reason: b.reason,
        record_url: b.record_url,
    };
    let done = app
        .conversations
        .handle(Inbound::Call { agent, report })
        .await;
    core_answer(done.map(handled_json))
}

/// The JSON answer of an agent action.
fn handled_json(done: Handled) -> serde_json::Value {
    match done {
        Handled::Chat(chat) => json!(chat),
        Handled::CrmLink(link) => json!({ "crm_link": link }),
        Handled::Attributes(attributes) => json!({ "attributes": attributes }),
        Handled::Call(call) => call,
        Handled::AgentMessage(stored) => json!({ "message": stored }),
        Handled::Crm(done) => done.body,
        Handled::Customer(_)
        | Handled::Offline(_)
        | Handled::Bot(_)
        | Handled::Widget
        | Handled::Session(_) => json!({ "result": "ok" }),
    }
}
