//! `hub.toml`: the operator's one configuration file, its defaults, the
//! environment overrides used in deployment, and the checks `hub check` runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod webhooks;
mod wiring;

pub use webhooks::{CrmConfig, DEFAULT_ORDER_HOLD, WebhooksConfig};
pub use wiring::{
    DestinationConfig, MAX_PLUGIN_MEMORY_MB, OnError, PluginConfig, RetryConfig, RouteConfig,
    RuntimeConfig, expand_env,
};

/// Everything the hub reads from `hub.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub storage: StorageConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub delivery: DeliveryConfig,
    #[serde(default)]
    pub channels: Vec<ChannelConfig>,
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    #[serde(default)]
    pub crm: CrmConfig,
    #[serde(default)]
    pub runtime: RuntimeConfig,
    #[serde(default)]
    pub plugins: Vec<PluginConfig>,
    #[serde(default)]
    pub destinations: Vec<DestinationConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Directory of the file the configuration came from; relative paths in
    /// it (plugins, cache) are resolved against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The file itself, when the configuration was loaded from one; reload reads it again.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `sqlite://path/to/file.db` (created if missing) or, later, `postgres://…`.
    #[serde(default = "default_database_url")]
    pub url: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token of the admin API; without one the admin API answers 403.
    #[serde(default)]
    pub token: Option<String>,
}

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
}

/// A channel declared in `hub.toml`, created on first start and matched by name after.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    pub name: String,
    pub customer_endpoint: String,
    #[serde(default)]
    pub chunked: bool,
    #[serde(default)]
    pub agents: Vec<String>,
    /// Where the channel's event webhooks go.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// A Standard Webhooks secret (`whsec_…`) turns on signing of them.
    #[serde(default)]
    pub webhook_secret: Option<String>,
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
fn default_database_url() -> String {
    "sqlite://data/hub.db".to_owned()
}
fn default_attempts() -> u32 {
    3
}
fn default_interval_ms() -> u64 {
    3_000
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
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            url: default_database_url(),
        }
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            attempts: default_attempts(),
            retry_interval_ms: default_interval_ms(),
            attempt_timeout_ms: default_interval_ms(),
        }
    }
}

/// A configuration that cannot be used, with every reason found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("{}", .problems.iter().map(|p| format!("{}: {p}", .file.display())).collect::<Vec<_>>().join("\n"))]
    Invalid {
        file: PathBuf,
        problems: Vec<String>,
    },
}

/// Environment variables that override the file, for deployment.
pub const ENV_LISTEN: &str = "HUB_LISTEN";
pub const ENV_PUBLIC_URL: &str = "HUB_PUBLIC_URL";
pub const ENV_DATABASE_URL: &str = "HUB_DATABASE_URL";
pub const ENV_ADMIN_TOKEN: &str = "HUB_ADMIN_TOKEN";

impl Config {
    /// Reads `file`, applies the environment overrides and validates the result.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_owned(),
            source,
        })?;
        let mut config = Config::parse(&text, file)?;
        config.source = Some(file.to_owned());
        config.apply_env(file, |k| std::env::var(k).ok())?;
        config.validate(file)?;
        Ok(config)
    }

    /// Parses TOML text; `file` names the source in errors and anchors relative paths.
    pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.base_dir = match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(config)
    }

    /// A path from the file, resolved against the file's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.base_dir.join(path)
        }
    }

    /// Applies `HUB_*` overrides read through `get`.
    pub fn apply_env(
        &mut self,
        file: &Path,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(listen) = get(ENV_LISTEN) {
            self.server.listen = listen.parse().map_err(|_| ConfigError::Invalid {
                file: file.to_owned(),
                problems: vec![format!(
                    "{ENV_LISTEN}: `{listen}` is not an address like 0.0.0.0:8080"
                )],
            })?;
        }
        if let Some(url) = get(ENV_PUBLIC_URL) {
            self.server.public_url = Some(url);
        }
        if let Some(url) = get(ENV_DATABASE_URL) {
            self.storage.url = url;
        }
        if let Some(token) = get(ENV_ADMIN_TOKEN) {
            self.admin.token = Some(token);
        }
        Ok(())
    }

    /// Checks what serde cannot: URLs, limits and duplicate channel names.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if let Some(url) = &self.server.public_url
            && !is_http_url(url)
        {
            problems.push(format!("server.public_url: `{url}` is not an http(s) URL"));
        }
        if self.server.max_body_bytes < 1024 {
            problems.push("server.max_body_bytes: must be at least 1024".to_owned());
        }
        if self.server.header_timeout_ms == 0 {
            problems.push("server.header_timeout_ms: must be positive".to_owned());
        }
        if self.server.body_timeout_ms == 0 {
            problems.push("server.body_timeout_ms: must be positive".to_owned());
        }
        if !(self.storage.url.starts_with("sqlite:") || self.storage.url.starts_with("postgres")) {
            problems.push(format!(
                "storage.url: `{}` is neither sqlite://… nor postgres://…",
                self.storage.url
            ));
        }
        if self.admin.token.as_deref().is_some_and(|t| t.len() < 16) {
            problems.push("admin.token: must be at least 16 characters".to_owned());
        }
        if self.delivery.attempts == 0 {
            problems.push("delivery.attempts: must be at least 1".to_owned());
        }
        if self.delivery.attempt_timeout_ms == 0 {
            problems.push("delivery.attempt_timeout_ms: must be positive".to_owned());
        }
        let mut names = std::collections::HashSet::new();
        for (i, ch) in self.channels.iter().enumerate() {
            if ch.name.trim().is_empty() {
                problems.push(format!("channels[{i}].name: must not be empty"));
            }
            if !names.insert(ch.name.as_str()) {
                problems.push(format!(
                    "channels[{i}].name: `{}` is declared twice",
                    ch.name
                ));
            }
            if !is_http_url(&ch.customer_endpoint) {
                problems.push(format!(
                    "channels[{i}].customer_endpoint: `{}` is not an http(s) URL",
                    ch.customer_endpoint
                ));
            }
            if let Some(url) = &ch.webhook_url
                && !is_http_url(url)
            {
                problems.push(format!(
                    "channels[{i}].webhook_url: `{url}` is not an http(s) URL"
                ));
            }
            if let Some(secret) = &ch.webhook_secret
                && let Err(e) = crate::core::webhooks::signing::Secret::parse(secret)
            {
                problems.push(format!("channels[{i}].webhook_secret: {e}"));
            }
            for (j, agent) in ch.agents.iter().enumerate() {
                if !agent.contains('@') {
                    problems.push(format!(
                        "channels[{i}].agents[{j}]: `{agent}` is not an e-mail address"
                    ));
                }
            }
        }
        wiring::check(self, &mut problems);
        webhooks::check(&self.webhooks, &self.crm, &mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                file: file.to_owned(),
                problems,
            })
        }
    }

    /// The base of every endpoint URL handed to integrators, without a trailing slash.
    pub fn public_base(&self, bound: SocketAddr) -> String {
        match &self.server.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("http://{bound}"),
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

impl DeliveryConfig {
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms)
    }
    pub fn attempt_timeout(&self) -> Duration {
        Duration::from_millis(self.attempt_timeout_ms)
    }
}

/// True for `http://host…` and `https://host…`.
pub fn is_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    matches!(rest, Some(r) if !r.is_empty() && !r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_name_the_key_and_file() {
        let err = Config::parse("[server]\nlisen = \"x\"\n", Path::new("conf/hub.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("conf/hub.toml:"), "{err}");
        assert!(err.contains("lisen"), "{err}");
    }

    #[test]
    fn every_problem_is_reported() {
        let text = r#"
            [[channels]]
            name = "a"
            customer_endpoint = "ftp://x"
            [[channels]]
            name = "a"
            customer_endpoint = "http://x"
            agents = ["nobody"]
        "#;
        let file = Path::new("hub.toml");
        let err = Config::parse(text, file)
            .unwrap()
            .validate(file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("channels[0].customer_endpoint"), "{err}");
        assert!(err.contains("channels[1].name"), "{err}");
        assert!(err.contains("channels[1].agents[0]"), "{err}");
    }

    #[test]
    fn read_timeouts_default_and_must_be_positive() {
        let file = Path::new("hub.toml");
        let c = Config::parse("", file).unwrap();
        assert_eq!(c.server.header_timeout(), Duration::from_secs(10));
        assert_eq!(c.server.body_timeout(), Duration::from_secs(30));
        let err = Config::parse(
            "[server]\nheader_timeout_ms = 0\nbody_timeout_ms = 0\n",
            file,
        )
        .unwrap()
        .validate(file)
        .unwrap_err()
        .to_string();
        assert!(err.contains("server.header_timeout_ms"), "{err}");
        assert!(err.contains("server.body_timeout_ms"), "{err}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let file = Path::new("hub.toml");
        let mut c = Config::parse("", file).unwrap();
        c.apply_env(file, |k| match k {
            ENV_LISTEN => Some("0.0.0.0:9999".into()),
            ENV_DATABASE_URL => Some("sqlite://other.db".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.server.listen.port(), 9999);
        assert_eq!(c.storage.url, "sqlite://other.db");
    }
}
