//! Channel benchmark: customer-message ingress (req/s, p50/p99) against a bare
//! hyper hello-world under the same load, and agent-message deliveries/s to a
//! loopback integrator. Run: `cargo bench -p hub --bench channel`.
//! Environment: BENCH_SECS (default 5), BENCH_CONNS (default 32), BENCH_REPLIES (default 2000).
//!
//! Black-box mode: `BENCH_ENDPOINT=http://127.0.0.1:8080/<secret>/<public_id>`
//! drives a running `hub serve` (a channel's customer-message endpoint, as
//! `hub channel create` prints it) over loopback instead of an in-process
//! hub, side by side with the same hello-world baseline; operators measure
//! their own deployment this way. The messages it posts are stored.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

const ADMIN: &str = "bench-admin-token-0123456789";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let secs = env_or("BENCH_SECS", 5);
    let conns = env_or("BENCH_CONNS", 32) as usize;
    let replies = env_or("BENCH_REPLIES", 2000) as usize;
    let duration = Duration::from_secs(secs);

    let (hello, _) = serve_hello().await;
    let hello_body = |_: usize| Bytes::from_static(b"{}");
    let base = load(hello, "/", conns, duration, &hello_body).await;
    if let Ok(endpoint) = std::env::var("BENCH_ENDPOINT") {
        black_box(&endpoint, conns, duration, &base).await;
        return;
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let (integrator, received) = serve_hello().await;
    let (hub, endpoint_path, token) = start_hub(dir.path(), integrator).await;
    let ingress = load(
        hub.addr(),
        &endpoint_path,
        conns,
        duration,
        &customer_message,
    )
    .await;

    println!(
        "channel benchmark: {conns} connections, {secs} s per run, 2 cores shared with the load generator"
    );
    base.print("hello-world (bare hyper)");
    ingress.print("customer-message ingress");
    println!(
        "ingress / hello-world throughput: {:.1} %",
        100.0 * ingress.rps() / base.rps()
    );

    let (delivered_per_s, elapsed) = deliveries(&hub, &token, replies, conns, &received).await;
    println!(
        "agent-message end to end: {replies} replies delivered to a loopback integrator in {:.2} s = {delivered_per_s:.0} deliveries/s",
        elapsed.as_secs_f64()
    );
    hub.shutdown().await;
}

/// The customer messages both modes post: 1000 customers, one short text.
fn customer_message(i: usize) -> Bytes {
    Bytes::from(
        json!({ "sender": { "id": i % 1000, "name": "Bench" },
                "message": { "type": "text", "text": "How much is the premium plan?" } })
        .to_string(),
    )
}

/// Loads a running hub's customer-message endpoint, next to the baseline.
async fn black_box(endpoint: &str, conns: usize, duration: Duration, base: &Run) {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        eprintln!("BENCH_ENDPOINT must be an http:// URL of a channel endpoint");
        return;
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let Some(addr) = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut a| a.next())
    else {
        eprintln!("cannot resolve {authority}");
        return;
    };
    let ingress = load(addr, path, conns, duration, &customer_message).await;
    println!(
        "channel benchmark, black box: {conns} connections, {} s per run, against {endpoint}",
        duration.as_secs()
    );
    base.print("hello-world (bare hyper)");
    ingress.print("customer-message ingress");
    println!(
        "ingress / hello-world throughput: {:.1} %",
        100.0 * ingress.rps() / base.rps()
    );
}

struct Run {
    count: usize,
    errors: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn rps(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    fn print(&self, name: &str) {
        println!(
            "{name:<28} {:>9.0} req/s  p50 {:>7.0} µs  p99 {:>7.0} µs  ({} requests, {} errors)",
            self.rps(),
            self.pct(0.50).as_secs_f64() * 1e6,
            self.pct(0.99).as_secs_f64() * 1e6,
            self.count,
            self.errors
        );
    }
}

/// A hello-world server: the ceiling for any HTTP service on this machine.
/// Returns its address and a count of requests served.
async fn serve_hello() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let counter = counter.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        counter.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            b"{\"result\":\"ok\"}",
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, served)
}

/// Keeps `conns` keep-alive connections busy with POSTs for `duration`.
async fn load(
    addr: SocketAddr,
    path: &str,
    conns: usize,
    duration: Duration,
    body: &(dyn Fn(usize) -> Bytes + Sync),
) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let bodies: Arc<Vec<Bytes>> = Arc::new((0..4096).map(body).collect());
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let path = path.to_owned();
        let next = next.clone();
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let _ = stream.set_nodelay(true);
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let mut lat = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let req = http::Request::post(path.as_str())
                    .header("host", addr.to_string())
                    .header("content-type", "application/json; charset=utf-8")
                    .body(Full::new(bodies[i % bodies.len()].clone()))
                    .expect("request");
                let t = Instant::now();
                match send.send_request(req).await {
                    Ok(resp) => {
                        let ok = resp.status().is_success();
                        let _ = resp.into_body().collect().await;
                        if ok {
                            lat.push(t.elapsed());
                        } else {
                            errors += 1;
                        }
                    }
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("load task");
        latencies.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed();
    latencies.sort();
    Run {
        count: latencies.len(),
        errors,
        elapsed,
        latencies,
    }
}

async fn start_hub(
    dir: &std::path::Path,
    integrator: SocketAddr,
) -> (hub::app::Running, String, String) {
    let config_text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[storage]\nurl = \"sqlite://{}\"\n[admin]\ntoken = \"{ADMIN}\"\n",
        dir.join("bench.db").display()
    );
    let path = dir.join("hub.toml");
    std::fs::write(&path, config_text).expect("write config");
    let config = hub::config::Config::load_with(&path, &hub::config::Env::empty()).expect("config");
    let running = hub::app::start(config).await.expect("start hub");
    let http = reqwest::Client::new();
    let base = running.base_url().to_owned();
    let agent: Value = http
        .post(format!("{base}/admin/v1/agents"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": "Bench", "email": "bench@example.com" }))
        .send()
        .await
        .expect("create agent")
        .json()
        .await
        .expect("agent json");
    let channel: Value = http
        .post(format!("{base}/admin/v1/channels"))
        .bearer_auth(ADMIN)
        .json(
            &json!({ "name": "bench", "customer_endpoint": format!("http://{integrator}/hook"),
                       "agents": ["bench@example.com"] }),
        )
        .send()
        .await
        .expect("create channel")
        .json()
        .await
        .expect("channel json");
    let endpoint = channel["endpoint_url"]
        .as_str()
        .expect("endpoint")
        .to_owned();
    let path = endpoint.trim_start_matches(&base).to_owned();
    let token = agent["token"].as_str().expect("token").to_owned();
    (running, path, token)
}

/// Sends `n` agent replies spread over the open chats and waits until all are delivered.
async fn deliveries(
    hub: &hub::app::Running,
    token: &str,
    n: usize,
    conns: usize,
    received: &AtomicUsize,
) -> (f64, Duration) {
    let http = reqwest::Client::new();
    let base = hub.base_url().to_owned();
    let chats: Value = http
        .get(format!("{base}/agent/v1/chats"))
        .bearer_auth(token)
        .send()
        .await
        .expect("list chats")
        .json()
        .await
        .expect("chats json");
    let ids: Vec<i64> = chats["chats"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["id"].as_i64()).collect())
        .unwrap_or_default();
    assert!(!ids.is_empty(), "the ingress run opened no chats");
    let ids = Arc::new(ids);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (http, base, token, ids, next) = (
            http.clone(),
            base.clone(),
            token.to_owned(),
            ids.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let chat = ids[i % ids.len()];
                let _ = http
                    .post(format!("{base}/agent/v1/chats/{chat}/messages"))
                    .bearer_auth(&token)
                    .json(&json!({ "type": "text", "text": "Premium is 10 a month." }))
                    .send()
                    .await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    while received.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed();
    (n as f64 / elapsed.as_secs_f64(), elapsed)
}
