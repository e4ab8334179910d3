//! The custom chat channel edge: the status endpoint and the customer-message
//! endpoint integrators call, exactly as the spec draws them.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::channel::parse_customer_message;

use crate::core::Inbound;
use crate::http::limits::{self, Door};
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, check_json_depth, json, method_not_allowed, read_body, text};
use crate::http::{App, client_ip};
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
    let source = limits::source(client_ip(&req, &app.config.server.trusted_proxies));
    // Before the comparison, so that guessing gets no answer at all.
    if let Some(wait) = app.limits.auth_blocked(Door::Channel, source) {
        return Problem::too_many("too many requests to wrong addresses from this source")
            .answer_after(Dialect::Channel, wait);
    }
    if !constant_time_eq(secret.as_bytes(), app.path_secret.as_bytes()) {
        app.limits.auth_failed(Door::Channel, source);
        return text(StatusCode::NOT_FOUND, NO_CHANNEL);
    }
    let channel = match find(app, public_id).await {
        Ok(Some(ch)) => ch,
        Ok(None) => return text(StatusCode::NOT_FOUND, NO_CHANNEL),
        Err(resp) => return resp,
    };
    if let Err(wait) = app.limits.channel(channel.id, source) {
        return Problem::too_many("too many requests to this channel; slow down")
            .answer_after(Dialect::Channel, wait);
    }
    match (status, req.method()) {
        (true, &Method::GET) | (true, &Method::HEAD) => availability(app, &channel).await,
        (false, &Method::POST) => customer_message(app, req, &channel).await,
        _ => method_not_allowed(),
    }
}

const NO_CHANNEL: &str = "no channel at this address";

async fn find(app: &App, public_id: &str) -> Result<Option<Channel>, Resp> {
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
    if let Err(e) = check_json_depth(&body) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("body is not valid JSON: {e}"),
        );
    }
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
        Err(e) => Problem::core(e, NO_CHANNEL, "customer message").answer(Dialect::Channel),
    }
}
