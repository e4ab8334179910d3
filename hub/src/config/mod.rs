//! `hub.toml`: the operator's one configuration file, its defaults, the
//! environment overrides used in deployment, and the checks `hub check` runs.
//!
//! Loading is one step: parse, apply the `HUB_*` overrides, check every key
//! (all problems at once) and fill in `${VAR}`, with the environment read
//! through one injected [`Env`]. The result carries what the checks produced
//! (destination headers expanded and marked sensitive), so nothing reads the
//! environment or expands a value again later.
//!
//! One file per section holds its keys, defaults and checks (`server.rs`,
//! `limits.rs`, `storage.rs`, `delivery.rs`, `channels.rs`, `access.rs` for
//! `[admin]`, `[console]` and `[metrics]`, `log.rs`, `geoip.rs`, and
//! `bots.rs`, `calls.rs`, `outbound.rs`, `webhooks.rs`, `wiring.rs`); this
//! file keeps the whole, loading, the `HUB_*` overrides and the order in
//! which the checks run, and each problem names its key (the error, the file).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod access;
mod bots;
mod calls;
mod channels;
mod delivery;
mod env;
#[cfg(test)]
mod fixtures;
mod geoip;
mod limits;
mod log;
mod outbound;
mod server;
mod storage;
mod webhooks;
mod wiring;

pub use access::{AdminConfig, ConsoleConfig, MetricsAccess, MetricsConfig};
pub use bots::{BotAuthConfig, BotConfig, is_provider_id, is_token};
pub use calls::{CALLBACK_DISABLED, CallHours, CallsConfig, OUTSIDE_HOURS};
pub use channels::{ChannelConfig, ChannelType, check_widget_settings, customer_endpoint_ok};
pub use delivery::{BOT_EXCHANGE_TIMEOUT_MS, DeliveryConfig};
pub use env::Env;
pub use geoip::GeoIpConfig;
pub use limits::LimitsConfig;
pub use log::{LogConfig, LogFormat};
pub use outbound::{OutboundConfig, Private};
pub use server::ServerConfig;
pub use storage::{Durability, MAX_CONNECT_TIMEOUT_MS, StorageConfig};
pub use webhooks::{CrmConfig, DEFAULT_ORDER_HOLD, WebhooksConfig};
pub use wiring::{
    DestinationConfig, EntryLines, MAX_PLUGIN_MEMORY_MB, OnError, PluginConfig, RetryConfig,
    RouteConfig, RuntimeConfig, expand_env, is_name,
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
    #[serde(default)]
    pub bots: Vec<BotConfig>,
    #[serde(default)]
    pub geoip: GeoIpConfig,
    #[serde(default)]
    pub console: ConsoleConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub outbound: OutboundConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// Directory of the file the configuration came from; relative paths in
    /// it (plugins, cache) are resolved against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The file itself, when the configuration was loaded from one; reload reads it again.
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// The environment the file was read with, for a reload to read it the
    /// same way. What loading took from it is in the fields above already
    /// (overrides applied, `${VAR}` filled in): nothing reads it after.
    #[serde(skip)]
    pub env: Env,
}

/// The keys a `HUB_*` variable set, so problems name the variable too.
#[derive(Default)]
struct Overrides(Vec<(&'static str, &'static str)>);

impl Overrides {
    /// `key`, followed by the variable that set it, if one did.
    fn key(&self, key: &'static str) -> String {
        match self.0.iter().find(|(k, _)| *k == key) {
            Some((_, var)) => format!("{key} ({var})"),
            None => key.to_owned(),
        }
    }
}

/// A configuration that cannot be used, with every reason found.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The reason is in the text and not a `source`, so `{:#}` does not print it twice.
    #[error("{file}: cannot read: {error}")]
    Read {
        file: PathBuf,
        error: std::io::Error,
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
/// Every override, for a test to keep the developer's own out of a `hub` it spawns.
pub const ENV_OVERRIDES: [&str; 4] = [
    ENV_LISTEN,
    ENV_PUBLIC_URL,
    ENV_DATABASE_URL,
    ENV_ADMIN_TOKEN,
];

impl Config {
    /// Reads `file` with the process environment. Only `main` calls this;
    /// everything else passes its environment to [`Config::load_with`].
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        Config::load_with(file, &Env::process())
    }

    /// Reads `file`, applies the `HUB_*` overrides and fills in `${VAR}`,
    /// both read through `env` and only here, and checks the result.
    pub fn load_with(file: &Path, env: &Env) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|error| ConfigError::Read {
            file: file.to_owned(),
            error,
        })?;
        let mut config = Config::from_toml(&text, file, env)?;
        config.source = Some(file.to_owned());
        Ok(config)
    }

    /// TOML text checked as [`Config::load_with`] checks a file, without any
    /// environment variable set. `file` names the source in errors and
    /// anchors relative paths.
    pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
        Config::from_toml(text, file, &Env::empty())
    }

    /// TOML text with the overrides and `${VAR}` read through `env`, checked:
    /// the configuration as the hub uses it, or every problem found.
    pub fn from_toml(text: &str, file: &Path, env: &Env) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_owned(),
            message: parse_message(text, &e),
        })?;
        wiring::note_lines(&mut config.plugins, text);
        config.base_dir = match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut problems = Vec::new();
        let overrides = config.apply_env(env, &mut problems);
        config.check(&overrides, env, &mut problems);
        config.env = env.clone();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                file: file.to_owned(),
                problems,
            })
        }
    }

    /// A path from the file, resolved against the file's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.base_dir.join(path)
        }
    }

    /// Applies the `HUB_*` overrides read through `env`; says which keys they set.
    fn apply_env(&mut self, env: &Env, problems: &mut Vec<String>) -> Overrides {
        let mut set = Overrides::default();
        if let Some(listen) = env.get(ENV_LISTEN) {
            match listen.parse() {
                Ok(addr) => self.server.listen = addr,
                Err(_) => problems.push(format!(
                    "server.listen ({ENV_LISTEN}): `{listen}` is not an address like 0.0.0.0:8080"
                )),
            }
            set.0.push(("server.listen", ENV_LISTEN));
        }
        if let Some(url) = env.get(ENV_PUBLIC_URL) {
            self.server.public_url = Some(url);
            set.0.push(("server.public_url", ENV_PUBLIC_URL));
        }
        if let Some(url) = env.get(ENV_DATABASE_URL) {
            self.storage.url = url;
            set.0.push(("storage.url", ENV_DATABASE_URL));
        }
        if let Some(token) = env.get(ENV_ADMIN_TOKEN) {
            self.admin.token = Some(token);
            set.0.push(("admin.token", ENV_ADMIN_TOKEN));
        }
        set
    }

    /// Checks what serde cannot (URLs, limits, names, references) and fills
    /// in what loading derives from the checked values: the destination
    /// headers with `${VAR}` read through `env`.
    fn check(&mut self, overrides: &Overrides, env: &Env, problems: &mut Vec<String>) {
        self.log.check(problems);
        self.server.check(overrides, problems);
        self.limits.check(problems);
        self.storage.check(overrides, problems);
        self.admin.check(overrides, problems);
        self.delivery
            .check(self.longest_attempt_timeout(), problems);
        self.console.check(problems);
        channels::check(&self.channels, problems);
        self.geoip.check(self, problems);
        wiring::check(self, env, problems);
        let plugins: std::collections::HashSet<&str> =
            self.plugins.iter().map(|p| p.name.as_str()).collect();
        bots::check(&mut self.bots, &plugins, env, problems);
        webhooks::check(&self.webhooks, &self.crm, problems);
        outbound::check(self, problems);
    }

    /// The base of every endpoint URL handed to integrators, without a trailing slash.
    pub fn public_base(&self, bound: SocketAddr) -> String {
        match &self.server.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("http://{bound}"),
        }
    }
}

/// A TOML or serde error as `key: message (line L, column C)`, the key found
/// from where the error points (`server.lisen`, `channels[1]`); toml's own
/// text, with the line quoted, when the text is not TOML at all.
fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let whole = || e.to_string().trim_end().to_owned();
    let Some(at) = e.span().map(|s| s.start) else {
        return whole();
    };
    let Ok(doc) = toml::de::DeTable::parse(text) else {
        return whole();
    };
    let Some(key) = key_at(doc.get_ref(), at) else {
        return whole();
    };
    let before = text.get(..at).unwrap_or(text);
    let line = line_at(text, at);
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!(
        "{key}: {} (line {line}, column {column})",
        e.message().trim_end()
    )
}

/// The line (from 1) of byte `at` of `text`.
fn line_at(text: &str, at: usize) -> usize {
    text.get(..at).unwrap_or(text).matches('\n').count() + 1
}

/// The dotted key of the innermost key or value of `table` at byte `at`.
fn key_at(table: &toml::de::DeTable<'_>, at: usize) -> Option<String> {
    for (key, value) in table.iter() {
        if let Some(inner) = value_key_at(value, at) {
            return Some(format!("{}{inner}", key.get_ref()));
        }
        if key.span().contains(&at) {
            return Some(key.get_ref().to_string());
        }
    }
    None
}

/// The rest of the key (`.name`, `[2]`, or nothing for the value itself) at byte `at`.
/// A table's own span is its header only, so containers are searched first.
fn value_key_at(value: &toml::Spanned<toml::de::DeValue<'_>>, at: usize) -> Option<String> {
    match value.get_ref() {
        toml::de::DeValue::Table(table) => {
            if let Some(inner) = key_at(table, at) {
                return Some(format!(".{inner}"));
            }
        }
        toml::de::DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(inner) = value_key_at(item, at) {
                    return Some(format!("[{i}]{inner}"));
                }
            }
        }
        _ => {}
    }
    value.span().contains(&at).then(String::new)
}

/// True for `http://host…` and `https://host…`.
pub fn is_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    matches!(rest, Some(r) if !r.is_empty() && !r.starts_with('/'))
}

// Error texts are checked by the fixtures in `tests/fixtures/config/` (see `fixtures.rs`).
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn read_timeouts_default() {
        let c = Config::parse("", Path::new("hub.toml")).unwrap();
        assert_eq!(c.server.header_timeout(), Duration::from_secs(10));
        assert_eq!(c.server.body_timeout(), Duration::from_secs(30));
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = Env::fixed([
            (ENV_LISTEN, "0.0.0.0:9999"),
            (ENV_DATABASE_URL, "sqlite://other.db"),
            (ENV_ADMIN_TOKEN, "a-token-of-sixteen-chars"),
        ]);
        let text = "[storage]\nurl = \"sqlite://file.db\"\n";
        let c = Config::from_toml(text, Path::new("hub.toml"), &env).unwrap();
        assert_eq!(c.server.listen.port(), 9999);
        assert_eq!(c.storage.url, "sqlite://other.db");
        assert_eq!(c.admin.token.as_deref(), Some("a-token-of-sixteen-chars"));
        assert_eq!(c.server.public_url, None);
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named_with_the_reason_once() {
        let file = Path::new("/nonexistent/hub.toml");
        let err = Config::load_with(file, &Env::empty()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent/hub.toml: cannot read: "),
            "{err}"
        );
        // `hub check` prints the chain: the reason must not come twice.
        assert!(std::error::Error::source(&err).is_none());
    }

    #[test]
    fn storage_durability_is_full_unless_set_to_normal() {
        let c = Config::parse("", Path::new("hub.toml")).unwrap();
        assert_eq!(c.storage.durability, Durability::Full);
        let c = Config::parse(
            "[storage]\nurl = \"sqlite://f.db\"\n",
            Path::new("hub.toml"),
        )
        .unwrap();
        assert_eq!(c.storage.durability, Durability::Full);
        let text = "[storage]\ndurability = \"normal\"\n";
        let c = Config::parse(text, Path::new("hub.toml")).unwrap();
        assert_eq!(c.storage.durability, Durability::Normal);
        let text = "[storage]\ndurability = \"full\"\n";
        let c = Config::parse(text, Path::new("hub.toml")).unwrap();
        assert_eq!(c.storage.durability, Durability::Full);
    }

    #[test]
    fn storage_pool_settings_default_and_can_be_set() {
        let c = Config::parse("", Path::new("hub.toml")).unwrap();
        assert_eq!(c.storage.max_connections, 16);
        assert_eq!(c.storage.acquire_timeout(), Duration::from_secs(5));
        assert_eq!(c.storage.connect_timeout(), Duration::from_secs(10));
        let text = "[storage]\nurl = \"postgres://hub@db/hub\"\nmax_connections = 40\n\
                    acquire_timeout_ms = 2000\nconnect_timeout_ms = 120000\n";
        let c = Config::parse(text, Path::new("hub.toml")).unwrap();
        assert_eq!(c.storage.max_connections, 40);
        assert_eq!(c.storage.acquire_timeout(), Duration::from_secs(2));
        assert_eq!(c.storage.connect_timeout(), Duration::from_secs(120));
        assert_eq!(c.storage.write_lanes, 2, "the default");
    }

    #[test]
    fn write_lanes_must_leave_connections_for_the_rest() {
        let text = "[storage]\nurl = \"postgres://hub@db/hub\"\nwrite_lanes = 4\n";
        let c = Config::parse(text, Path::new("hub.toml")).unwrap();
        assert_eq!(c.storage.write_lanes, 4);
        for bad in [
            "write_lanes = 0\n",
            "write_lanes = 17\nmax_connections = 100\n",
            "write_lanes = 6\n",
        ] {
            let text = format!("[storage]\nurl = \"postgres://hub@db/hub\"\n{bad}");
            let err = Config::parse(&text, Path::new("hub.toml"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("storage.write_lanes"), "{bad}: {err}");
        }
        // SQLite has one writer: the lanes do not apply, nor their check.
        let text = "[storage]\nwrite_lanes = 8\nmax_connections = 4\n";
        assert!(Config::parse(text, Path::new("hub.toml")).is_ok());
    }

    #[test]
    fn client_limits_default_on_and_bad_values_are_refused_naming_the_key() {
        let c = Config::parse("", Path::new("hub.toml")).unwrap();
        assert_eq!(c.server.max_connections, 4096);
        assert_eq!(c.server.max_header_bytes, 32 * 1024);
        assert!(c.limits.channel_source_per_second > 0.0 && c.limits.auth_failures > 0);
        let off = "[limits]\nchannel_per_second = 0\nchannel_burst = 0\n";
        assert!(
            Config::parse(off, Path::new("hub.toml")).is_ok(),
            "0 is off"
        );
        let text = "[server]\nmax_connections = 0\nmax_header_bytes = 100\nmax_headers = 2\n\
                    [limits]\nbot_per_second = -1\nchannel_source_burst = 0\n\
                    auth_failure_window_secs = 0\n";
        let err = Config::parse(text, Path::new("hub.toml"))
            .unwrap_err()
            .to_string();
        for key in [
            "server.max_connections",
            "server.max_header_bytes",
            "server.max_headers",
            "limits.bot_per_second",
            "limits.channel_source_burst",
            "limits.auth_failure_window_secs",
        ] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let err = Config::parse("[limits]\nchanel_burst = 1\n", Path::new("hub.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("chanel_burst"), "{err}");
    }

    #[test]
    fn an_unknown_storage_durability_is_refused_naming_the_key() {
        let text = "[storage]\ndurability = \"fsync\"\n";
        let err = Config::parse(text, Path::new("hub.toml")).unwrap_err();
        let err = err.to_string();
        assert!(err.starts_with("hub.toml: "), "{err}");
        assert!(err.contains("storage.durability"), "{err}");
        assert!(err.contains("fsync"), "{err}");
    }

    #[test]
    fn without_an_environment_the_file_stands() {
        let text = "[storage]\nurl = \"sqlite://file.db\"\n";
        let c = Config::from_toml(text, Path::new("hub.toml"), &Env::empty()).unwrap();
        assert_eq!(c.storage.url, "sqlite://file.db");
        assert_eq!(c.server.listen, ServerConfig::default().listen);
        assert_eq!(c.admin.token, None);
    }
}
