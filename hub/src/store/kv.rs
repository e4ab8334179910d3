//! Plugin key-value namespaces: reads one key at a time, writes a call's
//! changes together, in the transaction of the event the call belonged to.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row};

use super::{Ctx, Store, StoreError};

impl Store {
    pub async fn kv_get(&self, plugin: &str, key: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM plugin_kv WHERE plugin = $1 AND key = $2")
            .bind(plugin)
            .bind(key)
            .fetch_optional(self.pool())
            .await
            .ctx("reading a plugin key")?;
        row.map(|r| r.try_get::<String, _>("value"))
            .transpose()
            .ctx("reading a plugin key")
    }

    /// Every key of a plugin's namespace with its value, in key order.
    pub async fn kv_entries(&self, plugin: &str) -> Result<Vec<KvEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT key, value, updated_at FROM plugin_kv WHERE plugin = $1 ORDER BY key",
        )
        .bind(plugin)
        .fetch_all(self.pool())
        .await
        .ctx("listing a plugin's keys")?;
        rows.iter()
            .map(|r| {
                Ok(KvEntry {
                    key: r.try_get("key")?,
                    value: r.try_get("value")?,
                    updated_at: r.try_get("updated_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .ctx("listing a plugin's keys")
    }

    /// How much a plugin keeps: keys, and bytes of keys and values.
    pub async fn kv_usage(&self, plugin: &str) -> Result<KvUsage, StoreError> {
        let (keys, bytes): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0) \
             FROM plugin_kv WHERE plugin = $1",
        )
        .bind(plugin)
        .fetch_one(self.pool())
        .await
        .ctx("measuring a plugin's keys")?;
        Ok(KvUsage {
            keys: u64::try_from(keys).unwrap_or(0),
            bytes: u64::try_from(bytes).unwrap_or(0),
        })
    }
}

/// One key of a plugin's namespace, as `hub plugin kv` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KvEntry {
    pub key: String,
    pub value: String,
    /// Unix milliseconds of the last write.
    pub updated_at: i64,
}

/// What a plugin keeps in its key-value namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvUsage {
    pub keys: u64,
    pub bytes: u64,
}

/// Applies one call's writes in the caller's transaction: `Some` sets a key,
/// `None` deletes it. The core calls it in the transaction of the event the
/// call belonged to, so a refused event keeps no writes.
pub async fn apply(
    conn: &mut AnyConnection,
    plugin: &str,
    writes: &BTreeMap<String, Option<String>>,
    now: i64,
) -> Result<(), StoreError> {
    for (key, value) in writes {
        match value {
            Some(value) => sqlx::query(
                "INSERT INTO plugin_kv (plugin, key, value, updated_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (plugin, key) DO UPDATE SET value = excluded.value, \
                 updated_at = excluded.updated_at",
            )
            .bind(plugin)
            .bind(key.as_str())
            .bind(value.as_str())
            .bind(now)
            .execute(&mut *conn)
            .await
            .ctx("writing a plugin key")?,
            None => sqlx::query("DELETE FROM plugin_kv WHERE plugin = $1 AND key = $2")
                .bind(plugin)
                .bind(key.as_str())
                .execute(&mut *conn)
                .await
                .ctx("deleting a plugin key")?,
        };
    }
    Ok(())
}
