//! What each live plugin did to each event (`plugin_outcomes`), the inbound
//! payloads an operator chose to keep (`inbound_payloads`), and the
//! read-only view of a database that `hub plugin replay` reads them from.

use std::time::Duration;

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, ConnectOptions, Connection, Row};

use super::batch::Literal;
use super::events::event_from_row;
use super::{Ctx, Store, StoreError};
use crate::event::Event;

/// One plugin call of an event's live chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeRow {
    pub event_id: String,
    /// The call's place in the event's chain, from 0.
    pub position: i64,
    pub plugin: String,
    /// `continue`, `changed`, `drop`, `reply` or `failed`.
    pub verdict: String,
    /// SHA-256 (hex) of the payload the plugin returned, when it changed it.
    pub payload_hash: Option<String>,
    pub forwards: i64,
    pub error_kind: Option<String>,
}

/// Rows written in one transaction at most: a long backlog is several.
const ROWS_PER_WRITE: usize = 500;

impl Store {
    /// Records a batch of outcomes and kept inbound payloads. A row already
    /// there (an event recorded twice) is left as it is.
    pub async fn record_outcomes(
        &self,
        outcomes: &[OutcomeRow],
        inbound: &[(String, String)],
        now: i64,
    ) -> Result<(), StoreError> {
        let postgres = self.backend() == super::Backend::Postgres;
        // Inbound payloads first: whoever sees an event's outcomes finds
        // its kept payload too. One statement per chunk, in the row mode:
        // these are inserts of rows nobody else writes, on the hot path.
        for chunk in inbound.chunks(ROWS_PER_WRITE) {
            let rows: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(id, payload)| serde_json::json!({ "e": id, "p": payload }))
                .collect();
            let sql = if postgres {
                "INSERT INTO inbound_payloads (event_id, payload, created_at) \
                 SELECT x.e, x.p, $2 FROM json_to_recordset($1::JSON) AS x(e TEXT, p TEXT) \
                 ON CONFLICT (event_id) DO NOTHING"
            } else {
                "INSERT INTO inbound_payloads (event_id, payload, created_at) \
                 SELECT json_extract(value, '$.e'), json_extract(value, '$.p'), $2 \
                 FROM json_each($1) WHERE true ON CONFLICT (event_id) DO NOTHING"
            };
            self.insert_rows(sql, rows, now, "keeping inbound payloads")
                .await?;
        }
        for chunk in outcomes.chunks(ROWS_PER_WRITE) {
            let rows: Vec<serde_json::Value> = chunk
                .iter()
                .map(|o| {
                    serde_json::json!({
                        "e": o.event_id, "n": o.position, "p": o.plugin, "v": o.verdict,
                        "h": o.payload_hash, "f": o.forwards, "k": o.error_kind,
                    })
                })
                .collect();
            let sql = if postgres {
                "INSERT INTO plugin_outcomes (event_id, position, plugin, verdict, \
                 payload_hash, forwards, error_kind, created_at) \
                 SELECT x.e, x.n, x.p, x.v, x.h, x.f, x.k, $2 FROM json_to_recordset($1::JSON) \
                 AS x(e TEXT, n BIGINT, p TEXT, v TEXT, h TEXT, f BIGINT, k TEXT) \
                 ON CONFLICT (event_id, position) DO NOTHING"
            } else {
                "INSERT INTO plugin_outcomes (event_id, position, plugin, verdict, \
                 payload_hash, forwards, error_kind, created_at) \
                 SELECT json_extract(value, '$.e'), json_extract(value, '$.n'), \
                 json_extract(value, '$.p'), json_extract(value, '$.v'), \
                 json_extract(value, '$.h'), json_extract(value, '$.f'), \
                 json_extract(value, '$.k'), $2 FROM json_each($1) WHERE true \
                 ON CONFLICT (event_id, position) DO NOTHING"
            };
            self.insert_rows(sql, rows, now, "recording plugin outcomes")
                .await?;
        }
        Ok(())
    }

    /// Runs one `INSERT … SELECT` over `rows` (`$1`, a JSON array) and
    /// `now` (`$2`) in a transaction of its own, in the row mode: on
    /// PostgreSQL one round trip (the values written in), not the four of
    /// a transaction begun, written and committed statement by statement.
    async fn insert_rows(
        &self,
        sql: &str,
        rows: Vec<serde_json::Value>,
        now: i64,
        what: &'static str,
    ) -> Result<(), StoreError> {
        let rows = serde_json::Value::Array(rows).to_string();
        self.write_alone(sql, &[Literal::Text(&rows), Literal::Int(now)], what)
            .await
    }

    /// Deletes kept inbound payloads older than `before` (ms), a bounded
    /// number per transaction; how many went.
    pub async fn prune_inbound(&self, before: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let mut w = self.begin_write().await?;
            let done = sqlx::query(
                "DELETE FROM inbound_payloads WHERE event_id IN \
                 (SELECT event_id FROM inbound_payloads WHERE created_at < $1 LIMIT 1000)",
            )
            .bind(before)
            .execute(&mut *w.tx)
            .await
            .ctx("pruning inbound payloads")?
            .rows_affected();
            w.commit().await?;
            total += done;
            if done < 1000 {
                return Ok(total);
            }
        }
    }

    /// The recorded outcomes of one event, in chain order.
    pub async fn outcomes_of(&self, event_id: &str) -> Result<Vec<OutcomeRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTCOME_COLUMNS} FROM plugin_outcomes WHERE event_id = $1 ORDER BY position"
        ))
        .bind(event_id)
        .fetch_all(self.pool())
        .await
        .ctx("reading plugin outcomes")?;
        rows.iter().map(outcome_from_row).collect()
    }
}

const OUTCOME_COLUMNS: &str =
    "event_id, position, plugin, verdict, payload_hash, forwards, error_kind";

fn outcome_from_row(row: &sqlx::any::AnyRow) -> Result<OutcomeRow, StoreError> {
    let get = |e| StoreError::Db {
        context: "reading plugin outcomes",
        source: e,
    };
    Ok(OutcomeRow {
        event_id: row.try_get("event_id").map_err(get)?,
        position: row.try_get("position").map_err(get)?,
        plugin: row.try_get("plugin").map_err(get)?,
        verdict: row.try_get("verdict").map_err(get)?,
        payload_hash: row.try_get("payload_hash").map_err(get)?,
        forwards: row.try_get("forwards").map_err(get)?,
        error_kind: row.try_get("error_kind").map_err(get)?,
    })
}

/// Which recorded events a replay reads.
#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    /// Events at or after this time (ms).
    pub since: Option<i64>,
    /// Event ids (time-ordered UUIDs) from and to, both included.
    pub from: Option<String>,
    pub to: Option<String>,
    pub kind: Option<String>,
    pub channel_id: Option<i64>,
}

/// A recorded event with what is known of its live run.
#[derive(Debug)]
pub struct Recorded {
    pub event: Event,
    pub outcomes: Vec<OutcomeRow>,
    /// The payload as it entered, when the operator keeps those.
    pub inbound: Option<String>,
}

/// One connection to a hub's database that cannot change it: SQLite opened
/// read-only, PostgreSQL in read-only transactions. No migration runs: a
/// database the hub has not migrated to step 17 has no outcomes to read.
pub struct ReadOnlyLog {
    conn: AnyConnection,
    outcomes: bool,
    inbound: bool,
}

impl ReadOnlyLog {
    pub async fn open(url: &str) -> Result<ReadOnlyLog, StoreError> {
        sqlx::any::install_default_drivers();
        let postgres = !url.starts_with("sqlite:");
        let url = if postgres {
            url.to_owned()
        } else {
            let base = url.split('?').next().unwrap_or(url);
            format!("{base}?mode=ro")
        };
        let options: AnyConnectOptions = url.parse().map_err(|source| StoreError::Db {
            context: "reading the database URL",
            source,
        })?;
        let options = options.disable_statement_logging();
        let mut conn = tokio::time::timeout(
            Duration::from_secs(30),
            AnyConnection::connect_with(&options),
        )
        .await
        .map_err(|_| StoreError::Unreachable {
            target: super::redacted_url(&url),
            reason: "no connection within 30 s".to_owned(),
        })?
        .ctx("connecting to the database read-only")?;
        if postgres {
            sqlx::query("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
                .execute(&mut conn)
                .await
                .ctx("making the session read-only")?;
        }
        let outcomes = has_table(&mut conn, postgres, "plugin_outcomes").await?;
        let inbound = has_table(&mut conn, postgres, "inbound_payloads").await?;
        Ok(ReadOnlyLog {
            conn,
            outcomes,
            inbound,
        })
    }

    /// Up to `limit` events matching `filter` after `after` (the id last
    /// read), oldest first, with their outcomes and kept inbound payloads.
    pub async fn page(
        &mut self,
        filter: &LogFilter,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Recorded>, StoreError> {
        let mut sql = "SELECT id, kind, direction, channel_id, chat_id, payload, created_at \
                       FROM events WHERE 1 = 1"
            .to_owned();
        let mut n = 0;
        let mut arg = |sql: &mut String, clause: &str| {
            n += 1;
            sql.push_str(&clause.replace('?', &format!("${n}")));
        };
        if after.is_some() {
            arg(&mut sql, " AND id > ?");
        }
        if filter.since.is_some() {
            arg(&mut sql, " AND created_at >= ?");
        }
        if filter.from.is_some() {
            arg(&mut sql, " AND id >= ?");
        }
        if filter.to.is_some() {
            arg(&mut sql, " AND id <= ?");
        }
        if filter.kind.is_some() {
            arg(&mut sql, " AND kind = ?");
        }
        if filter.channel_id.is_some() {
            arg(&mut sql, " AND channel_id = ?");
        }
        arg(&mut sql, " ORDER BY id LIMIT ?");
        let mut q = sqlx::query(&sql);
        if let Some(a) = after {
            q = q.bind(a);
        }
        if let Some(s) = filter.since {
            q = q.bind(s);
        }
        if let Some(f) = &filter.from {
            q = q.bind(f);
        }
        if let Some(t) = &filter.to {
            q = q.bind(t);
        }
        if let Some(k) = &filter.kind {
            q = q.bind(k);
        }
        if let Some(c) = filter.channel_id {
            q = q.bind(c);
        }
        let rows = q
            .bind(limit)
            .fetch_all(&mut self.conn)
            .await
            .ctx("reading recorded events")?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(Recorded {
                event: event_from_row(row)?,
                outcomes: Vec::new(),
                inbound: None,
            });
        }
        let (Some(first), Some(last)) = (out.first(), out.last()) else {
            return Ok(out);
        };
        let (lo, hi) = (first.event.id.to_string(), last.event.id.to_string());
        if self.outcomes {
            let rows = sqlx::query(&format!(
                "SELECT {OUTCOME_COLUMNS} FROM plugin_outcomes \
                 WHERE event_id >= $1 AND event_id <= $2 ORDER BY event_id, position"
            ))
            .bind(&lo)
            .bind(&hi)
            .fetch_all(&mut self.conn)
            .await
            .ctx("reading plugin outcomes")?;
            let mut by_id = std::collections::HashMap::<String, Vec<OutcomeRow>>::new();
            for row in &rows {
                let o = outcome_from_row(row)?;
                by_id.entry(o.event_id.clone()).or_default().push(o);
            }
            for r in &mut out {
                r.outcomes = by_id.remove(&r.event.id.to_string()).unwrap_or_default();
            }
        }
        if self.inbound {
            let rows = sqlx::query(
                "SELECT event_id, payload FROM inbound_payloads \
                 WHERE event_id >= $1 AND event_id <= $2",
            )
            .bind(&lo)
            .bind(&hi)
            .fetch_all(&mut self.conn)
            .await
            .ctx("reading kept inbound payloads")?;
            let mut by_id = std::collections::HashMap::<String, String>::new();
            for row in &rows {
                let id: String = row
                    .try_get("event_id")
                    .ctx("reading kept inbound payloads")?;
                let p: String = row
                    .try_get("payload")
                    .ctx("reading kept inbound payloads")?;
                by_id.insert(id, p);
            }
            for r in &mut out {
                r.inbound = by_id.remove(&r.event.id.to_string());
            }
        }
        Ok(out)
    }

    /// A plugin's key-value entries (key, value, updated_at), for the
    /// candidate's scratch copy.
    pub async fn kv_entries(
        &mut self,
        plugin: &str,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT key, value, updated_at FROM plugin_kv WHERE plugin = $1")
            .bind(plugin)
            .fetch_all(&mut self.conn)
            .await
            .ctx("reading a plugin's keys")?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("key")?,
                    r.try_get("value")?,
                    r.try_get("updated_at")?,
                ))
            })
            .collect::<Result<_, sqlx::Error>>()
            .ctx("reading a plugin's keys")
    }

    /// Channel ids by name, and names by id.
    pub async fn channels(&mut self) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query("SELECT id, name FROM channels")
            .fetch_all(&mut self.conn)
            .await
            .ctx("reading channels")?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("name")?)))
            .collect::<Result<_, sqlx::Error>>()
            .ctx("reading channels")
    }

    pub async fn close(self) {
        let _ = self.conn.close().await;
    }
}

impl Store {
    /// Copies entries into `plugin`'s namespace (a scratch database's).
    pub async fn kv_seed(
        &self,
        plugin: &str,
        entries: &[(String, String, i64)],
    ) -> Result<(), StoreError> {
        let mut w = self.begin_write().await?;
        for (key, value, at) in entries {
            sqlx::query(
                "INSERT INTO plugin_kv (plugin, key, value, updated_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(plugin)
            .bind(key)
            .bind(value)
            .bind(*at)
            .execute(&mut *w.tx)
            .await
            .ctx("copying a plugin's keys")?;
        }
        w.commit().await
    }
}

async fn has_table(
    conn: &mut AnyConnection,
    postgres: bool,
    table: &str,
) -> Result<bool, StoreError> {
    let sql = if postgres {
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = $1"
    } else {
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1"
    };
    let (n,): (i64,) = sqlx::query_as(sql)
        .bind(table)
        .fetch_one(conn)
        .await
        .ctx("reading the schema")?;
    Ok(n > 0)
}
