//! The schema's steps for each database (`hub/migrations/`), embedded, and
//! the runners that apply the pending ones at start (on PostgreSQL under the
//! write lock, so instances starting together both come up).

use super::*;

pub(super) const SQLITE_MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_channel.sql")),
    (2, include_str!("../../migrations/sqlite/0002_plugins.sql")),
    (
        3,
        include_str!("../../migrations/sqlite/0003_webhooks_crm.sql"),
    ),
    (
        4,
        include_str!("../../migrations/sqlite/0004_crm_indexes.sql"),
    ),
    (
        5,
        include_str!("../../migrations/sqlite/0005_delivery_fixes.sql"),
    ),
    (6, include_str!("../../migrations/sqlite/0006_bots.sql")),
    (7, include_str!("../../migrations/sqlite/0007_widget.sql")),
    (8, include_str!("../../migrations/sqlite/0008_console.sql")),
    (9, include_str!("../../migrations/sqlite/0009_notices.sql")),
    (
        10,
        include_str!("../../migrations/sqlite/0010_event_log_writes.sql"),
    ),
    (
        11,
        include_str!("../../migrations/sqlite/0011_outbox_pending.sql"),
    ),
    (
        12,
        include_str!("../../migrations/sqlite/0012_outbox_heads.sql"),
    ),
    (
        13,
        include_str!("../../migrations/sqlite/0013_outbox_pending_order.sql"),
    ),
    (
        15,
        include_str!("../../migrations/sqlite/0015_instances.sql"),
    ),
    (
        17,
        include_str!("../../migrations/sqlite/0017_plugin_outcomes.sql"),
    ),
];

/// PostgreSQL's schema: the same tables, columns and meaning as
/// [`SQLITE_MIGRATIONS`], step for step, in PostgreSQL's dialect; steps 14
/// and 16 are PostgreSQL's alone (storage parameters, and an index SQLite
/// keeps as it is: it has no heap-only updates to make room for; the
/// webhook sequence of writers side by side: SQLite has one writer).
pub(super) const POSTGRES_MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../migrations/postgres/0001_channel.sql"),
    ),
    (
        2,
        include_str!("../../migrations/postgres/0002_plugins.sql"),
    ),
    (
        3,
        include_str!("../../migrations/postgres/0003_webhooks_crm.sql"),
    ),
    (
        4,
        include_str!("../../migrations/postgres/0004_crm_indexes.sql"),
    ),
    (
        5,
        include_str!("../../migrations/postgres/0005_delivery_fixes.sql"),
    ),
    (6, include_str!("../../migrations/postgres/0006_bots.sql")),
    (7, include_str!("../../migrations/postgres/0007_widget.sql")),
    (
        8,
        include_str!("../../migrations/postgres/0008_console.sql"),
    ),
    (
        9,
        include_str!("../../migrations/postgres/0009_notices.sql"),
    ),
    (
        10,
        include_str!("../../migrations/postgres/0010_event_log_writes.sql"),
    ),
    (
        11,
        include_str!("../../migrations/postgres/0011_outbox_pending.sql"),
    ),
    (
        12,
        include_str!("../../migrations/postgres/0012_outbox_heads.sql"),
    ),
    (
        13,
        include_str!("../../migrations/postgres/0013_outbox_pending_order.sql"),
    ),
    (
        14,
        include_str!("../../migrations/postgres/0014_outbox_hot_claims.sql"),
    ),
    (
        15,
        include_str!("../../migrations/postgres/0015_instances.sql"),
    ),
    (
        16,
        include_str!("../../migrations/postgres/0016_row_mode.sql"),
    ),
    (
        17,
        include_str!("../../migrations/postgres/0017_plugin_outcomes.sql"),
    ),
    (
        18,
        include_str!("../../migrations/postgres/0018_messages_without_foreign_keys.sql"),
    ),
];

/// Whether the PostgreSQL database behind `conn` has every step of
/// [`POSTGRES_MIGRATIONS`] (or a newer build's too: steps only add).
pub(super) async fn is_current(conn: &mut sqlx::AnyConnection) -> Result<bool, sqlx::Error> {
    let latest = POSTGRES_MIGRATIONS.last().map_or(0, |(v, _)| *v);
    // Two statements: the second names a table the first may find missing.
    let (exists,): (bool,) = sqlx::query_as("SELECT to_regclass('schema_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(false);
    }
    let (applied,): (i64,) =
        sqlx::query_as("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            .fetch_one(&mut *conn)
            .await?;
    Ok(applied >= latest)
}

impl Store {
    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Sqlite => self.apply(SQLITE_MIGRATIONS).await,
            Backend::Postgres => self.apply_postgres(POSTGRES_MIGRATIONS).await,
        }
    }

    /// Applies PostgreSQL's pending migrations in one transaction under the
    /// write lock: instances starting together on an empty database take
    /// turns, and the later ones find the schema done (creating even the
    /// migrations table unlocked would race: `IF NOT EXISTS` is no lock).
    pub(super) async fn apply_postgres(
        &self,
        migrations: &[(i64, &str)],
    ) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await.ctx("locking the schema")?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, PG_BEGIN_WRITE)
            .await
            .ctx("locking the schema")?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS schema_migrations \
             (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await
        .ctx("creating the migrations table")?;
        let done: Vec<(i64,)> = sqlx::query_as("SELECT version FROM schema_migrations")
            .fetch_all(&mut *tx)
            .await
            .ctx("reading applied migrations")?;
        let mut applied = Vec::new();
        for (version, sql) in migrations {
            if done.iter().any(|(v,)| v == version) {
                continue;
            }
            sqlx::raw_sql(sql)
                .execute(&mut *tx)
                .await
                .map_err(|source| StoreError::Migration {
                    version: *version,
                    source,
                })?;
            sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)")
                .bind(*version)
                .bind(crate::clock::now_ms())
                .execute(&mut *tx)
                .await
                .ctx("recording a migration")?;
            applied.push(*version);
        }
        tx.commit().await.ctx("committing the migrations")?;
        // Made before the schema was current (this start's migrations or
        // another instance's still running), this connection may lack the
        // statements a begin `EXECUTE`s (`prepared.rs`); a begin that finds
        // one missing recovers, but leaves an `ERROR` line in the server's
        // log. Closed, not kept: the pool's next connection gets them all.
        if let Err(e) = conn.close().await {
            tracing::debug!(error = %e, "closing the migrations' connection");
        }
        for version in applied {
            tracing::info!(version, "applied migration");
        }
        Ok(())
    }

    pub(super) async fn apply(&self, migrations: &[(i64, &str)]) -> Result<(), StoreError> {
        self.pool
            .execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations \
                 (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
            )
            .await
            .ctx("creating the migrations table")?;
        for (version, sql) in migrations {
            let mut w = self.begin_write().await?;
            let done: Option<(i64,)> =
                sqlx::query_as("SELECT version FROM schema_migrations WHERE version = $1")
                    .bind(*version)
                    .fetch_optional(&mut *w.tx)
                    .await
                    .ctx("reading applied migrations")?;
            if done.is_some() {
                continue;
            }
            sqlx::raw_sql(sql)
                .execute(&mut *w.tx)
                .await
                .map_err(|source| StoreError::Migration {
                    version: *version,
                    source,
                })?;
            sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)")
                .bind(*version)
                .bind(crate::clock::now_ms())
                .execute(&mut *w.tx)
                .await
                .ctx("recording a migration")?;
            w.commit().await?;
            tracing::info!(version, "applied migration");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh database's first start: the connection that found no schema
    /// and applied it is not kept, and the one the pool makes next has
    /// every statement a begin `EXECUTE`s, so no begin finds one missing
    /// (each such find is an `ERROR` line in the server's log).
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn the_first_start_keeps_no_connection_without_the_statements() {
        use sqlx::Connection;
        let url = crate::store::required_test_postgres_url().await;
        sqlx::any::install_default_drivers();
        let mut before = sqlx::AnyConnection::connect(&url).await.expect("connect");
        assert!(
            !is_current(&mut before).await.expect("look"),
            "an empty database"
        );
        let store = crate::store::test_postgres_one_connection_at(&url).await;
        let mut conn = store.pool().acquire().await.expect("the pool's connection");
        assert!(is_current(&mut conn).await.expect("look"), "migrated");
        let (prepared,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM pg_prepared_statements WHERE name LIKE 'hub\\_%'")
                .fetch_one(&mut *conn)
                .await
                .expect("statements");
        assert_eq!(
            usize::try_from(prepared).ok(),
            Some(crate::store::prepared::prepare_statements(&[]).len())
        );
        // A schema a step behind this build's (an upgrade under way) is not
        // current: a connection made then is given no statements.
        let latest = POSTGRES_MIGRATIONS.last().map_or(0, |(v, _)| *v);
        sqlx::query("DELETE FROM schema_migrations WHERE version = $1")
            .bind(latest)
            .execute(&mut *conn)
            .await
            .expect("one step back");
        assert!(!is_current(&mut conn).await.expect("look"), "a step behind");
    }
}
