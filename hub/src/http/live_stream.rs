//! Server-Sent Events from the live broadcast: one task per open stream
//! that says it is connected, keeps the connection alive, ends with the hub,
//! and sends what its [`Frames`] makes of each live event (agents' streams,
//! widget visitors' streams), each counted while it is open.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use tokio::sync::{broadcast, mpsc};

use crate::core::live::LiveEvent;
use crate::http::App;
use crate::http::respond::{Body, Resp, event_stream};
use crate::obs::{Edge, StreamGuard};

/// A comment line now and then, so proxies keep the connection open.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// What happened, for a stream to turn into a frame.
pub enum Update {
    Event(LiveEvent),
    /// The stream fell behind the broadcast and missed this many events.
    Lagged(u64),
    /// The stream's own timer ([`Frames::tick`]) went off.
    Tick,
}

/// What one kind of stream sends.
pub trait Frames: Send + 'static {
    /// How often [`Update::Tick`] comes, if ever.
    fn tick(&self) -> Option<Duration> {
        None
    }

    /// What to send first, once the stream listens to the broadcast and
    /// before its client sees it open: what a resumed stream missed, or
    /// where a new one begins. Whatever is published meanwhile waits in the
    /// stream's queue and comes after.
    fn start(&mut self) -> impl Future<Output = Vec<Bytes>> + Send + '_ {
        async { Vec::new() }
    }

    /// The bytes to send for `update`, or nothing.
    fn frame(&mut self, update: Update) -> impl Future<Output = Option<Bytes>> + Send + '_;
}

/// The broadcast, listened to from now on: a stream's handler takes it
/// before it reads the state its frames start from, so nothing published
/// after that read can fall between the read and the stream.
pub struct Listening(broadcast::Receiver<LiveEvent>);

/// Starts listening to the live broadcast (see [`Listening`]).
pub fn listen(app: &App) -> Listening {
    Listening(app.live.subscribe())
}

/// An open event stream fed by `frames`. The answer's headers go out only
/// once [`Frames::start`] has fixed where the stream begins: a client that
/// sees the stream open gets everything published afterwards.
pub async fn open(app: &App, listening: Listening, mut frames: impl Frames) -> Resp {
    let Listening(mut updates) = listening;
    let mut shutdown = app.shutdown.clone();
    app.live.watching().await;
    let first = frames.start().await;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        // An interval must tick; a stream without a timer gets a day-long one.
        let mut timer = tokio::time::interval(frames.tick().unwrap_or(Duration::from_secs(86_400)));
        timer.tick().await;
        let has_timer = frames.tick().is_some();
        if tx
            .send(Bytes::from_static(b": connected\n\n"))
            .await
            .is_err()
        {
            return;
        }
        for frame in first {
            if tx.send(frame).await.is_err() {
                return;
            }
        }
        loop {
            let update = tokio::select! {
                update = updates.recv() => match update {
                    Ok(ev) => Update::Event(ev),
                    Err(broadcast::error::RecvError::Lagged(n)) => Update::Lagged(n),
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                _ = timer.tick(), if has_timer => Update::Tick,
                _ = keepalive.tick() => {
                    if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                        break;
                    }
                    continue;
                }
                _ = shutdown.changed() => break,
            };
            if let Some(frame) = frames.frame(update).await
                && tx.send(frame).await.is_err()
            {
                break;
            }
        }
    });
    event_stream(rx)
}

/// `event: <name>` with `data` as one SSE frame.
pub fn frame(name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// As [`frame`], with the SSE `id` a client sends back as `Last-Event-ID`
/// when it reconnects.
pub fn frame_with_id(id: i64, name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("id: {id}\nevent: {name}\ndata: {data}\n\n"))
}

/// `resp` counted in `hub_live_streams` under `edge` for as long as its body
/// lives, when it is an event stream (others pass as they are). The body,
/// not the stream's task, is what counts: hyper drops it as soon as the
/// client goes, while the task notices only at its next frame.
pub fn counted(resp: Resp, edge: Edge) -> Resp {
    let is_stream = resp
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"text/event-stream");
    if !is_stream {
        return resp;
    }
    let open = crate::obs::stream_opened(edge);
    resp.map(|body| Counted { body, _open: open }.boxed())
}

/// An event stream's body with the guard that counts it.
struct Counted {
    body: Body,
    _open: StreamGuard,
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
