//! Named receivers from `hub.toml` that plugins send and forward to: URL,
//! headers (secrets filled in from the environment when the configuration was
//! loaded) and retry policy. Plugins only ever name them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::config::DestinationConfig;
use crate::outbound::RetryPolicy;

/// Outbox rows of forwards name their policy `dest:<destination>`.

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
    /// The destinations of a loaded configuration, headers as loading
    /// expanded them (nothing reads the environment here).
    pub fn from_config(configs: &[DestinationConfig]) -> Destinations {
        let mut by_name = HashMap::new();
        for d in configs {
            let headers = d.expanded_headers.clone();
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
        Destinations { by_name }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Destination>> {
        self.by_name.get(name)
    }
}
