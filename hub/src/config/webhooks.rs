//! The `[webhooks]` and `[crm]` tables: how event and CRM webhooks are
//! retried and signed, and where CRM webhooks go.

use serde::Deserialize;

/// Delivery of event webhooks (the URL is per channel) and CRM webhooks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// `chat_accepted` and `chat_updated`: the agent waits for the reply, so
    /// few attempts with a short timeout.
    #[serde(default = "default_sync_attempts")]
    pub sync_attempts: u32,
    #[serde(default = "default_sync_timeout_ms")]
    pub sync_timeout_ms: u64,
    #[serde(default = "default_sync_interval_ms")]
    pub sync_retry_interval_ms: u64,
    /// Every other event webhook and every CRM webhook: retried with backoff
    /// (with the defaults, the last attempt starts about 11 hours after the first), then kept as dead letters.
    #[serde(default = "default_attempts")]
    pub attempts: u32,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "default_backoff")]
    pub backoff: f64,
    #[serde(default = "default_max_interval_ms")]
    pub max_interval_ms: u64,
    /// How long a failing webhook keeps the later webhooks of its chat (or
    /// client, or the CRM's) waiting, counted from its first attempt; after
    /// that they go out and it goes on retrying on its own.
    #[serde(default = "default_order_hold_ms")]
    pub order_hold_ms: u64,
    /// The spec's Safe URL setting: custom-data links to other domains than
    /// the receiver's are dropped before the agent sees them.
    #[serde(default)]
    pub safe_url: bool,
}

/// The CRM's webhook receiver and the account id it expects.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrmConfig {
    /// `site_id` of every CRM webhook.
    #[serde(default = "default_site_id")]
    pub site_id: i64,
    /// Without one, CRM events still cross their plugins (which may forward them).
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// A Standard Webhooks secret (`whsec_…`) turns on signing.
    #[serde(default)]
    pub webhook_secret: Option<String>,
}

fn default_sync_attempts() -> u32 {
    2
}
fn default_sync_timeout_ms() -> u64 {
    3_000
}
fn default_sync_interval_ms() -> u64 {
    1_000
}
fn default_attempts() -> u32 {
    20
}
fn default_timeout_ms() -> u64 {
    10_000
}
fn default_interval_ms() -> u64 {
    10_000
}
fn default_backoff() -> f64 {
    2.0
}
fn default_max_interval_ms() -> u64 {
    3_600_000
}
/// Two minutes: the first four attempts of a webhook with the default backoff.
pub const DEFAULT_ORDER_HOLD: std::time::Duration = std::time::Duration::from_secs(120);
fn default_order_hold_ms() -> u64 {
    u64::try_from(DEFAULT_ORDER_HOLD.as_millis()).unwrap_or(u64::MAX)
}
fn default_site_id() -> i64 {
    1
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            sync_attempts: default_sync_attempts(),
            sync_timeout_ms: default_sync_timeout_ms(),
            sync_retry_interval_ms: default_sync_interval_ms(),
            attempts: default_attempts(),
            timeout_ms: default_timeout_ms(),
            retry_interval_ms: default_interval_ms(),
            backoff: default_backoff(),
            max_interval_ms: default_max_interval_ms(),
            order_hold_ms: default_order_hold_ms(),
            safe_url: false,
        }
    }
}

impl Default for CrmConfig {
    fn default() -> Self {
        CrmConfig {
            site_id: default_site_id(),
            webhook_url: None,
            webhook_secret: None,
        }
    }
}

/// Problems with the two tables, each naming its key.
pub(super) fn check(w: &WebhooksConfig, crm: &CrmConfig, problems: &mut Vec<String>) {
    if w.sync_attempts == 0 {
        problems.push("webhooks.sync_attempts: must be at least 1".to_owned());
    }
    if w.sync_timeout_ms == 0 {
        problems.push("webhooks.sync_timeout_ms: must be positive".to_owned());
    }
    if w.attempts == 0 {
        problems.push("webhooks.attempts: must be at least 1".to_owned());
    }
    if w.timeout_ms == 0 {
        problems.push("webhooks.timeout_ms: must be positive".to_owned());
    }
    if !(w.backoff.is_finite() && w.backoff >= 1.0) {
        problems.push("webhooks.backoff: must be a number of at least 1".to_owned());
    }
    if let Some(url) = &crm.webhook_url
        && !super::is_http_url(url)
    {
        problems.push(format!("crm.webhook_url: `{url}` is not an http(s) URL"));
    }
    if let Some(secret) = &crm.webhook_secret
        && let Err(e) = crate::outbound::signing::Secret::parse(secret)
    {
        problems.push(format!("crm.webhook_secret: {e}"));
    }
}
