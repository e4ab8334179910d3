//! The widget's HTTP edge. Today: the offline form (`sendOfflineMessage`),
//! answering `{result: ok}` or `{result: fail, error}` as the spec's method does.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::core::offline::OfflineOutcome;
use crate::core::{Handled, Inbound};
use crate::http::App;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, json, method_not_allowed, parse_json, read_body};
use plugin_api::widget::OfflineMessageInput;

/// Routes `/widget/v1/<public_id>/...`.
pub async fn handle(app: &App, req: Request<Incoming>, rest: &[&str]) -> Resp {
    match (req.method().clone(), rest) {
        (Method::POST, [public_id, "offline-messages"]) => {
            offline_message(app, req, public_id).await
        }
        (_, [_, "offline-messages"]) => method_not_allowed(),
        _ => fail(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

fn fail(status: StatusCode, error: impl Into<String>) -> Resp {
    Problem::new(status, "fail", error).answer(Dialect::Widget)
}

async fn offline_message(app: &App, req: Request<Incoming>, public_id: &str) -> Resp {
    let channel = match app.store.channel_by_public_id(public_id).await {
        Ok(Some(c)) => c,
        Ok(None) => return fail(StatusCode::NOT_FOUND, "no such widget"),
        Err(e) => {
            tracing::error!(error = %e, "channel lookup failed");
            return Problem::unavailable().answer(Dialect::Widget);
        }
    };
    let body = match read_body(req, &app.config.server).await {
        Ok(b) => b,
        Err(e) => return Problem::body(&e).answer(Dialect::Widget),
    };
    let form: OfflineMessageInput = match parse_json(&body) {
        Ok(f) => f,
        Err(e) => return fail(StatusCode::BAD_REQUEST, format!("invalid form: {e}")),
    };
    let done = app
        .conversations
        .handle(Inbound::OfflineMessage {
            channel: &channel,
            form,
        })
        .await;
    match done {
        Ok(Handled::Offline(OfflineOutcome::Stored { id })) => json(
            StatusCode::OK,
            &json!({ "result": "ok", "offline_message_id": id }),
        ),
        // A spam filter's drop is not told to the sender.
        Ok(_) => json(StatusCode::OK, &json!({ "result": "ok" })),
        Err(e) => Problem::core(e, "no such widget", "offline message").answer(Dialect::Widget),
    }
}
