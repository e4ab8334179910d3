//! HTTP plumbing shared by the edges: response builders, bounded body reading,
//! JSON body parsing, bearer tokens and the JSON error body.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::ServerConfig;

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
    /// The whole body did not arrive within `server.body_timeout_ms`.
    TimedOut(Duration),
    Broken(String),
}

impl BodyError {
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            // The server closes the connection of every 408 (`server::serve`).
            BodyError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Broken(_) => StatusCode::BAD_REQUEST,
        }
    }

    pub fn reason(&self) -> String {
        match self {
            BodyError::TooLarge(limit) => format!("request body is larger than {limit} bytes"),
            BodyError::TimedOut(after) => format!(
                "request body did not arrive within {} ms",
                after.as_millis()
            ),
            BodyError::Broken(e) => format!("cannot read the request body: {e}"),
        }
    }
}

/// Reads a whole request body (Content-Length or chunked) up to
/// `server.max_body_bytes`, within `server.body_timeout_ms` for the whole body:
/// a client trickling bytes must not hold a connection and a task for ever.
pub async fn read_body(req: Request<Incoming>, server: &ServerConfig) -> Result<Bytes, BodyError> {
    let limit = server.max_body_bytes;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge(limit));
    }
    let timeout = server.body_timeout();
    let collect = Limited::new(req.into_body(), limit).collect();
    match tokio::time::timeout(timeout, collect).await {
        Err(_elapsed) => Err(BodyError::TimedOut(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge(limit)),
        Ok(Err(e)) => Err(BodyError::Broken(e.to_string())),
    }
}

/// How deep a request's JSON may nest (objects and arrays). Lower than
/// serde_json's own 128, since what is stored is later parsed again inside
/// event envelopes (a plugin's, a receiver's) that add levels of their own.
pub const MAX_JSON_DEPTH: usize = 64;

/// Refuses JSON nested deeper than [`MAX_JSON_DEPTH`], in one pass over the
/// bytes and before any parser recurses into them.
pub fn check_json_depth(bytes: &[u8]) -> Result<(), String> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(format!("JSON nested deeper than {MAX_JSON_DEPTH} levels"));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Parses a JSON request body into `T`, refusing duplicate keys first (serde
/// would keep the last value silently, while a plugin or receiver parsing the
/// stored payload might keep the first). The error is the reason alone; each
/// edge words its 400 in its own dialect.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    check_json_depth(bytes)?;
    if let Some(dup) = plugin_api::json::duplicate_key(bytes) {
        return Err(dup.to_string());
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(named)?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// The decoded `key=value` pairs of a query string (`%XX` escapes, `+` for a
/// space; malformed escapes stay as written).
pub fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned()))
}

/// A JSON value read as `T`; a type error names where it is.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(named)
}

/// serde's reason, after the path of the field it is about (`sender.id:
/// invalid type…`); at the root (a missing field, say) the reason alone.
fn named<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    if path == "." {
        e.inner().to_string()
    } else {
        format!("{path}: {}", e.inner())
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

/// A `text/event-stream` answer whose frames come from `rx` until it closes.
pub fn event_stream(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Resp {
    let mut resp = Response::new(SseBody(rx).boxed());
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    resp
}

struct SseBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only parsed")]
    struct Body {
        sender: Sender,
        items: Vec<Sender>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only parsed")]
    struct Sender {
        id: u64,
    }

    #[test]
    fn a_type_error_names_the_field_it_is_about() {
        let err = parse_json::<Body>(br#"{"sender":{"id":true},"items":[]}"#).expect_err("bool");
        assert!(
            err.starts_with("sender.id: invalid type: boolean `true`"),
            "{err}"
        );
        let err = parse_json::<Body>(br#"{"sender":{"id":1},"items":[{"id":1},{"id":"x"}]}"#)
            .expect_err("string");
        assert!(err.starts_with("items[1].id: invalid type"), "{err}");
        let err = parse_json::<Body>(br#"{"items":[]}"#).expect_err("missing");
        assert_eq!(err, "missing field `sender` at line 1 column 12");
        let err = parse_json::<Body>(br#"{"sender":{"id":1},"items":[]} x"#).expect_err("trailing");
        assert!(err.starts_with("trailing characters"), "{err}");
        let err = from_value::<Body>(serde_json::json!({"sender": {"id": -1}, "items": []}))
            .expect_err("negative");
        assert!(err.starts_with("sender.id: invalid value"), "{err}");
    }

    #[test]
    fn json_nested_past_the_limit_is_refused_before_it_is_parsed() {
        assert!(check_json_depth(nested(MAX_JSON_DEPTH).as_bytes()).is_ok());
        let err = parse_json::<serde_json::Value>(nested(MAX_JSON_DEPTH + 1).as_bytes())
            .expect_err("too deep");
        assert_eq!(err, "JSON nested deeper than 64 levels");
        // Far past serde_json's own limit: the same reason, not the parser's.
        let err = parse_json::<serde_json::Value>(nested(100_000).as_bytes()).expect_err("deep");
        assert_eq!(err, "JSON nested deeper than 64 levels");
    }

    #[test]
    fn brackets_inside_strings_do_not_count_as_nesting() {
        let text = format!(
            r#"{{"a":"{}\"{}","b":[1]}}"#,
            "[".repeat(100),
            "{".repeat(100)
        );
        assert!(check_json_depth(text.as_bytes()).is_ok(), "{text}");
        let value: serde_json::Value = parse_json(text.as_bytes()).expect("valid JSON");
        assert_eq!(value["b"][0], 1);
    }
}
