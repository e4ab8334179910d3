//! The bot exchange edge: what providers post to
//! `/webhooks/<provider_id>/<token>` and `/providers/<provider_id>/<token>`
//! (the latter with the optional `Authorization`), answered with the spec's
//! statuses and `{"error":{"code","message"}}` bodies.

use http::header::AUTHORIZATION;
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::bot::{BotEvent, ErrorCode};
use serde_json::{Value, json};

use crate::core::Inbound;
use crate::core::conversations::CoreError;
use crate::http::limits;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, error, json, parse_json, read_body};
use crate::http::{App, client_ip};
use crate::ids::constant_time_eq;

/// Events a provider sends; the others are the hub's own (405 if posted to it).
const FROM_PROVIDERS: [&str; 3] = ["BOT_MESSAGE", "INVITE_AGENT", "CLIENT_INFO"];

/// Which of the two URLs the provider used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `/webhooks/…`: the token in the path is the credential.
    Webhooks,
    /// `/providers/…`: a bot with `auth` also requires its bearer token back.
    Providers,
}

/// Handles a provider's request; `rest` is the path after `webhooks` or `providers`.
pub async fn handle(app: &App, req: Request<Incoming>, door: Door, rest: &[&str]) -> Resp {
    let [provider_id, token] = rest else {
        return refuse(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            "malformed endpoint: expected /<provider_id>/<token>",
        );
    };
    let directory = app.conversations.bots();
    let Some(bot) = directory.by_provider_id(provider_id).cloned() else {
        return refuse(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            "no bot provider at this address",
        );
    };
    // Plugin bots take no requests: their URLs do not exist.
    let Some(expected) = bot.token() else {
        return refuse(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            "no bot provider at this address",
        );
    };
    let source = limits::source(client_ip(&req, &app.config.server.trusted_proxies));
    let guarded = limits::Door::Bot(provider_id);
    // Before the comparison, so that guessing gets no answer at all.
    if let Some(wait) = app.limits.auth_blocked(guarded, source) {
        return Problem::too_many("too many wrong tokens from this address; retry later")
            .answer_after(Dialect::Api, wait);
    }
    if !constant_time_eq(token.as_bytes(), expected.as_bytes()) {
        app.limits.auth_failed(guarded, source);
        return refuse(
            StatusCode::UNAUTHORIZED,
            ErrorCode::InvalidClient,
            "the token does not match the bot",
        );
    }
    // Only the bot's own requests count, so nobody else can use up its rate.
    if let Err(wait) = app.limits.bot(provider_id, source) {
        return Problem::too_many("too many requests for this bot; slow down")
            .answer_after(Dialect::Api, wait);
    }
    if req.method() != Method::POST {
        return refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::InvalidRequest,
            "only POST is supported",
        );
    }
    if door == Door::Providers {
        let header = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !app.conversations.provider_authorized(&bot, header).await {
            app.limits.auth_failed(guarded, source);
            return refuse(
                StatusCode::UNAUTHORIZED,
                ErrorCode::UnauthorizedClient,
                "the Authorization header does not carry the bot's access token",
            );
        }
    }
    let bytes = match read_body(req, &app.config.server).await {
        Ok(b) => b,
        Err(e) => return refuse(e.status(), ErrorCode::InvalidRequest, e.reason()),
    };
    let (event, payload) = match parse_event(&bytes) {
        Ok(parsed) => parsed,
        Err((status, reason)) => return refuse(status, ErrorCode::InvalidRequest, reason),
    };
    let done = app
        .conversations
        .handle(Inbound::Bot {
            bot: &bot,
            event,
            payload,
        })
        .await;
    match done {
        Ok(_) => json(StatusCode::OK, &json!({ "result": "ok" })),
        Err(e) => core_refusal(e),
    }
}

/// Reads a provider's body: the event, and the payload as it is recorded
/// (with a `timestamp` filled in), or the status and reason of the refusal.
pub(crate) fn parse_event(bytes: &[u8]) -> Result<(BotEvent, Value), (StatusCode, String)> {
    let payload: Value =
        parse_json(bytes).map_err(|e| (StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")))?;
    match payload.get("event").and_then(Value::as_str) {
        None => {
            return Err((
                StatusCode::BAD_REQUEST,
                "`event` (a string) is required".to_owned(),
            ));
        }
        Some(name) if !FROM_PROVIDERS.contains(&name) => {
            return Err((
                StatusCode::METHOD_NOT_ALLOWED,
                format!("event `{name}` is not supported here"),
            ));
        }
        Some(_) => {}
    }
    let payload = with_timestamp(payload);
    let event: BotEvent = crate::http::respond::from_value(payload.clone())
        .map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    Ok((event, payload))
}

/// A `message` without `timestamp` gets the time it arrived: the spec gives
/// every message one, but sloppy providers leave it out, and refusing the
/// bot's answer over it would leave the customer without one.
fn with_timestamp(mut payload: Value) -> Value {
    if let Some(message) = payload.get_mut("message").and_then(Value::as_object_mut) {
        message
            .entry("timestamp")
            .or_insert_with(|| Value::from(crate::clock::now_ms() / 1000));
    }
    payload
}

/// A refusal in the bot exchange's error body.
fn refuse(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Resp {
    let code = match code {
        ErrorCode::InvalidClient => "invalid_client",
        ErrorCode::UnauthorizedClient => "unauthorized_client",
        ErrorCode::InvalidRequest => "invalid_request",
    };
    error(status, code, message)
}

/// What the core's refusal means to a provider: its own mistakes are 400
/// `invalid_request`; the hub's faults a 503 to retry, without the detail.
fn core_refusal(e: CoreError) -> Resp {
    match e {
        CoreError::NotFound => refuse(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "chat_id names no chat of this bot",
        ),
        CoreError::Invalid(m) | CoreError::Conflict(m) => {
            refuse(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, m)
        }
        CoreError::Unavailable(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "temporarily unavailable, retry",
        ),
        CoreError::Store(e) => {
            tracing::error!(error = %e, "a bot event failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "temporarily unavailable, retry",
            )
        }
    }
}
