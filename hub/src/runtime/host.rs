//! What a plugin can reach: the state of one call's store and the host
//! imports (`log`, `config`, key-value, `send`), each counted against the
//! plugin's host-call budget. WASI is linked with no files, environment or sockets.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::ErrorKind;
use super::bindings::{self, Level, Response};
use super::deadline::Deadline;
use super::sanitize::{MAX_MESSAGE_BYTES, one_line};
use super::scope::{MemoryBudget, PluginScope};
use crate::outbound::Request;

/// Longest key and value a plugin may store.
pub const MAX_KEY_BYTES: usize = 512;
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Guest stdout/stderr kept per call for the log; the rest is dropped
/// (never an error to the guest).
const MAX_STDIO_BYTES: usize = 16 * 1024;
/// Bytes of `log()` messages one call may write to the hub's log; later
/// messages are dropped and counted.
pub const MAX_LOG_BYTES_PER_CALL: usize = 16 * 1024;

/// The store data of one call.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: MemoryCap,
    plugin: Arc<PluginScope>,
    event_id: String,
    /// When the call must end; the host's database waits move it.
    deadline: Arc<Deadline>,
    host_calls: u32,
    /// Set by a host import that stops the call, so the trap it raises is
    /// reported as what it is rather than as a generic trap.
    pub failure: Option<(ErrorKind, String)>,
    /// Key-value changes of this call, applied only if the call succeeds.
    pub kv_writes: BTreeMap<String, Option<String>>,
    pub stdout: Capture,
    pub stderr: Capture,
    /// `log()` bytes written by this call, and messages dropped past the cap.
    pub log_bytes: usize,
    pub logs_dropped: usize,
    /// Key-value writes refused by a quota in this call.
    pub quota_refusals: usize,
    /// The plugin's long-call turn this call holds or waits for.
    pub turn: Arc<Turn>,
    /// Keeps the epoch ticking while this sandbox lives: its deadline is
    /// counted in ticks.
    _awake: super::engine::Awake,
}

/// A long call's turn among the plugin's `max_concurrency`: taken at the
/// call's second epoch tick and held until the call's store is dropped.
#[derive(Default)]
pub struct Turn {
    permit: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
    waiting: std::sync::atomic::AtomicBool,
}

impl Turn {
    /// Waits for a permit of `turns` and keeps it.
    pub async fn take(self: Arc<Self>, turns: Arc<tokio::sync::Semaphore>) {
        use std::sync::atomic::Ordering;
        self.waiting.store(true, Ordering::Release);
        if let Ok(permit) = turns.acquire_owned().await {
            *self.permit.lock().unwrap_or_else(|e| e.into_inner()) = Some(permit);
        }
        self.waiting.store(false, Ordering::Release);
    }

    /// Whether the call was stopped while it waited for a turn.
    pub fn waiting(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl HostState {
    pub fn new(
        plugin: Arc<PluginScope>,
        event_id: String,
        deadline: Arc<Deadline>,
        awake: super::engine::Awake,
    ) -> HostState {
        let stdout = Capture::new(MAX_STDIO_BYTES);
        let stderr = Capture::new(MAX_STDIO_BYTES);
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryCap::new(plugin.limits().memory_bytes, plugin.memory_budget()),
            plugin,
            event_id,
            deadline,
            host_calls: 0,
            failure: None,
            kv_writes: BTreeMap::new(),
            stdout,
            stderr,
            log_bytes: 0,
            logs_dropped: 0,
            quota_refusals: 0,
            turn: Arc::new(Turn::default()),
            _awake: awake,
        }
    }

    /// Counts one host call; past the budget the call is stopped.
    fn count(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        let max = self.plugin.limits().max_host_calls;
        if self.host_calls > max {
            return Err(self.stop(ErrorKind::HostCalls, format!("more than {max} host calls")));
        }
        Ok(())
    }

    fn stop(&mut self, kind: ErrorKind, message: String) -> wasmtime::Error {
        let error = wasmtime::Error::msg(message.clone());
        self.failure.get_or_insert((kind, message));
        error
    }

    /// Holds a write to the plugin's key-value quotas: writes per call, and
    /// keys and bytes stored (as last measured, plus this call's writes).
    async fn kv_quota(&mut self, key: &str, value: &str) -> Result<(), String> {
        let quota = self.plugin.kv_quota();
        let new_key = !self.kv_writes.contains_key(key);
        if new_key && self.kv_writes.len() >= quota.writes_per_call {
            return Err(format!(
                "quota: more than {} key-value writes in one call (kv_max_writes_per_call)",
                quota.writes_per_call
            ));
        }
        // The hub's database wait, not the plugin's: left out of its deadline.
        let deadline = self.deadline.clone();
        let stored = deadline
            .excusing(self.plugin.kv_usage())
            .await
            .map_err(|e| {
                tracing::error!(plugin = self.plugin.name(), error = %e, "key-value usage unknown");
                "the key-value store is unavailable".to_owned()
            })?;
        let pending_keys = self.kv_writes.len() + usize::from(new_key);
        let call_bytes: usize = self
            .kv_writes
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, String::len))
            .sum::<usize>()
            + key.len()
            + value.len();
        if call_bytes > quota.bytes_per_call {
            return Err(format!(
                "quota: more than {} bytes of key-value writes in one call (kv_max_bytes_per_call)",
                quota.bytes_per_call
            ));
        }
        let pending_bytes = call_bytes;
        if stored.keys + pending_keys as u64 > quota.max_keys {
            return Err(format!(
                "quota: the plugin may keep at most {} keys (kv_max_keys)",
                quota.max_keys
            ));
        }
        if stored.bytes + pending_bytes as u64 > quota.max_bytes {
            return Err(format!(
                "quota: the plugin may keep at most {} bytes (kv_max_bytes)",
                quota.max_bytes
            ));
        }
        Ok(())
    }

    fn kv_allowed(&self) -> Result<(), String> {
        if self.plugin.kv_enabled() {
            Ok(())
        } else {
            Err("this plugin has no key-value store (set kv = true in hub.toml)".to_owned())
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The linker every plugin is instantiated with: minimal WASI plus the hub's imports.
pub fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    bindings::Handler::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    Ok(linker)
}

impl bindings::hub::plugin::types::Host for HostState {}

impl bindings::hub::plugin::host::Host for HostState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.count()?;
        // A line the log filter would discard costs nothing more and takes
        // nothing from the caps: a plugin's debug lines must not crowd out
        // its warnings, nor be reported as dropped when nobody asked for them.
        let enabled = match level {
            Level::Trace => tracing::enabled!(tracing::Level::TRACE),
            Level::Debug => tracing::enabled!(tracing::Level::DEBUG),
            Level::Info => tracing::enabled!(tracing::Level::INFO),
            Level::Warn => tracing::enabled!(tracing::Level::WARN),
            Level::Error => tracing::enabled!(tracing::Level::ERROR),
        };
        if !enabled {
            return Ok(());
        }
        let message = one_line(&message, MAX_MESSAGE_BYTES);
        if self.log_bytes + message.len() > MAX_LOG_BYTES_PER_CALL
            || !self.plugin.log_allowed(message.len())
        {
            self.logs_dropped += 1;
            return Ok(());
        }
        self.log_bytes += message.len();
        let plugin = self.plugin.name();
        let event = self.event_id.as_str();
        match level {
            Level::Trace => tracing::trace!(plugin, event, "{message}"),
            Level::Debug => tracing::debug!(plugin, event, "{message}"),
            Level::Info => tracing::info!(plugin, event, "{message}"),
            Level::Warn => tracing::warn!(plugin, event, "{message}"),
            Level::Error => tracing::error!(plugin, event, "{message}"),
        }
        Ok(())
    }

    async fn config(&mut self) -> wasmtime::Result<String> {
        self.count()?;
        Ok(self.plugin.config_json().to_owned())
    }

    async fn kv_get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, String>> {
        self.count()?;
        if let Err(e) = self.kv_allowed() {
            return Ok(Err(e));
        }
        if let Some(pending) = self.kv_writes.get(&key) {
            return Ok(Ok(pending.clone()));
        }
        // The hub's database wait, not the plugin's: left out of its deadline.
        let deadline = self.deadline.clone();
        Ok(deadline
            .excusing(
                self.plugin
                    .services()
                    .store
                    .kv_get(self.plugin.name(), &key),
            )
            .await
            .map_err(|e| {
                tracing::error!(plugin = self.plugin.name(), error = %e, "key-value read failed");
                "the key-value store is unavailable".to_owned()
            }))
    }

    async fn kv_set(&mut self, key: String, value: String) -> wasmtime::Result<Result<(), String>> {
        self.count()?;
        if let Err(e) = self.kv_allowed() {
            return Ok(Err(e));
        }
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Ok(Err(format!("keys are 1 to {MAX_KEY_BYTES} bytes")));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Ok(Err(format!("values are at most {MAX_VALUE_BYTES} bytes")));
        }
        if let Err(e) = self.kv_quota(&key, &value).await {
            self.quota_refusals += 1;
            return Ok(Err(e));
        }
        self.kv_writes.insert(key, Some(value));
        Ok(Ok(()))
    }

    async fn kv_delete(&mut self, key: String) -> wasmtime::Result<Result<(), String>> {
        self.count()?;
        if let Err(e) = self.kv_allowed() {
            return Ok(Err(e));
        }
        self.kv_writes.insert(key, None);
        Ok(Ok(()))
    }

    async fn send(
        &mut self,
        destination: String,
        payload: String,
    ) -> wasmtime::Result<Result<Response, String>> {
        self.count()?;
        let Some(target) = self.plugin.granted(&destination) else {
            return Err(self.stop(
                ErrorKind::Destination,
                format!("destination `{destination}` is not granted to this plugin"),
            ));
        };
        if serde_json::from_str::<serde::de::IgnoredAny>(&payload).is_err() {
            return Ok(Err("the payload is not JSON".to_owned()));
        }
        if self.plugin.services().shadow {
            return Ok(Ok(Response {
                status: 200,
                body: "{}".to_owned(),
            }));
        }
        // The request may not outlive the call it was made from.
        let left = self.deadline.left();
        let timeout = target
            .policy
            .timeout
            .min(left)
            .max(Duration::from_millis(1));
        let answer = self
            .plugin
            .services()
            .sender
            .exchange(Request {
                headers: &target.headers,
                ..Request::post(&target.url, payload, timeout)
            })
            .await;
        Ok(answer
            .map(|(status, body)| Response {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).into_owned(),
            })
            .map_err(|e| e.to_string()))
    }
}

/// Caps a call's linear memory at the plugin's `memory_mb` and at what is
/// left of the runtime's budget, and remembers which cap the guest hit, so
/// the trap that follows is reported as such.
pub struct MemoryCap {
    max: usize,
    pub exceeded: bool,
    /// The budget was spent by other calls (not this one's `memory_mb`).
    pub budget_spent: bool,
    budget: MemoryBudget,
    /// What this call holds of the budget, given back when the call ends.
    held: usize,
}

impl MemoryCap {
    fn new(max: usize, budget: MemoryBudget) -> MemoryCap {
        MemoryCap {
            max,
            exceeded: false,
            budget_spent: false,
            budget,
            held: 0,
        }
    }
}

impl MemoryCap {
    /// Linear memory this call holds.
    pub fn held(&self) -> usize {
        self.held
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        self.budget.give_back(self.held);
    }
}

/// Tables of Rust guests stay small; this only stops a runaway one.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.exceeded = true;
            return Ok(false);
        }
        let more = desired.saturating_sub(current);
        if !self.budget.take(more) {
            self.budget_spent = true;
            return Ok(false);
        }
        self.held += more;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// A guest's stdout or stderr: keeps the first `cap` bytes for the log and
/// drops the rest, so writing more is never an error to the guest.
#[derive(Clone)]
pub struct Capture {
    kept: Arc<Mutex<Vec<u8>>>,
    cap: usize,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            kept: Arc::new(Mutex::new(Vec::new())),
            cap,
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.cap.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    pub fn contents(&self) -> Vec<u8> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
