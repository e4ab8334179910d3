//! Process-wide counters and gauges for `/metrics`, recorded from every layer:
//! HTTP requests by edge and status, events by kind and verdict, deliveries
//! by result and attempt, webhook replies, bot exchange refusals by reason,
//! PostgreSQL write waits, SQLite WAL syncs and restarts (what the disk
//! adds to an acknowledgement), open live streams, and when the process
//! started. A leaf: it imports nothing of the hub, so any layer may
//! record here.
//!
//! These are per process: with several instances on one database each
//! counts its own traffic, and the sums are the operator's (Prometheus adds
//! them up). What the database knows for all instances (the outbox) is read
//! at scrape time instead (`http::metrics`).
//!
//! Recording is cheap because ingress runs at more than 10k requests per
//! second: fixed arrays of atomics indexed by enums and status codes, no
//! lock and no allocation per request; only event kinds live in a map, read
//! under a shared lock and written once per new kind.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a request entered: the edge that owns its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    Channel,
    Widget,
    Bots,
    Agent,
    Admin,
    Console,
    Health,
    Metrics,
    Other,
}

impl Edge {
    pub const ALL: [Edge; 9] = [
        Edge::Channel,
        Edge::Widget,
        Edge::Bots,
        Edge::Agent,
        Edge::Admin,
        Edge::Console,
        Edge::Health,
        Edge::Metrics,
        Edge::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Edge::Channel => "channel",
            Edge::Widget => "widget",
            Edge::Bots => "bots",
            Edge::Agent => "agent",
            Edge::Admin => "admin",
            Edge::Console => "console",
            Edge::Health => "health",
            Edge::Metrics => "metrics",
            Edge::Other => "other",
        }
    }
}

/// What the plugin chain decided for an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Went on unchanged (also: no plugin saw it).
    Passed,
    /// Went on with a payload a plugin changed.
    Transformed,
    Dropped,
    /// A plugin answered in the hub's place.
    Replied,
    /// A plugin failed on a rejecting route (or was not loaded).
    Rejected,
}

impl Verdict {
    const ALL: [Verdict; 5] = [
        Verdict::Passed,
        Verdict::Transformed,
        Verdict::Dropped,
        Verdict::Replied,
        Verdict::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Transformed => "transformed",
            Verdict::Dropped => "dropped",
            Verdict::Replied => "replied",
            Verdict::Rejected => "rejected",
        }
    }
}

/// What an outbox row is, as a label (the store's row kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryKind {
    Channel,
    Webhook,
    Crm,
    Forward,
    Bot,
}

impl DeliveryKind {
    const ALL: [DeliveryKind; 5] = [
        DeliveryKind::Channel,
        DeliveryKind::Webhook,
        DeliveryKind::Crm,
        DeliveryKind::Forward,
        DeliveryKind::Bot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryKind::Channel => "channel",
            DeliveryKind::Webhook => "webhook",
            DeliveryKind::Crm => "crm",
            DeliveryKind::Forward => "forward",
            DeliveryKind::Bot => "bot",
        }
    }
}

/// How the deliverer left a row after claiming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryResult {
    /// The receiver took it, or a plugin answered in its place.
    Delivered,
    /// The attempt failed and the row will be tried again.
    Retry,
    /// Refused for good by the receiver (4xx, an error body) or by the
    /// outbound policy: a dead letter.
    Rejected,
    /// Given up after its attempts (or its destination is gone, or a
    /// plugin refused it): a dead letter.
    Failed,
    /// Never sent on purpose: a plugin dropped it, or nobody receives it.
    NotSent,
}

impl DeliveryResult {
    const ALL: [DeliveryResult; 5] = [
        DeliveryResult::Delivered,
        DeliveryResult::Retry,
        DeliveryResult::Rejected,
        DeliveryResult::Failed,
        DeliveryResult::NotSent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryResult::Delivered => "delivered",
            DeliveryResult::Retry => "retry",
            DeliveryResult::Rejected => "rejected",
            DeliveryResult::Failed => "failed",
            DeliveryResult::NotSent => "not_sent",
        }
    }

    fn is_dead_letter(self) -> bool {
        matches!(self, DeliveryResult::Rejected | DeliveryResult::Failed)
    }
}

/// Why the bot exchange refused a provider's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BotRefusal {
    /// No bot at that address, or a malformed one (404).
    UnknownBot,
    /// The token in the path or the `Authorization` header is wrong (401).
    Credentials,
    /// Over the bot's rate, or blocked after wrong credentials (429).
    RateLimited,
    /// A method or an event the exchange does not take (405).
    NotAllowed,
    /// A body that could not be read, or is not a valid event (400, 408, 413).
    Malformed,
    /// `chat_id` names no chat of the bot (400).
    UnknownChat,
    /// The bot is done with the chat: an agent joined it or it closed (400).
    ChatDone,
    /// The hub's own fault; the provider may retry (503).
    Unavailable,
}

impl BotRefusal {
    pub const ALL: [BotRefusal; 8] = [
        BotRefusal::UnknownBot,
        BotRefusal::Credentials,
        BotRefusal::RateLimited,
        BotRefusal::NotAllowed,
        BotRefusal::Malformed,
        BotRefusal::UnknownChat,
        BotRefusal::ChatDone,
        BotRefusal::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BotRefusal::UnknownBot => "unknown_bot",
            BotRefusal::Credentials => "credentials",
            BotRefusal::RateLimited => "rate_limited",
            BotRefusal::NotAllowed => "not_allowed",
            BotRefusal::Malformed => "malformed",
            BotRefusal::UnknownChat => "unknown_chat",
            BotRefusal::ChatDone => "chat_done",
            BotRefusal::Unavailable => "unavailable",
        }
    }
}

/// Upper bounds of the request-duration histogram's buckets, in µs.
pub const HTTP_BUCKETS_MICROS: [u64; 14] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];

/// Every status `http::StatusCode` can hold (100–999) has a slot, so
/// counting never needs a map.
const STATUS_FIRST: u16 = 100;
const STATUSES: usize = 900;
/// Attempts 1 to 9 are counted apart; later ones share the last slot.
const ATTEMPT_SLOTS: usize = 10;
/// Event kinds are the hub's own and few; past this many, new ones are
/// counted as `other` so a bug cannot grow the map without bound.
const MAX_KINDS: usize = 256;
const OTHER_KIND: &str = "other";

const fn zeros<const N: usize>() -> [AtomicU64; N] {
    [const { AtomicU64::new(0) }; N]
}

/// Every counter of one process. The service records into [`REGISTRY`];
/// tests make their own.
pub struct Registry {
    http: [[AtomicU64; STATUSES]; Edge::ALL.len()],
    http_buckets: [[AtomicU64; HTTP_BUCKETS_MICROS.len() + 1]; Edge::ALL.len()],
    http_micros: [AtomicU64; Edge::ALL.len()],
    events: RwLock<BTreeMap<Box<str>, [AtomicU64; Verdict::ALL.len()]>>,
    deliveries: [[AtomicU64; DeliveryResult::ALL.len()]; DeliveryKind::ALL.len()],
    attempts: [AtomicU64; ATTEMPT_SLOTS],
    dead_letters: AtomicU64,
    /// Applied, ignored.
    webhook_replies: [AtomicU64; 2],
    bot_refusals: [AtomicU64; BotRefusal::ALL.len()],
    /// PostgreSQL write transactions started and the microseconds they
    /// waited for their mode, [exclusive, row].
    write_turns: [AtomicU64; 2],
    write_turn_micros: [AtomicU64; 2],
    /// SQLite WAL restarts: how many, the microseconds they held the
    /// writer in all, and the longest.
    wal_restarts: AtomicU64,
    wal_restart_micros: AtomicU64,
    wal_restart_max_micros: AtomicU64,
    /// `durability = "full"`: the WAL syncs the acknowledgements waited
    /// for, the microseconds they took in all, and the longest.
    wal_syncs: AtomicU64,
    wal_sync_micros: AtomicU64,
    wal_sync_max_micros: AtomicU64,
    streams: [AtomicI64; Edge::ALL.len()],
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    pub const fn new() -> Registry {
        Registry {
            http: [const { zeros() }; Edge::ALL.len()],
            http_buckets: [const { zeros() }; Edge::ALL.len()],
            http_micros: zeros(),
            events: RwLock::new(BTreeMap::new()),
            deliveries: [const { zeros() }; DeliveryKind::ALL.len()],
            attempts: zeros(),
            dead_letters: AtomicU64::new(0),
            webhook_replies: zeros(),
            bot_refusals: zeros(),
            write_turns: zeros(),
            write_turn_micros: zeros(),
            wal_restarts: AtomicU64::new(0),
            wal_restart_micros: AtomicU64::new(0),
            wal_restart_max_micros: AtomicU64::new(0),
            wal_syncs: AtomicU64::new(0),
            wal_sync_micros: AtomicU64::new(0),
            wal_sync_max_micros: AtomicU64::new(0),
            streams: [const { AtomicI64::new(0) }; Edge::ALL.len()],
        }
    }

    /// One answered request: its status and the time until its response
    /// head was ready (for a stream: until it opened).
    pub fn http_request(&self, edge: Edge, status: u16, took: Duration) {
        let e = edge as usize;
        let slot = usize::from(status.saturating_sub(STATUS_FIRST)).min(STATUSES - 1);
        self.http[e][slot].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = HTTP_BUCKETS_MICROS.partition_point(|&bound| bound < micros);
        self.http_buckets[e][bucket].fetch_add(1, Ordering::Relaxed);
        self.http_micros[e].fetch_add(micros, Ordering::Relaxed);
    }

    pub fn event(&self, kind: &str, verdict: Verdict) {
        let v = verdict as usize;
        {
            let events = self.events.read().unwrap_or_else(|e| e.into_inner());
            if let Some(counts) = events.get(kind) {
                counts[v].fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let mut events = self.events.write().unwrap_or_else(|e| e.into_inner());
        let key = if events.len() < MAX_KINDS || events.contains_key(kind) {
            kind
        } else {
            OTHER_KIND
        };
        events.entry(key.into()).or_insert_with(zeros)[v].fetch_add(1, Ordering::Relaxed);
    }

    /// How the deliverer left a row; failed and rejected rows are dead letters.
    pub fn delivery(&self, kind: DeliveryKind, result: DeliveryResult) {
        self.deliveries[kind as usize][result as usize].fetch_add(1, Ordering::Relaxed);
        if result.is_dead_letter() {
            self.dead_letters.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An attempt made, numbered from 1 as `X-Hub-Attempt` numbers it.
    pub fn attempt(&self, number: i64) {
        let slot = usize::try_from(number.max(1) - 1)
            .unwrap_or(0)
            .min(ATTEMPT_SLOTS - 1);
        self.attempts[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// A `chat_accepted`/`chat_updated` reply: shown to the agent (an ok
    /// reply), or ignored (anything else).
    pub fn webhook_reply(&self, applied: bool) {
        self.webhook_replies[usize::from(!applied)].fetch_add(1, Ordering::Relaxed);
    }

    /// A provider's request the bot exchange refused.
    pub fn bot_refusal(&self, reason: BotRefusal) {
        self.bot_refusals[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A PostgreSQL write transaction began after waiting `waited` for its
    /// mode (the process's side and the database's advisory lock).
    pub fn write_turn_waited(&self, exclusive: bool, waited: Duration) {
        let m = usize::from(!exclusive);
        self.write_turns[m].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.write_turn_micros[m].fetch_add(micros, Ordering::Relaxed);
    }

    /// A SQLite WAL restart held the writer (every write of the process
    /// waited) for `held`.
    pub fn wal_restarted(&self, held: Duration) {
        timed(
            [
                &self.wal_restarts,
                &self.wal_restart_micros,
                &self.wal_restart_max_micros,
            ],
            held,
        );
    }

    /// A sync of the SQLite WAL that acknowledgements waited for took `took`.
    pub fn wal_synced(&self, took: Duration) {
        timed(
            [
                &self.wal_syncs,
                &self.wal_sync_micros,
                &self.wal_sync_max_micros,
            ],
            took,
        );
    }

    /// Counts a live stream as open until the guard is dropped.
    pub fn stream_opened(&'static self, kind: Edge) -> StreamGuard {
        self.streams[kind as usize].fetch_add(1, Ordering::Relaxed);
        StreamGuard {
            registry: self,
            kind,
        }
    }

    /// Appends every family in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        self.render_http(out);
        self.render_events(out);
        self.render_deliveries(out);
        let name = "hub_webhook_replies_total";
        header(
            out,
            name,
            "counter",
            "chat_accepted/chat_updated replies: applied (shown to the agent) or ignored.",
        );
        for (result, n) in ["applied", "ignored"].iter().zip(&self.webhook_replies) {
            let _ = writeln!(out, "{name}{{result=\"{result}\"}} {}", load(n));
        }
        let name = "hub_bot_refusals_total";
        header(
            out,
            name,
            "counter",
            "Bot providers' requests the bot exchange refused, by reason.",
        );
        // Every reason shows from the start, so an alert has a series to watch.
        for reason in BotRefusal::ALL {
            let n = load(&self.bot_refusals[reason as usize]);
            let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", reason.as_str());
        }
        for (name, kind, help, values) in [
            (
                "hub_store_write_transactions_total",
                "counter",
                "PostgreSQL write transactions begun, by mode (exclusive: one at a time across instances; row: side by side).",
                &self.write_turns,
            ),
            (
                "hub_store_write_wait_seconds_total",
                "counter",
                "Time PostgreSQL write transactions waited to begin, by mode.",
                &self.write_turn_micros,
            ),
        ] {
            header(out, name, kind, help);
            for (mode, n) in ["exclusive", "row"].iter().zip(values) {
                let n = load(n);
                if name.ends_with("seconds_total") {
                    let _ = writeln!(out, "{name}{{mode=\"{mode}\"}} {}", n as f64 / 1e6);
                } else {
                    let _ = writeln!(out, "{name}{{mode=\"{mode}\"}} {n}");
                }
            }
        }
        for (family, what, [count, micros, max]) in [
            (
                "hub_store_wal_restart",
                "SQLite WAL restarts (each holds every write of the process while it copies and syncs the WAL's last frames)",
                [
                    &self.wal_restarts,
                    &self.wal_restart_micros,
                    &self.wal_restart_max_micros,
                ],
            ),
            (
                "hub_store_wal_sync",
                "SQLite syncs of the WAL that durability = \"full\" acknowledgements waited for (one per group of commits)",
                [
                    &self.wal_syncs,
                    &self.wal_sync_micros,
                    &self.wal_sync_max_micros,
                ],
            ),
        ] {
            for (name, kind, help, value) in [
                (
                    format!("{family}s_total"),
                    "counter",
                    what.to_owned(),
                    load(count) as f64,
                ),
                (
                    format!("{family}_seconds_total"),
                    "counter",
                    format!("{what}: the time they took."),
                    load(micros) as f64 / 1e6,
                ),
                (
                    format!("{family}_seconds_max"),
                    "gauge",
                    format!("{what}: the longest since the process started."),
                    load(max) as f64 / 1e6,
                ),
            ] {
                header(out, &name, kind, &help);
                let _ = writeln!(out, "{name} {value}");
            }
        }
        let name = "hub_live_streams";
        header(
            out,
            name,
            "gauge",
            "Event streams open now, by the edge that serves them (agent, widget).",
        );
        for edge in Edge::ALL {
            let n = self.streams[edge as usize].load(Ordering::Relaxed);
            // The two kinds of stream always show, even at zero.
            if n != 0 || matches!(edge, Edge::Agent | Edge::Widget) {
                let _ = writeln!(out, "{name}{{kind=\"{}\"}} {n}", edge.as_str());
            }
        }
    }

    fn render_http(&self, out: &mut String) {
        let name = "hub_http_requests_total";
        header(
            out,
            name,
            "counter",
            "HTTP requests answered, by edge and status.",
        );
        for edge in Edge::ALL {
            for (slot, n) in self.http[edge as usize].iter().enumerate() {
                let n = load(n);
                if n > 0 {
                    let status = slot + usize::from(STATUS_FIRST);
                    let _ = writeln!(
                        out,
                        "{name}{{edge=\"{}\",status=\"{status}\"}} {n}",
                        edge.as_str()
                    );
                }
            }
        }
        let name = "hub_http_request_duration_seconds";
        header(
            out,
            name,
            "histogram",
            "Time until a request's response was ready (a stream: until it opened), by edge.",
        );
        for edge in Edge::ALL {
            let e = edge as usize;
            let counts: Vec<u64> = self.http_buckets[e].iter().map(load).collect();
            let total: u64 = counts.iter().sum();
            if total == 0 {
                continue;
            }
            let label = edge.as_str();
            let mut cumulative = 0;
            for (i, n) in counts.iter().enumerate() {
                cumulative += n;
                let le = HTTP_BUCKETS_MICROS
                    .get(i)
                    .map_or("+Inf".to_owned(), |micros| {
                        (*micros as f64 / 1e6).to_string()
                    });
                let _ = writeln!(
                    out,
                    "{name}_bucket{{edge=\"{label}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let seconds = load(&self.http_micros[e]) as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{edge=\"{label}\"}} {seconds}");
            let _ = writeln!(out, "{name}_count{{edge=\"{label}\"}} {total}");
        }
    }

    fn render_events(&self, out: &mut String) {
        let name = "hub_events_total";
        header(
            out,
            name,
            "counter",
            "Events through the plugin pipeline, by kind and verdict.",
        );
        let events = self.events.read().unwrap_or_else(|e| e.into_inner());
        for (kind, counts) in events.iter() {
            for verdict in Verdict::ALL {
                let n = load(&counts[verdict as usize]);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "{name}{{kind=\"{}\",verdict=\"{}\"}} {n}",
                        escape(kind),
                        verdict.as_str()
                    );
                }
            }
        }
    }

    fn render_deliveries(&self, out: &mut String) {
        let name = "hub_deliveries_total";
        header(
            out,
            name,
            "counter",
            "Outbox rows the deliverer settled or rescheduled, by row kind and result.",
        );
        for kind in DeliveryKind::ALL {
            for result in DeliveryResult::ALL {
                let n = load(&self.deliveries[kind as usize][result as usize]);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "{name}{{kind=\"{}\",result=\"{}\"}} {n}",
                        kind.as_str(),
                        result.as_str()
                    );
                }
            }
        }
        let name = "hub_delivery_attempts_total";
        header(
            out,
            name,
            "counter",
            "Delivery attempts made, by attempt number (10+ for the tenth and later).",
        );
        for (i, n) in self.attempts.iter().enumerate() {
            let n = load(n);
            if n > 0 {
                let attempt = if i + 1 == ATTEMPT_SLOTS {
                    format!("{ATTEMPT_SLOTS}+")
                } else {
                    (i + 1).to_string()
                };
                let _ = writeln!(out, "{name}{{attempt=\"{attempt}\"}} {n}");
            }
        }
        let name = "hub_dead_letters_total";
        header(
            out,
            name,
            "counter",
            "Deliveries this process settled as failed (rejected or given up).",
        );
        let _ = writeln!(out, "{name} {}", load(&self.dead_letters));
    }
}

/// Keeps a live stream counted while it is open.
pub struct StreamGuard {
    registry: &'static Registry,
    kind: Edge,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.registry.streams[self.kind as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

/// The process's counters.
pub static REGISTRY: Registry = Registry::new();

static STARTED: OnceLock<(SystemTime, Instant)> = OnceLock::new();

/// Notes when the hub started; the first call in a process wins.
pub fn mark_started() {
    STARTED.get_or_init(|| (SystemTime::now(), Instant::now()));
}

pub fn http_request(edge: Edge, status: u16, took: Duration) {
    REGISTRY.http_request(edge, status, took);
}

pub fn event(kind: &str, verdict: Verdict) {
    REGISTRY.event(kind, verdict);
}

pub fn delivery(kind: DeliveryKind, result: DeliveryResult) {
    REGISTRY.delivery(kind, result);
}

pub fn attempt(number: i64) {
    REGISTRY.attempt(number);
}

pub fn webhook_reply(applied: bool) {
    REGISTRY.webhook_reply(applied);
}

pub fn stream_opened(kind: Edge) -> StreamGuard {
    REGISTRY.stream_opened(kind)
}

pub fn bot_refusal(reason: BotRefusal) {
    REGISTRY.bot_refusal(reason);
}

pub fn wal_restarted(held: Duration) {
    REGISTRY.wal_restarted(held);
}

pub fn wal_synced(took: Duration) {
    REGISTRY.wal_synced(took);
}

pub fn write_turn_waited(exclusive: bool, waited: Duration) {
    REGISTRY.write_turn_waited(exclusive, waited);
}

/// The process families (`hub_up`, `hub_build_info`, start time and
/// uptime), then every counter of [`REGISTRY`].
pub fn render(out: &mut String) {
    header(out, "hub_up", "gauge", "1 while the hub serves.");
    let _ = writeln!(out, "hub_up 1");
    header(
        out,
        "hub_build_info",
        "gauge",
        "The hub's version, as a label; the value is always 1.",
    );
    let _ = writeln!(
        out,
        "hub_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let (wall, mono) = *STARTED.get_or_init(|| (SystemTime::now(), Instant::now()));
    let since_epoch = wall
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    header(
        out,
        "hub_start_time_seconds",
        "gauge",
        "When this process started, in Unix seconds.",
    );
    let _ = writeln!(out, "hub_start_time_seconds {since_epoch:.3}");
    header(
        out,
        "hub_uptime_seconds",
        "gauge",
        "Seconds since this process started.",
    );
    let _ = writeln!(
        out,
        "hub_uptime_seconds {:.3}",
        mono.elapsed().as_secs_f64()
    );
    REGISTRY.render(out);
}

/// `# HELP` and `# TYPE` of one family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the text format wants it.
pub fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Counts one occurrence in `[count, micros, max micros]`.
fn timed([count, total, max]: [&AtomicU64; 3], took: Duration) {
    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    count.fetch_add(1, Ordering::Relaxed);
    total.fetch_add(micros, Ordering::Relaxed);
    max.fetch_max(micros, Ordering::Relaxed);
}

fn load(n: &AtomicU64) -> u64 {
    n.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(r: &Registry) -> String {
        let mut out = String::new();
        r.render(&mut out);
        out
    }

    #[test]
    fn requests_are_counted_by_edge_and_exact_status_with_a_cumulative_histogram() {
        let r = Registry::new();
        r.http_request(Edge::Channel, 200, Duration::from_micros(300));
        r.http_request(Edge::Channel, 200, Duration::from_millis(3));
        r.http_request(Edge::Channel, 413, Duration::from_secs(30));
        r.http_request(Edge::Admin, 401, Duration::ZERO);
        let out = rendered(&r);
        assert!(out.contains("# TYPE hub_http_requests_total counter\n"));
        assert!(out.contains("hub_http_requests_total{edge=\"channel\",status=\"200\"} 2\n"));
        assert!(out.contains("hub_http_requests_total{edge=\"channel\",status=\"413\"} 1\n"));
        assert!(out.contains("hub_http_requests_total{edge=\"admin\",status=\"401\"} 1\n"));
        assert!(
            !out.contains("edge=\"widget\""),
            "edges without traffic stay out"
        );
        let h = "hub_http_request_duration_seconds";
        assert!(out.contains(&format!("{h}_bucket{{edge=\"channel\",le=\"0.0005\"}} 1\n")));
        assert!(out.contains(&format!("{h}_bucket{{edge=\"channel\",le=\"0.005\"}} 2\n")));
        assert!(out.contains(&format!("{h}_bucket{{edge=\"channel\",le=\"10\"}} 2\n")));
        assert!(out.contains(&format!("{h}_bucket{{edge=\"channel\",le=\"+Inf\"}} 3\n")));
        assert!(out.contains(&format!("{h}_count{{edge=\"channel\"}} 3\n")));
        assert!(out.contains(&format!("{h}_sum{{edge=\"channel\"}} 30.0033\n")));
    }

    #[test]
    fn events_are_counted_by_kind_and_verdict_and_kinds_are_bounded() {
        let r = Registry::new();
        r.event("channel.customer_message", Verdict::Passed);
        r.event("channel.customer_message", Verdict::Passed);
        r.event("channel.customer_message", Verdict::Dropped);
        r.event("agent.accept", Verdict::Rejected);
        let out = rendered(&r);
        assert!(out.contains(
            "hub_events_total{kind=\"channel.customer_message\",verdict=\"passed\"} 2\n"
        ));
        assert!(out.contains(
            "hub_events_total{kind=\"channel.customer_message\",verdict=\"dropped\"} 1\n"
        ));
        assert!(out.contains("hub_events_total{kind=\"agent.accept\",verdict=\"rejected\"} 1\n"));
        for i in 0..MAX_KINDS + 10 {
            r.event(&format!("k{i}"), Verdict::Passed);
        }
        let out = rendered(&r);
        assert!(out.contains("hub_events_total{kind=\"other\",verdict=\"passed\"} "));
        assert!(!out.contains(&format!("kind=\"k{}\"", MAX_KINDS + 5)));
    }

    #[test]
    fn failed_and_rejected_deliveries_are_dead_letters_and_late_attempts_share_a_label() {
        let r = Registry::new();
        r.delivery(DeliveryKind::Channel, DeliveryResult::Delivered);
        r.delivery(DeliveryKind::Channel, DeliveryResult::Retry);
        r.delivery(DeliveryKind::Webhook, DeliveryResult::Failed);
        r.delivery(DeliveryKind::Channel, DeliveryResult::Rejected);
        for n in [1, 1, 2, 10, 12] {
            r.attempt(n);
        }
        let out = rendered(&r);
        assert!(out.contains("hub_deliveries_total{kind=\"channel\",result=\"delivered\"} 1\n"));
        assert!(out.contains("hub_deliveries_total{kind=\"channel\",result=\"retry\"} 1\n"));
        assert!(out.contains("hub_deliveries_total{kind=\"webhook\",result=\"failed\"} 1\n"));
        assert!(out.contains("hub_dead_letters_total 2\n"));
        assert!(out.contains("hub_delivery_attempts_total{attempt=\"1\"} 2\n"));
        assert!(out.contains("hub_delivery_attempts_total{attempt=\"2\"} 1\n"));
        assert!(out.contains("hub_delivery_attempts_total{attempt=\"10+\"} 2\n"));
    }

    #[test]
    fn wal_restarts_and_syncs_add_up_and_the_longest_is_kept() {
        let r = Registry::new();
        assert!(rendered(&r).contains("hub_store_wal_restarts_total 0\n"));
        r.wal_restarted(Duration::from_millis(7));
        r.wal_restarted(Duration::from_millis(3));
        let out = rendered(&r);
        assert!(out.contains("hub_store_wal_restarts_total 2\n"), "{out}");
        assert!(
            out.contains("hub_store_wal_restart_seconds_total 0.01\n"),
            "{out}"
        );
        assert!(
            out.contains("hub_store_wal_restart_seconds_max 0.007\n"),
            "{out}"
        );
        r.wal_synced(Duration::from_micros(1500));
        let out = rendered(&r);
        assert!(out.contains("hub_store_wal_syncs_total 1\n"), "{out}");
        assert!(
            out.contains("hub_store_wal_sync_seconds_max 0.0015\n"),
            "{out}"
        );
        assert!(out.contains("hub_store_wal_restarts_total 2\n"), "{out}");
    }

    #[test]
    fn a_stream_counts_while_its_guard_lives() {
        static R: Registry = Registry::new();
        let out = rendered(&R);
        assert!(out.contains("hub_live_streams{kind=\"agent\"} 0\n"));
        assert!(out.contains("hub_live_streams{kind=\"widget\"} 0\n"));
        let a = R.stream_opened(Edge::Agent);
        let b = R.stream_opened(Edge::Agent);
        assert!(rendered(&R).contains("hub_live_streams{kind=\"agent\"} 2\n"));
        drop(a);
        assert!(rendered(&R).contains("hub_live_streams{kind=\"agent\"} 1\n"));
        drop(b);
        assert!(rendered(&R).contains("hub_live_streams{kind=\"agent\"} 0\n"));
    }

    #[test]
    fn webhook_replies_show_both_results_from_the_start() {
        let r = Registry::new();
        assert!(rendered(&r).contains("hub_webhook_replies_total{result=\"ignored\"} 0\n"));
        r.webhook_reply(true);
        let out = rendered(&r);
        assert!(out.contains("hub_webhook_replies_total{result=\"applied\"} 1\n"));
    }

    #[test]
    fn bot_refusals_show_every_reason_and_count_each_apart() {
        let r = Registry::new();
        assert!(rendered(&r).contains("hub_bot_refusals_total{reason=\"chat_done\"} 0\n"));
        r.bot_refusal(BotRefusal::UnknownChat);
        r.bot_refusal(BotRefusal::UnknownChat);
        r.bot_refusal(BotRefusal::RateLimited);
        let out = rendered(&r);
        assert!(out.contains("# TYPE hub_bot_refusals_total counter\n"));
        assert!(out.contains("hub_bot_refusals_total{reason=\"unknown_chat\"} 2\n"));
        assert!(out.contains("hub_bot_refusals_total{reason=\"rate_limited\"} 1\n"));
        assert!(out.contains("hub_bot_refusals_total{reason=\"unavailable\"} 0\n"));
    }

    #[test]
    fn the_process_families_come_first() {
        let mut out = String::new();
        render(&mut out);
        assert!(out.starts_with("# HELP hub_up "));
        assert!(out.contains("\nhub_up 1\n"));
        assert!(out.contains(&format!(
            "hub_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )));
        assert!(out.contains("# TYPE hub_uptime_seconds gauge\n"));
    }
}
