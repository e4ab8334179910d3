//! The locks row-mode writers take on PostgreSQL ([`Store::begin_row_write`]):
//! what two instances may write at once is kept apart here, per key, instead
//! of by one turn for every writer.
//!
//! Two keys exist, both transaction-scoped advisory locks (released at
//! commit or rollback) hashed from text by the database:
//! - a **sender** (`<channel id>:<external key>`): its client row, its live
//!   chat, the messages of its chats (so message ids grow in commit order
//!   per client, which streams resume by), its chats' state and the
//!   webhook sequence numbers taken for it;
//! - an **order key** (`outbox:<key>`): which pending row of the key is its
//!   head (a row queued and a row finished at once would otherwise each
//!   miss the other, and the next row would never go).
//!
//! Each statement here takes all its keys sorted, so writers that take
//! theirs in one statement never wait for one another in a circle; a key
//! taken later (one `enqueue`) can meet another writer's in a cycle, which
//! PostgreSQL breaks by failing one transaction, and the batch writers then
//! write their jobs one by one. On SQLite everything here does nothing:
//! it has one writer.
//!
//! [`Store::begin_row_write`]: super::Store::begin_row_write

use sqlx::AnyConnection;

use super::batch::Literal;
use super::prepared;
use super::{Ctx, StoreError, is_postgres};

/// The sender key of `(channel, key)` as SQL over columns or fields `ch`, `k`.
fn sender_key(ch: &str, k: &str) -> String {
    format!("hashtextextended(CAST({ch} AS TEXT) || ':' || {k}, 0)")
}

/// The order key `key` as SQL.
fn order_key(key: &str) -> String {
    format!("hashtextextended('outbox:' || {key}, 0)")
}

/// What a row-mode writer locks in the round trip that begins its
/// transaction ([`Store::begin_row_write_locking`]): one round trip less
/// per batch than a statement of its own. Each set is one sorted run.
///
/// [`Store::begin_row_write_locking`]: super::Store::begin_row_write_locking
#[derive(Debug, Default)]
pub struct RowLocks {
    /// Senders (channel id, external key).
    pub senders: Vec<(i64, String)>,
    /// Chats, by their senders, with [`order_keys`](RowLocks::order_keys)
    /// in the same run.
    pub chats: Vec<i64>,
    pub order_keys: Vec<String>,
    /// Outbox rows, by their order keys (before they are finished).
    pub outbox_rows: Vec<i64>,
}

impl RowLocks {
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
            && self.chats.is_empty()
            && self.order_keys.is_empty()
            && self.outbox_rows.is_empty()
    }

    /// The statements, separated by `;`, with the keys written in as
    /// hexadecimal (`decode`), so no text a customer or integrator sent is
    /// ever part of a statement's syntax. Planned in every round trip: for
    /// the begins that cannot give a connection the prepared ones
    /// ([`executes`](RowLocks::executes)).
    pub(super) fn statements(&self) -> Result<String, StoreError> {
        self.each(|statement, lists| statement.inline(lists))
    }

    /// The same as `EXECUTE`s of the connection's [`prepared`] statements:
    /// planned once per connection, not in every round trip (a sender
    /// lock's planning took longer than its execution: 0.05–0.26 ms a
    /// batch, `pg_stat_statements`, 2026-12-03). For a begin that gives a
    /// connection without them every statement
    /// (`Store::begin_row_write_reading`).
    pub(super) fn executes(&self) -> Result<String, StoreError> {
        self.each(|statement, lists| statement.execute(lists))
    }

    /// `write` of each lock statement this takes, with its lists as JSON,
    /// joined by `;`.
    fn each(
        &self,
        write: impl Fn(&prepared::Prepared, &[Literal<'_>]) -> Result<String, StoreError>,
    ) -> Result<String, StoreError> {
        let mut statements = Vec::new();
        if !self.senders.is_empty() {
            let list: Vec<serde_json::Value> = self
                .senders
                .iter()
                .map(|(ch, k)| serde_json::json!({ "ch": ch, "k": k }))
                .collect();
            statements.push(write(
                &prepared::LOCK_SENDERS,
                &[Literal::Text(&json(&list))],
            )?);
        }
        if !self.chats.is_empty() || !self.order_keys.is_empty() {
            statements.push(write(
                &prepared::LOCK_CHATS,
                &[
                    Literal::Text(&json(&self.chats)),
                    Literal::Text(&json(&self.order_keys)),
                ],
            )?);
        }
        if !self.outbox_rows.is_empty() {
            statements.push(write(
                &prepared::LOCK_ROWS,
                &[Literal::Text(&json(&self.outbox_rows))],
            )?);
        }
        Ok(statements.join("; "))
    }
}

/// `value` as JSON text, for a prepared lock statement's parameter.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "[]".into())
}

/// The lock statements with their lists as parameters (`$1`, `$2`: JSON
/// text), as [`prepared`] gives every connection.
pub(super) fn senders_prepared() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| senders_sql("$1::JSON"))
}

pub(crate) fn chats_prepared() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| chats_sql("$1::JSON", "$2::JSON"))
}

pub(super) fn rows_prepared() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| rows_sql("$1::JSON"))
}

/// Locks the senders in `json`, an SQL expression of a JSON array of
/// `{"ch", "k"}`.
fn senders_sql(json: &str) -> String {
    let key = sender_key("x.ch", "x.k");
    format!(
        "SELECT COUNT(pg_advisory_xact_lock(s.key)) FROM (SELECT DISTINCT {key} AS key \
         FROM json_to_recordset({json}) AS x(ch BIGINT, k TEXT) ORDER BY 1) s"
    )
}

/// Locks the senders of the chats in `chats` and the order keys in `keys`
/// (SQL expressions of JSON arrays) in one sorted run. Each chat is one
/// lookup by key (`LATERAL … LIMIT 1`): joined as a set, PostgreSQL may
/// hash every client of the database for a batch of a few chats.
fn chats_sql(chats: &str, keys: &str) -> String {
    let sender = sender_key("cl.channel_id", "cl.external_key");
    let order = order_key("o.value");
    format!(
        "SELECT COUNT(pg_advisory_xact_lock(s.key)) FROM (SELECT {sender} AS key \
         FROM json_array_elements_text({chats}) v CROSS JOIN LATERAL (SELECT cl.channel_id, \
         cl.external_key FROM chats ch JOIN clients cl ON cl.id = ch.client_id \
         WHERE ch.id = v.value::BIGINT LIMIT 1) cl \
         UNION SELECT {order} FROM json_array_elements_text({keys}) o ORDER BY 1) s"
    )
}

/// Locks the order keys of the outbox rows in `seqs` (an SQL expression of
/// a JSON array).
fn rows_sql(seqs: &str) -> String {
    let key = order_key("o.order_key");
    format!(
        "SELECT COUNT(pg_advisory_xact_lock(s.key)) FROM (SELECT DISTINCT {key} AS key \
         FROM outbox o WHERE o.order_key IS NOT NULL AND o.seq = ANY (ARRAY(SELECT \
         value::BIGINT FROM json_array_elements_text({seqs}))) ORDER BY 1) s"
    )
}

/// Locks the senders of chats `chat_ids` and the order keys `order_keys`,
/// in one sorted run.
pub async fn chats(
    conn: &mut AnyConnection,
    chat_ids: &[i64],
    order_keys: &[&str],
) -> Result<(), StoreError> {
    if !is_postgres(conn) || (chat_ids.is_empty() && order_keys.is_empty()) {
        return Ok(());
    }
    sqlx::query(chats_prepared())
        .bind(serde_json::to_string(chat_ids).unwrap_or_else(|_| "[]".into()))
        .bind(serde_json::to_string(order_keys).unwrap_or_else(|_| "[]".into()))
        .execute(conn)
        .await
        .ctx("locking the batch's chats")?;
    Ok(())
}

/// Locks order key `key` (before a row of it is queued).
pub async fn order_key_of(conn: &mut AnyConnection, key: &str) -> Result<(), StoreError> {
    if !is_postgres(conn) {
        return Ok(());
    }
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| format!("SELECT pg_advisory_xact_lock({})", order_key("$1")));
    sqlx::query(sql)
        .bind(key)
        .execute(conn)
        .await
        .ctx("locking an order key")?;
    Ok(())
}

/// Locks the order keys of outbox rows `seqs` (before they are finished).
pub async fn order_keys_of_rows(conn: &mut AnyConnection, seqs: &[i64]) -> Result<(), StoreError> {
    if !is_postgres(conn) || seqs.is_empty() {
        return Ok(());
    }
    let sql = rows_prepared();
    // Kept plans read by key: row-mode writers plan without whole-table
    // scans (`PG_KEYED_PLANS`).
    sqlx::query(sql)
        .bind(serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into()))
        .execute(conn)
        .await
        .ctx("locking the results' order keys")?;
    Ok(())
}
