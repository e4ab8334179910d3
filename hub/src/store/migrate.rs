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
        let mut tx = self
            .pool
            .begin_with(PG_BEGIN_WRITE)
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
