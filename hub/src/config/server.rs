//! `[server]`: the listening address, the public URL, and the bounds of
//! connections and requests.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{Overrides, is_http_url};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the HTTP server binds.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Base URL integrators reach the hub at; channel endpoint URLs start with it.
    /// Defaults to `http://<listen>`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Largest request body accepted; larger bodies get 413.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// How long shutdown waits for in-flight requests and deliveries.
    #[serde(default = "default_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// How long a client may take to send a request's headers, from the
    /// connection (or the previous response) on; then the connection closes.
    #[serde(default = "default_header_timeout_ms")]
    pub header_timeout_ms: u64,
    /// How long a client may take to send a whole request body once its
    /// headers are in; then it gets 408 and the connection closes.
    #[serde(default = "default_body_timeout_ms")]
    pub body_timeout_ms: u64,
    /// Addresses of reverse proxies in front of the hub: for a request from
    /// one of them, the client's address is taken from `X-Forwarded-For`
    /// (widget rate limits, the visitor's recorded address).
    #[serde(default)]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Connections open at once; past it a new connection is answered 503
    /// and closed, so a flood cannot take every file descriptor.
    #[serde(default = "default_max_open_connections")]
    pub max_connections: usize,
    /// Largest request head (request line and headers); larger ones get 431.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Most headers a request may carry; more get 431.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Names this instance to the others on one database: a restarted
    /// instance takes back the deliveries its previous run left in flight.
    /// Defaults to the host name and the address the hub listens on; set it
    /// where neither is stable (`instance_id = "${POD_NAME}"`). Two running
    /// instances must not share one.
    #[serde(default)]
    pub instance_id: Option<String>,
}

fn default_max_open_connections() -> usize {
    4096
}

fn default_max_header_bytes() -> usize {
    32 * 1024
}

fn default_max_headers() -> usize {
    100
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

fn default_max_body() -> usize {
    64 * 1024
}

fn default_grace_ms() -> u64 {
    10_000
}

fn default_header_timeout_ms() -> u64 {
    10_000
}

fn default_body_timeout_ms() -> u64 {
    30_000
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            public_url: None,
            max_body_bytes: default_max_body(),
            shutdown_grace_ms: default_grace_ms(),
            header_timeout_ms: default_header_timeout_ms(),
            body_timeout_ms: default_body_timeout_ms(),
            trusted_proxies: Vec::new(),
            max_connections: default_max_open_connections(),
            max_header_bytes: default_max_header_bytes(),
            max_headers: default_max_headers(),
            instance_id: None,
        }
    }
}

impl ServerConfig {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }
}

impl ServerConfig {
    /// The checks of `[server]`, each problem naming its key (and the
    /// `HUB_*` variable that set it).
    pub(super) fn check(&self, overrides: &Overrides, problems: &mut Vec<String>) {
        if let Some(url) = &self.public_url
            && !is_http_url(url)
        {
            problems.push(format!(
                "{}: `{url}` is not an http(s) URL",
                overrides.key("server.public_url")
            ));
        }
        if self.max_body_bytes < 1024 {
            problems.push("server.max_body_bytes: must be at least 1024".to_owned());
        }
        if self.header_timeout_ms == 0 {
            problems.push("server.header_timeout_ms: must be positive".to_owned());
        }
        if self.body_timeout_ms == 0 {
            problems.push("server.body_timeout_ms: must be positive".to_owned());
        }
        if self.max_connections == 0 {
            problems.push("server.max_connections: must be at least 1".to_owned());
        }
        if self.max_header_bytes < 1024 {
            problems.push("server.max_header_bytes: must be at least 1024".to_owned());
        }
        if self.max_headers < 16 {
            problems.push("server.max_headers: must be at least 16".to_owned());
        }
        if let Some(id) = &self.instance_id
            && id.trim().is_empty()
        {
            problems.push("server.instance_id: must not be empty".to_owned());
        }
    }
}
