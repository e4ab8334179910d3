//! The custom chat channel edge: the status endpoint and the customer-message
//! endpoint integrators call, exactly as the spec draws them.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::channel::parse_customer_message;

use crate::core::Inbound;
use crate::http::App;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, json, method_not_allowed, read_body, text};
use crate::ids::constant_time_eq;
use crate::store::Channel;

/// Handles `/<random_string>/<public_id>` and `/<random_string>/<public_id>/status`.
pub async fn handle(
    app: &App,
    req: Request<Incoming>,
    secret: &str,
    public_id: &str,
    status: bool,
) -> Resp {
    let channel = match find(app, secret, public_id).await {
        Ok(Some(ch)) => ch,
        Ok(None) => return text(StatusCode::NOT_FOUND, "no channel at this address"),
        Err(resp) => return resp,
    };
    match (status, req.method()) {
        (true, &Method::GET) | (true, &Method::HEAD) => availability(app, &channel).await,
        (false, &Method::POST) => customer_message(app, req, &channel).await,
        _ => method_not_allowed(),
    }
}

async fn find(app: &App, secret: &str, public_id: &str) -> Result<Option<Channel>, Resp> {
    if !constant_time_eq(secret.as_bytes(), app.path_secret.as_bytes()) {
        return Ok(None);
    }
    app.store
        .channel_by_public_id(public_id)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "channel lookup failed");
            Problem::unavailable().answer(Dialect::Channel)
        })
}

async fn availability(app: &App, channel: &Channel) -> Resp {
    match app.store.channel_has_online_agent(channel.id).await {
        Ok(online) => text(StatusCode::OK, if online { "1" } else { "0" }),
        Err(e) => {
            tracing::error!(error = %e, channel = channel.id, "status lookup failed");
            Problem::unavailable().answer(Dialect::Channel)
        }
    }
}

async fn customer_message(app: &App, req: Request<Incoming>, channel: &Channel) -> Resp {
    let body = match read_body(req, &app.config.server).await {
        Ok(b) => b,
        Err(e) => return Problem::body(&e).answer(Dialect::Channel),
    };
    let message = match parse_customer_message(&body) {
        Ok(m) => m,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.0),
    };
    match app
        .conversations
        .handle(Inbound::CustomerMessage { channel, message })
        .await
    {
        // Stored, or dropped by a plugin: the integrator's part is done.
        Ok(_) => json(StatusCode::OK, &serde_json::json!({ "result": "ok" })),
        Err(e) => Problem::core(e, "no channel at this address", "customer message")
            .answer(Dialect::Channel),
    }
}
