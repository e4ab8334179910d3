//! Request rate limits for public endpoints: a token bucket per key (a
//! source address, a visitor), kept in memory, forgotten when idle.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets idle this long are dropped (they would be full again anyway).
const IDLE: Duration = Duration::from_secs(600);
/// Past this many keys the idle ones are swept before a new one is added.
const SWEEP_AT: usize = 10_000;

/// `burst` requests at once, then `per_second` on average, per key.
pub struct Limiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Limiter {
    pub fn new(per_second: f64, burst: u32) -> Limiter {
        Limiter {
            per_second,
            burst: f64::from(burst),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request's token for `key`; false when the key is over its rate.
    pub fn allow(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= SWEEP_AT && !buckets.contains_key(key) {
            buckets.retain(|_, b| now.duration_since(b.at) < IDLE);
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() * self.per_second;
        bucket.tokens = (bucket.tokens + refill).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
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
}
