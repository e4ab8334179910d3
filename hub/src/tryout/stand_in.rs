//! Stand-in destinations for `hub plugin test`: a loopback server that every
//! destination of the plugin under test points at. It answers a `send` with
//! `200 {}`, or with `--live-send` passes it on to the real destination once;
//! when the plugin runs again each answer is replayed, so nothing is sent twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::outbound::{HttpSender, Request};
use crate::runtime::destinations::Destination;

/// What a destination of the plugin under test does with a `send`.
#[derive(Debug, Clone)]
pub enum Target {
    /// Answered here with `200 {}`.
    Stub,
    /// Passed on to the destination of `hub.toml`, with its headers.
    Live(Arc<Destination>),
    /// Not granted: the hub would have stopped the call. Answered like a
    /// stub so the run can end, and reported.
    Refused,
}

/// How one `send` was answered.
#[derive(Debug, Clone)]
pub enum Answer {
    Reply {
        status: u16,
        body: String,
    },
    /// The real destination could not be reached; the plugin sees its
    /// request fail.
    Failed(String),
}

/// One `send` of the current run.
#[derive(Debug, Clone)]
pub struct Send {
    pub destination: String,
    pub payload: Value,
    pub answer: Answer,
    /// Whether a real destination answered (now or in an earlier run).
    pub live: bool,
    /// Whether the destination was not granted (the hub would have refused it).
    pub refused: bool,
}

const STUB_BODY: &str = "{}";

#[derive(Default)]
struct State {
    /// By the index in the URL path, so any name the plugin uses fits in a URL.
    targets: Vec<(String, Target)>,
    /// Every answer given so far per destination, in order, with whether it was live.
    answers: HashMap<String, Vec<(Answer, bool)>>,
    /// Sends of the current run per destination, to find the answer to replay.
    seen: HashMap<String, usize>,
    sends: Vec<Send>,
    /// Set by a send the hub would have refused; the run is no longer one
    /// the hub could make, so nothing after it goes out live.
    refused: Option<String>,
}

struct Shared {
    sender: HttpSender,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn answer(&self, index: usize, body: Bytes) -> Option<Answer> {
        let payload = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        let (name, target, replay, halted) = {
            let mut state = self.state();
            let (name, target) = state.targets.get(index)?.clone();
            let k = state.seen.entry(name.clone()).or_default();
            let nth = *k;
            *k += 1;
            let replay = state.answers.get(&name).and_then(|a| a.get(nth)).cloned();
            (name, target, replay, state.refused.is_some())
        };
        let stub = || Answer::Reply {
            status: 200,
            body: STUB_BODY.to_owned(),
        };
        let (answer, live, refused) = match (replay, target) {
            (Some((answer, live)), _) => (answer, live, false),
            (None, Target::Refused) => {
                self.state().refused.get_or_insert_with(|| name.clone());
                (stub(), false, true)
            }
            (None, _) if halted => return Some(stub()),
            (None, Target::Stub) => (stub(), false, false),
            (None, Target::Live(dest)) => {
                let sent = self
                    .sender
                    .exchange(Request {
                        headers: &dest.headers,
                        ..Request::post(&dest.url, body, dest.policy.timeout)
                    })
                    .await;
                let answer = match sent {
                    Ok((status, body)) => Answer::Reply {
                        status: status.as_u16(),
                        body: String::from_utf8_lossy(&body).into_owned(),
                    },
                    Err(e) => Answer::Failed(e.to_string()),
                };
                (answer, true, false)
            }
        };
        let mut state = self.state();
        if !refused {
            let sent = state.seen.get(&name).copied().unwrap_or(0);
            let kept = state.answers.entry(name.clone()).or_default();
            if kept.len() < sent {
                kept.push((answer.clone(), live));
            }
        }
        state.sends.push(Send {
            destination: name,
            payload,
            answer: answer.clone(),
            live,
            refused,
        });
        Some(answer)
    }
}

/// The loopback server and what it has seen; stops when dropped.
pub struct StandIns {
    base: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl StandIns {
    pub async fn start(sender: HttpSender) -> std::io::Result<StandIns> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            sender,
            state: Mutex::new(State::default()),
        });
        let server = tokio::spawn(accept(listener, shared.clone()));
        Ok(StandIns {
            base,
            shared,
            server,
        })
    }

    /// Registers `name` and returns the URL its sends go to.
    pub fn url(&self, name: &str, target: Target) -> String {
        let mut state = self.shared.state();
        let index = match state.targets.iter().position(|(n, _)| n == name) {
            Some(i) => {
                state.targets[i].1 = target;
                i
            }
            None => {
                state.targets.push((name.to_owned(), target));
                state.targets.len() - 1
            }
        };
        format!("{}/{index}", self.base)
    }

    /// Forgets the sends of the last run; the answers stay for replay.
    pub fn begin_run(&self) {
        let mut state = self.shared.state();
        state.seen.clear();
        state.sends.clear();
        state.refused = None;
    }

    /// The sends of the current run, in order.
    pub fn sends(&self) -> Vec<Send> {
        self.shared.state().sends.clone()
    }

    /// The destination of the first refused send of the current run.
    pub fn refused(&self) -> Option<String> {
        self.shared.state().refused.clone()
    }
}

impl Drop for StandIns {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        let shared = shared.clone();
        let service = service_fn(move |req: http::Request<Incoming>| {
            let shared = shared.clone();
            async move { respond(&shared, req).await }
        });
        tokio::spawn(async move {
            // The plugin's request timing out ends the connection; nothing to report.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// An `Err` closes the connection without an answer, so the plugin's `send`
/// fails as it would have against the unreachable destination.
async fn respond(
    shared: &Shared,
    req: http::Request<Incoming>,
) -> Result<Response<Full<Bytes>>, String> {
    let index = req
        .uri()
        .path()
        .trim_start_matches('/')
        .parse::<usize>()
        .ok();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let answer = match index {
        Some(i) => shared.answer(i, body).await,
        None => None,
    };
    let (status, body) = match answer {
        Some(Answer::Reply { status, body }) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            body,
        ),
        Some(Answer::Failed(e)) => return Err(e),
        None => (StatusCode::NOT_FOUND, String::new()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    Ok(resp)
}
