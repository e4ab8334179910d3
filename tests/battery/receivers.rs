//! The integrators the hub delivers to: a recording one that answers every
//! reply with `{"result":"ok"}`, and a raw one that misbehaves as each
//! scenario of the fault matrix says.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::wire::{RawRequest, read_request};

/// One request the recorder got.
#[derive(Clone)]
pub struct Receipt {
    pub at: Instant,
    /// `message.id` of the body: the agent message's uid.
    pub message_id: String,
    pub delivery: String,
    pub attempt: u32,
    /// When the answer was ready to go back.
    pub answered: Instant,
}

/// A loopback integrator that records every agent message it is sent.
#[derive(Clone)]
pub struct Recorder {
    pub url: String,
    receipts: Arc<Mutex<Vec<Receipt>>>,
    /// How long each answer waits, in ms (a slow integrator keeps
    /// deliveries in flight).
    delay_ms: Arc<AtomicU64>,
}

impl Recorder {
    pub async fn start() -> Result<Recorder, String> {
        Recorder::start_on("127.0.0.1:0").await
    }

    pub async fn start_on(addr: &str) -> Result<Recorder, String> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot bind the integrator: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("integrator address: {e}"))?;
        let recorder = Recorder {
            url: format!("http://{local}"),
            receipts: Arc::default(),
            delay_ms: Arc::default(),
        };
        let shared = recorder.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(shared.answer(req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(recorder)
    }

    async fn answer(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<Full<Bytes>> {
        let at = Instant::now();
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let delivery = header("x-hub-delivery");
        let attempt = header("x-hub-attempt").parse().unwrap_or(0);
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let message_id = json["message"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        // Recorded once answered: what the hub may count as delivered.
        if let Ok(mut r) = self.receipts.lock() {
            r.push(Receipt {
                at,
                message_id,
                delivery,
                attempt,
                answered: Instant::now(),
            });
        }
        hyper::Response::new(Full::new(Bytes::from_static(b"{\"result\":\"ok\"}")))
    }

    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn receipts(&self) -> Vec<Receipt> {
        self.receipts.lock().map(|r| r.clone()).unwrap_or_default()
    }

    pub fn count(&self) -> usize {
        self.receipts.lock().map_or(0, |r| r.len())
    }
}

/// What a fault receiver does with one attempt.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// `HTTP/1.1 <status>` with this extra header line and body.
    Status(u16, &'static str, &'static str),
    /// A 200 whose body stops after a few bytes of its Content-Length, then
    /// a reset.
    ResetMidResponse,
    /// Reads the request and answers nothing for this long.
    Hang(Duration),
    /// A 200 `{"result":"ok"}` padded to this many bytes.
    Huge(usize),
    Ok,
}

/// Per scenario (the first path segment), what each attempt gets: attempt n
/// takes the n-th fault, and the last one repeats.
pub type Script = HashMap<String, Vec<Fault>>;

/// A raw loopback integrator playing the fault matrix.
#[derive(Clone)]
pub struct FaultServer {
    pub url: String,
    /// Every request: scenario, attempt header, when.
    pub seen: Arc<Mutex<Vec<(String, String, Instant)>>>,
}

impl FaultServer {
    pub async fn start(script: Script) -> Result<FaultServer, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind the fault receiver: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("fault receiver address: {e}"))?;
        let server = FaultServer {
            url: format!("http://{local}"),
            seen: Arc::default(),
        };
        let script = Arc::new(script);
        let seen = server.seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_faults(stream, script.clone(), seen.clone()));
            }
        });
        Ok(server)
    }

    /// The requests seen for one scenario.
    pub fn hits(&self, scenario: &str) -> Vec<Instant> {
        self.seen
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|(name, _, _)| name == scenario)
                    .map(|(_, _, at)| *at)
                    .collect()
            })
            .unwrap_or_default()
    }
}

async fn serve_faults(
    mut stream: TcpStream,
    script: Arc<Script>,
    seen: Arc<Mutex<Vec<(String, String, Instant)>>>,
) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut stream, &mut buf).await {
        let scenario = scenario_of(&req);
        let n = {
            let Ok(mut seen) = seen.lock() else { return };
            seen.push((
                scenario.clone(),
                req.header("x-hub-attempt").unwrap_or_default().to_owned(),
                Instant::now(),
            ));
            seen.iter().filter(|(s, _, _)| *s == scenario).count()
        };
        let fault = script
            .get(&scenario)
            .and_then(|faults| faults.get(n - 1).or(faults.last()).copied())
            .unwrap_or(Fault::Ok);
        let keep = match fault {
            Fault::Status(status, header, body) => {
                let answer = format!(
                    "HTTP/1.1 {status} Whatever\r\n{header}Content-Type: text/plain\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.is_ok()
            }
            Fault::Ok => {
                let body = "{\"result\":\"ok\"}";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.is_ok()
            }
            Fault::ResetMidResponse => {
                let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                              Content-Length: 100\r\n\r\n{\"resu";
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.flush().await;
                // A zero linger turns the close into a reset.
                let _ = stream.set_zero_linger();
                false
            }
            Fault::Hang(d) => {
                tokio::time::sleep(d).await;
                false
            }
            Fault::Huge(size) => {
                let prefix = b"{\"result\":\"ok\",\"pad\":\"";
                let tail = b"\"}";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Content-Length: {size}\r\n\r\n"
                );
                let mut ok = stream.write_all(head.as_bytes()).await.is_ok()
                    && stream.write_all(prefix).await.is_ok();
                let mut left = size.saturating_sub(prefix.len() + tail.len());
                let block = vec![b'x'; 64 * 1024];
                while ok && left > 0 {
                    let n = left.min(block.len());
                    ok = stream.write_all(&block[..n]).await.is_ok();
                    left -= n;
                }
                ok && stream.write_all(tail).await.is_ok()
            }
        };
        if !keep {
            return;
        }
    }
}

/// The scenario a request is for: the first segment of its path.
fn scenario_of(req: &RawRequest) -> String {
    req.path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}
