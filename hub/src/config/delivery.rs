//! `[delivery]`: the retry policy of agent messages to the integrator, and
//! the leases and heartbeats of instances sharing one database.

use std::time::Duration;

use serde::Deserialize;

use super::Config;

/// Retry policy for agent messages to the integrator; the spec's values are the defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    #[serde(default = "default_attempts")]
    pub attempts: u32,
    #[serde(default = "default_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "default_interval_ms")]
    pub attempt_timeout_ms: u64,
    /// How long an instance holds a delivery it is attempting; another
    /// instance takes the row over after that (one that died mid-attempt).
    /// Longer than every attempt's timeout, or the hub refuses to start.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// How often an instance on PostgreSQL tells the others it is alive.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// An instance silent this long is taken for dead: the others take over
    /// the deliveries it held at once, not when their lease runs out.
    #[serde(default = "default_takeover_ms")]
    pub takeover_ms: u64,
}

fn default_lease_ms() -> u64 {
    30_000
}

fn default_heartbeat_ms() -> u64 {
    1_000
}

fn default_takeover_ms() -> u64 {
    5_000
}

/// The bot exchange's timeout per request (the spec's 3 s).
pub const BOT_EXCHANGE_TIMEOUT_MS: u64 = 3_000;

fn default_attempts() -> u32 {
    3
}

fn default_interval_ms() -> u64 {
    3_000
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            attempts: default_attempts(),
            retry_interval_ms: default_interval_ms(),
            attempt_timeout_ms: default_interval_ms(),
            lease_ms: default_lease_ms(),
            heartbeat_ms: default_heartbeat_ms(),
            takeover_ms: default_takeover_ms(),
        }
    }
}

impl DeliveryConfig {
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms)
    }
    pub fn attempt_timeout(&self) -> Duration {
        Duration::from_millis(self.attempt_timeout_ms)
    }
}

impl Config {
    /// The longest timeout of any attempt the deliverer makes, and the key
    /// that sets it: a lease must outlast it.
    pub(super) fn longest_attempt_timeout(&self) -> Option<(String, u64)> {
        let mut all = vec![
            (
                "delivery.attempt_timeout_ms".to_owned(),
                self.delivery.attempt_timeout_ms,
            ),
            ("webhooks.timeout_ms".to_owned(), self.webhooks.timeout_ms),
            (
                "webhooks.sync_timeout_ms".to_owned(),
                self.webhooks.sync_timeout_ms,
            ),
        ];
        if !self.bots.is_empty() {
            all.push((
                "the bot exchange's timeout".to_owned(),
                BOT_EXCHANGE_TIMEOUT_MS,
            ));
        }
        for (i, d) in self.destinations.iter().enumerate() {
            all.push((format!("destinations[{i}].timeout_ms"), d.timeout_ms));
        }
        for (i, p) in self.plugins.iter().enumerate() {
            all.push((format!("plugins[{i}].timeout_ms"), p.timeout_ms));
        }
        all.into_iter().max_by_key(|(_, ms)| *ms)
    }
}

impl DeliveryConfig {
    /// The checks of `[delivery]`, each problem naming its key; `longest`
    /// is the longest attempt timeout of the whole file and its key.
    pub(super) fn check(&self, longest: Option<(String, u64)>, problems: &mut Vec<String>) {
        if self.attempts == 0 {
            problems.push("delivery.attempts: must be at least 1".to_owned());
        }
        if self.attempt_timeout_ms == 0 {
            problems.push("delivery.attempt_timeout_ms: must be positive".to_owned());
        }
        if let Some((key, longest)) = longest
            && self.lease_ms <= longest
        {
            problems.push(format!(
                "delivery.lease_ms: {} ms must be longer than the longest attempt timeout, \
                 {key} ({longest} ms)",
                self.lease_ms
            ));
        }
        if self.heartbeat_ms == 0 {
            problems.push("delivery.heartbeat_ms: must be positive".to_owned());
        }
        if self.takeover_ms < 2 * self.heartbeat_ms {
            problems.push(format!(
                "delivery.takeover_ms: {} ms must be at least twice delivery.heartbeat_ms \
                 ({} ms), or a live instance could be taken for dead",
                self.takeover_ms, self.heartbeat_ms
            ));
        }
    }
}
