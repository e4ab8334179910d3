//! Limits on what clients may ask of the server, kept in memory per
//! process: token buckets per key (a channel, a source address, a visitor),
//! failed credentials per source address, and the cap on open connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{LimitsConfig, ServerConfig};

/// Past this many keys, entries that no longer matter are swept before a new
/// key is added; the next sweep waits until the map has doubled, so a flood
/// of new keys costs amortised constant time per request, not a scan each.
const SWEEP_AT: usize = 10_000;

/// `burst` requests at once, then `per_second` on average, per key.
pub struct Limiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<Keyed<Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A map of per-key state that sweeps what `live` says no longer matters.
struct Keyed<T> {
    map: HashMap<String, T>,
    sweep_at: usize,
}

impl<T> Keyed<T> {
    fn new() -> Keyed<T> {
        Keyed {
            map: HashMap::new(),
            sweep_at: SWEEP_AT,
        }
    }

    fn make_room(&mut self, key: &str, live: impl Fn(&T) -> bool) {
        if self.map.len() >= self.sweep_at && !self.map.contains_key(key) {
            self.map.retain(|_, v| live(v));
            self.sweep_at = SWEEP_AT.max(self.map.len().saturating_mul(2));
        }
    }
}

impl Limiter {
    pub fn new(per_second: f64, burst: u32) -> Limiter {
        Limiter {
            per_second,
            burst: f64::from(burst),
            buckets: Mutex::new(Keyed::new()),
        }
    }

    /// Takes one request's token for `key`; false when the key is over its rate.
    pub fn allow(&self, key: &str) -> bool {
        self.take(key).is_ok()
    }

    /// Takes one request's token for `key`, or says how long until the key
    /// has one again.
    pub fn take(&self, key: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        // A bucket that has filled up again is no different from a new one.
        buckets.make_room(key, |b| {
            b.tokens + now.duration_since(b.at).as_secs_f64() * self.per_second < self.burst
        });
        let bucket = buckets.map.entry(key.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * self.per_second;
        bucket.tokens = (bucket.tokens + refill).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else if self.per_second > 0.0 {
            Err(Duration::from_secs_f64(
                ((1.0 - bucket.tokens) / self.per_second).min(86_400.0),
            ))
        } else {
            Err(Duration::from_secs(86_400))
        }
    }
}

/// A limiter that is off when its rate is 0.
fn limiter(per_second: f64, burst: u32) -> Option<Limiter> {
    (per_second > 0.0).then(|| Limiter::new(per_second, burst))
}

/// The widget's limits: every request per source address, new sessions per
/// source address (a page load makes one), and messages per visitor.
pub struct WidgetLimits {
    pub requests_per_ip: Limiter,
    pub sessions_per_ip: Limiter,
    pub messages_per_visitor: Limiter,
}

impl Default for WidgetLimits {
    fn default() -> Self {
        WidgetLimits {
            requests_per_ip: Limiter::new(20.0, 200),
            sessions_per_ip: Limiter::new(1.0, 60),
            messages_per_visitor: Limiter::new(1.0, 20),
        }
    }
}

/// A source address as the limits count it. An IPv6 client usually holds a
/// whole /64 and could change its address per request, so the /64 is the
/// source; an IPv4-mapped address is the IPv4 one.
pub fn source(ip: Option<IpAddr>) -> IpAddr {
    match ip {
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
        Some(v4) => v4,
        None => IpAddr::from([0, 0, 0, 0]),
    }
}

/// What a failed credential was for: failures are counted per source
/// address and door, so a wrong admin token does not also stop the same
/// server's channel traffic.
#[derive(Debug, Clone, Copy)]
pub enum Door<'a> {
    /// The random string of the channel endpoints.
    Channel,
    /// Bearer tokens of the agent and admin APIs.
    Api,
    /// The token of one bot, by provider id: a provider platform posts for
    /// many bots from one address, and one stale token must not stop them all.
    Bot(&'a str),
}

impl Door<'_> {
    fn key(&self, source: IpAddr) -> String {
        match self {
            Door::Channel => format!("channel|{source}"),
            Door::Api => format!("api|{source}"),
            Door::Bot(provider) => format!("bot:{provider}|{source}"),
        }
    }
}

/// Failed credentials per key within a window that starts at the first
/// failure; past `max` the key waits until the window ends.
pub struct Failures {
    max: u32,
    window: Duration,
    seen: Mutex<Keyed<Tally>>,
}

struct Tally {
    started: Instant,
    count: u32,
}

impl Failures {
    /// `max` 0: never blocks.
    pub fn new(max: u32, window: Duration) -> Failures {
        Failures {
            max,
            window,
            seen: Mutex::new(Keyed::new()),
        }
    }

    /// How long `key` must still wait, if it failed too often.
    pub fn blocked(&self, key: &str) -> Option<Duration> {
        if self.max == 0 {
            return None;
        }
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let tally = seen.map.get(key)?;
        let left = self.window.checked_sub(tally.started.elapsed())?;
        (tally.count >= self.max && !left.is_zero()).then_some(left)
    }

    pub fn failed(&self, key: &str) {
        if self.max == 0 {
            return;
        }
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.make_room(key, |t| now.duration_since(t.started) < self.window);
        let tally = seen.map.entry(key.to_owned()).or_insert(Tally {
            started: now,
            count: 0,
        });
        if now.duration_since(tally.started) >= self.window {
            *tally = Tally {
                started: now,
                count: 0,
            };
        }
        tally.count = tally.count.saturating_add(1);
    }
}

/// The cap on open connections, and how many were refused for it.
pub struct Connections {
    slots: Arc<Semaphore>,
    /// Refused connections being answered at once: past these, a refused
    /// connection is closed without an answer, so refusing stays cheap.
    answering: Arc<Semaphore>,
    max: usize,
    refused: AtomicU64,
    /// When a refusal was last logged (ms since `epoch`), so a flood of
    /// them makes one line a minute, not one each.
    logged_at: AtomicU64,
    epoch: Instant,
}

/// Refused connections answered at once at most.
const ANSWERING: usize = 256;
/// How often a refused connection is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

impl Connections {
    pub fn new(max: usize) -> Connections {
        let max = max.min(Semaphore::MAX_PERMITS);
        Connections {
            slots: Arc::new(Semaphore::new(max)),
            answering: Arc::new(Semaphore::new(ANSWERING)),
            max,
            refused: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// A slot for a new connection, held as long as it is open; `None` at the cap.
    pub fn open(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Counts a connection refused at the cap; a turn to answer it, if
    /// not too many are being answered already.
    pub fn refuse(&self) -> Option<OwnedSemaphorePermit> {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.logged_at.load(Ordering::Relaxed);
        let due = refused == 1 || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64;
        if due
            && self
                .logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                max_connections = self.max,
                refused_so_far = refused,
                "connection refused: server.max_connections are open"
            );
        }
        self.answering.clone().try_acquire_owned().ok()
    }

    /// Connections refused at the cap since the start (for `/metrics`).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open_now(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// Every limit the server applies to clients, built from `[server]` and
/// `[limits]`.
pub struct Limits {
    pub connections: Connections,
    channel: Option<Limiter>,
    channel_source: Option<Limiter>,
    bot: Option<Limiter>,
    bot_source: Option<Limiter>,
    failures: Failures,
}

impl Limits {
    pub fn new(server: &ServerConfig, limits: &LimitsConfig) -> Limits {
        Limits {
            connections: Connections::new(server.max_connections),
            channel: limiter(limits.channel_per_second, limits.channel_burst),
            channel_source: limiter(
                limits.channel_source_per_second,
                limits.channel_source_burst,
            ),
            bot: limiter(limits.bot_per_second, limits.bot_burst),
            bot_source: limiter(limits.bot_source_per_second, limits.bot_source_burst),
            failures: Failures::new(
                limits.auth_failures,
                Duration::from_secs(limits.auth_failure_window_secs),
            ),
        }
    }

    /// A request to channel `channel_id` from `source`; over a limit, how
    /// long to wait. The source's own limit is taken first, so that one
    /// source over its rate does not use up the channel's.
    pub fn channel(&self, channel_id: i64, source: IpAddr) -> Result<(), Duration> {
        take_both(
            self.channel_source.as_ref(),
            &format!("{channel_id}|{source}"),
            self.channel.as_ref(),
            &channel_id.to_string(),
        )
    }

    /// A request of the bot with `provider_id` from `source`, as [`Limits::channel`].
    pub fn bot(&self, provider_id: &str, source: IpAddr) -> Result<(), Duration> {
        take_both(
            self.bot_source.as_ref(),
            &format!("{provider_id}|{source}"),
            self.bot.as_ref(),
            provider_id,
        )
    }

    /// How long `source` must wait before it may try a credential at `door` again.
    pub fn auth_blocked(&self, door: Door<'_>, source: IpAddr) -> Option<Duration> {
        self.failures.blocked(&door.key(source))
    }

    /// Counts a wrong credential from `source` at `door`.
    pub fn auth_failed(&self, door: Door<'_>, source: IpAddr) {
        self.failures.failed(&door.key(source));
    }
}

fn take_both(
    first: Option<&Limiter>,
    first_key: &str,
    then: Option<&Limiter>,
    then_key: &str,
) -> Result<(), Duration> {
    if let Some(l) = first {
        l.take(first_key)?;
    }
    if let Some(l) = then {
        l.take(then_key)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_holds_per_key() {
        let l = Limiter::new(1000.0, 3);
        assert!((0..3).all(|_| l.allow("a")));
        assert!(l.allow("b"), "another key has its own bucket");
        std::thread::sleep(Duration::from_millis(5));
        assert!(l.allow("a"), "refilled at the rate");
        let slow = Limiter::new(0.001, 2);
        assert!(slow.allow("x") && slow.allow("x"));
        assert!(!slow.allow("x"), "over the burst");
    }

    #[test]
    fn a_refusal_says_how_long_until_the_next_token() {
        let l = Limiter::new(0.5, 1);
        assert!(l.take("k").is_ok());
        let wait = l.take("k").expect_err("over the rate");
        assert!(
            wait > Duration::from_secs(1) && wait <= Duration::from_secs(2),
            "{wait:?}"
        );
    }

    #[test]
    fn a_flood_of_new_keys_does_not_grow_the_map_without_bound() {
        let l = Limiter::new(1_000_000.0, 2);
        for i in 0..(SWEEP_AT * 5) {
            assert!(l.allow(&format!("k{i}")));
        }
        // Each bucket refills within a microsecond: the sweeps drop them.
        let len = l.buckets.lock().map(|b| b.map.len()).unwrap_or(usize::MAX);
        assert!(len <= SWEEP_AT * 2, "{len} buckets kept");
    }

    #[test]
    fn failures_past_the_threshold_block_the_key_until_the_window_ends() {
        let f = Failures::new(3, Duration::from_secs(60));
        for _ in 0..2 {
            f.failed("a");
        }
        assert_eq!(f.blocked("a"), None, "under the threshold");
        f.failed("a");
        let left = f.blocked("a").expect("blocked at the threshold");
        assert!(left > Duration::from_secs(58), "{left:?}");
        assert_eq!(f.blocked("b"), None, "another key is not blocked");
        let short = Failures::new(1, Duration::from_millis(20));
        short.failed("a");
        assert!(short.blocked("a").is_some());
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(short.blocked("a"), None, "the window passed");
        let off = Failures::new(0, Duration::from_secs(60));
        (0..100).for_each(|_| off.failed("a"));
        assert_eq!(off.blocked("a"), None, "0 turns the limit off");
    }

    #[test]
    fn an_ipv6_source_is_its_64_and_a_mapped_ipv4_is_the_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("ip");
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().expect("ip");
        let other: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(source(Some(a)), source(Some(b)));
        assert_ne!(source(Some(a)), source(Some(other)));
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().expect("ip");
        assert_eq!(
            source(Some(mapped)),
            "203.0.113.7".parse::<IpAddr>().expect("ip")
        );
    }

    #[test]
    fn past_the_cap_connections_are_refused_and_counted() {
        let c = Connections::new(2);
        let first = c.open();
        let second = c.open();
        assert!(first.is_some() && second.is_some());
        assert!(c.open().is_none(), "at the cap");
        assert!(c.refuse().is_some(), "answered");
        assert_eq!(c.refused(), 1);
        assert_eq!(c.open_now(), 2);
        drop(first);
        assert!(c.open().is_some(), "a closed connection frees its slot");
    }
}
