//! HTTP plumbing shared by the edges: response builders, bounded body reading,
//! bearer tokens and the JSON error body.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;

pub type Body = BoxBody<Bytes, Infallible>;
pub type Resp = Response<Body>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn with_type(status: StatusCode, content_type: &'static str, body: Body) -> Resp {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A `text/plain` answer: what the channel endpoints use for reasons.
pub fn text(status: StatusCode, body: impl Into<String>) -> Resp {
    let mut body = body.into();
    if !body.ends_with('\n') && status != StatusCode::OK {
        body.push('\n');
    }
    with_type(status, "text/plain; charset=utf-8", full(body))
}

pub fn json(status: StatusCode, value: &impl Serialize) -> Resp {
    match serde_json::to_vec(value) {
        Ok(bytes) => with_type(status, "application/json", full(bytes)),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the answer: {e}"),
        ),
    }
}

/// `{"error":{"code","message"}}`, the error body of the JSON APIs.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Resp {
    json(
        status,
        &serde_json::json!({ "error": { "code": code, "message": message.into() } }),
    )
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    TooLarge(usize),
    Broken(String),
}

impl BodyError {
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Broken(_) => StatusCode::BAD_REQUEST,
        }
    }

    pub fn reason(&self) -> String {
        match self {
            BodyError::TooLarge(limit) => format!("request body is larger than {limit} bytes"),
            BodyError::Broken(e) => format!("cannot read the request body: {e}"),
        }
    }
}

/// Reads a whole request body (Content-Length or chunked) up to `limit` bytes.
pub async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, BodyError> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge(limit));
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge(limit)),
        Err(e) => Err(BodyError::Broken(e.to_string())),
    }
}

/// The token of an `Authorization: Bearer …` header.
pub fn bearer<B>(req: &Request<B>) -> Option<&str> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Path segments without empty ones: `/a//b/` → `["a", "b"]`.
pub fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

pub fn method_not_allowed() -> Resp {
    text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

pub fn not_found() -> Resp {
    text(StatusCode::NOT_FOUND, "not found")
}
