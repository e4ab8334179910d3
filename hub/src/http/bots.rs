//! The bot exchange edge: what providers post to
//! `/webhooks/<provider_id>/<token>` and `/providers/<provider_id>/<token>`
//! (the latter with the optional `Authorization`), answered with the spec's
//! statuses and `{"error":{"code","message"}}` bodies. The layer
//! (`layer.rs`) found the bot and checked its tokens and rate; this edge
//! answers its refusals ([`refuse`]) and takes the event.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::bot::{BotEvent, ErrorCode};
use serde_json::{Value, json};

use crate::core::Inbound;
use crate::core::error::CoreError;
use crate::http::App;
use crate::http::layer::{BotDenial, BotDenied};
use crate::http::problem::{Problem, retry_after};
use crate::http::respond::{Resp, error, json, parse_json, read_body};
use crate::obs::BotRefusal;
use crate::store::Bot;

/// Events a provider sends; the others are the hub's own (405 if posted to it).
const FROM_PROVIDERS: [&str; 3] = ["BOT_MESSAGE", "INVITE_AGENT", "CLIENT_INFO"];

/// Handles a provider's request for the bot the layer admitted. Every
/// refusal is logged (one line at `info`: bot, chat, event, reason) and
/// counted by reason for `/metrics`, so an operator sees why a provider's
/// events did not land.
pub async fn handle(app: &App, req: Request<Incoming>, bot: &Arc<Bot>) -> Resp {
    let mut asked = Asked {
        bot: bot.name.clone(),
        ..Asked::default()
    };
    match take(app, req, bot, &mut asked).await {
        Ok(resp) => resp,
        Err(refusal) => refusal.answer(&asked),
    }
}

/// The layer's refusal of a provider's request, in the spec's words, logged
/// and counted like the handler's.
pub fn refuse(denial: BotDenial) -> Resp {
    let asked = Asked {
        bot: denial.bot,
        ..Asked::default()
    };
    let refusal = match denial.why {
        BotDenied::Malformed => Refusal::new(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            BotRefusal::UnknownBot,
            "malformed endpoint: expected /<provider_id>/<token>",
        ),
        BotDenied::Unknown => Refusal::new(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            BotRefusal::UnknownBot,
            "no bot provider at this address",
        ),
        BotDenied::Blocked(wait) => {
            Refusal::too_many(wait, "too many wrong tokens from this address; retry later")
        }
        BotDenied::WrongToken => Refusal::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::InvalidClient,
            BotRefusal::Credentials,
            "the token does not match the bot",
        ),
        BotDenied::OverRate(wait) => {
            Refusal::too_many(wait, "too many requests for this bot; slow down")
        }
        BotDenied::NotPost => Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::InvalidRequest,
            BotRefusal::NotAllowed,
            "only POST is supported",
        ),
        BotDenied::WrongAuthorization => Refusal::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::UnauthorizedClient,
            BotRefusal::Credentials,
            "the Authorization header does not carry the bot's access token",
        ),
    };
    refusal.answer(&asked)
}

/// What is known of a request when it is refused, for the log line.
#[derive(Default)]
struct Asked {
    /// The bot's name, or the provider id the path gave.
    bot: String,
    chat: Option<String>,
    event: Option<String>,
}

/// A refusal: its answer and why, as `/metrics` counts it.
struct Refusal {
    status: StatusCode,
    code: &'static str,
    reason: BotRefusal,
    message: String,
    retry_after: Option<Duration>,
}

impl Refusal {
    fn new(
        status: StatusCode,
        code: ErrorCode,
        reason: BotRefusal,
        message: impl Into<String>,
    ) -> Refusal {
        let code = match code {
            ErrorCode::InvalidClient => "invalid_client",
            ErrorCode::UnauthorizedClient => "unauthorized_client",
            ErrorCode::InvalidRequest => "invalid_request",
        };
        Refusal {
            status,
            code,
            reason,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 429 with `Retry-After`.
    fn too_many(wait: Duration, message: &str) -> Refusal {
        let p = Problem::too_many(message);
        Refusal {
            status: p.status,
            code: p.code,
            reason: BotRefusal::RateLimited,
            message: p.message,
            retry_after: Some(wait),
        }
    }

    fn unavailable() -> Refusal {
        Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "temporarily_unavailable",
            reason: BotRefusal::Unavailable,
            message: "temporarily unavailable, retry".to_owned(),
            retry_after: None,
        }
    }

    fn answer(self, asked: &Asked) -> Resp {
        tracing::info!(
            bot = %loggable(&asked.bot),
            chat = %asked.chat.as_deref().map_or("-".into(), loggable),
            event = %asked.event.as_deref().map_or("-".into(), loggable),
            status = self.status.as_u16(),
            reason = self.reason.as_str(),
            detail = %loggable(&self.message),
            "bot exchange request refused"
        );
        crate::obs::bot_refusal(self.reason);
        let resp = error(self.status, self.code, self.message);
        match self.retry_after {
            Some(wait) => retry_after(resp, wait),
            None => resp,
        }
    }
}

/// A value from the request as one short log line: what a provider sends
/// is untrusted (control characters escaped, length capped).
fn loggable(value: &str) -> String {
    crate::runtime::one_line(value, 120)
}

async fn take(
    app: &App,
    req: Request<Incoming>,
    bot: &Arc<Bot>,
    asked: &mut Asked,
) -> Result<Resp, Refusal> {
    let bytes = read_body(req, &app.config.server).await.map_err(|e| {
        Refusal::new(
            e.status(),
            ErrorCode::InvalidRequest,
            BotRefusal::Malformed,
            e.reason(),
        )
    })?;
    let (event, payload) = parse_event(&bytes).map_err(|(status, reason)| {
        // What of it could be read, for the log line.
        if let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&bytes) {
            asked.event = fields.get("event").map(label_of);
            asked.chat = fields.get("chat_id").map(label_of);
        }
        let why = if status == StatusCode::METHOD_NOT_ALLOWED {
            BotRefusal::NotAllowed
        } else {
            BotRefusal::Malformed
        };
        Refusal::new(status, ErrorCode::InvalidRequest, why, reason)
    })?;
    asked.event = Some(event.event_name().to_owned());
    asked.chat = Some(event.chat_id().to_owned());
    let done = app
        .conversations
        .handle(Inbound::Bot {
            bot,
            event,
            payload,
        })
        .await;
    match done {
        Ok(_) => Ok(json(StatusCode::OK, &json!({ "result": "ok" }))),
        Err(e) => Err(core_refusal(e, asked)),
    }
}

/// A field of a refused body as text (a string as is, anything else as JSON).
fn label_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
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

/// What the core's refusal means to a provider: its own mistakes are 400
/// `invalid_request`; the hub's faults a 503 to retry, without the detail.
fn core_refusal(e: CoreError, asked: &Asked) -> Refusal {
    let invalid = |reason, message: String| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            reason,
            message,
        )
    };
    match e {
        CoreError::NotFound => invalid(
            BotRefusal::UnknownChat,
            format!(
                "chat_id `{}` names no chat of this bot",
                asked.chat.as_deref().unwrap_or_default()
            ),
        ),
        CoreError::Missing(m) => invalid(BotRefusal::Malformed, m.to_owned()),
        CoreError::Conflict(m) => invalid(BotRefusal::ChatDone, m),
        CoreError::Invalid(m) => invalid(BotRefusal::Malformed, m),
        CoreError::Unavailable(_) => Refusal::unavailable(),
        CoreError::Store(e) => {
            tracing::error!(error = %e, "a bot event failed");
            Refusal::unavailable()
        }
    }
}
