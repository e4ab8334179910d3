//! Test harness: a hub on 127.0.0.1:0 with a temporary SQLite file (or, with
//! `HUB_TEST_DATABASE_URL` set, a fresh PostgreSQL database on that server:
//! `scripts/with-postgres.sh`), a real loopback HTTP server playing the
//! integrator, an SSE reader for the agent stream, and a `hub` child process
//! for tests that kill or signal it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hub::app::Running;
use hub::clock::ManualClock;
use hub::config::{Config, Env};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// Settings of a test hub; delays default to fast values, tests of the spec's
/// timing set them back to 3 s.
#[derive(Clone)]
pub struct HubOptions {
    pub attempts: u32,
    pub retry_interval_ms: u64,
    pub attempt_timeout_ms: u64,
    pub max_body_bytes: usize,
    pub shutdown_grace_ms: u64,
    /// `[delivery] lease_ms`: how long a crashed instance's deliveries wait
    /// on PostgreSQL (SQLite gives them back at start).
    pub lease_ms: u64,
    /// Extra TOML appended to the file, e.g. `[[channels]]` tables.
    pub extra_toml: String,
    /// The hub's time, held still and moved on by the test; the system's
    /// clock when `None`. A restart keeps it.
    pub clock: Option<ManualClock>,
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            attempts: 3,
            retry_interval_ms: 300,
            attempt_timeout_ms: 300,
            max_body_bytes: 65536,
            shutdown_grace_ms: 5000,
            lease_ms: 30_000,
            extra_toml: String::new(),
            clock: None,
        }
    }
}

/// Writes a `hub.toml` for a test into `dir` and returns its path.
pub fn write_config(dir: &Path, opts: &HubOptions, listen: &str) -> PathBuf {
    let text = format!(
        "[server]\nlisten = \"{listen}\"\nmax_body_bytes = {}\nshutdown_grace_ms = {}\n\n\
         [storage]\nurl = \"{}\"\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n\n\
         [delivery]\nattempts = {}\nretry_interval_ms = {}\nattempt_timeout_ms = {}\n\
         lease_ms = {}\n\n{}\n",
        opts.max_body_bytes,
        opts.shutdown_grace_ms,
        storage_url(dir),
        opts.attempts,
        opts.retry_interval_ms,
        opts.attempt_timeout_ms,
        opts.lease_ms,
        opts.extra_toml,
    );
    let path = dir.join("hub.toml");
    std::fs::write(&path, text).expect("write test config");
    path
}

/// The PostgreSQL server the suite runs on (`HUB_TEST_DATABASE_URL`, which
/// `scripts/with-postgres.sh` sets), or `None`: SQLite, the default.
pub fn postgres_server() -> Option<String> {
    std::env::var("HUB_TEST_DATABASE_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
}

/// Whether the suite runs on PostgreSQL. Tests of SQLite itself (its files,
/// its settings) skip there: `skip_on_postgres`.
pub fn on_postgres() -> bool {
    postgres_server().is_some()
}

/// Fails the test, saying why, when the suite does not run on PostgreSQL.
/// Such a test is `#[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]`,
/// and `scripts/test.sh` runs the ignored tests under `with-postgres.sh`: run
/// by hand without the server, it fails rather than pass having tested nothing.
pub fn require_postgres(why: &str) {
    assert!(
        on_postgres(),
        "this test needs PostgreSQL: {why}; run it under scripts/with-postgres.sh"
    );
}

/// Prints why a test does nothing on PostgreSQL and returns `true` there:
/// `if skip_on_postgres("…") { return; }`.
pub fn skip_on_postgres(why: &str) -> bool {
    if on_postgres() {
        eprintln!("skipped on PostgreSQL: {why}");
        return true;
    }
    false
}

/// The storage URL of the hub whose files are in `dir`: a SQLite file there,
/// or, on PostgreSQL, a database of its own on the suite's server, created
/// on first use. Its URL is kept in `dir`, so a restart (or a `hub` command
/// on the same config) finds the same database.
pub fn storage_url(dir: &Path) -> String {
    let Some(server) = postgres_server() else {
        return format!("sqlite://{}", dir.join("hub.db").display());
    };
    let kept = dir.join("postgres-url");
    if let Ok(url) = std::fs::read_to_string(&kept) {
        return url;
    }
    let name = format!("hub_t_{}", uuid::Uuid::new_v4().simple());
    run_on_server(&server, format!("CREATE DATABASE {name}"))
        .unwrap_or_else(|e| panic!("HUB_TEST_DATABASE_URL {server}: {e}"));
    let url = database_url(&server, &name);
    std::fs::write(&kept, &url).expect("keep the test database's URL");
    created()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(dir.to_owned(), Arc::new(TestDatabase { server, name }));
    url
}

/// A database [`storage_url`] created on the suite's PostgreSQL server,
/// dropped with the last test hub that holds it: some 300 hubs of ~8 MB
/// each would otherwise stay until the suite ends (a CI machine with little
/// disk ran out of it).
pub struct TestDatabase {
    server: String,
    name: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // `FORCE`: the hub's pool may still hold connections. A failure leaves
        // the database to the end of the suite, as before.
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = run_on_server(&self.server, sql) {
            eprintln!("could not drop the test database {}: {e}", self.name);
        }
    }
}

/// Databases created for a directory and not yet taken by a hub.
fn created() -> &'static Mutex<std::collections::HashMap<PathBuf, Arc<TestDatabase>>> {
    static CREATED: std::sync::OnceLock<
        Mutex<std::collections::HashMap<PathBuf, Arc<TestDatabase>>>,
    > = std::sync::OnceLock::new();
    CREATED.get_or_init(Default::default)
}

/// The database [`storage_url`] created for `dir`, for its hub to hold.
pub fn take_database(dir: &Path) -> Option<Arc<TestDatabase>> {
    created()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(dir)
}

/// `server` (a URL of any database there) with its database replaced by `name`.
fn database_url(server: &str, name: &str) -> String {
    let (base, query) = match server.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (server, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_start..].find('/') {
        Some(i) => &base[..authority_start + i],
        None => base,
    };
    format!("{root}/{name}{query}")
}

/// Runs one statement on `server`. Callers may be inside a runtime or not
/// (`write_config` is a plain function, `Drop` too), so the connection lives
/// on a thread with a runtime of its own.
fn run_on_server(server: &str, sql: String) -> Result<(), String> {
    let server = server.to_owned();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for {sql}: {e}"))?;
        runtime.block_on(async {
            use sqlx::{Connection, Executor};
            let mut conn = sqlx::PgConnection::connect(&server)
                .await
                .map_err(|e| e.to_string())?;
            let done = conn.execute(sql.as_str()).await;
            let _ = conn.close().await;
            done.map(|_| ()).map_err(|e| format!("{sql}: {e}"))
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the statement's thread panicked".to_owned()))
}

/// The `.wasm` of an example plugin (`redact`, `spam_guard`, `crm_forward`,
/// `auto_reply`) or of the test suite's `fault` plugin. The first call in a
/// test binary builds them with `scripts/build-plugins.sh` (quick when they
/// are up to date).
pub fn plugin_wasm(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let root = repo_root();
        let output = Command::new(root.join("scripts/build-plugins.sh"))
            .current_dir(&root)
            .output()
            .map_err(|e| format!("cannot run scripts/build-plugins.sh: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "scripts/build-plugins.sh failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(root.join("target/plugins/wasm32-wasip2/release"))
    });
    match dir {
        Ok(dir) => dir.join(format!("{name}.wasm")),
        Err(e) => panic!("{e}"),
    }
}

/// The `.wasm` of a Python or TypeScript plugin of the repository
/// (`spam_guard_py`, `spam_guard_ts`, `hostile_py`): the first call in a test
/// binary builds them with `scripts/polyglot.sh build`, which installs the
/// pinned toolchains into `target/polyglot` on first use.
pub fn polyglot_wasm(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let root = repo_root();
        let output = Command::new(root.join("scripts/polyglot.sh"))
            .arg("build")
            .current_dir(&root)
            .output()
            .map_err(|e| format!("cannot run scripts/polyglot.sh: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "scripts/polyglot.sh build failed:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(root.join("target/plugins/polyglot"))
    });
    match dir {
        Ok(dir) => dir.join(format!("{name}.wasm")),
        Err(e) => panic!("{e}"),
    }
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the hub crate lives in the repository")
        .to_owned()
}

/// A process-wide log subscriber that keeps `info` and above and writes them
/// nowhere: what the hub does with a plugin's log line depends on whether the
/// filter keeps it, and a test binary has no subscriber of its own.
pub fn discard_logs_at_info() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .with_max_level(tracing::Level::INFO)
            .try_init();
    });
}

/// A `[[plugins]]` table for `plugin_wasm(wasm)` named `name`, with `extra`
/// TOML lines (limits, grants) and a `config` table of `config` lines. The
/// plugin runs at the shipped limits (`timeout_ms = 100`) unless `extra`
/// sets its own: what a plugin does must hold at the deadline users get.
pub fn plugin_toml(name: &str, wasm: &str, extra: &str, config: &str) -> String {
    format!(
        "[[plugins]]\nname = \"{name}\"\npath = \"{}\"\n{extra}\n[plugins.config]\n{config}\n\n",
        plugin_wasm(wasm).display()
    )
}

/// A `[[routes]]` table.
pub fn route_toml(events: &str, plugins: &str, on_error: &str) -> String {
    format!("[[routes]]\nevents = [{events}]\nplugins = [{plugins}]\non_error = \"{on_error}\"\n\n")
}

/// A hub running in this process.
pub struct TestHub {
    pub running: Option<Running>,
    pub base: String,
    pub dir: tempfile::TempDir,
    pub opts: HubOptions,
    pub http: reqwest::Client,
    /// On PostgreSQL, the databases this hub uses (its own; a second
    /// instance also holds the first's), dropped after the hub.
    pub databases: Vec<Arc<TestDatabase>>,
}

impl TestHub {
    pub async fn start() -> TestHub {
        TestHub::start_with(HubOptions::default()).await
    }

    pub async fn start_with(opts: HubOptions) -> TestHub {
        let dir = tempfile::tempdir().expect("temp dir");
        TestHub::start_in(dir, opts).await
    }

    async fn start_in(dir: tempfile::TempDir, opts: HubOptions) -> TestHub {
        TestHub::start_edited(dir, opts, |_| {}).await
    }

    async fn start_edited(
        dir: tempfile::TempDir,
        opts: HubOptions,
        edit: impl FnOnce(&mut Config),
    ) -> TestHub {
        let path = write_config(dir.path(), &opts, "127.0.0.1:0");
        // No environment: a developer's own `HUB_*` variables stay out of the suite.
        let mut config = Config::load_with(&path, &Env::empty()).expect("test config loads");
        edit(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a port for the hub");
        let clock = opts
            .clock
            .as_ref()
            .map(ManualClock::clock)
            .unwrap_or_default();
        let running = hub::app::start_on_clock(listener, config, clock)
            .await
            .expect("hub starts");
        TestHub {
            base: running.base_url().to_owned(),
            running: Some(running),
            databases: take_database(dir.path()).into_iter().collect(),
            dir,
            opts,
            http: reqwest::Client::new(),
        }
    }

    /// Stops the hub gracefully and starts it again on the same database.
    pub async fn restart(mut self) -> TestHub {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
        let mut hub = TestHub::start_in(self.dir, self.opts).await;
        hub.databases.append(&mut self.databases);
        hub
    }

    pub async fn shutdown(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }

    pub fn store(&self) -> &hub::store::Store {
        self.running.as_ref().expect("hub running").store()
    }

    /// Waits until delivery `id` is no longer pending (nor in flight), and
    /// returns it: a test that moves the hub's clock on waits for this first,
    /// or the move would time out a request still under way.
    pub async fn delivery_done(&self, id: &str) -> hub::store::DeliveryView {
        eventually(Duration::from_secs(10), "the delivery's result", || async {
            self.store()
                .delivery(id)
                .await
                .expect("reading the delivery")
                .filter(|d| d.state != "pending")
        })
        .await
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("hub running")
    }

    /// Plugin counters as `/metrics` shows them: `name{labels}` → value.
    pub async fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let text = self
            .http
            .get(self.url("/metrics"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("metrics request")
            .text()
            .await
            .expect("metrics body");
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// An admin request with the admin token; the status and the JSON answer.
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("admin request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .expect("admin request")
    }

    pub async fn create_agent(&self, name: &str, email: &str) -> TestAgent {
        let resp = self
            .admin_post("/admin/v1/agents", json!({ "name": name, "email": email }))
            .await;
        assert_eq!(resp.status(), 201, "agent creation");
        let v: Value = resp.json().await.expect("agent json");
        TestAgent {
            id: v["id"].as_i64().expect("agent id"),
            token: v["token"].as_str().expect("agent token").to_owned(),
            base: self.base.clone(),
            http: self.http.clone(),
        }
    }

    pub async fn create_channel(
        &self,
        name: &str,
        endpoint: &str,
        chunked: bool,
        agents: &[&str],
    ) -> TestChannel {
        let resp = self
            .admin_post(
                "/admin/v1/channels",
                json!({ "name": name, "customer_endpoint": endpoint, "chunked": chunked,
                        "agents": agents }),
            )
            .await;
        assert_eq!(resp.status(), 201, "channel creation");
        let v: Value = resp.json().await.expect("channel json");
        TestChannel::from_view(v)
    }

    /// Posts a customer message body as-is (a JSON value) to the channel.
    pub async fn customer(&self, ch: &TestChannel, body: Value) -> (u16, String) {
        let resp = self
            .http
            .post(&ch.endpoint_url)
            .header("content-type", "application/json; charset=utf-8")
            .body(body.to_string())
            .send()
            .await
            .expect("customer request");
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }

    /// A text message from customer `id`.
    pub async fn say(&self, ch: &TestChannel, id: Value, text: &str) {
        let (status, body) = self
            .customer(
                ch,
                json!({ "sender": { "id": id }, "message": { "type": "text", "text": text } }),
            )
            .await;
        assert_eq!(status, 200, "customer message refused: {body}");
    }
}

#[derive(Clone)]
pub struct TestChannel {
    pub public_id: String,
    pub endpoint_url: String,
    pub status_url: String,
    pub raw: Value,
}

impl TestChannel {
    /// The channel as the admin API answered it.
    pub fn from_view(v: Value) -> TestChannel {
        TestChannel {
            public_id: v["public_id"].as_str().expect("public_id").to_owned(),
            endpoint_url: v["endpoint_url"].as_str().expect("endpoint_url").to_owned(),
            status_url: v["status_url"].as_str().expect("status_url").to_owned(),
            raw: v,
        }
    }

    /// The same channel reached through another hub instance at `base`
    /// (its URLs start with `from`, the instance that made it).
    pub fn via(&self, from: &str, base: &str) -> TestChannel {
        TestChannel {
            endpoint_url: self.endpoint_url.replace(from, base),
            status_url: self.status_url.replace(from, base),
            ..self.clone()
        }
    }
}

#[derive(Clone)]
pub struct TestAgent {
    pub id: i64,
    pub token: String,
    pub base: String,
    pub http: reqwest::Client,
}

impl TestAgent {
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("agent request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("agent request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn set_online(&self, online: bool) {
        let (status, _) = self
            .send(
                reqwest::Method::PUT,
                "/agent/v1/status",
                Some(json!({ "online": online })),
            )
            .await;
        assert_eq!(status, 200);
    }

    pub async fn chats(&self) -> Vec<Value> {
        let (status, v) = self.get("/agent/v1/chats").await;
        assert_eq!(status, 200);
        v["chats"].as_array().cloned().unwrap_or_default()
    }

    pub async fn chat(&self, id: i64) -> Value {
        let (status, v) = self.get(&format!("/agent/v1/chats/{id}")).await;
        assert_eq!(status, 200, "chat {id}: {v}");
        v
    }

    /// Sends a text reply and returns the stored message.
    pub async fn reply(&self, chat_id: i64, text: &str) -> Value {
        let (status, v) = self
            .post(
                &format!("/agent/v1/chats/{chat_id}/messages"),
                json!({ "type": "text", "text": text }),
            )
            .await;
        assert_eq!(status, 201, "reply refused: {v}");
        v["message"].clone()
    }

    pub async fn stream(&self) -> Sse {
        Sse::connect(&format!("{}/agent/v1/stream", self.base), &self.token).await
    }
}

/// How long a test that moves a [`ManualClock`] gives the hub to do what it
/// must not do yet, before the clock reaches the time it is due: a hub that
/// acts early is then seen doing so, with the early time on its stamps.
pub const EARLY_WINDOW: Duration = Duration::from_millis(200);

/// Moves `clock` on to `at_ms` (Unix ms): first to 1 ms before it, where
/// nothing due at `at_ms` may happen yet ([`EARLY_WINDOW`]), then onto it.
pub async fn move_clock_to(clock: &ManualClock, at_ms: i64) {
    let now = clock.now_ms();
    assert!(now < at_ms, "the clock is at {now}, past {at_ms}");
    let ms = |n: i64| Duration::from_millis(u64::try_from(n).expect("forward"));
    clock.advance(ms(at_ms - 1 - now));
    tokio::time::sleep(EARLY_WINDOW).await;
    clock.advance(ms(1));
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the integrator answers to one request.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    /// The answer's Content-Type.
    pub content_type: &'static str,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::json(200, r#"{"result":"ok"}"#)
    }
    pub fn json(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.to_owned(),
            delay: Duration::ZERO,
            content_type: "application/json",
        }
    }
    pub fn delayed(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
    /// The same answer under another Content-Type (receivers get it wrong).
    pub fn with_content_type(mut self, content_type: &'static str) -> Reply {
        self.content_type = content_type;
        self
    }
}

/// A request the integrator received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub at: Instant,
    /// When it arrived by the hub's clock, for an integrator given one
    /// ([`Integrator::on_clock`]).
    pub hub_ms: Option<i64>,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("integrator got JSON")
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
    }
}

struct IntegratorState {
    requests: Vec<Recorded>,
    clock: Option<ManualClock>,
    script: VecDeque<Reply>,
    default: Reply,
}

/// The integrator's endpoint: a real HTTP server on loopback that records every
/// request and answers from a script (then with a default reply).
#[derive(Clone)]
pub struct Integrator {
    pub url: String,
    pub addr: SocketAddr,
    state: Arc<Mutex<IntegratorState>>,
    arrived: Arc<Notify>,
}

impl Integrator {
    pub async fn start() -> Integrator {
        Integrator::start_on("127.0.0.1:0").await
    }

    pub async fn start_on(addr: &str) -> Integrator {
        let listener = TcpListener::bind(addr).await.expect("bind integrator");
        let addr = listener.local_addr().expect("integrator addr");
        let integrator = Integrator {
            url: format!("http://{addr}/hub"),
            addr,
            state: Arc::new(Mutex::new(IntegratorState {
                requests: Vec::new(),
                clock: None,
                script: VecDeque::new(),
                default: Reply::ok(),
            })),
            arrived: Arc::new(Notify::new()),
        };
        let this = integrator.clone();
        serve(listener, move |req| {
            let this = this.clone();
            async move { this.answer(req).await }
        });
        integrator
    }

    async fn answer(
        &self,
        req: http::Request<hyper::body::Incoming>,
    ) -> http::Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let reply = {
            let mut st = self.state.lock().expect("integrator state");
            let hub_ms = st.clock.as_ref().map(ManualClock::now_ms);
            st.requests.push(Recorded {
                path: parts.uri.path().to_owned(),
                headers: parts.headers,
                body,
                at: Instant::now(),
                hub_ms,
            });
            st.script.pop_front().unwrap_or_else(|| st.default.clone())
        };
        self.arrived.notify_waiters();
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        let mut resp = http::Response::new(Full::new(Bytes::from(reply.body)));
        *resp.status_mut() = http::StatusCode::from_u16(reply.status).expect("status");
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static(reply.content_type),
        );
        resp
    }

    /// Stamps each later request with `clock`'s time ([`Recorded::hub_ms`]).
    pub fn on_clock(&self, clock: &ManualClock) {
        self.state.lock().expect("state").clock = Some(clock.clone());
    }

    /// Queues replies for the next requests.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.lock().expect("state").script.extend(replies);
    }

    pub fn set_default(&self, reply: Reply) {
        self.state.lock().expect("state").default = reply;
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("state").requests.clone()
    }

    /// Waits until at least `n` requests arrived and returns them all.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.arrived.notified();
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "integrator got {} of {n} requests",
                got.len()
            );
            let _ = tokio::time::timeout(left, notified).await;
        }
    }
}

/// Serves HTTP/1.1 on `listener` for the rest of the test, each connection
/// in a task of its own, every request answered by `answer`.
pub fn serve<F, Fut>(listener: TcpListener, answer: F)
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// A reader of the agent's Server-Sent Events stream.
pub struct Sse {
    stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buf: String,
}

impl Sse {
    pub async fn connect(url: &str, token: &str) -> Sse {
        Sse::of(reqwest::Client::new().get(url).bearer_auth(token), url).await
    }

    /// The stream `request` opens; it must answer 200 with an event stream.
    async fn of(request: reqwest::RequestBuilder, url: &str) -> Sse {
        let resp = request.send().await.expect("stream request");
        assert_eq!(resp.status(), 200, "stream {url}");
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        Sse {
            stream: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event (name, data), or `None` if none comes within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<(String, Value)> {
        self.next_with_id(timeout)
            .await
            .map(|(name, data, _)| (name, data))
    }

    /// The next event (name, data, its SSE `id` if it has one), or `None` if
    /// none comes within `timeout`.
    pub async fn next_with_id(
        &mut self,
        timeout: Duration,
    ) -> Option<(String, Value, Option<String>)> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut name = None;
                let mut id = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        name = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    }
                }
                if let Some(name) = name {
                    return Some((
                        name,
                        serde_json::from_str(&data).expect("event data is JSON"),
                        id,
                    ));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.stream.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return None,
            }
        }
    }

    /// Skips events until one named `name` arrives.
    pub async fn expect(&mut self, name: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some((n, data)) if n == name => return data,
                Some(_) => continue,
                None => panic!("no `{name}` event within {timeout:?}"),
            }
        }
    }
}

/// A `hub serve` child process.
pub struct HubProcess {
    pub child: Child,
    pub base: String,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl HubProcess {
    /// Starts `hub serve --config <config>` and waits for its `listening` line.
    pub fn spawn(config: &Path) -> HubProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hub"));
        // The file alone configures the hub: a developer's own `HUB_*` variables stay out.
        for var in hub::config::ENV_OVERRIDES {
            command.env_remove(var);
        }
        let mut child = command
            .args(["serve", "--config"])
            .arg(config)
            // The file's `[log] level` applies (`info` unless it says otherwise).
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hub");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // `[log] format = "json"` writes the same record as an object.
                if line.starts_with('{')
                    && let Ok(record) = serde_json::from_str::<Value>(&line)
                    && record["fields"]["message"] == "listening"
                    && let Some(addr) = record["fields"]["addr"].as_str()
                {
                    let _ = tx.send(addr.to_owned());
                } else if let Some(i) = line.find("listening addr=") {
                    let addr = line[i + "listening addr=".len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let _ = tx.send(addr);
                }
                sink.lock().expect("lines").push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("hub did not start: {:?}", lines.lock().map(|l| l.clone())));
        HubProcess {
            child,
            base: format!("http://{addr}"),
            stderr: lines,
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    pub fn log(&self) -> String {
        self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TestHub {
    /// As [`TestHub::start_with`], with `edit` applied to the loaded
    /// configuration: for settings `HubOptions` has no field for, such as the
    /// `[server]` read timeouts. A restart goes back to the file's settings.
    pub async fn start_with_config(opts: HubOptions, edit: impl FnOnce(&mut Config)) -> TestHub {
        let dir = tempfile::tempdir().expect("temp dir");
        TestHub::start_edited(dir, opts, edit).await
    }
}

impl Sse {
    /// Connects to a stream that takes no `Authorization` header: the
    /// widget's `…/stream?token=`, as a browser's `EventSource` opens it.
    pub async fn open(url: &str) -> Sse {
        Sse::of(reqwest::Client::new().get(url), url).await
    }

    /// As [`Sse::open`], as a browser reconnects: with `Last-Event-ID`.
    pub async fn resume(url: &str, last_event_id: &str) -> Sse {
        let request = reqwest::Client::new()
            .get(url)
            .header("last-event-id", last_event_id);
        Sse::of(request, url).await
    }
}

/// Creates `what` (`agents`, `channels`, …) through the admin API of the hub
/// at `base` and answers its JSON; anything but 201 fails the test.
pub async fn admin_create(base: &str, what: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("{base}/admin/v1/{what}"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("admin request");
    assert_eq!(resp.status(), 201, "creating {what}");
    resp.json().await.expect("admin json")
}
