//! The HTTP server: accepts connections up to `server.max_connections`,
//! routes each request through the edges' layer (`layer.rs`: credentials
//! and rate limits) to its edge's handler, bounds a request head's size and how
//! long a client may take to send a request, and drains connections on
//! shutdown.

pub(crate) mod admin;
pub(crate) mod agents;
pub(crate) mod bots;
pub(crate) mod channel;
pub(crate) mod console;
pub mod geoip;
pub(crate) mod layer;
pub(crate) mod limits;
pub(crate) mod live_stream;
pub(crate) mod metrics;
pub(crate) mod problem;
pub(crate) mod respond;
pub(crate) mod session;
mod state;
pub(crate) mod widget;

pub use state::App;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::CONNECTION;
use http::{HeaderValue, Method, Request, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use crate::http::layer::BotDoor;
use crate::http::respond::{Resp, method_not_allowed, not_found, segments, text};

/// The address a request's connection came from (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// The client's address: the connection's, or, when that is one of
/// `[server] trusted_proxies`, the last address in `X-Forwarded-For` that is
/// not a trusted proxy (earlier entries are the client's to forge).
pub fn client_ip<B>(req: &Request<B>, trusted: &[std::net::IpAddr]) -> Option<std::net::IpAddr> {
    let peer = req.extensions().get::<Peer>()?.0.ip();
    if !trusted.contains(&peer) {
        return Some(peer);
    }
    let forwarded = req
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .collect::<Vec<_>>();
    Some(
        forwarded
            .into_iter()
            .rev()
            .find(|a| !trusted.contains(a))
            .unwrap_or(peer),
    )
}

pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let builder = connection_builder(&app.config.server);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Held for as long as the connection is open.
                    let Some(slot) = app.limits.connections.open() else {
                        refuse_connection(stream, &app.limits.connections);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let service = service_fn(move |mut req: Request<Incoming>| {
                        let app = app.clone();
                        // The widget records the visitor's address.
                        req.extensions_mut().insert(Peer(peer));
                        async move {
                            let mut resp = route(&app, req).await;
                            // A client too slow to send its request, or one
                            // whose body was too large to read, gets no second
                            // chance on this connection: the rest of what it
                            // sends would be read as the next request.
                            if matches!(
                                resp.status(),
                                StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
                            ) {
                                resp.headers_mut()
                                    .insert(CONNECTION, HeaderValue::from_static("close"));
                            }
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                    let (socket, returned) = Socket::new(stream);
                    let conn = builder.serve_connection(TokioIo::new(socket), service);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        let _slot = slot;
                        // `conn` (and with it the socket) is dropped once this await ends.
                        let ended = conn.await;
                        let Ok((stream, head_started)) = returned.await else { return };
                        match ended {
                            Err(e) if e.is_timeout() && head_started => {
                                answer_header_timeout(stream).await;
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "connection ended with an error");
                                close_gently(stream, LINGER).await;
                            }
                            Ok(()) => close_gently(stream, LINGER).await,
                        }
                    });
                }
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace");
    }
}

/// What a client that sent part of a request head but not all of it within
/// `server.header_timeout_ms` reads before the connection closes.
const HEADER_TIMEOUT_REASON: &str = "request headers did not arrive in time\n";

/// Answers a header read timeout with 408, then closes. hyper only closes the
/// connection on this timeout, without an answer; the socket comes back to
/// the connection task for this (see [`Socket`]).
async fn answer_header_timeout(stream: TcpStream) {
    answer_and_close(stream, "408 Request Timeout", "", HEADER_TIMEOUT_REASON).await;
}

/// What a connection refused at `server.max_connections` reads.
const BUSY_REASON: &str = "too many connections are open; retry shortly\n";

/// Counts a connection over `server.max_connections` and answers it 503 with
/// `Retry-After` on a task of its own; while many refusals are being
/// answered already it is closed at once instead, so that a flood of
/// connections costs little more than accepting them.
fn refuse_connection(stream: TcpStream, connections: &crate::http::limits::Connections) {
    let Some(turn) = connections.refuse() else {
        return;
    };
    tokio::spawn(async move {
        let _turn = turn;
        answer_and_close(
            stream,
            "503 Service Unavailable",
            "retry-after: 1\r\n",
            BUSY_REASON,
        )
        .await;
    });
}

/// Writes a whole `text/plain` answer without hyper, then closes gently.
async fn answer_and_close(
    mut stream: TcpStream,
    status: &'static str,
    headers: &str,
    reason: &str,
) {
    let answer = format!(
        "HTTP/1.1 {status}\r\nconnection: close\r\n{headers}\
         content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\r\n{reason}",
        reason.len()
    );
    // Bounded, as a client that stopped sending may well have stopped reading.
    let written =
        tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
    if !matches!(written, Ok(Ok(()))) {
        tracing::debug!(status, "could not answer before closing");
        return;
    }
    close_gently(stream, LINGER).await;
}

/// How long a closing connection is still read from, and how much at most.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 256 * 1024;

/// Closes a connection so that its client gets to read the last answer:
/// the write side first, then whatever the client still sends (the rest of
/// a body refused with 413, a request it sent before it read a 503) is read
/// and dropped for a moment. A socket closed with unread bytes is reset by
/// the kernel, and a reset can destroy the answer before the client read it.
async fn close_gently(mut stream: TcpStream, linger: Duration) {
    // Fails when hyper shut the write side already, which is just as good.
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(linger, async {
        let mut buf = [0u8; 8192];
        let mut read = 0;
        while read < LINGER_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}

/// How many headers hyper keeps on the stack; another count costs an
/// allocation per request, so it is only set when it differs.
const HYPER_DEFAULT_MAX_HEADERS: usize = 100;

/// hyper's settings for every connection: the header read timeout and the
/// limits of a request head, past which hyper answers 431 and closes.
fn connection_builder(server: &crate::config::ServerConfig) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(server.header_timeout())
        .max_header_size(server.max_header_bytes);
    if server.max_headers != HYPER_DEFAULT_MAX_HEADERS {
        builder.max_headers(server.max_headers);
    }
    builder
}

/// A connection's socket as hyper reads and writes it. When hyper lets go of
/// it, it goes back to the connection task with whether a request head had
/// started to arrive, so that a header read timeout can still be answered
/// with 408 — but only when a request was under way: an idle keep-alive
/// connection that times out is closed silently, since a client may be
/// sending its next request at that moment and would read the 408 as its
/// answer.
struct Socket {
    stream: Option<TcpStream>,
    /// Bytes were read since the last bytes were written, i.e. since the
    /// previous response: the next request has begun.
    head_started: bool,
    back: Option<oneshot::Sender<(TcpStream, bool)>>,
}

impl Socket {
    fn new(stream: TcpStream) -> (Socket, oneshot::Receiver<(TcpStream, bool)>) {
        let (back, returned) = oneshot::channel();
        let socket = Socket {
            stream: Some(stream),
            head_started: false,
            back: Some(back),
        };
        (socket, returned)
    }

    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        // `stream` is only taken in `drop`.
        self.stream
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let (Some(stream), Some(back)) = (self.stream.take(), self.back.take()) {
            // The task may be gone (its receiver dropped); the socket then closes here.
            let _ = back.send((stream, self.head_started));
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = this.stream()?.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.head_started = true;
        }
        polled
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = this.stream()?.poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.head_started = false;
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = this.stream()?.poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.head_started = false;
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().stream()?.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().stream()?.poll_shutdown(cx)
    }
}

/// The agent, admin and widget APIs as an OpenAPI document.
const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// Serving, and whether everything configured is in force: plugins that
/// are not required and did not load make the hub `degraded` (still 200: it
/// serves, and their routes act per `on_error`).
async fn readiness(app: &App) -> Resp {
    // Not ready while stopping (a load balancer moves traffic away) or
    // while the database does not answer (every write would be a 503).
    if *app.shutdown.borrow() {
        return crate::http::respond::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "status": "draining" }),
        );
    }
    if !app.store.ping(std::time::Duration::from_secs(2)).await {
        return crate::http::respond::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "status": "unavailable", "reason": "the database does not answer" }),
        );
    }
    // The database answers reads, yet cannot store anything (a full disk):
    // every message would be refused with 503 until a commit succeeds.
    if let Some(reason) = app.store.write_failure() {
        return crate::http::respond::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "status": "unavailable", "reason": format!("writes fail: {reason}") }),
        );
    }
    let wiring = app.wiring.current();
    let body = if wiring.unavailable.is_empty() {
        serde_json::json!({ "status": "ready" })
    } else {
        let plugins: Vec<_> = wiring
            .unavailable
            .iter()
            .map(|(name, error)| serde_json::json!({ "name": name, "error": error }))
            .collect();
        serde_json::json!({ "status": "degraded", "unavailable_plugins": plugins })
    };
    crate::http::respond::json(StatusCode::OK, &body)
}

/// Sends a request to the edge that owns its path, and counts it by edge
/// and status (`/metrics`); an event stream is counted as open until its
/// body is dropped.
pub async fn route(app: &App, req: Request<Incoming>) -> Resp {
    let started = std::time::Instant::now();
    let path = req.uri().path().to_owned();
    let parts = segments(&path);
    let edge = edge_of(&parts);
    let resp = dispatch(app, req, &parts).await;
    crate::obs::http_request(edge, resp.status().as_u16(), started.elapsed());
    live_stream::counted(resp, edge)
}

/// The edge a path belongs to, by the same patterns as [`dispatch`], in
/// the same order.
fn edge_of(parts: &[&str]) -> crate::obs::Edge {
    use crate::obs::Edge;
    match parts {
        ["healthz"] | ["readyz"] => Edge::Health,
        ["metrics"] => Edge::Metrics,
        ["admin", "v1", ..] => Edge::Admin,
        ["console", ..] => Edge::Console,
        ["agent", "v1", ..] => Edge::Agent,
        ["widget", "v1", ..] | ["widget", _] | ["script", "widget", _] | ["demo", _] => {
            Edge::Widget
        }
        ["webhooks", ..] | ["providers", ..] => Edge::Bots,
        [_, _] | [_, _, "status"] => Edge::Channel,
        _ => Edge::Other,
    }
}

/// Hands a request to its edge: first through the layer, with what the
/// edge declares (`layer.rs`), then to the edge's handler with what the
/// layer established.
async fn dispatch(app: &App, req: Request<Incoming>, parts: &[&str]) -> Resp {
    match parts {
        ["healthz"] => match *req.method() {
            Method::GET | Method::HEAD => text(StatusCode::OK, "ok"),
            _ => method_not_allowed(),
        },
        ["readyz"] => match *req.method() {
            Method::GET | Method::HEAD => readiness(app).await,
            _ => method_not_allowed(),
        },
        ["openapi.json"] => match *req.method() {
            Method::GET => crate::http::respond::with_type(
                StatusCode::OK,
                "application/json",
                crate::http::respond::full(OPENAPI),
            ),
            _ => method_not_allowed(),
        },
        ["metrics"] => match *req.method() {
            Method::GET => match layer::metrics(app, &req).await {
                Ok(()) => metrics::handle(app).await,
                Err(refused) => refused,
            },
            _ => method_not_allowed(),
        },
        ["admin", "v1", rest @ ..] => match layer::admin(app, &req).await {
            Ok(proof) => admin::handle(app, req, &proof, rest).await,
            Err(refused) => refused,
        },
        ["console", rest @ ..] => console::handle(app, req, rest).await,
        ["agent", "v1", rest @ ..] => match layer::agent(app, &req).await {
            Ok(agent) => agents::handle(app, req, &agent, rest).await,
            Err(refused) => refused,
        },
        ["widget", "v1", rest @ ..] => match layer::widget(app, &req, rest, widget::needs).await {
            Ok(admitted) => widget::handle(app, req, admitted).await,
            Err(refused) => refused,
        },
        ["widget", widget_id] | ["script", "widget", widget_id] => {
            widget::script(app, &req, widget_id).await
        }
        ["demo", widget_id] => widget::demo(app, &req, widget_id).await,
        ["webhooks", rest @ ..] => match layer::bot(app, &req, BotDoor::Webhooks, rest).await {
            Ok(bot) => bots::handle(app, req, &bot).await,
            Err(denial) => bots::refuse(denial),
        },
        ["providers", rest @ ..] => match layer::bot(app, &req, BotDoor::Providers, rest).await {
            Ok(bot) => bots::handle(app, req, &bot).await,
            Err(denial) => bots::refuse(denial),
        },
        [secret, public_id] | [secret, public_id, "status"] => {
            match layer::channel(app, &req, secret, public_id).await {
                Ok(channel) => channel::handle(app, req, &channel, parts.len() == 3).await,
                Err(refused) => refused,
            }
        }
        _ => not_found(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn request(peer: &str, forwarded: &[&str]) -> Request<()> {
        let mut req = Request::new(());
        for f in forwarded {
            req.headers_mut()
                .append("x-forwarded-for", HeaderValue::from_str(f).expect("header"));
        }
        let addr = format!("{peer}:4000").parse().expect("address");
        req.extensions_mut().insert(Peer(addr));
        req
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn the_client_address_comes_from_x_forwarded_for_only_behind_a_trusted_proxy() {
        let proxy = [ip("10.0.0.2")];
        // Not from the proxy: the header is the client's to forge, and ignored.
        let direct = request("198.51.100.9", &["203.0.113.7"]);
        assert_eq!(client_ip(&direct, &proxy), Some(ip("198.51.100.9")));
        // From the proxy: the last address it did not add itself.
        let proxied = request("10.0.0.2", &["1.2.3.4, 203.0.113.7"]);
        assert_eq!(client_ip(&proxied, &proxy), Some(ip("203.0.113.7")));
        let chained = request("10.0.0.2", &["203.0.113.7", "10.0.0.2"]);
        assert_eq!(client_ip(&chained, &proxy), Some(ip("203.0.113.7")));
        // A proxy that sent no header: the proxy's own address.
        assert_eq!(
            client_ip(&request("10.0.0.2", &[]), &proxy),
            Some(ip("10.0.0.2"))
        );
        assert_eq!(
            client_ip(&request("10.0.0.2", &["1.2.3.4"]), &[]),
            Some(ip("10.0.0.2")),
            "no trusted proxies: never the header"
        );
    }
}
