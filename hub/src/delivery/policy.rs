//! Retry policies by name: each outbox row names the policy it is sent under.

use std::collections::HashMap;
use std::time::Duration;

pub use crate::outbound::RetryPolicy;

use crate::config::{DeliveryConfig, WebhooksConfig};
use crate::store::outbox::{POLICY_BOT, POLICY_CHANNEL, POLICY_TYPING};
use crate::store::outbox::{POLICY_WEBHOOK as POLICY_ASYNC, POLICY_WEBHOOK_SYNC as POLICY_SYNC};

#[derive(Debug, Clone)]
pub struct Policies {
    by_name: HashMap<&'static str, RetryPolicy>,
    fallback: RetryPolicy,
    /// How long a claimed row is held (`[delivery] lease_ms`).
    pub lease: Duration,
}

impl Policies {
    pub fn from_config(c: &DeliveryConfig, w: &WebhooksConfig) -> Policies {
        let channel = RetryPolicy::fixed(c.attempts, c.retry_interval(), c.attempt_timeout());
        let typing = RetryPolicy {
            attempts: 1,
            ..channel
        };
        let sync = RetryPolicy {
            order_hold: Some(Duration::from_millis(w.order_hold_ms)),
            ..RetryPolicy::fixed(
                w.sync_attempts,
                Duration::from_millis(w.sync_retry_interval_ms),
                Duration::from_millis(w.sync_timeout_ms),
            )
        };
        let webhook = RetryPolicy {
            attempts: w.attempts,
            interval: Duration::from_millis(w.retry_interval_ms),
            backoff: w.backoff,
            max_interval: Duration::from_millis(w.max_interval_ms),
            timeout: Duration::from_millis(w.timeout_ms),
            order_hold: Some(Duration::from_millis(w.order_hold_ms)),
        };
        // The spec's bot exchange limits: 3 s per request, 2 retries, 9 s in all.
        let bot_timeout = Duration::from_millis(crate::config::BOT_EXCHANGE_TIMEOUT_MS);
        let bot = RetryPolicy::fixed(3, bot_timeout, bot_timeout);
        Policies {
            by_name: HashMap::from([
                (POLICY_BOT, bot),
                (POLICY_CHANNEL, channel),
                (POLICY_TYPING, typing),
                (POLICY_SYNC, sync),
                (POLICY_ASYNC, webhook),
            ]),
            fallback: channel,
            lease: c.lease(),
        }
    }

    /// The named policy; rows from a newer version with an unknown name get the channel's.
    pub fn get(&self, name: &str) -> RetryPolicy {
        self.by_name.get(name).copied().unwrap_or(self.fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_policies_wait_the_same_and_give_up_after_all_waits() {
        let p = RetryPolicy::fixed(3, Duration::from_secs(3), Duration::from_secs(3));
        assert_eq!(p.wait_after(1), Duration::from_secs(3));
        assert_eq!(p.wait_after(3), Duration::from_secs(3));
        assert_eq!(p.give_up_after(), Duration::from_secs(9));
    }

    #[test]
    fn backoff_grows_up_to_the_cap() {
        let p = RetryPolicy {
            attempts: 6,
            interval: Duration::from_secs(1),
            backoff: 2.0,
            max_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            order_hold: Some(Duration::from_secs(8)),
        };
        assert_eq!(p.hold_after(), Duration::from_secs(8));
        let strict = RetryPolicy::fixed(3, Duration::from_secs(3), Duration::from_secs(3));
        assert_eq!(strict.hold_after(), Duration::from_secs(9));
        let waits: Vec<u64> = (1..=6).map(|n| p.wait_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5, 5]);
    }
}
