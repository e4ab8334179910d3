//! What a plugin can reach: the state of one call's store and the host
//! imports (`log`, `config`, key-value, `send`), each counted against the
//! plugin's host-call budget. WASI is linked with no files, environment or sockets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::ErrorKind;
use super::bindings::{self, Level, Response};
use super::plugin::Plugin;
use crate::outbound::Request;

/// Longest key and value a plugin may store.
pub const MAX_KEY_BYTES: usize = 512;
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Guest stdout/stderr kept per call for the log.
const MAX_STDIO_BYTES: usize = 16 * 1024;

/// The store data of one call.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: MemoryCap,
    plugin: Arc<Plugin>,
    event_id: String,
    deadline: Instant,
    host_calls: u32,
    /// Set by a host import that stops the call, so the trap it raises is
    /// reported as what it is rather than as a generic trap.
    pub failure: Option<(ErrorKind, String)>,
    /// Key-value changes of this call, applied only if the call succeeds.
    pub kv_writes: BTreeMap<String, Option<String>>,
    pub stdout: MemoryOutputPipe,
    pub stderr: MemoryOutputPipe,
}

impl HostState {
    pub fn new(plugin: Arc<Plugin>, event_id: String, deadline: Instant) -> HostState {
        let stdout = MemoryOutputPipe::new(MAX_STDIO_BYTES);
        let stderr = MemoryOutputPipe::new(MAX_STDIO_BYTES);
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
            limiter: MemoryCap::new(plugin.limits().memory_bytes),
            plugin,
            event_id,
            deadline,
            host_calls: 0,
            failure: None,
            kv_writes: BTreeMap::new(),
            stdout,
            stderr,
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
    bindings::Plugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    Ok(linker)
}

impl bindings::hub::plugin::types::Host for HostState {}

impl bindings::hub::plugin::host::Host for HostState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.count()?;
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
        Ok(self
            .plugin
            .services()
            .store
            .kv_get(self.plugin.name(), &key)
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
        // The request may not outlive the call it was made from.
        let left = self.deadline.saturating_duration_since(Instant::now());
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
        Ok(answer.map(|(status, body)| Response {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
        }))
    }
}

/// Caps a call's linear memory at the plugin's `memory_mb` and remembers
/// when the guest hit the cap, so the trap that follows is reported as such.
pub struct MemoryCap {
    max: usize,
    pub exceeded: bool,
}

impl MemoryCap {
    fn new(max: usize) -> MemoryCap {
        MemoryCap {
            max,
            exceeded: false,
        }
    }
}

/// Tables of Rust guests stay small; this only stops a runaway one.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.exceeded = true;
            return Ok(false);
        }
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
