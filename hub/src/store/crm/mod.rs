//! The CRM store: pipelines, client categories, tags, deals, tasks,
//! organizations and the CRM side of clients, read as the spec's CRM objects
//! (`plugin_api::crm`). Every function takes a connection, so the agent API
//! reads, changes and queues its webhooks in one transaction. CRM times
//! (`*_ts`) are Unix seconds.

pub(crate) mod clients;
pub(crate) mod deals;
pub(crate) mod organizations;
pub(crate) mod pipelines;
pub(crate) mod statuses;
pub(crate) mod tags;
pub(crate) mod tasks;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection};

use super::{Ctx, Store, StoreError};

/// `settings` key: only administrators may create client tags (`1`/`0`).
pub const TAGS_ADMINISTRATORS_ONLY: &str = "crm.tags.administrators_only";
/// `settings` key: agents must update a client's category (`1`/`0`).
pub const STATUS_REQUIRE_UPDATE: &str = "crm.statuses.require_update";

impl Store {
    /// A connection for CRM reads that need no write transaction.
    pub async fn crm_reader(&self) -> Result<PoolConnection<Any>, StoreError> {
        self.pool()
            .acquire()
            .await
            .ctx("taking a connection for CRM reads")
    }
}

/// A `1`/`0` value of the `settings` table; absent reads as off.
pub async fn setting_flag(conn: &mut AnyConnection, key: &str) -> Result<bool, StoreError> {
    let row: Option<(String,)> = sqlx::query_as("SELECT value FROM settings WHERE key = $1")
        .bind(key)
        .fetch_optional(conn)
        .await
        .ctx("reading a CRM setting")?;
    Ok(row.is_some_and(|(v,)| v.trim() == "1"))
}

pub async fn set_setting_flag(
    conn: &mut AnyConnection,
    key: &str,
    on: bool,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO settings (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(key)
    .bind(if on { "1" } else { "0" })
    .execute(conn)
    .await
    .ctx("writing a CRM setting")?;
    Ok(())
}

/// Whether an agent with this id exists.
pub async fn agent_exists(conn: &mut AnyConnection, id: i64) -> Result<bool, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as("SELECT id FROM agents WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await
        .ctx("looking up an agent")?;
    Ok(row.is_some())
}
