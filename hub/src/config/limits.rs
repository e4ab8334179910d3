//! `[limits]`: the rates of the unauthenticated endpoints and failed
//! credentials, per process.

use serde::Deserialize;

/// `[limits]`: request rates of the unauthenticated endpoints and failed
/// credentials, per process. A rate of 0 turns that limit off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests to one channel's endpoints, from all sources together.
    #[serde(default = "default_channel_per_second")]
    pub channel_per_second: f64,
    #[serde(default = "default_channel_burst")]
    pub channel_burst: u32,
    /// Requests to one channel's endpoints from one source address. An
    /// integrator sends all of a channel's customers from its server's
    /// address, so this must stay well above a busy channel's rate.
    #[serde(default = "default_source_per_second")]
    pub channel_source_per_second: f64,
    #[serde(default = "default_source_burst")]
    pub channel_source_burst: u32,
    /// Requests of one bot provider (`/webhooks/…`, `/providers/…`).
    #[serde(default = "default_channel_per_second")]
    pub bot_per_second: f64,
    #[serde(default = "default_channel_burst")]
    pub bot_burst: u32,
    /// Requests of one bot provider from one source address.
    #[serde(default = "default_source_per_second")]
    pub bot_source_per_second: f64,
    #[serde(default = "default_source_burst")]
    pub bot_source_burst: u32,
    /// Failed credentials (channel secret, admin or agent token, bot token)
    /// from one source address that make it wait out the window (0: off).
    #[serde(default = "default_auth_failures")]
    pub auth_failures: u32,
    #[serde(default = "default_auth_failure_window_secs")]
    pub auth_failure_window_secs: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            channel_per_second: default_channel_per_second(),
            channel_burst: default_channel_burst(),
            channel_source_per_second: default_source_per_second(),
            channel_source_burst: default_source_burst(),
            bot_per_second: default_channel_per_second(),
            bot_burst: default_channel_burst(),
            bot_source_per_second: default_source_per_second(),
            bot_source_burst: default_source_burst(),
            auth_failures: default_auth_failures(),
            auth_failure_window_secs: default_auth_failure_window_secs(),
        }
    }
}

fn default_channel_per_second() -> f64 {
    1000.0
}

fn default_channel_burst() -> u32 {
    2000
}

fn default_source_per_second() -> f64 {
    500.0
}

fn default_source_burst() -> u32 {
    1000
}

fn default_auth_failures() -> u32 {
    20
}

fn default_auth_failure_window_secs() -> u64 {
    60
}

impl LimitsConfig {
    /// The checks of `[limits]`, each problem naming its key.
    pub(super) fn check(&self, problems: &mut Vec<String>) {
        let rates = [
            (
                "channel_per_second",
                self.channel_per_second,
                "channel_burst",
                self.channel_burst,
            ),
            (
                "channel_source_per_second",
                self.channel_source_per_second,
                "channel_source_burst",
                self.channel_source_burst,
            ),
            (
                "bot_per_second",
                self.bot_per_second,
                "bot_burst",
                self.bot_burst,
            ),
            (
                "bot_source_per_second",
                self.bot_source_per_second,
                "bot_source_burst",
                self.bot_source_burst,
            ),
        ];
        for (rate_key, rate, burst_key, burst) in rates {
            if !rate.is_finite() || rate < 0.0 {
                problems.push(format!(
                    "limits.{rate_key}: must be a number of requests per second, 0 for no limit"
                ));
            } else if rate > 0.0 && burst == 0 {
                problems.push(format!(
                    "limits.{burst_key}: must be at least 1 while limits.{rate_key} is on"
                ));
            }
        }
        if self.auth_failures > 0 && self.auth_failure_window_secs == 0 {
            problems.push(
                "limits.auth_failure_window_secs: must be positive while limits.auth_failures is on"
                    .to_owned(),
            );
        }
    }
}
