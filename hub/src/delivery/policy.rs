//! Retry policies by name: each outbox row names the policy it is sent under.

use std::collections::HashMap;
use std::time::Duration;

use crate::config::DeliveryConfig;

/// Agent messages to the integrator: the spec's 3 tries, 3 s apart.
pub const POLICY_CHANNEL: &str = "channel";
/// Typing indicators: worth one try only; a late one is wrong.
pub const POLICY_TYPING: &str = "typing";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub attempts: u32,
    /// From the start of one attempt to the start of the next.
    pub interval: Duration,
    /// Longest wait for one response.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Policies {
    by_name: HashMap<&'static str, RetryPolicy>,
    fallback: RetryPolicy,
}

impl Policies {
    pub fn from_config(c: &DeliveryConfig) -> Policies {
        let channel = RetryPolicy {
            attempts: c.attempts,
            interval: c.retry_interval(),
            timeout: c.attempt_timeout(),
        };
        let typing = RetryPolicy {
            attempts: 1,
            ..channel
        };
        Policies {
            by_name: HashMap::from([(POLICY_CHANNEL, channel), (POLICY_TYPING, typing)]),
            fallback: channel,
        }
    }

    /// The named policy; rows from a newer version with an unknown name get the channel's.
    pub fn get(&self, name: &str) -> RetryPolicy {
        self.by_name.get(name).copied().unwrap_or(self.fallback)
    }

    pub fn longest_timeout(&self) -> Duration {
        self.by_name
            .values()
            .map(|p| p.timeout)
            .max()
            .unwrap_or(self.fallback.timeout)
    }
}
