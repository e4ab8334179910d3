//! The HTTP server: accepts connections, routes each request to its edge, and
//! drains connections on shutdown.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::App;
use crate::web::{Resp, method_not_allowed, not_found, segments, text};

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
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let service = service_fn(move |req| {
                        let app = app.clone();
                        async move { Ok::<_, std::convert::Infallible>(route(&app, req).await) }
                    });
                    let conn = http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(30))
                        .serve_connection(TokioIo::new(stream), service);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
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

/// The agent, admin and widget APIs as an OpenAPI document.
const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// Sends a request to the edge that owns its path.
pub async fn route(app: &App, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let parts = segments(&path);
    match parts.as_slice() {
        ["healthz"] => match *req.method() {
            Method::GET | Method::HEAD => text(StatusCode::OK, "ok"),
            _ => method_not_allowed(),
        },
        ["openapi.json"] => match *req.method() {
            Method::GET => crate::web::with_type(
                StatusCode::OK,
                "application/json",
                crate::web::full(OPENAPI),
            ),
            _ => method_not_allowed(),
        },
        ["metrics"] => match *req.method() {
            Method::GET => crate::metrics::handle(app),
            _ => method_not_allowed(),
        },
        ["admin", "v1", rest @ ..] => crate::admin::handle(app, req, rest).await,
        ["agent", "v1", rest @ ..] => crate::agents::handle(app, req, rest).await,
        ["widget", "v1", rest @ ..] => crate::widget::handle(app, req, rest).await,
        [secret, public_id] => crate::channel::handle(app, req, secret, public_id, false).await,
        [secret, public_id, "status"] => {
            crate::channel::handle(app, req, secret, public_id, true).await
        }
        _ => not_found(),
    }
}
