//! The HTTP server: accepts connections, routes each request to its edge,
//! bounds how long a client may take to send a request, and drains
//! connections on shutdown.

pub mod admin;
pub mod agents;
pub mod bots;
pub mod channel;
pub mod console;
pub mod geoip;
pub mod limits;
pub mod live_stream;
pub mod metrics;
pub mod problem;
pub mod respond;
pub mod session;
mod state;
pub mod widget;

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
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

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
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let header_timeout = app.config.server.header_timeout();
                    let app = app.clone();
                    let service = service_fn(move |mut req: Request<Incoming>| {
                        let app = app.clone();
                        // The widget records the visitor's address.
                        req.extensions_mut().insert(Peer(peer));
                        async move {
                            let mut resp = route(&app, req).await;
                            // A client too slow to send its request gets no
                            // second chance on this connection: whatever it
                            // still sends would be read as the next request.
                            if resp.status() == StatusCode::REQUEST_TIMEOUT {
                                resp.headers_mut()
                                    .insert(CONNECTION, HeaderValue::from_static("close"));
                            }
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                    let (socket, returned) = Socket::new(stream);
                    let conn = http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(header_timeout)
                        .serve_connection(TokioIo::new(socket), service);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        // `conn` (and with it the socket) is dropped once this await ends.
                        let Err(e) = conn.await else { return };
                        if e.is_timeout()
                            && let Ok((stream, head_started)) = returned.await
                            && head_started
                        {
                            answer_header_timeout(stream).await;
                        } else {
                            tracing::debug!(error = %e, "connection ended with an error");
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
async fn answer_header_timeout(mut stream: TcpStream) {
    let answer = format!(
        "HTTP/1.1 408 Request Timeout\r\nconnection: close\r\n\
         content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\r\n{HEADER_TIMEOUT_REASON}",
        HEADER_TIMEOUT_REASON.len()
    );
    // Bounded, as a client that stopped sending may well have stopped reading.
    let answered = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(answered, Ok(Ok(()))) {
        tracing::debug!("could not answer a header read timeout");
    }
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

/// Sends a request to the edge that owns its path.
pub async fn route(app: &App, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let parts = segments(&path);
    match parts.as_slice() {
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
            Method::GET => {
                if app.config.metrics.access == crate::config::MetricsAccess::Admin
                    && let Err(resp) = crate::http::session::admin(app, &req).await
                {
                    return resp;
                }
                crate::http::metrics::handle(app).await
            }
            _ => method_not_allowed(),
        },
        ["admin", "v1", rest @ ..] => crate::http::admin::handle(app, req, rest).await,
        ["console", rest @ ..] => crate::http::console::handle(app, req, rest).await,
        ["agent", "v1", rest @ ..] => crate::http::agents::handle(app, req, rest).await,
        ["widget", "v1", rest @ ..] => crate::http::widget::handle(app, req, rest).await,
        ["widget", widget_id] | ["script", "widget", widget_id] => {
            crate::http::widget::script(app, &req, widget_id).await
        }
        ["demo", widget_id] => crate::http::widget::demo(app, &req, widget_id).await,
        ["webhooks", rest @ ..] => {
            crate::http::bots::handle(app, req, crate::http::bots::Door::Webhooks, rest).await
        }
        ["providers", rest @ ..] => {
            crate::http::bots::handle(app, req, crate::http::bots::Door::Providers, rest).await
        }
        [secret, public_id] => {
            crate::http::channel::handle(app, req, secret, public_id, false).await
        }
        [secret, public_id, "status"] => {
            crate::http::channel::handle(app, req, secret, public_id, true).await
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
