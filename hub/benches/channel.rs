//! Channel benchmark: customer-message ingress against a bare hyper
//! hello-world under the same closed-loop load, in one run: in-process and
//! against the real `hub serve` binary over loopback; with no plugin and with
//! the default `redact`; with `durability = "full"` and `"normal"`; then a
//! paced run at half the measured rate (ack latency when not saturated),
//! agent-message deliveries/s end to end, and the served hub's RSS.
//! Run: `cargo bench -p hub --bench channel`.
//! Environment: BENCH_SECS (default 5), BENCH_CONNS (default 32),
//! BENCH_REPLIES (default 5000), BENCH_SKIP_SERVE=1 (in-process only),
//! BENCH_SOAK_SECS (a soak of the served hub at half rate, RSS every 30 s).
//!
//! Operators' mode: `BENCH_ENDPOINT=http://host:port/<secret>/<public_id>`
//! drives a hub already running (a channel's customer-message endpoint, as
//! `hub channel create` prints it) next to the same hello-world baseline;
//! `BENCH_PID=<pid of hub serve>` adds its RSS. The messages it posts are
//! stored.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::{create_channel, env_or, guard_backtraces, memory_kib, plugins_dir};

const ADMIN: &str = "bench-admin-token-0123456789";

fn main() {
    guard_backtraces();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    if std::env::var_os("BENCH_SERVE_HELLO").is_some() {
        runtime.block_on(hello_process());
        return;
    }
    runtime.block_on(bench());
}

/// The settings of one measured hub.
#[derive(Clone, Copy)]
struct Setup {
    redact: bool,
    durability: &'static str,
}

impl Setup {
    fn label(self) -> String {
        format!(
            "{}, {}",
            if self.redact { "redact" } else { "no plugin" },
            self.durability
        )
    }
}

const SETUPS: [Setup; 4] = [
    Setup {
        redact: false,
        durability: "full",
    },
    Setup {
        redact: false,
        durability: "normal",
    },
    Setup {
        redact: true,
        durability: "full",
    },
    Setup {
        redact: true,
        durability: "normal",
    },
];

async fn bench() {
    let secs = env_or("BENCH_SECS", 5);
    let conns = env_or("BENCH_CONNS", 32) as usize;
    let replies = env_or("BENCH_REPLIES", 5000) as usize;
    let duration = Duration::from_secs(secs);

    let (hello, _) = serve_hello().await;
    let hello_body = |_: usize| Bytes::from_static(b"{}");
    let base = load(hello, "/", conns, duration, &hello_body, None).await;
    if let Ok(endpoint) = std::env::var("BENCH_ENDPOINT") {
        black_box(&endpoint, conns, duration, &base).await;
        return;
    }
    let plugins = plugins_dir();
    println!(
        "channel benchmark: {conns} connections, {secs} s per run, 2 cores shared with the load generator"
    );
    println!("\nin-process (hub and load generator in one process):");
    base.print("hello-world (bare hyper)", None);
    let (integrator, received) = serve_hello().await;
    let mut kept = None;
    for setup in SETUPS {
        let dir = tempfile::tempdir().expect("temp dir");
        let (hub, endpoint_path, token) = start_hub(dir.path(), integrator, setup, &plugins).await;
        let run = ingress(hub.addr(), &endpoint_path, conns, duration, setup, &base).await;
        if setup.redact && setup.durability == "full" {
            paced(hub.addr(), &endpoint_path, conns, duration, &run).await;
            kept = Some((hub, token, dir));
        } else {
            hub.shutdown().await;
        }
    }
    if let Some((hub, token, _dir)) = kept {
        let (delivered_per_s, elapsed) =
            deliveries(hub.base_url(), &token, replies, conns, &received).await;
        println!(
            "agent messages end to end (redact, full): {replies} delivered to a loopback integrator in {:.2} s = {delivered_per_s:.0} deliveries/s",
            elapsed.as_secs_f64()
        );
        hub.shutdown().await;
    }
    if std::env::var_os("BENCH_SKIP_SERVE").is_none() {
        served(conns, duration, replies, &plugins).await;
    }
}

/// The same figures against the real `hub serve` binary, a separate process,
/// next to a hello-world in a separate process too.
async fn served(conns: usize, duration: Duration, replies: usize, plugins: &Path) {
    println!("\nblack box (`hub serve` and a hello-world process, driven over loopback):");
    let (mut hello_child, hello) = spawn_hello();
    let hello_body = |_: usize| Bytes::from_static(b"{}");
    let base = load(hello, "/", conns, duration, &hello_body, None).await;
    base.print("hello-world (bare hyper)", None);
    let _ = hello_child.kill();
    let (integrator, received) = serve_hello().await;
    for setup in [SETUPS[0], SETUPS[2], SETUPS[3]] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut hub = ServedHub::start(dir.path(), integrator, setup, plugins).await;
        let idle = memory_kib(hub.child.id(), "VmRSS");
        let run = ingress(hub.addr, &hub.path, conns, duration, setup, &base).await;
        if setup.redact && setup.durability == "full" {
            paced(hub.addr, &hub.path, conns, duration, &run).await;
            received.store(0, Ordering::Relaxed);
            let (delivered_per_s, _) =
                deliveries(&hub.base, &hub.token, replies, conns, &received).await;
            println!(
                "  agent messages end to end: {delivered_per_s:.0} deliveries/s ({replies} replies)"
            );
            let size = |name: &str| {
                std::fs::metadata(dir.path().join(name)).map_or(0.0, |m| m.len() as f64 / 1e6)
            };
            println!(
                "  hub RSS: idle {:.1} MB, after the runs {:.1} MB; database {:.1} MB, WAL {:.1} MB",
                idle as f64 / 1024.0,
                memory_kib(hub.child.id(), "VmRSS") as f64 / 1024.0,
                size("bench.db"),
                size("bench.db-wal")
            );
            soak(&hub, &run).await;
        }
        hub.stop();
    }
}

/// With `BENCH_SOAK_SECS`, keeps the served hub at half the measured rate
/// for that long and prints its RSS every 30 s: memory must stay flat.
async fn soak(hub: &ServedHub, closed: &Run) {
    let secs = env_or("BENCH_SOAK_SECS", 0);
    if secs == 0 {
        return;
    }
    let rate = closed.rps() / 2.0;
    println!("  soak: {rate:.0} msg/s for {secs} s, RSS every 30 s:");
    let chunk = Duration::from_secs(30);
    let mut done = Duration::ZERO;
    let mut samples = Vec::new();
    while done.as_secs() < secs {
        let run = load(
            hub.addr,
            &hub.path,
            32,
            chunk,
            &customer_message,
            Some(rate),
        )
        .await;
        done += chunk;
        let rss = memory_kib(hub.child.id(), "VmRSS") as f64 / 1024.0;
        samples.push(rss);
        println!(
            "    {:4} s  {:6.1} MB  ({:.0} msg/s, {} errors)",
            done.as_secs(),
            rss,
            run.rps(),
            run.errors
        );
    }
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        println!(
            "  soak RSS: first {first:.1} MB, last {last:.1} MB, max {:.1} MB",
            samples.iter().cloned().fold(0.0, f64::max)
        );
    }
}

/// The customer messages every mode posts: 1000 customers, one short text
/// with something `redact` masks.
fn customer_message(i: usize) -> Bytes {
    Bytes::from(
        json!({ "sender": { "id": i % 1000, "name": "Bench" },
                "message": { "type": "text", "text": "How much is the premium plan? Call me at +1 555 0100" } })
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
    println!(
        "channel benchmark, black box: {conns} connections, {} s per run, against {endpoint}",
        duration.as_secs()
    );
    base.print("hello-world (bare hyper)", None);
    let pid = std::env::var("BENCH_PID").ok().and_then(|p| p.parse().ok());
    if let Some(pid) = pid {
        println!(
            "hub RSS before: {:.1} MB",
            memory_kib(pid, "VmRSS") as f64 / 1024.0
        );
    }
    let ingress = load(addr, path, conns, duration, &customer_message, None).await;
    ingress.print("customer-message ingress", Some(base));
    paced(addr, path, conns, duration, &ingress).await;
    if let Some(pid) = pid {
        println!(
            "hub RSS after: {:.1} MB",
            memory_kib(pid, "VmRSS") as f64 / 1024.0
        );
    }
}

/// The closed-loop ingress run of a setup, printed next to `base`.
async fn ingress(
    addr: SocketAddr,
    path: &str,
    conns: usize,
    duration: Duration,
    setup: Setup,
    base: &Run,
) -> Run {
    let run = load(addr, path, conns, duration, &customer_message, None).await;
    run.print(&format!("ingress, {}", setup.label()), Some(base));
    run
}

/// Customer messages at half the rate `closed` reached: the latency of
/// acknowledgements when the hub is not saturated.
async fn paced(addr: SocketAddr, path: &str, conns: usize, duration: Duration, closed: &Run) {
    let rate = Some(closed.rps() / 2.0);
    let run = load(addr, path, conns, duration, &customer_message, rate).await;
    run.print("  paced at half that rate", None);
}

/// The hub configuration of a setup.
fn config_text(dir: &Path, listen: &str, setup: Setup, plugins: &Path) -> String {
    let mut text = format!(
        "[server]\nlisten = \"{listen}\"\n[storage]\nurl = \"sqlite://{}\"\ndurability = \"{}\"\n\
         [admin]\ntoken = \"{ADMIN}\"\n",
        dir.join("bench.db").display(),
        setup.durability
    );
    if setup.redact {
        text += &format!(
            "[[plugins]]\nname = \"redact\"\npath = \"{}\"\n\
             [[routes]]\nevents = [\"channel.customer_message\"]\nplugins = [\"redact\"]\n\
             on_error = \"reject\"\n",
            plugins.join("redact.wasm").display()
        );
    }
    text
}

/// A `hub serve` child process with a channel and an agent.
struct ServedHub {
    child: Child,
    addr: SocketAddr,
    base: String,
    path: String,
    token: String,
}

impl ServedHub {
    async fn start(dir: &Path, integrator: SocketAddr, setup: Setup, plugins: &Path) -> ServedHub {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let path = dir.join("hub.toml");
        std::fs::write(&path, config_text(dir, &addr.to_string(), setup, plugins))
            .expect("write config");
        let child = Command::new(env!("CARGO_BIN_EXE_hub"))
            .args(["--config", &path.display().to_string(), "serve"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hub serve");
        let base = format!("http://{addr}");
        let http = reqwest::Client::new();
        let started = Instant::now();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "hub serve did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (path, token) = provision(&base, integrator).await;
        ServedHub {
            child,
            addr,
            base,
            path,
            token,
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Re-runs this benchmark binary as a hello-world server process.
fn spawn_hello() -> (Child, SocketAddr) {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().expect("bench binary"))
        .env("BENCH_SERVE_HELLO", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the hello-world process");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let addr = line.trim().parse().expect("hello-world address");
    (child, addr)
}

/// The hello-world process: prints its address, serves until killed.
async fn hello_process() {
    let (addr, _) = serve_hello().await;
    println!("{addr}");
    std::future::pending::<()>().await;
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
    /// One line; with `base`, the throughput as a share of it.
    fn print(&self, name: &str, base: Option<&Run>) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let share = base
            .map(|b| format!("  = {:.1} % of hello-world", 100.0 * self.rps() / b.rps()))
            .unwrap_or_default();
        println!(
            "{name:<34} {:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  p999 {:>6.2} ms  ({} ok, {} errors){share}",
            self.rps(),
            ms(self.pct(0.50)),
            ms(self.pct(0.99)),
            ms(self.pct(0.999)),
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

/// Keeps `conns` keep-alive connections busy with POSTs for `duration`:
/// closed loop, or with `rate`, requests started at that total rate (each
/// latency counted from when its request was due, so a stall is not hidden).
async fn load(
    addr: SocketAddr,
    path: &str,
    conns: usize,
    duration: Duration,
    body: &(dyn Fn(usize) -> Bytes + Sync),
    rate: Option<f64>,
) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let bodies: Arc<Vec<Bytes>> = Arc::new((0..4096).map(body).collect());
    let start = Instant::now();
    let deadline = start + duration;
    // Paced: each connection sends every `interval`, the connections offset.
    let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r.max(1.0)));
    let mut tasks = Vec::new();
    for c in 0..conns {
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
            let mut due = start
                + interval
                    .map(|i| i.mul_f64(c as f64 / conns as f64))
                    .unwrap_or_default();
            while Instant::now() < deadline {
                if interval.is_some() {
                    tokio::time::sleep_until(due.into()).await;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let req = http::Request::post(path.as_str())
                    .header("host", addr.to_string())
                    .header("content-type", "application/json; charset=utf-8")
                    .body(Full::new(bodies[i % bodies.len()].clone()))
                    .expect("request");
                let t = if interval.is_some() {
                    due
                } else {
                    Instant::now()
                };
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
                if let Some(interval) = interval {
                    due += interval;
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

/// An in-process hub of `setup` with a channel and an agent.
async fn start_hub(
    dir: &Path,
    integrator: SocketAddr,
    setup: Setup,
    plugins: &Path,
) -> (hub::app::Running, String, String) {
    let path = dir.join("hub.toml");
    std::fs::write(&path, config_text(dir, "127.0.0.1:0", setup, plugins)).expect("write config");
    let config = hub::config::Config::load_with(&path, &hub::config::Env::empty()).expect("config");
    let running = hub::app::start(config).await.expect("start hub");
    let (path, token) = provision(running.base_url(), integrator).await;
    (running, path, token)
}

/// Creates the agent and the channel; their endpoint path and agent token.
async fn provision(base: &str, integrator: SocketAddr) -> (String, String) {
    let http = reqwest::Client::new();
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
    let hook = format!("http://{integrator}/hook");
    let path = create_channel(base, ADMIN, "bench", &hook, &["bench@example.com"]).await;
    let token = agent["token"].as_str().expect("token").to_owned();
    (path, token)
}

/// Sends `n` agent replies spread over the open chats and waits until all are delivered.
async fn deliveries(
    base: &str,
    token: &str,
    n: usize,
    conns: usize,
    received: &AtomicUsize,
) -> (f64, Duration) {
    let http = reqwest::Client::new();
    let base = base.to_owned();
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
    let before = received.load(Ordering::Relaxed);
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
    while received.load(Ordering::Relaxed) < before + n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = start.elapsed();
    (n as f64 / elapsed.as_secs_f64(), elapsed)
}
