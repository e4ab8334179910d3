//! Named receivers from `hub.toml` that plugins send and forward to: URL,
//! headers (secrets resolved from the environment) and retry policy. Plugins
//! only ever name them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::config::{DestinationConfig, expand_env};
use crate::delivery::RetryPolicy;

/// Outbox rows of forwards name their policy `dest:<destination>`.
pub const POLICY_PREFIX: &str = "dest:";

#[derive(Debug)]
pub struct Destination {
    pub name: String,
    pub url: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub policy: RetryPolicy,
}

#[derive(Debug, Default)]
pub struct Destinations {
    by_name: HashMap<String, Arc<Destination>>,
}

impl Destinations {
    /// Resolves the configured destinations; `get` reads environment variables.
    pub fn from_config(
        configs: &[DestinationConfig],
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Destinations, String> {
        let mut by_name = HashMap::new();
        for d in configs {
            let mut headers = Vec::with_capacity(d.headers.len());
            for (name, value) in &d.headers {
                let key = format!("destination `{}` header `{name}`", d.name);
                let value = expand_env(value, &get).map_err(|e| format!("{key}: {e}"))?;
                let name =
                    HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("{key}: {e}"))?;
                let mut value = HeaderValue::from_str(&value).map_err(|e| format!("{key}: {e}"))?;
                value.set_sensitive(true);
                headers.push((name, value));
            }
            let policy = RetryPolicy {
                attempts: d.retry.attempts,
                interval: Duration::from_millis(d.retry.interval_ms),
                backoff: d.retry.backoff,
                max_interval: Duration::from_millis(d.retry.max_interval_ms),
                timeout: Duration::from_millis(d.timeout_ms),
                // Forwards to one destination of one chat keep their order for
                // as long as webhooks do; a dead receiver must not stall the rest.
                order_hold: Some(crate::config::DEFAULT_ORDER_HOLD),
            };
            by_name.insert(
                d.name.clone(),
                Arc::new(Destination {
                    name: d.name.clone(),
                    url: d.url.clone(),
                    headers,
                    policy,
                }),
            );
        }
        Ok(Destinations { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Destination>> {
        self.by_name.get(name)
    }

    /// The destination an outbox policy name refers to, if it is a forward's.
    pub fn of_policy(&self, policy: &str) -> Option<&Arc<Destination>> {
        policy
            .strip_prefix(POLICY_PREFIX)
            .and_then(|name| self.by_name.get(name))
    }

    pub fn longest_timeout(&self) -> Option<Duration> {
        self.by_name.values().map(|d| d.policy.timeout).max()
    }
}

impl Destination {
    pub fn policy_name(&self) -> String {
        format!("{POLICY_PREFIX}{}", self.name)
    }
}
