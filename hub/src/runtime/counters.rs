//! Per-plugin counters: calls, outcomes, errors by kind and time spent. They
//! outlive reloads, so a reloaded plugin keeps counting where it was.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::ErrorKind;

#[derive(Debug, Default)]
pub struct PluginCounters {
    calls: AtomicU64,
    drops: AtomicU64,
    replies: AtomicU64,
    forwards: AtomicU64,
    micros: AtomicU64,
    /// Nanoseconds in the phases of successful calls (where the time goes:
    /// `plugins` benchmark, `/metrics`).
    instantiate_nanos: AtomicU64,
    guest_nanos: AtomicU64,
    teardown_nanos: AtomicU64,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    log_bytes: AtomicU64,
    logs_dropped: AtomicU64,
    quota_refusals: AtomicU64,
    /// Calls by duration, one count per bucket of [`DURATION_BUCKETS_MICROS`]
    /// (and one past the last).
    durations: [AtomicU64; DURATION_BUCKETS_MICROS.len() + 1],
    /// The latest failures, newest last, for an operator to read (admin API).
    last_errors: Mutex<VecDeque<LastError>>,
}

/// How many failures [`Snapshot::last_errors`] keeps per plugin.
pub const LAST_ERRORS: usize = 5;
/// How much of a failure's message is kept.
const LAST_ERROR_CHARS: usize = 500;

/// One recent failure of a plugin.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LastError {
    pub at_ms: i64,
    pub kind: &'static str,
    /// The event the call was for.
    pub event: String,
    /// The message, cut short and on one line.
    pub message: String,
}

/// Upper bounds of the call-duration histogram's buckets, in µs.
pub const DURATION_BUCKETS_MICROS: [u64; 12] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000, 50_000, 250_000, 1_000_000,
];

/// A copy of one plugin's counters at one moment.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Snapshot {
    pub calls: u64,
    pub drops: u64,
    pub replies: u64,
    pub forwards: u64,
    /// Time spent in calls, instantiation included.
    pub micros: u64,
    /// Of successful calls: creating the sandbox, running the guest's
    /// `handle`, dropping the sandbox.
    pub instantiate_nanos: u64,
    pub guest_nanos: u64,
    pub teardown_nanos: u64,
    pub errors: BTreeMap<&'static str, u64>,
    /// Bytes of `log()` messages written to the hub's log, and messages
    /// dropped past the per-call cap.
    pub log_bytes: u64,
    pub logs_dropped: u64,
    /// Key-value writes refused by a quota (the guest got an error back).
    pub quota_refusals: u64,
    /// Calls per duration bucket (not cumulative), the last past every bound.
    pub durations: Vec<u64>,
    /// The latest failures, oldest first.
    pub last_errors: Vec<LastError>,
}

impl PluginCounters {
    pub fn call(&self, took: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.micros.fetch_add(micros, Ordering::Relaxed);
        let bucket = DURATION_BUCKETS_MICROS
            .iter()
            .position(|bound| micros <= *bound)
            .unwrap_or(DURATION_BUCKETS_MICROS.len());
        self.durations[bucket].fetch_add(1, Ordering::Relaxed);
    }
    /// The phases of one successful call.
    pub fn phases(&self, instantiate: Duration, guest: Duration, teardown: Duration) {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.instantiate_nanos
            .fetch_add(nanos(instantiate), Ordering::Relaxed);
        self.guest_nanos.fetch_add(nanos(guest), Ordering::Relaxed);
        self.teardown_nanos
            .fetch_add(nanos(teardown), Ordering::Relaxed);
    }
    pub fn log_bytes(&self, written: usize, dropped: usize) {
        self.log_bytes.fetch_add(written as u64, Ordering::Relaxed);
        self.logs_dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
    }
    pub fn quota_refusals(&self, n: usize) {
        self.quota_refusals.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn drop_(&self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
    pub fn reply(&self) {
        self.replies.fetch_add(1, Ordering::Relaxed);
    }
    pub fn forwards(&self, n: usize) {
        self.forwards.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failure and keeps it among the latest.
    pub fn failure(&self, kind: ErrorKind, event: &str, message: &str) {
        self.error(kind);
        let message: String = message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(LAST_ERROR_CHARS)
            .collect();
        let mut last = self.last_errors.lock().unwrap_or_else(|e| e.into_inner());
        if last.len() == LAST_ERRORS {
            last.pop_front();
        }
        last.push_back(LastError {
            at_ms: crate::clock::now_ms(),
            kind: kind.as_str(),
            event: event.to_owned(),
            message,
        });
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            calls: self.calls.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            replies: self.replies.load(Ordering::Relaxed),
            forwards: self.forwards.load(Ordering::Relaxed),
            micros: self.micros.load(Ordering::Relaxed),
            instantiate_nanos: self.instantiate_nanos.load(Ordering::Relaxed),
            guest_nanos: self.guest_nanos.load(Ordering::Relaxed),
            teardown_nanos: self.teardown_nanos.load(Ordering::Relaxed),
            errors: ErrorKind::ALL
                .iter()
                .map(|k| (k.as_str(), self.errors[*k as usize].load(Ordering::Relaxed)))
                .collect(),
            log_bytes: self.log_bytes.load(Ordering::Relaxed),
            logs_dropped: self.logs_dropped.load(Ordering::Relaxed),
            quota_refusals: self.quota_refusals.load(Ordering::Relaxed),
            durations: self
                .durations
                .iter()
                .map(|d| d.load(Ordering::Relaxed))
                .collect(),
            last_errors: self
                .last_errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect(),
        }
    }
}

/// Counters of every plugin ever loaded, by name.
#[derive(Debug, Clone, Default)]
pub struct Counters(Arc<Mutex<BTreeMap<String, Arc<PluginCounters>>>>);

impl Counters {
    pub fn of(&self, plugin: &str) -> Arc<PluginCounters> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(plugin.to_owned()).or_default().clone()
    }

    pub fn snapshot(&self) -> BTreeMap<String, Snapshot> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (k.clone(), v.snapshot())).collect()
    }
}
