//! How each interface answers a failure, in one place: the channel answers in
//! plain text (integrators show the reason), the agent, admin and CRM APIs
//! with `{"error":{"code","message"}}`, the widget with
//! `{"result":"fail","error"}` (and `reason` for a refused request). Edges turn what went wrong into a [`Problem`]
//! and answer it in their [`Dialect`].

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderValue, StatusCode};
use serde_json::json;

use crate::core::error::CoreError;
use crate::http::respond::{BodyError, Resp, error, json, text};

/// The answer format of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// The custom chat channel: `text/plain` reasons.
    Channel,
    /// The agent, admin and CRM APIs: `{"error":{"code","message"}}`.
    Api,
    /// The widget: `{"result":"fail","error"}`.
    Widget,
}

/// What went wrong, as a client may be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// What the hub says of its own transient faults; the detail goes to the log.
const UNAVAILABLE: &str = "temporarily unavailable, retry";

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Problem {
        Problem {
            status,
            code,
            message: message.into(),
        }
    }

    /// A 503 the client may retry; nothing of the cause is shown.
    pub fn unavailable() -> Problem {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", UNAVAILABLE)
    }

    pub fn not_found(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn invalid(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// A body that could not be read (413, 408, 400).
    pub fn body(e: &BodyError) -> Problem {
        Problem::new(e.status(), "invalid_request", e.reason())
    }

    /// A core failure. `not_found` names what was missing. A refusal by a
    /// plugin (logged by the core where it happened) and a storage fault
    /// (logged here with `what`) are answered with the generic 503: a
    /// plugin's error text may hold its config, and a database error is
    /// nobody's business but the operator's.
    pub fn core(e: CoreError, not_found: &str, what: &str) -> Problem {
        match e {
            CoreError::NotFound => Problem::not_found(not_found),
            CoreError::Missing(what) => Problem::not_found(what),
            CoreError::Conflict(m) => Problem::new(StatusCode::CONFLICT, "conflict", m),
            CoreError::Invalid(m) => Problem::invalid(m),
            CoreError::Unavailable(_) => Problem::unavailable(),
            CoreError::Store(e) => {
                tracing::error!(error = %e, "{what} failed");
                Problem::unavailable()
            }
        }
    }

    /// 429: the client is over a rate limit or failed its credentials too
    /// often; [`Problem::answer_after`] says when to come back.
    pub fn too_many(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
    }

    /// The answer in `dialect` with `Retry-After` (see [`retry_after`]).
    pub fn answer_after(self, dialect: Dialect, wait: Duration) -> Resp {
        retry_after(self.answer(dialect), wait)
    }

    /// The answer in `dialect`.
    pub fn answer(self, dialect: Dialect) -> Resp {
        match dialect {
            Dialect::Channel => text(self.status, self.message),
            Dialect::Api => error(self.status, self.code, self.message),
            Dialect::Widget => json(
                self.status,
                &json!({ "result": "fail", "error": self.message }),
            ),
        }
    }
}

/// The widget API's refusal of a request, `{"result":"fail","reason"}`
/// (its methods' failures are [`Dialect::Widget`]'s `error`).
pub fn widget_fail(status: StatusCode, reason: impl Into<String>) -> Resp {
    json(
        status,
        &json!({ "result": "fail", "reason": reason.into() }),
    )
}

/// `resp` with `Retry-After`: `wait` in whole seconds, rounded up and at
/// least 1, so a client that waits as told gets in.
pub fn retry_after(mut resp: Resp, wait: Duration) -> Resp {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_of(resp: Resp) -> (StatusCode, String) {
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn each_dialect_answers_the_same_problem_its_own_way() {
        let p = || Problem::invalid("message.text must not be empty");
        assert_eq!(
            body_of(p().answer(Dialect::Channel)).await,
            (
                StatusCode::BAD_REQUEST,
                "message.text must not be empty\n".to_owned()
            )
        );
        let (status, api) = body_of(p().answer(Dialect::Api)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&api).ok(),
            Some(
                json!({"error":{"code":"invalid_request","message":"message.text must not be empty"}})
            )
        );
        let (_, widget) = body_of(p().answer(Dialect::Widget)).await;
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&widget).ok(),
            Some(json!({"result":"fail","error":"message.text must not be empty"}))
        );
    }

    #[tokio::test]
    async fn a_rate_limit_says_when_to_come_back_in_whole_seconds() {
        let resp = Problem::too_many("slow down")
            .answer_after(Dialect::Channel, Duration::from_millis(1200));
        assert_eq!(
            resp.headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
        let resp =
            Problem::too_many("slow down").answer_after(Dialect::Api, Duration::from_millis(3));
        assert_eq!(
            resp.headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let (status, body) = body_of(resp).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).ok(),
            Some(json!({"error":{"code":"rate_limited","message":"slow down"}}))
        );
    }

    #[tokio::test]
    async fn a_plugins_refusal_is_not_shown_to_the_client() {
        let refused = CoreError::Unavailable("redact: config: secret=hunter2".into());
        let (status, body) =
            body_of(Problem::core(refused, "no such chat", "test").answer(Dialect::Api)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("hunter2"), "{body}");
        assert!(body.contains(UNAVAILABLE), "{body}");
    }
}
