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

use super::{Ctx, StoreError, is_postgres};

/// The sender key of `(channel, key)` as SQL over columns or fields `ch`, `k`.
fn sender_key(ch: &str, k: &str) -> String {
    format!("hashtextextended(CAST({ch} AS TEXT) || ':' || {k}, 0)")
}

/// The order key `key` as SQL.
fn order_key(key: &str) -> String {
    format!("hashtextextended('outbox:' || {key}, 0)")
}

/// Locks the senders `(channel id, external key)`; waits for any writer
/// that holds one of them.
pub async fn senders(
    conn: &mut AnyConnection,
    senders: &[(i64, String)],
) -> Result<(), StoreError> {
    if !is_postgres(conn) || senders.is_empty() {
        return Ok(());
    }
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let key = sender_key("x.ch", "x.k");
        format!(
            "SELECT COUNT(pg_advisory_xact_lock(s.key)) FROM (SELECT DISTINCT {key} AS key \
             FROM json_to_recordset($1::JSON) AS x(ch BIGINT, k TEXT) ORDER BY 1) s"
        )
    });
    let list: Vec<serde_json::Value> = senders
        .iter()
        .map(|(ch, k)| serde_json::json!({ "ch": ch, "k": k }))
        .collect();
    sqlx::query(sql)
        .bind(serde_json::Value::Array(list).to_string())
        .execute(conn)
        .await
        .ctx("locking the batch's senders")?;
    Ok(())
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
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let sender = sender_key("cl.channel_id", "cl.external_key");
        let order = order_key("o.value");
        format!(
            "SELECT COUNT(pg_advisory_xact_lock(s.key)) FROM (SELECT {sender} AS key \
             FROM chats ch JOIN clients cl ON cl.id = ch.client_id \
             WHERE ch.id IN (SELECT value::BIGINT FROM json_array_elements_text($1::JSON)) \
             UNION SELECT {order} FROM json_array_elements_text($2::JSON) o ORDER BY 1) s"
        )
    });
    sqlx::query(sql)
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
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let key = order_key("o.order_key");
        format!(
            "SELECT COUNT(pg_advisory_xact_lock(s.key)) FROM (SELECT DISTINCT {key} AS key \
             FROM outbox o WHERE o.order_key IS NOT NULL AND o.seq = ANY (ARRAY(SELECT \
             value::BIGINT FROM json_array_elements_text($1::JSON))) ORDER BY 1) s"
        )
    });
    // Planned per batch like the results it comes before: a prepared plan
    // kept from when the outbox was small reads the whole outbox behind a
    // sudden backlog, until autovacuum happens to analyze it.
    super::batch::planned_per_batch(conn, sql)
        .bind(serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into()))
        .execute(conn)
        .await
        .ctx("locking the results' order keys")?;
    Ok(())
}
