//! `[storage]`: the database, its durability and pool, and how long the
//! outbox and inbound payloads are kept.

use std::time::Duration;

use serde::Deserialize;

use super::Overrides;

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
    /// PostgreSQL: how many batches of each batch writer (customer
    /// messages, agent messages, delivery results) this instance writes at
    /// once, each a transaction of its own. One lane's batch grows while it
    /// is busy, so more lanes pay only where the database has cores and
    /// round trips to spare (docs/operations.md, "Scale model").
    #[serde(default = "default_write_lanes")]
    pub write_lanes: u32,
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

fn default_write_lanes() -> u32 {
    2
}

/// Most `write_lanes`: each lane of each of the three writers may hold a
/// connection.
pub const MAX_WRITE_LANES: u32 = 16;

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

fn default_database_url() -> String {
    "sqlite://data/hub.db".to_owned()
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            url: default_database_url(),
            durability: Durability::Full,
            max_connections: default_max_connections(),
            write_lanes: default_write_lanes(),
            acquire_timeout_ms: default_acquire_timeout_ms(),
            connect_timeout_ms: default_connect_timeout_ms(),
            delivered_retention_hours: default_delivered_retention_hours(),
            keep_inbound_hours: 0,
        }
    }
}

impl StorageConfig {
    /// The checks of `[storage]`, each problem naming its key.
    pub(super) fn check(&self, overrides: &Overrides, problems: &mut Vec<String>) {
        if !(self.url.starts_with("sqlite:") || self.url.starts_with("postgres")) {
            problems.push(format!(
                "{}: `{}` is neither sqlite://… nor postgres://…",
                overrides.key("storage.url"),
                self.url
            ));
        }
        if self.max_connections == 0 {
            problems.push("storage.max_connections: must be at least 1".to_owned());
        }
        if self.write_lanes == 0 || self.write_lanes > MAX_WRITE_LANES {
            problems.push(format!(
                "storage.write_lanes: must be between 1 and {MAX_WRITE_LANES}"
            ));
        } else if self.url.starts_with("postgres") && 3 * self.write_lanes >= self.max_connections {
            problems.push(format!(
                "storage.write_lanes: {} lanes of three writers would take all {} of \
                 storage.max_connections; raise max_connections above {}",
                self.write_lanes,
                self.max_connections,
                3 * self.write_lanes
            ));
        }
        if self.acquire_timeout_ms == 0 {
            problems.push("storage.acquire_timeout_ms: must be positive".to_owned());
        }
        if self.connect_timeout_ms == 0 {
            problems.push("storage.connect_timeout_ms: must be positive".to_owned());
        } else if self.connect_timeout_ms > MAX_CONNECT_TIMEOUT_MS {
            problems.push(format!(
                "storage.connect_timeout_ms: must be at most {MAX_CONNECT_TIMEOUT_MS} (2 minutes)"
            ));
        }
    }
}
