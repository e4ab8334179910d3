//! The custom chat channel edge: the status endpoint and the customer-message
//! endpoint integrators call, exactly as the spec draws them. The layer
//! (`layer.rs`) checked the path's secret and the channel's rate.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use plugin_api::channel::parse_customer_message;

use crate::core::Inbound;
use crate::http::App;
use crate::http::layer::NO_CHANNEL;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, check_json_depth, json, method_not_allowed, read_body, text};
use crate::store::Channel;

/// Handles `/<random_string>/<public_id>` and `/<random_string>/<public_id>/status`
/// of the channel the layer found.
pub async fn handle(app: &App, req: Request<Incoming>, channel: &Channel, status: bool) -> Resp {
    match (status, req.method()) {
        (true, &Method::GET) | (true, &Method::HEAD) => availability(app, channel).await,
        (false, &Method::POST) => customer_message(app, req, channel).await,
        _ => method_not_allowed(),
    }
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
