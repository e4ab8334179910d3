//! What a plugin's calls may reach through their host imports: its name and
//! config, limits, granted destinations, key-value quota and usage, log
//! allowance and the shared memory budget. The host (`host.rs`) holds a
//! call's scope, not the plugin, so host imports cannot reach the plugin's
//! component or its call machinery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::KvWrites;
use super::sanitize::{MAX_MESSAGE_BYTES, one_line};
use crate::outbound::HttpSender;
use crate::runtime::destinations::{Destination, Destinations};
use crate::store::Store;
use crate::store::kv::KvUsage;

/// What host imports reach: the database (key-value), the destinations and
/// the HTTP client.
#[derive(Clone)]
pub struct Services {
    pub store: Store,
    pub destinations: Arc<Destinations>,
    pub sender: HttpSender,
    /// A shadow plugin (a route's `shadow`): its sends are answered
    /// `200 {}` here and never made.
    pub shadow: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub max_output_bytes: usize,
    pub max_host_calls: u32,
    pub max_forwards: usize,
    pub max_concurrency: usize,
    /// Seconds of call time per second per channel.
    pub time_share: f64,
}

/// What a plugin may keep in its key-value namespace, and write per call.
#[derive(Debug, Clone, Copy)]
pub struct KvQuota {
    pub max_keys: u64,
    pub max_bytes: u64,
    pub writes_per_call: usize,
    pub bytes_per_call: usize,
}

/// How long a measured key-value usage is trusted before it is read again.
const KV_USAGE_TTL: Duration = Duration::from_secs(1);

/// Bytes of log (its `log()` messages, stdout and stderr) one plugin may
/// write per second, whatever the number of calls; the rest is dropped and
/// counted, and said once a second.
pub const MAX_LOG_BYTES_PER_SEC: usize = 64 * 1024;

/// A plugin's log allowance for the current second, and what was dropped
/// since the last warning about it.
#[derive(Default)]
pub(super) struct LogWindow {
    started: Option<Instant>,
    used: usize,
    dropped: usize,
    warned: Option<Instant>,
}

/// One plugin's scope, shared by its calls.
pub struct PluginScope {
    pub(super) name: String,
    pub(super) config_json: String,
    pub(super) limits: Limits,
    pub(super) kv: bool,
    pub(super) kv_quota: KvQuota,
    pub(super) kv_usage: tokio::sync::Mutex<Option<(Instant, KvUsage)>>,
    pub(super) log_window: std::sync::Mutex<LogWindow>,
    pub(super) grants: HashMap<String, Arc<Destination>>,
    pub(super) services: Services,
    pub(super) memory: MemoryBudget,
}

impl PluginScope {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    pub fn kv_enabled(&self) -> bool {
        self.kv
    }
    /// Counts a successful call's writes into the measured usage until it is
    /// read again, so calls in quick succession cannot each fill the quota
    /// (an overwrite counts as a new key until then).
    pub(super) async fn note_kv_writes(&self, writes: &KvWrites) {
        if writes.is_empty() {
            return;
        }
        if let Some((_, usage)) = self.kv_usage.lock().await.as_mut() {
            for (key, value) in writes {
                if let Some(value) = value {
                    usage.keys += 1;
                    usage.bytes += (key.len() + value.len()) as u64;
                }
            }
        }
    }

    /// Whether `bytes` more of this plugin's text may go to the log this
    /// second ([`MAX_LOG_BYTES_PER_SEC`]).
    pub(crate) fn log_allowed(&self, bytes: usize) -> bool {
        let mut w = self.log_window.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if w.started
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            w.started = Some(now);
            w.used = 0;
        }
        if w.used + bytes > MAX_LOG_BYTES_PER_SEC {
            return false;
        }
        w.used += bytes;
        true
    }

    /// Counts `dropped` log messages of a call and says, at most once a
    /// second, how many were dropped.
    pub(super) fn warn_dropped(&self, dropped: usize, event: &str) {
        let mut w = self.log_window.lock().unwrap_or_else(|e| e.into_inner());
        w.dropped += dropped;
        let now = Instant::now();
        if w.dropped == 0
            || w.warned
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        let dropped = std::mem::take(&mut w.dropped);
        w.warned = Some(now);
        drop(w);
        tracing::warn!(plugin = %self.name, event, dropped, "plugin log output past its caps was dropped (16 KiB per call, 64 KiB/s per plugin)");
    }

    /// Logs a guest's stdout or stderr line by line within the log caps;
    /// the bytes written and the lines dropped.
    pub(super) fn log_stdio(&self, stream: &'static str, bytes: &[u8]) -> (usize, usize) {
        let (mut written, mut dropped) = (0, 0);
        if bytes.is_empty() {
            return (0, 0);
        }
        for line in String::from_utf8_lossy(bytes).lines() {
            let line = one_line(line, MAX_MESSAGE_BYTES);
            if !self.log_allowed(line.len()) {
                dropped += 1;
                continue;
            }
            written += line.len();
            tracing::info!(plugin = %self.name, stream, "{line}");
        }
        (written, dropped)
    }

    pub(crate) fn memory_budget(&self) -> MemoryBudget {
        self.memory.clone()
    }

    pub fn kv_quota(&self) -> KvQuota {
        self.kv_quota
    }

    /// What the plugin keeps, as read at most [`KV_USAGE_TTL`] ago.
    pub async fn kv_usage(&self) -> Result<KvUsage, crate::store::StoreError> {
        let mut cached = self.kv_usage.lock().await;
        if let Some((at, usage)) = *cached
            && at.elapsed() < KV_USAGE_TTL
        {
            return Ok(usage);
        }
        let usage = self.services.store.kv_usage(&self.name).await?;
        *cached = Some((Instant::now(), usage));
        Ok(usage)
    }
    pub fn config_json(&self) -> &str {
        &self.config_json
    }
    pub fn services(&self) -> &Services {
        &self.services
    }
    pub fn granted(&self, destination: &str) -> Option<Arc<Destination>> {
        self.grants.get(destination).cloned()
    }
}

/// What the running calls' linear memories may hold together; shared by
/// every call's [`MemoryCap`].
#[derive(Clone)]
pub struct MemoryBudget {
    used: Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> MemoryBudget {
        MemoryBudget {
            used: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            limit,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `bytes` from the budget, or nothing if that would pass it.
    pub(super) fn take(&self, bytes: usize) -> bool {
        use std::sync::atomic::Ordering;
        let before = self.used.fetch_add(bytes, Ordering::AcqRel);
        if before.saturating_add(bytes) > self.limit {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub(super) fn give_back(&self, bytes: usize) {
        self.used
            .fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
    }
}
