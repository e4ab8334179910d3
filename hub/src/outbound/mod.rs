//! The outbound HTTP client: one POST of a plain [`Request`], and its answer
//! read by an [`AnswerRule`] (or handed back as it came, for a plugin's
//! `send`). Below the deliverer and the plugin runtime, it imports nothing
//! else of the hub; `signing` makes Standard Webhooks signatures; `policy`
//! decides which addresses may be connected to (`[outbound]`).
//!
//! How an answer is read: 2xx without an error body is delivered; a 4xx or an
//! `{"error":…}` body is final; anything else is retried.

pub(crate) mod oauth;
pub(crate) mod policy;
mod retry;
pub(crate) mod signing;

pub use policy::Policy;
pub use retry::RetryPolicy;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http::{HeaderName, HeaderValue, StatusCode, Uri};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Frame, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::clock::Clock;

/// Header carrying the outbox row id: the same on every attempt and after restarts,
/// so a receiver can recognise a retry.
pub const DELIVERY_ID_HEADER: &str = "x-hub-delivery";
pub const ATTEMPT_HEADER: &str = "x-hub-attempt";
/// Most of a response body read to find the reason for a refusal.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Longest reason kept from a plain-text refusal.
const MAX_REASON_CHARS: usize = 500;

/// One outbound POST.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub url: &'a str,
    /// Sent as `application/json; charset=utf-8`.
    pub body: Bytes,
    /// Sent with `Transfer-Encoding: chunked` (one chunk) instead of a Content-Length.
    pub chunked: bool,
    /// Added after the hub's own headers.
    pub headers: &'a [(HeaderName, HeaderValue)],
    /// The outbox row and attempt, when the request is one (`X-Hub-Delivery`,
    /// `X-Hub-Attempt`).
    pub delivery: Option<DeliveryId<'a>>,
    /// For the whole exchange: connecting, sending and reading the answer.
    pub timeout: Duration,
}

impl<'a> Request<'a> {
    /// A POST of `body` to `url`, not chunked, without extra headers and
    /// without delivery headers.
    pub fn post(url: &'a str, body: impl Into<Bytes>, timeout: Duration) -> Request<'a> {
        Request {
            url,
            body: body.into(),
            chunked: false,
            headers: &[],
            delivery: None,
            timeout,
        }
    }
}

/// Which delivery a request is an attempt of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryId<'a> {
    pub id: &'a str,
    pub attempt: i64,
}

/// How a receiver's answer is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerRule {
    /// The channel spec's reading: a 2xx with an `{"error":…}` body is a refusal.
    Channel,
    /// A webhook receiver's: any 2xx is a delivery (a `result` other than ok
    /// only means its data is not applied).
    Webhook,
    /// A bot provider's: only a 2xx counts, and every other answer (4xx
    /// included) is retried, since the spec retries "until a regular success".
    Bot,
}

impl AnswerRule {
    /// Reads one answer (status and the start of its body).
    pub fn read(self, status: StatusCode, body: Bytes) -> Attempt {
        match self {
            AnswerRule::Channel => classify(status, body),
            AnswerRule::Webhook => classify_webhook(status, body),
            AnswerRule::Bot if status.is_success() => Attempt::Delivered(body),
            AnswerRule::Bot => Attempt::Transient(format!("the provider answered {status}")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Accepted; the receiver's answer.
    Delivered(Bytes),
    /// Refused for good (4xx or an error body); the text is for the agent.
    Rejected(String),
    /// Worth retrying: 5xx, timeout, connection failure.
    Transient(String),
}

/// A request body sent whole, with Content-Length, or as one chunk of a chunked body.
pub struct OutBody {
    data: Option<Bytes>,
    chunked: bool,
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.data, self.chunked) {
            // An inexact hint is what makes hyper use Transfer-Encoding: chunked.
            (Some(_), true) => SizeHint::default(),
            (Some(d), false) => SizeHint::with_exact(d.len() as u64),
            (None, _) => SizeHint::with_exact(0),
        }
    }
}

enum PostError {
    /// The request could not be made at all (a bad URL, or one the outbound
    /// policy refuses): retrying will not help.
    Invalid(String),
    Transient(String),
}

/// Why an exchange brought no answer: `Final` when trying again cannot help
/// (an invalid URL, an address the outbound policy refuses), `Transient`
/// otherwise. Shows as the reason alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    #[error("{0}")]
    Final(String),
    #[error("{0}")]
    Transient(String),
}

impl ExchangeError {
    /// The same kind of failure with its reason rewritten.
    pub fn map(self, f: impl FnOnce(String) -> String) -> ExchangeError {
        match self {
            ExchangeError::Final(r) => ExchangeError::Final(f(r)),
            ExchangeError::Transient(r) => ExchangeError::Transient(f(r)),
        }
    }

    /// What this failure means to a delivery attempt.
    pub fn into_attempt(self) -> Attempt {
        match self {
            ExchangeError::Final(r) => Attempt::Rejected(r),
            ExchangeError::Transient(r) => Attempt::Transient(r),
        }
    }
}

/// The hub's HTTP client: a keep-alive pool, HTTP and HTTPS (webpki roots),
/// connecting only where the outbound [`Policy`] allows. Redirects are not
/// followed: a 3xx is an answer like any other (final, not a 2xx).
/// Cheap to clone; clones share the pool, and a policy put in force with
/// [`HttpSender::replace_policy`] holds for every clone.
#[derive(Clone)]
pub struct HttpSender {
    current: Arc<RwLock<Arc<Held>>>,
    /// What each request's timeout is measured on.
    clock: Clock,
}

/// A policy and the pool that connected under it. They change together: a
/// kept-alive connection was judged by the policy of its time, so a
/// stricter one must not reuse it.
struct Held {
    client: Client<HttpsConnector<HttpConnector<policy::Guard>>, OutBody>,
    policy: Arc<Policy>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot set up TLS for outbound requests: {0}")]
pub struct TlsSetupError(#[from] rustls::Error);

impl HttpSender {
    /// A sender with the default policy: private addresses allowed, the
    /// always-refused ranges refused.
    pub fn new() -> Result<HttpSender, TlsSetupError> {
        HttpSender::with_policy(Policy::default())
    }

    /// A sender that connects only where `policy` allows: host names are
    /// resolved by [`policy::Guard`], which drops the addresses the policy
    /// refuses; IP-literal hosts are checked before sending.
    pub fn with_policy(policy: Policy) -> Result<HttpSender, TlsSetupError> {
        Ok(HttpSender {
            current: Arc::new(RwLock::new(Arc::new(Held::new(policy)?))),
            clock: Clock::system(),
        })
    }

    /// This sender with its request timeouts measured on `clock` (the hub's).
    pub fn on_clock(self, clock: Clock) -> HttpSender {
        HttpSender { clock, ..self }
    }

    /// Puts `policy` in force for every later request (a reload): with a
    /// new connection pool, so no connection made under the old policy is
    /// used again. Requests under way finish as they started.
    pub fn replace_policy(&self, policy: Policy) -> Result<(), TlsSetupError> {
        let held = Arc::new(Held::new(policy)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = held;
        Ok(())
    }

    fn held(&self) -> Arc<Held> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The policy requests are held to now.
    pub fn policy(&self) -> Arc<Policy> {
        self.held().policy.clone()
    }

    /// Makes one attempt and reads its answer by `rule`.
    pub async fn send(&self, request: Request<'_>, rule: AnswerRule) -> Attempt {
        // Only the start of an answer matters to a delivery; a body too large
        // to keep counts as empty (one that broke off is an error, below).
        match self.post(request).await {
            Ok((status, body)) => rule.read(status, body.unwrap_or_default()),
            Err(PostError::Invalid(reason)) => Attempt::Rejected(reason),
            Err(PostError::Transient(reason)) => Attempt::Transient(reason),
        }
    }

    /// Makes one POST and returns the answer as it came (a plugin's `send`,
    /// a token request); an answer larger than the cap, like a failed
    /// request, is an error.
    pub async fn exchange(
        &self,
        request: Request<'_>,
    ) -> Result<(StatusCode, Bytes), ExchangeError> {
        match self.post(request).await {
            Ok((status, Some(body))) => Ok((status, body)),
            Ok((_, None)) => Err(ExchangeError::Transient(format!(
                "the answer is larger than {} KiB",
                MAX_RESPONSE_BYTES / 1024
            ))),
            Err(PostError::Invalid(r)) => Err(ExchangeError::Final(r)),
            Err(PostError::Transient(r)) => Err(ExchangeError::Transient(r)),
        }
    }

    async fn post(&self, post: Request<'_>) -> Result<(StatusCode, Option<Bytes>), PostError> {
        let timeout = post.timeout;
        let uri: Uri = post
            .url
            .parse()
            .map_err(|e| PostError::Invalid(format!("invalid endpoint URL: {e}")))?;
        let held = self.held();
        // The connector resolves host names through the policy's guard, but
        // connects to an IP literal as it is: that one is checked here.
        held.policy
            .check_uri(&uri)
            .map_err(|refused| PostError::Invalid(refused.to_string()))?;
        let mut request =
            http::Request::post(uri).header(USER_AGENT, concat!("hub/", env!("CARGO_PKG_VERSION")));
        // JSON unless the caller says otherwise (a token request is a form).
        if !post.headers.iter().any(|(name, _)| name == CONTENT_TYPE) {
            request = request.header(CONTENT_TYPE, "application/json; charset=utf-8");
        }
        if let Some(DeliveryId { id, attempt }) = post.delivery {
            request = request
                .header(DELIVERY_ID_HEADER, id)
                .header(ATTEMPT_HEADER, attempt);
        }
        for (name, value) in post.headers {
            request = request.header(name, value);
        }
        let request = request
            .body(OutBody {
                data: Some(post.body),
                chunked: post.chunked,
            })
            .map_err(|e| PostError::Invalid(format!("cannot build the request: {e}")))?;
        let exchange = async {
            let response = held.client.request(request).await.map_err(|e| {
                match policy::ResolveError::refusal_in(&e) {
                    // Every address the host resolved to is refused: final.
                    Some(refused) => PostError::Invalid(refused.to_string()),
                    None => PostError::Transient(format!("connection failed: {}", error_chain(&e))),
                }
            })?;
            let status = response.status();
            let body = match Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
            {
                Ok(collected) => Some(collected.to_bytes()),
                // Answered in full, only too long to keep: the status decides.
                Err(e) if e.is::<LengthLimitError>() => None,
                // A body that broke off is not an answer: the receiver may
                // not have finished handling the request, so try again.
                Err(e) => {
                    return Err(PostError::Transient(format!(
                        "the answer broke off (HTTP {}): {}",
                        status.as_u16(),
                        error_chain(e.as_ref())
                    )));
                }
            };
            Ok((status, body))
        };
        match self.clock.timeout(timeout, exchange).await {
            Err(_) => Err(PostError::Transient(format!(
                "no response within {} ms",
                timeout.as_millis()
            ))),
            Ok(answer) => answer,
        }
    }
}

impl Held {
    fn new(policy: Policy) -> Result<Held, TlsSetupError> {
        let policy = Arc::new(policy);
        let mut http = HttpConnector::new_with_resolver(policy::Guard::new(policy.clone()));
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(3)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Held { client, policy })
    }
}

/// Reads the integrator's answer to a channel message.
fn classify(status: StatusCode, body: Bytes) -> Attempt {
    let error_text = error_body_message(&body);
    if status.is_success() {
        return match error_text {
            Some(reason) => Attempt::Rejected(reason),
            None => Attempt::Delivered(body),
        };
    }
    failure(status, &body, error_text)
}

/// Reads a webhook receiver's answer: any 2xx is a delivery.
fn classify_webhook(status: StatusCode, body: Bytes) -> Attempt {
    if status.is_success() {
        return Attempt::Delivered(body);
    }
    let error_text = error_body_message(&body);
    failure(status, &body, error_text)
}

/// 5xx may pass; anything else not 2xx is final.
fn failure(status: StatusCode, body: &[u8], error_text: Option<String>) -> Attempt {
    let reason = error_text
        .or_else(|| plain_reason(body))
        .unwrap_or_else(|| status_text(status));
    if status.is_server_error() {
        Attempt::Transient(reason)
    } else {
        Attempt::Rejected(reason)
    }
}

/// `{"error":{"code":…,"message":…}}` → the message (or the code when there is none).
fn error_body_message(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    if error.is_null() {
        return None;
    }
    let message = error.get("message").and_then(|m| m.as_str());
    let code = error.get("code").map(|c| match c {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    Some(match (message, code) {
        (Some(m), _) if !m.trim().is_empty() => reason_text(m),
        (_, Some(c)) => reason_text(&format!("error {c}")),
        _ => match error {
            serde_json::Value::String(s) => reason_text(s),
            _ => "the receiver reported an error".to_owned(),
        },
    })
}

fn plain_reason(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    // Control characters only would make a blank reason: the status says more.
    if text.chars().all(char::is_control) || text.starts_with('<') {
        return None;
    }
    Some(reason_text(text))
}

/// A receiver's words as the hub keeps them (the outbox row, the log, the
/// agent's view): on one line, so that they cannot forge a log line, and
/// short, whatever the receiver sent.
fn reason_text(text: &str) -> String {
    // Controls become blanks before the trim, so none is left at either end.
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.trim();
    if line.is_empty() {
        // `{"error":""}`: a refusal all the same, and the agent reads something.
        return "the receiver reported an error".to_owned();
    }
    line.chars().take(MAX_REASON_CHARS).collect()
}

fn status_text(status: StatusCode) -> String {
    format!(
        "HTTP {} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default()
    )
    .trim_end()
    .to_owned()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_as_the_spec_says() {
        let b = |s: &'static [u8]| Bytes::from_static(s);
        let classify = |status, body| AnswerRule::Channel.read(status, body);
        assert_eq!(
            classify(StatusCode::OK, b(br#"{"result":"ok"}"#)),
            Attempt::Delivered(b(br#"{"result":"ok"}"#))
        );
        assert_eq!(classify(StatusCode::OK, b(b"")), Attempt::Delivered(b(b"")));
        assert_eq!(
            classify(
                StatusCode::OK,
                b(br#"{"error":{"code":3,"message":"user blocked"}}"#)
            ),
            Attempt::Rejected("user blocked".into())
        );
        assert_eq!(
            classify(StatusCode::BAD_REQUEST, b(b"no such user")),
            Attempt::Rejected("no such user".into())
        );
        assert_eq!(
            classify(StatusCode::NOT_FOUND, b(b"")),
            Attempt::Rejected("HTTP 404 Not Found".into())
        );
        assert!(matches!(
            classify(StatusCode::BAD_GATEWAY, b(b"")),
            Attempt::Transient(_)
        ));
    }

    #[test]
    fn a_receivers_error_text_is_kept_on_one_line_and_short() {
        let long = format!(
            r#"{{"error":{{"message":"no\n2026-01-01T00:00:00Z  INFO forged line {}"}}}}"#,
            "x".repeat(70_000)
        );
        let Attempt::Rejected(reason) = AnswerRule::Channel.read(StatusCode::OK, Bytes::from(long))
        else {
            panic!("an error body is a rejection");
        };
        assert!(reason.starts_with("no 2026-01-01"), "{reason}");
        assert!(!reason.contains('\n'));
        assert_eq!(reason.chars().count(), MAX_REASON_CHARS);
        let Attempt::Rejected(plain) = AnswerRule::Channel.read(
            StatusCode::BAD_REQUEST,
            Bytes::from(format!("bad\r\nforged {}", "y".repeat(70_000))),
        ) else {
            panic!("a 400 is a rejection");
        };
        assert!(plain.starts_with("bad  forged"), "{plain}");
        assert_eq!(plain.chars().count(), MAX_REASON_CHARS);
    }

    #[test]
    fn webhook_answers_count_as_delivered_whatever_their_result() {
        let failure = Bytes::from_static(b"FAILURE");
        let classify_webhook = |status, body| AnswerRule::Webhook.read(status, body);
        assert_eq!(
            classify_webhook(StatusCode::OK, failure.clone()),
            Attempt::Delivered(failure)
        );
        assert_eq!(
            classify_webhook(
                StatusCode::OK,
                Bytes::from_static(br#"{"error":{"message":"no"}}"#)
            ),
            Attempt::Delivered(Bytes::from_static(br#"{"error":{"message":"no"}}"#))
        );
        assert!(matches!(
            classify_webhook(StatusCode::GONE, Bytes::new()),
            Attempt::Rejected(_)
        ));
        assert!(matches!(
            classify_webhook(StatusCode::SERVICE_UNAVAILABLE, Bytes::new()),
            Attempt::Transient(_)
        ));
    }

    /// A loopback server answering every request with `answer`; counts the
    /// connections it accepted.
    async fn server(
        answer: &'static str,
    ) -> (
        std::net::SocketAddr,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                    let _ = socket.write_all(answer.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (addr, accepted)
    }

    fn post(url: &str) -> Request<'_> {
        Request::post(url, "{}", Duration::from_secs(3))
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

    #[tokio::test]
    async fn refused_addresses_are_final_failures_and_never_connected_to() {
        use std::sync::atomic::Ordering;
        let (addr, accepted) = server(OK).await;
        let strict =
            HttpSender::with_policy(Policy::new(true, &[]).expect("policy")).expect("sender");
        let port = addr.port();
        for url in [
            format!("http://127.0.0.1:{port}/x"),
            format!("http://localhost:{port}/x"),
            format!("http://2130706433:{port}/x"),
            format!("http://127.1:{port}/x"),
            format!("http://[::ffff:127.0.0.1]:{port}/x"),
        ] {
            match strict.send(post(&url), AnswerRule::Channel).await {
                Attempt::Rejected(reason) => assert!(
                    reason.contains("loopback")
                        && reason.ends_with("refused by `[outbound] private = \"deny\"`"),
                    "{url}: {reason}"
                ),
                other => panic!("{url}: {other:?}"),
            }
            let exchanged = strict.exchange(post(&url)).await;
            assert!(
                matches!(&exchanged, Err(ExchangeError::Final(e)) if e.contains("loopback")),
                "{url}: {exchanged:?}"
            );
        }
        match strict
            .send(post("http://evil@127.0.0.1:9/"), AnswerRule::Webhook)
            .await
        {
            Attempt::Rejected(reason) => assert!(reason.contains("user info"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            0,
            "a refused request connected"
        );
        // The default allows private addresses (and so the same server).
        let open = HttpSender::new().expect("sender");
        for url in [
            format!("http://127.0.0.1:{port}/x"),
            format!("http://localhost:{port}/x"),
        ] {
            assert!(
                matches!(
                    open.send(post(&url), AnswerRule::Channel).await,
                    Attempt::Delivered(_)
                ),
                "{url}"
            );
        }
        assert!(
            matches!(
                open.send(post("http://169.254.169.254/latest/meta-data"), AnswerRule::Bot)
                    .await,
                Attempt::Rejected(reason) if reason.starts_with("169.254.169.254 is link-local (cloud metadata)")
            ),
            "metadata refused by default"
        );
        // Allowed by name: any address the name resolves to.
        let by_name =
            HttpSender::with_policy(Policy::new(true, &["localhost".to_owned()]).expect("policy"))
                .expect("sender");
        assert!(matches!(
            by_name
                .send(
                    post(&format!("http://localhost:{port}/x")),
                    AnswerRule::Channel
                )
                .await,
            Attempt::Delivered(_)
        ));
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        use std::sync::atomic::Ordering;
        let (target, followed) = server(OK).await;
        let redirect: &'static str = Box::leak(
            format!(
                "HTTP/1.1 302 Found\r\nlocation: http://{target}/elsewhere\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n"
            )
            .into_boxed_str(),
        );
        let (addr, _) = server(redirect).await;
        let sender = HttpSender::new().expect("sender");
        let url = format!("http://{addr}/x");
        assert_eq!(
            sender.send(post(&url), AnswerRule::Channel).await,
            Attempt::Rejected("HTTP 302 Found".to_owned())
        );
        let (status, _) = sender.exchange(post(&url)).await.expect("an answer");
        assert_eq!(status, StatusCode::FOUND);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            followed.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }
}
