//! Writing the outbox: queueing a row in the transaction of its change,
//! staged bodies and answers, and final results (one at a time, or as a
//! batch: one script on SQLite, one statement on PostgreSQL).

use super::*;
const UNSTAGE: &str = "UPDATE outbox SET staged = 0, body = $1 WHERE id = $2";

impl Store {
    /// [`unstage`] in a write of its own (nothing else changed with it):
    /// on PostgreSQL one round trip.
    pub async fn unstage(&self, id: &str, body: &str) -> Result<(), StoreError> {
        self.write_alone(
            UNSTAGE,
            &[Literal::Text(body), Literal::Text(id)],
            "unstaging a delivery",
        )
        .await
    }
}

/// Takes a staged row out of staging with the body its plugins left.
pub async fn unstage(conn: &mut AnyConnection, id: &str, body: &str) -> Result<(), StoreError> {
    sqlx::query(UNSTAGE)
        .bind(body)
        .bind(id)
        .execute(conn)
        .await
        .ctx("unstaging a delivery")?;
    Ok(())
}

/// Keeps the start of a receiver's answer for operators.
pub async fn set_response(
    conn: &mut AnyConnection,
    id: &str,
    answer: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE outbox SET response = $1 WHERE id = $2")
        .bind(kept_answer(answer))
        .bind(id)
        .execute(conn)
        .await
        .ctx("keeping a delivery's answer")?;
    Ok(())
}

/// Appends an operator note to a delivery (shown by `GET /admin/v1/deliveries/{id}`).
pub async fn add_note(conn: &mut AnyConnection, id: &str, note: &str) -> Result<(), StoreError> {
    let row: Option<(Option<String>,)> = sqlx::query_as("SELECT notes FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .ctx("reading a delivery's notes")?;
    let Some((notes,)) = row else { return Ok(()) };
    let mut list = parse_notes(notes);
    list.push(note.chars().take(1000).collect());
    let text = serde_json::to_string(&list)
        .map_err(|e| StoreError::Corrupt(format!("delivery notes: {e}")))?;
    sqlx::query("UPDATE outbox SET notes = $1 WHERE id = $2")
        .bind(text)
        .bind(id)
        .execute(conn)
        .await
        .ctx("writing a delivery's notes")?;
    Ok(())
}

pub(super) fn parse_notes(notes: Option<String>) -> Vec<String> {
    notes
        .and_then(|n| serde_json::from_str(&n).ok())
        .unwrap_or_default()
}

pub async fn enqueue(
    conn: &mut AnyConnection,
    d: &NewDelivery,
    now: i64,
) -> Result<(), StoreError> {
    // The head is decided on the key's pending rows: nobody may queue or
    // finish a row of the key meanwhile (see `locks`).
    if let Some(key) = d.order_key.as_deref() {
        crate::store::locks::order_key_of(conn, key).await?;
    }
    sqlx::query(
        "INSERT INTO outbox (id, event_id, kind, policy, target_url, body, chunked, order_key, \
         message_id, chat_id, state, attempts, next_attempt_at, created_at, staged, secret, \
         head) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', 0, $11, $11, $12, $13, \
         CASE WHEN $8 IS NULL OR NOT EXISTS (SELECT 1 FROM outbox p \
         WHERE p.order_key = $8 AND p.state = 'pending') THEN 1 ELSE 0 END)",
    )
    .bind(d.id.to_string())
    .bind(d.event_id.to_string())
    .bind(d.kind.as_str())
    .bind(d.policy.as_str())
    .bind(d.target_url.as_str())
    .bind(d.body.as_str())
    .bind(i64::from(d.chunked))
    .bind(d.order_key.as_deref())
    .bind(d.message_id)
    .bind(d.chat_id)
    .bind(now)
    .bind(i64::from(d.staged))
    .bind(d.secret.as_deref())
    .execute(conn)
    .await
    .ctx("queueing a delivery")?;
    Ok(())
}

/// Marks a row finished for good; `attempts` is how many HTTP attempts it had.
pub async fn finish(
    conn: &mut AnyConnection,
    id: &str,
    state: OutboxState,
    error: Option<&str>,
    attempts: i64,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE outbox SET state = $1, last_error = COALESCE($2, last_error), lease_until = NULL, \
         finished_at = $3, attempts = $4 WHERE id = $5",
    )
    .bind(state.as_str())
    .bind(error)
    .bind(now)
    .bind(attempts)
    .bind(id)
    .execute(&mut *conn)
    .await
    .ctx("finishing a delivery")?;
    promote_next(conn, id).await
}

/// After a row left the queue: the next row of its order key is the key's
/// head, which the claim reads (see migration 12). `id` is the row's.
pub(super) async fn promote_next(conn: &mut AnyConnection, id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE outbox SET head = 1 WHERE seq = (SELECT MIN(p.seq) FROM outbox p \
         WHERE p.state = 'pending' AND p.order_key = \
         (SELECT f.order_key FROM outbox f WHERE f.id = $1))",
    )
    .bind(id)
    .execute(conn)
    .await
    .ctx("moving an order key's head")?;
    Ok(())
}

/// A delivery's final result, as [`finish_many`] writes it.
#[derive(Debug)]
pub struct Finished {
    /// The outbox row (`Claimed::seq`).
    pub seq: i64,
    pub state: OutboxState,
    pub error: Option<String>,
    /// How many HTTP attempts it had.
    pub attempts: i64,
    /// The receiver's answer, kept for operators.
    pub answer: Option<String>,
    /// The message whose delivery state this settles, and that state.
    pub message: Option<(i64, DeliveryState)>,
    /// The result's event-log row.
    pub event: Event,
    pub now: i64,
}

#[cfg(test)]
impl Finished {
    /// Row `seq` delivered at `now` with an empty answer (tests).
    pub(crate) fn delivered(seq: i64, now: i64) -> Finished {
        Finished {
            seq,
            state: OutboxState::Delivered,
            error: None,
            attempts: 1,
            answer: Some("{}".into()),
            message: None,
            event: Event::new(
                crate::event::EventKind::DELIVERY_RESULT,
                crate::event::Direction::Out,
                serde_json::json!({}),
            ),
            now,
        }
    }
}

/// Largest batch of results [`finish_many`] takes.
pub const MAX_FINISHED: usize = 128;

/// Records final results in the caller's transaction, in one round trip
/// however many there are: what [`finish`], [`set_response`],
/// `set_message_delivery` and `insert_event` do for one.
///
/// On PostgreSQL the transaction is exclusive or holds the rows' order keys
/// (`RowLocks::outbox_rows`, or [`locks::order_keys_of_rows`]).
///
/// [`locks::order_keys_of_rows`]: crate::store::locks::order_keys_of_rows
/// `first`: when [`finish_statement`] was sent with the transaction's
/// begin, the rows are written already.
///
/// Whether a row became its order key's head (on SQLite, whose script does
/// not say, always): it may be due, and the deliverer should look.
pub async fn finish_many(
    conn: &mut AnyConnection,
    rows: &[&Finished],
    first: Option<FirstRows>,
) -> Result<bool, StoreError> {
    if rows.is_empty() {
        return Ok(false);
    }
    if let Some(FirstRows(first)) = first {
        return Ok(!is_postgres(conn) || new_heads(first.first())?);
    }
    if is_postgres(conn) {
        return finish_postgres(conn, rows).await;
    }
    batch::run(conn, finish_script(rows), FINISHING).await?;
    Ok(true)
}

/// [`PG_FINISH`]'s row: whether it made new heads.
fn new_heads(row: Option<&AnyRow>) -> Result<bool, StoreError> {
    let Some(row) = row else {
        return Ok(true);
    };
    let heads: i64 = row.try_get(0).ctx(FINISHING)?;
    Ok(heads > 0)
}

/// SQLite: the batch's script over a temporary table, with its values.
fn finish_script(rows: &[&Finished]) -> batch::Query<'static> {
    let slots = slots_for(rows.len());
    let mut query = sqlx::query(FINISH_SCRIPTS.get(slots));
    for (ord, row) in rows.iter().enumerate() {
        let e = &row.event;
        query = query
            .bind(ord as i64)
            .bind(row.seq)
            .bind(row.state.as_str())
            .bind(row.error.clone())
            .bind(row.attempts)
            .bind(row.answer.as_deref().map(kept_answer))
            .bind(row.now)
            .bind(row.message.map(|(id, _)| id))
            .bind(row.message.map(|(_, state)| state.as_str()))
            .bind(e.id.to_string())
            .bind(e.kind.as_str().to_owned())
            .bind(e.direction.as_str())
            .bind(e.channel_id)
            .bind(e.chat_id)
            .bind(e.payload.to_string())
            .bind(e.at);
    }
    batch::pad_slots(query, FINISH_COLUMNS, rows.len(), slots)
}

/// PostgreSQL: the batch as the JSON parameter of one statement (PostgreSQL
/// runs no script of several statements with parameters): the results with
/// their messages, the order keys' new heads and the event-log rows: one
/// round trip, not two, while the write turn is held.
async fn finish_postgres(conn: &mut AnyConnection, rows: &[&Finished]) -> Result<bool, StoreError> {
    let row = sqlx::query(PG_FINISH)
        .bind(finished_json(rows)?)
        .bind(rows.len() as i64)
        .fetch_optional(&mut *conn)
        .await
        .ctx(FINISHING)?;
    new_heads(row.as_ref())
}

const FINISHING: &str = "recording delivery results";

/// [`finish_many`]'s statement for `rows` (on PostgreSQL [`PG_FINISH`]),
/// to send with the begin of their transaction
/// ([`Store::begin_row_write_reading`]); then [`finish_many`] has nothing
/// left to do.
///
/// [`Store::begin_row_write_reading`]: crate::store::Store::begin_row_write_reading
pub fn finish_statement(
    rows: &[&Finished],
    backend: Backend,
) -> Result<Option<FirstStatement>, StoreError> {
    if rows.is_empty() {
        return Ok(None);
    }
    if backend == Backend::Sqlite {
        return FirstStatement::sqlite(finish_script(rows), true, FINISHING).map(Some);
    }
    let json = finished_json(rows)?;
    prepared::FINISH
        .read(&[Literal::Text(&json), Literal::Int(rows.len() as i64)])
        .map(Some)
}

/// PostgreSQL: the rows for [`PG_FINISH`]'s `$1`.
fn finished_json(rows: &[&Finished]) -> Result<String, StoreError> {
    debug_assert!(rows.iter().all(|r| r.state != OutboxState::Pending));
    let batch: Vec<FinishRow> = rows
        .iter()
        .enumerate()
        .map(|(ord, row)| {
            let e = &row.event;
            FinishRow {
                ord,
                seq: row.seq,
                state: row.state.as_str(),
                error: row.error.as_deref(),
                attempts: row.attempts,
                response: row.answer.as_deref().map(kept_answer),
                now: row.now,
                mid: row.message.map(|(id, _)| id),
                mstate: row.message.map(|(_, state)| state.as_str()),
                eid: e.id.to_string(),
                kind: e.kind.as_str(),
                dir: e.direction.as_str(),
                ch: e.channel_id,
                chat: e.chat_id,
                payload: batch::PayloadCell::of(&e.payload),
                at: e.at,
            }
        })
        .collect();
    serde_json::to_string(&batch)
        .map_err(|e| StoreError::Corrupt(format!("encoding delivery results: {e}")))
}

/// One row of [`PG_FINISH`]'s `$1`, borrowed from the results.
#[derive(serde::Serialize)]
struct FinishRow<'a> {
    ord: usize,
    seq: i64,
    state: &'a str,
    error: Option<&'a str>,
    attempts: i64,
    response: Option<String>,
    now: i64,
    mid: Option<i64>,
    mstate: Option<&'a str>,
    eid: String,
    kind: &'a str,
    dir: &'a str,
    ch: Option<i64>,
    chat: Option<i64>,
    payload: batch::PayloadCell<'a>,
    at: i64,
}

/// `h`: the next pending row of each finished row's order key is its head
/// now. Every part of one statement sees the rows as they were before it,
/// so the finished rows, still pending there, are left out by hand (a
/// result is always final: delivered, failed or dropped), and `h` never
/// changes a row `u` changes. (`= ANY (ARRAY(…))`, not `IN`: the rows to
/// change are then read by `seq` through the primary key; as a join
/// PostgreSQL may hash the whole outbox for them. `u` and `m` are joins
/// with the same `= ANY` beside them, for the plan the server keeps after
/// five runs: the statement is prepared once, not planned per batch.) Its
/// row counts the new heads: without one, no row became due by it, and the
/// deliverer has nothing to claim for it.
pub(in crate::store) const PG_FINISH: &str = "WITH b AS (SELECT * FROM json_to_recordset($1::JSON) AS x(ord BIGINT, \
     seq BIGINT, state TEXT, error TEXT, attempts BIGINT, response TEXT, now BIGINT, \
     mid BIGINT, mstate TEXT, eid TEXT, kind TEXT, dir TEXT, ch BIGINT, chat BIGINT, \
     payload TEXT, at BIGINT) LIMIT $2), \
     u AS (UPDATE outbox SET state = b.state, last_error = COALESCE(b.error, outbox.last_error), \
     lease_until = NULL, finished_at = b.now, attempts = b.attempts, \
     response = COALESCE(b.response, outbox.response) FROM b WHERE outbox.seq = b.seq \
     AND outbox.seq = ANY (ARRAY(SELECT seq FROM b))), \
     m AS (UPDATE messages SET delivery_state = b.mstate, delivery_error = b.error \
     FROM b WHERE messages.id = b.mid AND messages.id = ANY (ARRAY(SELECT mid FROM b))), \
     h AS (UPDATE outbox SET head = 1 WHERE seq = ANY (ARRAY(SELECT (SELECT MIN(p.seq) \
     FROM outbox p WHERE p.order_key = f.order_key AND p.state = 'pending' \
     AND p.seq <> ALL (ARRAY(SELECT seq FROM b))) \
     FROM outbox f WHERE f.order_key IS NOT NULL AND f.seq = ANY (ARRAY(SELECT seq FROM b)))) \
     RETURNING seq), \
     v AS (INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
     SELECT eid, kind, dir, ch, chat, payload, at FROM b WHERE eid IS NOT NULL ORDER BY ord) \
     SELECT COUNT(*) FROM h";

const FINISH_COLUMNS: usize = 16;

static FINISH_SCRIPTS: Scripts = Scripts::new(MAX_FINISHED, build_finish_script);

fn build_finish_script(slots: usize) -> String {
    let values = values(FINISH_COLUMNS, slots);
    [
        "CREATE TEMP TABLE IF NOT EXISTS finish_batch (ord INTEGER, seq INTEGER, \
         state TEXT, error TEXT, attempts INTEGER, response TEXT, now INTEGER, mid INTEGER, \
         mstate TEXT, eid TEXT, kind TEXT, dir TEXT, ch INTEGER, chat INTEGER, \
         payload TEXT, at INTEGER)"
            .to_owned(),
        "DELETE FROM temp.finish_batch".to_owned(),
        format!("INSERT INTO temp.finish_batch VALUES {values}"),
        "UPDATE outbox SET state = b.state, last_error = COALESCE(b.error, outbox.last_error), \
         lease_until = NULL, finished_at = b.now, attempts = b.attempts, \
         response = COALESCE(b.response, outbox.response) \
         FROM temp.finish_batch b WHERE outbox.seq = b.seq"
            .to_owned(),
        // The next rows of their order keys are the keys' heads now.
        "UPDATE outbox SET head = 1 WHERE seq IN (SELECT (SELECT MIN(p.seq) FROM outbox p \
         WHERE p.order_key = f.order_key AND p.state = 'pending') \
         FROM temp.finish_batch b CROSS JOIN outbox f ON f.seq = b.seq \
         WHERE f.order_key IS NOT NULL)"
            .to_owned(),
        "UPDATE messages SET delivery_state = b.mstate, delivery_error = b.error \
         FROM temp.finish_batch b WHERE messages.id = b.mid"
            .to_owned(),
        "INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
         SELECT eid, kind, dir, ch, chat, payload, at FROM temp.finish_batch \
         WHERE eid IS NOT NULL ORDER BY ord"
            .to_owned(),
        "DELETE FROM temp.finish_batch".to_owned(),
    ]
    .join(";\n")
}

/// The start of a receiver's answer that operators see.
fn kept_answer(answer: &str) -> String {
    answer.chars().take(4096).collect()
}
