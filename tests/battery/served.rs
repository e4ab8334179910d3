//! A `hub serve` child process with its own `hub.toml` on a loopback port,
//! started, killed, stopped and restarted on the same database, and the
//! calls the battery makes to its admin, agent and channel APIs.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const ADMIN: &str = "battery-admin-token-0123456789";

/// What a battery hub's `hub.toml` says; fast retries by default.
#[derive(Clone)]
pub struct Options {
    pub attempts: u32,
    pub retry_interval_ms: u64,
    pub attempt_timeout_ms: u64,
    pub shutdown_grace_ms: u64,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub max_body_bytes: usize,
    /// `[outbound] private`.
    pub private: &'static str,
    /// The SQLite file; `<dir>/hub.db` when not given.
    pub database: Option<PathBuf>,
    /// Lines of `[limits]`. By default the request rates are off: the
    /// battery's load comes from one address to one channel, far past what
    /// an integrator sends (docs/operations.md says to turn them off for
    /// load tests).
    pub limits: String,
    /// Lines of `[runtime]` besides the shared plugin cache.
    pub runtime: String,
    /// Appended to the file: plugins, routes.
    pub extra: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            attempts: 3,
            retry_interval_ms: 300,
            attempt_timeout_ms: 300,
            shutdown_grace_ms: 5000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_body_bytes: 65536,
            private: "allow",
            database: None,
            limits: "channel_per_second = 0\nchannel_source_per_second = 0\n\
                     bot_per_second = 0\nbot_source_per_second = 0"
                .to_owned(),
            runtime: String::new(),
            extra: String::new(),
        }
    }
}

/// A channel as the admin API created it.
#[derive(Clone)]
pub struct Channel {
    pub id: i64,
    pub endpoint_url: String,
}

pub struct Hub {
    pub dir: PathBuf,
    pub db: PathBuf,
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub http: reqwest::Client,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A client for the battery's own requests: no proxy from the environment,
/// and a bound on every request so a hung hub fails a test instead of
/// holding it.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

impl Hub {
    /// Writes `<dir>/hub.toml` and starts `hub serve` on it, on a free port.
    pub async fn start(dir: &Path, opts: &Options) -> Result<Hub, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let db = opts.database.clone().unwrap_or_else(|| dir.join("hub.db"));
        let mut hub = Hub {
            dir: dir.to_owned(),
            db,
            base: format!("http://{addr}"),
            addr,
            http: client(),
            config: dir.join("hub.toml"),
            log: dir.join("hub.log"),
            child: None,
        };
        hub.configure(opts)?;
        hub.spawn().await?;
        Ok(hub)
    }

    /// Rewrites `hub.toml` (same port and database) for the next start.
    pub fn configure(&self, opts: &Options) -> Result<(), String> {
        // Compiled plugins are kept by content hash, so every run may share them.
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("battery-plugin-cache");
        let text = format!(
            "[server]\nlisten = \"{addr}\"\nmax_body_bytes = {max_body}\n\
             shutdown_grace_ms = {grace}\nheader_timeout_ms = {header}\nbody_timeout_ms = {body}\n\n\
             [storage]\nurl = \"sqlite://{db}\"\n\n[admin]\ntoken = \"{ADMIN}\"\n\n\
             [delivery]\nattempts = {attempts}\nretry_interval_ms = {interval}\n\
             attempt_timeout_ms = {timeout}\n\n[outbound]\nprivate = \"{private}\"\n\n[limits]\n{limits}\n\n\
             [runtime]\ncache_dir = \"{cache}\"\n{runtime}\n\n{extra}\n",
            addr = self.addr,
            max_body = opts.max_body_bytes,
            grace = opts.shutdown_grace_ms,
            header = opts.header_timeout_ms,
            body = opts.body_timeout_ms,
            db = self.db.display(),
            attempts = opts.attempts,
            interval = opts.retry_interval_ms,
            timeout = opts.attempt_timeout_ms,
            private = opts.private,
            limits = opts.limits,
            cache = cache.display(),
            runtime = opts.runtime,
            extra = opts.extra,
        );
        std::fs::write(&self.config, text).map_err(|e| format!("cannot write hub.toml: {e}"))
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("cannot open the hub's log: {e}"))?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_hub"));
        // The file alone configures the hub: a developer's own variables stay out.
        for var in [
            "HUB_LISTEN",
            "HUB_PUBLIC_URL",
            "HUB_DATABASE_URL",
            "HUB_ADMIN_TOKEN",
            "RUST_BACKTRACE",
        ] {
            command.env_remove(var);
        }
        let child = command
            .arg("--config")
            .arg(&self.config)
            .arg("serve")
            .current_dir(&self.dir)
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env!("CARGO_BIN_EXE_hub")))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "hub serve exited at start ({status}): {}",
                    self.log_tail(5)
                ));
            }
            if self.healthz().await == Some(200) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "hub serve did not answer /healthz within 60 s: {}",
                    self.log_tail(5)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the hub again on the same file and database; answers once it
    /// serves.
    pub async fn restart(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Err("restart of a hub that still runs".to_owned());
        }
        self.spawn().await
    }

    /// `kill -9`: the process dies at once, whatever it was doing.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM (through `kill`, as an operator or systemd would).
    pub fn sigterm(&self) -> Result<(), String> {
        let pid = self.pid().ok_or("no hub process to signal")?;
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -TERM {pid}: {status}"))
        }
    }

    /// Waits for the process to end on its own; `None` if it still runs
    /// after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log_path(&self) -> PathBuf {
        self.log.clone()
    }

    /// The last `n` lines of the hub's log, on one line.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }

    /// A field of `/proc/<pid>/status` in KiB: `VmRSS` (now) or `VmHWM` (peak).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let Some(pid) = self.pid() else { return 0 };
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The status of `GET /healthz`, or `None` without an answer within 2 s.
    pub async fn healthz(&self) -> Option<u16> {
        self.http
            .get(format!("{}/healthz", self.base))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// `GET /readyz`: its status and body, or `(0, why)` without an answer.
    pub async fn readyz(&self) -> (u16, String) {
        match self
            .http
            .get(format!("{}/readyz", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// One request with an optional bearer token and JSON body: the status
    /// and the answer (JSON, or the text as a JSON string).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        self.call(method, path, Some(ADMIN), body).await
    }

    /// Creates an agent; its token.
    pub async fn create_agent(&self, name: &str, email: &str) -> Result<String, String> {
        let body = json!({ "name": name, "email": email });
        match self
            .admin(reqwest::Method::POST, "/admin/v1/agents", Some(&body))
            .await?
        {
            (201, v) => v["token"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("agent without a token: {v}")),
            (status, v) => Err(format!("creating agent {email}: {status} {v}")),
        }
    }

    /// Creates a custom channel to `endpoint` for these agents.
    pub async fn create_channel(
        &self,
        name: &str,
        endpoint: &str,
        agents: &[&str],
    ) -> Result<Channel, String> {
        let body = json!({ "name": name, "customer_endpoint": endpoint, "agents": agents });
        match self
            .admin(reqwest::Method::POST, "/admin/v1/channels", Some(&body))
            .await?
        {
            (201, v) => Ok(Channel {
                id: v["id"].as_i64().unwrap_or_default(),
                endpoint_url: v["endpoint_url"]
                    .as_str()
                    .ok_or_else(|| format!("channel without endpoint_url: {v}"))?
                    .to_owned(),
            }),
            (status, v) => Err(format!("creating channel {name}: {status} {v}")),
        }
    }

    /// A text message from customer `sender` as the channel endpoint gets
    /// it; the status, or the transport error.
    pub async fn say(&self, channel: &Channel, sender: &str, text: &str) -> Result<u16, String> {
        let body = json!({ "sender": { "id": sender, "name": sender },
                           "message": { "type": "text", "text": text } });
        self.http
            .post(&channel.endpoint_url)
            .header("content-type", "application/json; charset=utf-8")
            .body(body.to_string())
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| format!("customer message: {e}"))
    }

    /// The chats an agent sees, closed ones included.
    pub async fn chats(&self, token: &str) -> Result<Vec<Value>, String> {
        match self
            .call(
                reqwest::Method::GET,
                "/agent/v1/chats?state=all",
                Some(token),
                None,
            )
            .await?
        {
            (200, v) => Ok(v["chats"].as_array().cloned().unwrap_or_default()),
            (status, v) => Err(format!("listing chats: {status} {v}")),
        }
    }

    /// The messages of one chat.
    pub async fn messages(&self, token: &str, chat: i64) -> Result<Vec<Value>, String> {
        match self
            .call(
                reqwest::Method::GET,
                &format!("/agent/v1/chats/{chat}"),
                Some(token),
                None,
            )
            .await?
        {
            (200, v) => Ok(v["messages"].as_array().cloned().unwrap_or_default()),
            (status, v) => Err(format!("reading chat {chat}: {status} {v}")),
        }
    }

    /// Every message text the agent can read, with how often it is stored.
    pub async fn stored_texts(&self, token: &str) -> Result<HashMap<String, usize>, String> {
        let mut texts = HashMap::new();
        for chat in self.chats(token).await? {
            let id = chat["id"].as_i64().unwrap_or_default();
            for m in self.messages(token, id).await? {
                if let Some(text) = m["body"]["text"].as_str() {
                    *texts.entry(text.to_owned()).or_default() += 1;
                }
            }
        }
        Ok(texts)
    }

    /// An agent's reply; the status and, on 201, the stored message's uid.
    pub async fn reply(
        &self,
        token: &str,
        chat: i64,
        text: &str,
    ) -> Result<(u16, Option<String>), String> {
        let body = json!({ "type": "text", "text": text });
        let (status, v) = self
            .call(
                reqwest::Method::POST,
                &format!("/agent/v1/chats/{chat}/messages"),
                Some(token),
                Some(&body),
            )
            .await?;
        Ok((status, v["message"]["uid"].as_str().map(str::to_owned)))
    }

    /// The dead letters (failed deliveries), newest first.
    pub async fn dead_letters(&self) -> Result<Vec<Value>, String> {
        match self
            .admin(
                reqwest::Method::GET,
                "/admin/v1/deliveries?state=dead&limit=1000",
                None,
            )
            .await?
        {
            (200, v) => Ok(v["deliveries"].as_array().cloned().unwrap_or_default()),
            (status, v) => Err(format!("listing dead letters: {status} {v}")),
        }
    }

    /// Waits until the reply `uid` is delivered or failed for good; its
    /// message as the agent sees it.
    pub async fn settled(
        &self,
        token: &str,
        chat: i64,
        uid: &str,
        timeout: Duration,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let messages = self.messages(token, chat).await?;
            let message = messages
                .into_iter()
                .find(|m| m["uid"] == uid)
                .ok_or_else(|| format!("reply {uid} is not in chat {chat}"))?;
            if message["delivery"] != "pending" || Instant::now() > deadline {
                return Ok(message);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `/healthz` every 100 ms while a test runs: how many polls failed, the slowest.
pub struct HealthWatch {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    slowest_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<u64>,
}

impl HealthWatch {
    pub fn start(hub: &Hub) -> HealthWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicU64::new(0));
        let slowest_ms = Arc::new(AtomicU64::new(0));
        let (url, http) = (format!("{}/healthz", hub.base), hub.http.clone());
        let (s, f, w) = (stop.clone(), failed.clone(), slowest_ms.clone());
        let task = tokio::spawn(async move {
            let mut polls = 0;
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = http
                    .get(&url)
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                polls += 1;
                if !ok {
                    f.fetch_add(1, Ordering::Relaxed);
                }
                w.fetch_max(t.elapsed().as_millis() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            polls
        });
        HealthWatch {
            stop,
            failed,
            slowest_ms,
            task,
        }
    }

    /// Stops it: (polls, failed, slowest ms).
    pub async fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let polls = self.task.await.unwrap_or(0);
        (
            polls,
            self.failed.load(Ordering::Relaxed),
            self.slowest_ms.load(Ordering::Relaxed),
        )
    }
}

/// The id of the chat customer `sender` opened on a channel, once it exists.
pub async fn chat_of(hub: &Hub, token: &str, sender: &str) -> Result<i64, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let chats = hub.chats(token).await?;
        if let Some(chat) = chats.iter().find(|c| c["client_name"] == sender) {
            return chat["id"]
                .as_i64()
                .ok_or_else(|| format!("chat without an id: {chat}"));
        }
        if Instant::now() > deadline {
            return Err(format!("no chat of customer {sender} after 10 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `PRAGMA integrity_check` of a SQLite file by the `sqlite3` program:
/// `ok`, or what it found, or why it could not check (no `sqlite3`: a
/// failure too, as a check that did not run proves nothing).
pub fn integrity(db: &Path) -> String {
    match Command::new("sqlite3")
        .arg(db)
        .arg("PRAGMA integrity_check;")
        .output()
    {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if text == "ok" {
                text
            } else {
                format!("BAD({})", text.replace('\n', "; "))
            }
        }
        Ok(out) => format!(
            "BAD(sqlite3 {}: {})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => format!("unchecked(no sqlite3: {e})"),
    }
}
