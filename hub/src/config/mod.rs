//! `hub.toml`: the operator's one configuration file, its defaults, the
//! environment overrides used in deployment, and the checks `hub check` runs.
//!
//! Loading is one step: parse, apply the `HUB_*` overrides, check every key
//! (all problems at once) and fill in `${VAR}`, with the environment read
//! through one injected [`Env`]. The result carries what the checks produced
//! (destination headers expanded and marked sensitive), so nothing reads the
//! environment or expands a value again later.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod bots;
mod calls;
mod env;
#[cfg(test)]
mod fixtures;
mod outbound;
mod webhooks;
mod wiring;

pub use bots::{BotAuthConfig, BotConfig, is_provider_id, is_token};
pub use calls::{CALLBACK_DISABLED, CallHours, CallsConfig, OUTSIDE_HOURS};
pub use env::Env;
pub use outbound::{OutboundConfig, Private};

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

fn default_max_open_connections() -> usize {
    4096
}
fn default_max_header_bytes() -> usize {
    32 * 1024
}
fn default_max_headers() -> usize {
    100
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
    fn check(&self, problems: &mut Vec<String>) {
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `sqlite://path/to/file.db` (created if missing) or, later, `postgres://…`.
    #[serde(default = "default_database_url")]
    pub url: String,
    /// What a 200 means (SQLite): `full` fsyncs every commit (survives power
    /// loss), `normal` survives a crash of the hub but not of the machine.
    #[serde(default)]
    pub durability: Durability,
    /// PostgreSQL: most connections this instance holds open at once.
    /// SQLite keeps its own small pool (one writer and a few readers).
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// PostgreSQL: how long a request waits for a connection (the database
    /// busy or down) before it is answered 503 for the client to retry.
    #[serde(default = "default_acquire_timeout_ms")]
    pub acquire_timeout_ms: u64,
    /// PostgreSQL: how long opening the first connection may take, at start
    /// and in `hub check`; then both give up naming the database.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long outbound requests that were delivered (or dropped by a
    /// plugin) stay in the outbox, for operators to look up; 0 keeps them
    /// for good. Dead letters stay until they are replayed.
    #[serde(default = "default_delivered_retention_hours")]
    pub delivered_retention_hours: u64,
    /// Hours inbound payloads are kept as they entered, before any plugin,
    /// so a candidate for the head of a chain (a new `redact`) can be
    /// replayed on them; 0 (the default) keeps none. A privacy trade-off:
    /// these are the texts the live chain masks.
    #[serde(default)]
    pub keep_inbound_hours: u64,
}

/// `hub check` promises an answer within two minutes, so a connection
/// attempt may take no longer.
pub const MAX_CONNECT_TIMEOUT_MS: u64 = 120_000;

fn default_max_connections() -> u32 {
    16
}
fn default_acquire_timeout_ms() -> u64 {
    5_000
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}
fn default_delivered_retention_hours() -> u64 {
    24 * 7
}

impl StorageConfig {
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// `[storage] durability`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Full,
    Normal,
}

/// `[geoip]`: where widget visitors' countries and cities come from.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeoIpConfig {
    /// A GeoIP2/GeoLite2 City database file (MaxMind format); without one,
    /// `session.geoip` stays empty.
    #[serde(default)]
    pub database: Option<PathBuf>,
}

/// `[log]`: how the hub writes its log (to standard error).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing` filter such as `"info"` or `"info,hub::delivery=debug"`;
    /// `RUST_LOG`, when set, wins.
    #[serde(default)]
    pub level: Option<String>,
}

/// One line per record: words for a terminal, or a JSON object for a log
/// collector, with the event id, channel and chat of the spans it ran in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[metrics]`: who may read `/metrics`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    #[serde(default)]
    pub access: MetricsAccess,
}

/// Who may read `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAccess {
    /// The admin token (or an admin agent's console session): the figures
    /// name plugins, channels' traffic and failures.
    #[default]
    Admin,
    /// Anyone who can reach the hub (a scraper on a private network).
    Public,
}

/// `[console]`: agents' sign-in to the console at `/console`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// How long a console session lasts after sign-in.
    #[serde(default = "default_session_hours")]
    pub session_hours: u64,
    /// Failed sign-ins for one account, or from one address, that lock it.
    #[serde(default = "default_max_failed_sign_ins")]
    pub max_failed_sign_ins: u32,
    /// How long such a lock lasts (and the window failures are counted in).
    #[serde(default = "default_sign_in_lock_secs")]
    pub sign_in_lock_secs: u64,
}

fn default_session_hours() -> u64 {
    12
}

fn default_max_failed_sign_ins() -> u32 {
    30
}

fn default_sign_in_lock_secs() -> u64 {
    900
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            session_hours: default_session_hours(),
            max_failed_sign_ins: default_max_failed_sign_ins(),
            sign_in_lock_secs: default_sign_in_lock_secs(),
        }
    }
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

/// A channel declared in `hub.toml`, created on first start and matched by name after.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    pub name: String,
    /// The integrator's endpoint; a widget channel has none.
    #[serde(default)]
    pub customer_endpoint: String,
    /// `custom` (an integrator's server) or `widget` (the hub's script in
    /// visitors' browsers).
    #[serde(default, rename = "type")]
    pub kind: ChannelType,
    /// A widget's id as pages embed it; random when not given.
    #[serde(default)]
    pub widget_id: Option<String>,
    /// A widget's colour, `#rrggbb`.
    #[serde(default)]
    pub color: Option<String>,
    /// Origins (`https://shop.example.com`) allowed to use a widget; empty: any.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// A widget's callback calls; absent: off.
    #[serde(default)]
    pub calls: Option<CallsConfig>,
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
            trusted_proxies: Vec::new(),
            max_connections: default_max_open_connections(),
            max_header_bytes: default_max_header_bytes(),
            max_headers: default_max_headers(),
            instance_id: None,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            url: default_database_url(),
            durability: Durability::Full,
            max_connections: default_max_connections(),
            acquire_timeout_ms: default_acquire_timeout_ms(),
            connect_timeout_ms: default_connect_timeout_ms(),
            delivered_retention_hours: default_delivered_retention_hours(),
            keep_inbound_hours: 0,
        }
    }
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
        // Checked whether or not `RUST_LOG` overrides it, so that `hub check`
        // tells before the day the variable is not set.
        if let Some(level) = &self.log.level
            && let Err(e) = tracing_subscriber::EnvFilter::try_new(level)
        {
            problems.push(format!("log.level: `{level}` is not a log filter: {e}"));
        }
        if let Some(url) = &self.server.public_url
            && !is_http_url(url)
        {
            problems.push(format!(
                "{}: `{url}` is not an http(s) URL",
                overrides.key("server.public_url")
            ));
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
        if self.server.max_connections == 0 {
            problems.push("server.max_connections: must be at least 1".to_owned());
        }
        if self.server.max_header_bytes < 1024 {
            problems.push("server.max_header_bytes: must be at least 1024".to_owned());
        }
        if self.server.max_headers < 16 {
            problems.push("server.max_headers: must be at least 16".to_owned());
        }
        self.limits.check(problems);
        if !(self.storage.url.starts_with("sqlite:") || self.storage.url.starts_with("postgres")) {
            problems.push(format!(
                "{}: `{}` is neither sqlite://… nor postgres://…",
                overrides.key("storage.url"),
                self.storage.url
            ));
        }
        if self.storage.max_connections == 0 {
            problems.push("storage.max_connections: must be at least 1".to_owned());
        }
        if self.storage.acquire_timeout_ms == 0 {
            problems.push("storage.acquire_timeout_ms: must be positive".to_owned());
        }
        if self.storage.connect_timeout_ms == 0 {
            problems.push("storage.connect_timeout_ms: must be positive".to_owned());
        } else if self.storage.connect_timeout_ms > MAX_CONNECT_TIMEOUT_MS {
            problems.push(format!(
                "storage.connect_timeout_ms: must be at most {MAX_CONNECT_TIMEOUT_MS} (2 minutes)"
            ));
        }
        if self.admin.token.as_deref().is_some_and(|t| t.len() < 16) {
            problems.push(format!(
                "{}: must be at least 16 characters",
                overrides.key("admin.token")
            ));
        }
        if self.delivery.attempts == 0 {
            problems.push("delivery.attempts: must be at least 1".to_owned());
        }
        if self.console.session_hours == 0 {
            problems.push("console.session_hours: must be at least 1".to_owned());
        }
        if self.console.max_failed_sign_ins == 0 {
            problems.push("console.max_failed_sign_ins: must be at least 1".to_owned());
        }
        if self.console.sign_in_lock_secs == 0 {
            problems.push("console.sign_in_lock_secs: must be positive".to_owned());
        }
        if self.delivery.attempt_timeout_ms == 0 {
            problems.push("delivery.attempt_timeout_ms: must be positive".to_owned());
        }
        if let Some((key, longest)) = self.longest_attempt_timeout()
            && self.delivery.lease_ms <= longest
        {
            problems.push(format!(
                "delivery.lease_ms: {} ms must be longer than the longest attempt timeout, \
                 {key} ({longest} ms)",
                self.delivery.lease_ms
            ));
        }
        if self.delivery.heartbeat_ms == 0 {
            problems.push("delivery.heartbeat_ms: must be positive".to_owned());
        }
        if self.delivery.takeover_ms < 2 * self.delivery.heartbeat_ms {
            problems.push(format!(
                "delivery.takeover_ms: {} ms must be at least twice delivery.heartbeat_ms \
                 ({} ms), or a live instance could be taken for dead",
                self.delivery.takeover_ms, self.delivery.heartbeat_ms
            ));
        }
        if let Some(id) = &self.server.instance_id
            && id.trim().is_empty()
        {
            problems.push("server.instance_id: must not be empty".to_owned());
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
            let widget = ch.kind == ChannelType::Widget;
            if !widget && ch.customer_endpoint.is_empty() {
                problems.push(format!(
                    "channels[{i}].customer_endpoint: required (the integrator's endpoint; \
                     a channel of type \"widget\" has none)"
                ));
            } else if !customer_endpoint_ok(widget, &ch.customer_endpoint) {
                problems.push(format!(
                    "channels[{i}].customer_endpoint: `{}` is not an http(s) URL",
                    ch.customer_endpoint
                ));
            }
            if let Err(problem) = check_widget_settings(
                widget,
                ch.widget_id.as_deref(),
                ch.color.as_deref(),
                &ch.allowed_origins,
            ) {
                for problem in problem {
                    problems.push(format!("channels[{i}].{problem}"));
                }
            }
            if let Some(calls) = &ch.calls {
                if !widget {
                    problems.push(format!(
                        "channels[{i}].calls: only a channel of type `widget` has one"
                    ));
                }
                for problem in calls.problems() {
                    problems.push(format!("channels[{i}].{problem}"));
                }
            }
            if let Some(url) = &ch.webhook_url
                && !is_http_url(url)
            {
                problems.push(format!(
                    "channels[{i}].webhook_url: `{url}` is not an http(s) URL"
                ));
            }
            if let Some(secret) = &ch.webhook_secret
                && let Err(e) = crate::outbound::signing::Secret::parse(secret)
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
        if let Some(db) = &self.geoip.database {
            let path = self.resolve(db);
            if let Err(e) = std::fs::metadata(&path) {
                // The path as written: relative ones are relative to the file.
                problems.push(format!(
                    "geoip.database: cannot read `{}`: {e}",
                    db.display()
                ));
            }
        }
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

impl ServerConfig {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }
    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }
}

impl Config {
    /// The longest timeout of any attempt the deliverer makes, and the key
    /// that sets it: a lease must outlast it.
    fn longest_attempt_timeout(&self) -> Option<(String, u64)> {
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

/// `[[channels]] type`: how a channel's customers reach the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelType {
    /// An integrator's server.
    #[default]
    Custom,
    /// The hub's script in visitors' browsers.
    Widget,
}

/// Checks a widget's settings: every problem, each naming its key
/// (`color: …`). Custom channels may not have them.
pub fn check_widget_settings(
    widget: bool,
    widget_id: Option<&str>,
    color: Option<&str>,
    allowed_origins: &[String],
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if !widget {
        for (key, set) in [
            ("widget_id", widget_id.is_some()),
            ("color", color.is_some()),
            ("allowed_origins", !allowed_origins.is_empty()),
        ] {
            if set {
                problems.push(format!("{key}: only a channel of type `widget` has one"));
            }
        }
    } else {
        if let Some(id) = widget_id
            && !(id.len() >= 6 && is_provider_id(id))
        {
            problems.push(format!(
                "widget_id: `{id}` must be 6 or more letters, digits, `-` or `_`"
            ));
        }
        if let Some(c) = color {
            let hex = c.strip_prefix('#').unwrap_or("");
            if !((hex.len() == 6 || hex.len() == 3) && hex.chars().all(|h| h.is_ascii_hexdigit())) {
                problems.push(format!("color: `{c}` is not a colour like #1e88e5"));
            }
        }
        for origin in allowed_origins {
            let host = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            if !host.is_some_and(|h| !h.is_empty() && !h.contains('/')) {
                problems.push(format!(
                    "allowed_origins: `{origin}` is not an origin like https://shop.example.com"
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// A custom channel needs an http(s) endpoint; a widget has none (or one).
pub fn customer_endpoint_ok(widget: bool, endpoint: &str) -> bool {
    is_http_url(endpoint) || (widget && endpoint.is_empty())
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
        assert_eq!(c.server.listen, default_listen());
        assert_eq!(c.admin.token, None);
    }
}
