//! Agent messages and typing notices (and a plugin's automatic replies)
//! written in batches: each message, its event-log row and the outbox row
//! that delivers it, for a whole batch in one round trip.
//!
//! Why: as for customer messages (`ingress.rs`), every statement is a
//! hand-off to the driver's thread and back; one script per batch replaces
//! six statements per message.

use std::collections::HashMap;

use sqlx::{AnyConnection, Row as _};

use super::batch::{Literal, Query, Scripts, json_cell, pad_slots, run, slots_for, values};
use super::chats::{CHAT_COLUMNS, chat_from_row};
use super::prepared;
use super::webhooks::ChatCard;
use super::{
    Author, Backend, Chat, Claimed, Ctx, DeliveryState, FirstRows, FirstStatement, NewDelivery,
    StoreError, TxConn, is_postgres,
};
use crate::event::Event;

/// What failures of this module's statements say.
const WHAT: &str = "storing agent messages";

/// Largest batch the writer takes at once.
pub const MAX_OUTGOING: usize = 128;

/// One message (or typing notice) to a customer.
#[derive(Debug)]
pub struct OutgoingWrite {
    pub chat_id: i64,
    pub uid: String,
    pub author: Author,
    pub agent_id: Option<i64>,
    /// The channel `message` object as stored; `None` for a typing notice.
    pub body: Option<String>,
    /// Answered by a plugin in the integrator's place: delivered already,
    /// and `delivery` is not queued.
    pub answered: bool,
    /// Its event-log row.
    pub event: Event,
    /// The request to the integrator (its `message_id` is filled in here).
    pub delivery: NewDelivery,
    pub now: i64,
}

/// Another row the batch queues with its messages (a webhook its messages
/// caused: the `chat_accepted` of a chat an agent's reply accepted): its
/// event-log row and its outbox row. Its order key is locked already, by
/// whoever made it ([`accept_chats`]): the batch's script decides which
/// pending row of a key is its head.
#[derive(Debug)]
pub struct Queued {
    pub event: Event,
    pub delivery: NewDelivery,
    pub now: i64,
}

/// One row of the batch's table: a message (or typing notice) or a
/// [`Queued`] row, which has no message.
struct Row<'a> {
    uid: Option<&'a str>,
    chat: Option<i64>,
    author: Option<&'a str>,
    agent: Option<i64>,
    body: Option<&'a str>,
    dstate: &'static str,
    now: i64,
    event: &'a Event,
    /// `None` when a plugin answered the message.
    delivery: Option<&'a NewDelivery>,
    /// When its outbox row's lease ends if it is handed to this process's
    /// deliverer (`outbox/handoff.rs`): a message's own row, when it is its
    /// order key's head.
    lease: Option<i64>,
}

impl<'a> Row<'a> {
    fn message(item: &'a OutgoingWrite) -> Row<'a> {
        let state = if item.answered {
            DeliveryState::Delivered
        } else {
            DeliveryState::Pending
        };
        Row {
            uid: Some(&item.uid),
            chat: Some(item.chat_id),
            author: Some(item.author.as_str()),
            agent: item.agent_id,
            body: item.body.as_deref(),
            dstate: state.as_str(),
            now: item.now,
            event: &item.event,
            delivery: (!item.answered).then_some(&item.delivery),
            lease: None,
        }
    }

    fn queued(q: &'a Queued) -> Row<'a> {
        Row {
            uid: None,
            chat: q.delivery.chat_id.or(q.event.chat_id),
            author: None,
            agent: None,
            body: None,
            dstate: DeliveryState::Pending.as_str(),
            now: q.now,
            event: &q.event,
            delivery: Some(&q.delivery),
            lease: None,
        }
    }
}

/// What accepting a batch's chats read for their `chat_accepted` webhooks.
#[derive(Debug)]
pub struct Accepted {
    /// The cards of the chats (those that exist, in no particular order).
    pub cards: Vec<ChatCard>,
    /// A webhook sequence number per chat, ascending.
    pub sequences: Vec<i64>,
}

/// Marks the chats of `accepts` (chat, agent, time; open chats this
/// batch's agents' first replies accept) accepted, reads their cards for
/// their `chat_accepted` webhooks, takes a sequence number for each and,
/// on PostgreSQL, locks the order keys their webhook rows will have: one
/// round trip there however many chats (prepared statements `EXECUTE`d in
/// one simple query: the batch waits for each round trip), three
/// statements on SQLite.
pub async fn accept_chats(
    conn: &mut AnyConnection,
    accepts: &[(i64, i64, i64)],
) -> Result<Accepted, StoreError> {
    if accepts.is_empty() {
        return Ok(Accepted {
            cards: Vec::new(),
            sequences: Vec::new(),
        });
    }
    let ids: Vec<i64> = accepts.iter().map(|(chat, _, _)| *chat).collect();
    if !is_postgres(conn) {
        super::chats::mark_accepted(conn, accepts).await?;
        return Ok(Accepted {
            cards: super::webhooks::chat_cards(conn, &ids).await?,
            sequences: super::webhooks::next_sequences_on_sqlite(conn, ids.len()).await?,
        });
    }
    let count = Literal::Int(accepts.len() as i64);
    let list = super::chats::accepts_json(accepts);
    let id_list = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_owned());
    let locks = super::locks::RowLocks {
        order_keys: ids
            .iter()
            .filter_map(|chat| {
                super::outbox::webhook_order_key("webhook.chat_accepted", Some(*chat), None)
            })
            .collect(),
        ..Default::default()
    };
    let sql = [
        prepared::ACCEPT_CHATS.execute(&[Literal::Text(&list), count])?,
        prepared::CHAT_CARDS.execute(&[Literal::Text(&id_list), Literal::Int(ids.len() as i64)])?,
        locks.statements()?,
        super::batch::inline(
            super::webhooks::PG_SEQUENCES,
            &[Literal::Int(ids.len() as i64)],
        )?,
    ]
    .join("; ");
    let mut statements = super::batch::run_simple(conn, &sql, "accepting chats").await?;
    if statements.len() != 4 {
        return Err(StoreError::Corrupt(format!(
            "accepting chats returned {} statements' rows for 4",
            statements.len()
        )));
    }
    let sequences = statements
        .pop()
        .unwrap_or_default()
        .iter()
        .map(|row| row.try_get::<i64, _>(0).ctx("numbering webhooks"))
        .collect::<Result<_, _>>()?;
    let cards = statements
        .get(1)
        .map(|rows| {
            rows.iter()
                .map(super::webhooks::chat_card_from_row)
                .collect()
        })
        .unwrap_or(Ok(Vec::new()))?;
    Ok(Accepted { cards, sequences })
}

/// The chats' read, sent with the begin of the batch's
/// transaction ([`Store::begin_row_write_reading`]); its rows go to
/// [`chats_by_ids`].
///
/// [`Store::begin_row_write_reading`]: super::Store::begin_row_write_reading
pub fn chats_read(ids: &[i64], backend: Backend) -> Result<Option<FirstStatement>, StoreError> {
    if ids.is_empty() {
        return Ok(None);
    }
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
    let count = ids.len() as i64;
    if backend == Backend::Sqlite {
        let query = sqlx::query(chats_sql(false)).bind(list).bind(count);
        return FirstStatement::sqlite(query, false, LOOKING_UP).map(Some);
    }
    prepared::CHATS_BY_IDS
        .read(&[Literal::Text(&list), Literal::Int(count)])
        .map(Some)
}

/// The chats of a batch as the transaction sees them: `first`, what
/// [`chats_read`] read as the transaction began, if it was sent then.
pub async fn chats_by_ids(
    conn: &mut AnyConnection,
    ids: &[i64],
    first: Option<FirstRows>,
) -> Result<HashMap<i64, Chat>, StoreError> {
    let rows = match first {
        Some(FirstRows(rows)) => rows,
        None => {
            let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
            // The count tells PostgreSQL's planner how many ids to expect
            // (a JSON array's elements it guesses at 100).
            let count = ids.len() as i64;
            sqlx::query(chats_sql(is_postgres(conn)))
                .bind(list)
                .bind(count)
                .fetch_all(conn)
                .await
                .ctx(LOOKING_UP)?
        }
    };
    rows.iter()
        .map(|row| chat_from_row(row).map(|chat| (chat.id, chat)))
        .collect()
}

const LOOKING_UP: &str = "looking up chats";

/// [`chats_by_ids`]' statement: `$1` the ids as a JSON array, `$2` how many.
pub(super) fn chats_sql(postgres: bool) -> &'static str {
    static SQLITE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static POSTGRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    // `= ANY (ARRAY(…))`: an index lookup per id whatever plan the server
    // keeps (`IN (…)` may become a hash join over every chat).
    let (cell, ids) = if postgres {
        (
            &POSTGRES,
            "= ANY (ARRAY(SELECT value::BIGINT FROM json_array_elements_text($1::JSON) LIMIT $2))",
        )
    } else {
        (&SQLITE, "IN (SELECT value FROM json_each($1) LIMIT $2)")
    };
    cell.get_or_init(|| format!("SELECT {CHAT_COLUMNS} FROM chats WHERE id {ids}"))
}

/// Stores `queued`, then `items` in order, in the caller's transaction;
/// what became of each of `items`. The
/// order keys of all their rows are locked already: those of `items` as
/// the caller's transaction began, those of `queued` by whoever made them.
///
/// `last`: the caller writes nothing after them, so on PostgreSQL their
/// statement carries the commit ([`TxConn::finish`]).
pub async fn write_outgoing(
    conn: &mut TxConn<'_>,
    items: &[&OutgoingWrite],
    queued: &[Queued],
    last: bool,
) -> Result<Vec<OutgoingWritten>, StoreError> {
    if items.is_empty() && queued.is_empty() {
        return Ok(Vec::new());
    }
    let handoff = conn
        .handoff_lease()
        .map(|(ms, owner)| (ms, owner.to_owned()));
    let owner = handoff.as_ref().map(|(_, owner)| owner.as_str());
    let rows: Vec<Row> = queued
        .iter()
        .map(Row::queued)
        .chain(items.iter().map(|item| {
            let mut row = Row::message(item);
            if let (Some((ms, _)), Some(_)) = (&handoff, row.delivery) {
                row.lease = Some(item.now.saturating_add(*ms));
            }
            row
        }))
        .collect();
    let results: Vec<(i64, Option<i64>, Option<i64>)> = if is_postgres(conn) {
        let last = last && conn.can_finish();
        write_postgres(conn, &rows, owner, last).await?
    } else {
        write_sqlite(conn, &rows).await?
    };
    if results.len() != rows.len() {
        return Err(StoreError::Corrupt(format!(
            "the batch script returned {} results for {} rows",
            results.len(),
            rows.len()
        )));
    }
    let handed = rows
        .iter()
        .zip(&results)
        .filter_map(|(row, (_, message, seq))| handed_row(row, (*seq)?, *message))
        .collect();
    conn.hand_over(handed);
    Ok(results
        .into_iter()
        .skip(queued.len())
        .map(|(_, id, seq)| OutgoingWritten {
            message_id: id,
            handed: seq.is_some(),
        })
        .collect())
}

/// What storing one message did.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutgoingWritten {
    /// `None` for a typing notice.
    pub message_id: Option<i64>,
    /// Its outbox row was leased to this process's deliverer and goes to it
    /// once the transaction commits: nothing to claim.
    pub handed: bool,
}

/// A row the batch leased to this process's deliverer, as a claim would
/// have returned it (no attempt before it).
fn handed_row(row: &Row<'_>, seq: i64, message_id: Option<i64>) -> Option<Claimed> {
    let d = row.delivery?;
    Some(Claimed {
        seq,
        id: d.id.to_string(),
        event_id: d.event_id.to_string(),
        kind: d.kind.clone(),
        policy: d.policy.clone(),
        target_url: d.target_url.clone(),
        body: d.body.clone(),
        chunked: d.chunked,
        message_id,
        chat_id: row.chat,
        attempts: 0,
        first_attempt_at: None,
        give_up_at: None,
        last_error: None,
        staged: d.staged,
        secret: d.secret.clone(),
        channel_id: row.event.channel_id,
    })
}

/// SQLite: the batch as one script over a temporary table; `[ord, message
/// id]` per row, in order.
async fn write_sqlite(
    conn: &mut AnyConnection,
    rows: &[Row<'_>],
) -> Result<Vec<(i64, Option<i64>, Option<i64>)>, StoreError> {
    let slots = slots_for(rows.len());
    let mut query = sqlx::query(SCRIPTS.get(slots));
    for (ord, row) in rows.iter().enumerate() {
        query = bind_row(query, ord, row);
    }
    let query = pad_slots(query, COLUMNS, rows.len(), slots);
    let statements = run(conn, query, WHAT).await?;
    let ids: Vec<(i64, Option<i64>)> = json_cell(statements.get(RESULT_STATEMENT), 0)?;
    // Nothing is handed over on SQLite (`TxConn::handoff_lease`).
    Ok(ids.into_iter().map(|(ord, id)| (ord, id, None)).collect())
}

/// One row of [`PG_SCRIPT`]'s `$1`, borrowed from the batch: written
/// straight to JSON, with no tree of values built first.
#[derive(serde::Serialize)]
struct PgRow<'a> {
    ord: usize,
    uid: Option<&'a str>,
    chat: Option<i64>,
    author: Option<&'a str>,
    agent: Option<i64>,
    body: Option<&'a str>,
    dstate: &'a str,
    now: i64,
    eid: String,
    kind: &'a str,
    dir: &'a str,
    ch: Option<i64>,
    payload: &'a str,
    at: i64,
    oid: Option<String>,
    oevent: Option<String>,
    okind: Option<&'a str>,
    policy: Option<&'a str>,
    url: Option<&'a str>,
    /// `None` when it is `payload` (an agent's reply, typing).
    obody: Option<&'a str>,
    chunked: Option<i64>,
    okey: Option<&'a str>,
    staged: Option<i64>,
    secret: Option<&'a str>,
    lease: Option<i64>,
    owner: Option<&'a str>,
}

/// PostgreSQL: the batch as one JSON parameter of one statement whose
/// steps are the script's (PostgreSQL runs no script of several
/// statements with parameters). The outbox rows learn their message ids
/// from the messages' `RETURNING`; a row's key is held by a pending row
/// queued before the statement or earlier in the batch (`f`: each key's
/// first row in the batch, grouped once: a look back over the batch for
/// every row, about 3 % of the statement in the benchmark's batches of
/// ~18 rows (auto_explain, 2026-12-03), grows with the square of the
/// batch).
async fn write_postgres(
    conn: &mut TxConn<'_>,
    rows: &[Row<'_>],
    owner: Option<&str>,
    last: bool,
) -> Result<Vec<(i64, Option<i64>, Option<i64>)>, StoreError> {
    let payloads: Vec<String> = rows.iter().map(|r| r.event.payload.to_string()).collect();
    let json: Vec<PgRow> = rows
        .iter()
        .zip(&payloads)
        .enumerate()
        .map(|(ord, (r, payload))| {
            let e = r.event;
            let d = r.delivery;
            PgRow {
                ord,
                uid: r.uid,
                chat: r.chat,
                author: r.author,
                agent: r.agent,
                body: r.body,
                dstate: r.dstate,
                now: r.now,
                eid: e.id.to_string(),
                kind: e.kind.as_str(),
                dir: e.direction.as_str(),
                ch: e.channel_id,
                payload,
                at: e.at,
                oid: d.map(|d| d.id.to_string()),
                oevent: d.map(|d| d.event_id.to_string()),
                okind: d.map(|d| d.kind.as_str()),
                policy: d.map(|d| d.policy.as_str()),
                url: d.map(|d| d.target_url.as_str()),
                // A reply's request is its event's payload: sent once.
                obody: d.map(|d| d.body.as_str()).filter(|body| body != payload),
                chunked: d.map(|d| i64::from(d.chunked)),
                okey: d.and_then(|d| d.order_key.as_deref()),
                staged: d.map(|d| i64::from(d.staged)),
                secret: d.and_then(|d| d.secret.as_deref()),
                lease: r.lease,
                owner: r.lease.and(owner),
            }
        })
        .collect();
    let json = serde_json::to_string(&json)
        .map_err(|e| StoreError::Corrupt(format!("encoding a batch of agent messages: {e}")))?;
    let count = rows.len() as i64;
    let statements = if last {
        let sql = prepared::OUTGOING.execute(&[Literal::Text(&json), Literal::Int(count)])?;
        conn.finish(&sql, WHAT).await?
    } else {
        run(conn, sqlx::query(PG_SCRIPT).bind(json).bind(count), WHAT).await?
    };
    json_cell(statements.first(), 0)
}

pub(super) const PG_SCRIPT: &str = "WITH b AS (SELECT * FROM json_to_recordset($1::JSON) AS x(ord BIGINT, \
     uid TEXT, chat BIGINT, author TEXT, agent BIGINT, body TEXT, dstate TEXT, now BIGINT, \
     eid TEXT, kind TEXT, dir TEXT, ch BIGINT, payload TEXT, at BIGINT, oid TEXT, oevent TEXT, \
     okind TEXT, policy TEXT, url TEXT, obody TEXT, chunked BIGINT, okey TEXT, staged BIGINT, \
     secret TEXT, lease BIGINT, owner TEXT) LIMIT $2), \
     m AS (INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, \
     created_at) SELECT uid, chat, author, agent, body, dstate, now FROM b \
     WHERE body IS NOT NULL ORDER BY ord RETURNING id, uid), \
     t AS (UPDATE chats SET last_message_at = (SELECT MAX(l.now) FROM b l \
     WHERE l.chat = chats.id AND l.body IS NOT NULL) \
     WHERE chats.id = ANY (ARRAY(SELECT chat FROM b WHERE body IS NOT NULL))), \
     e AS (INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
     SELECT eid, kind, dir, ch, chat, payload, at FROM b ORDER BY ord), \
     f AS (SELECT okey, MIN(ord) AS first FROM b WHERE oid IS NOT NULL AND okey IS NOT NULL \
     GROUP BY okey), \
     o AS (INSERT INTO outbox (id, event_id, kind, policy, target_url, body, chunked, \
     order_key, message_id, chat_id, state, attempts, next_attempt_at, created_at, staged, \
     secret, head, lease_until, lease_owner, first_attempt_at) \
     SELECT h.oid, h.oevent, h.okind, h.policy, h.url, COALESCE(h.obody, h.payload), h.chunked, \
     h.okey, h.mid, \
     h.chat, 'pending', CASE WHEN h.handed THEN 1 ELSE 0 END, h.now, h.now, h.staged, \
     h.secret, h.head, CASE WHEN h.handed THEN h.lease END, \
     CASE WHEN h.handed THEN h.owner END, CASE WHEN h.handed THEN h.now END \
     FROM (SELECT k.*, k.head = 1 AND k.lease IS NOT NULL AS handed FROM ( \
     SELECT b.*, m.id AS mid, CASE WHEN b.okey IS NULL THEN 1 \
     WHEN q.seq IS NOT NULL OR b.ord > f.first THEN 0 ELSE 1 END AS head \
     FROM b LEFT JOIN m ON m.uid = b.uid AND b.body IS NOT NULL \
     LEFT JOIN f ON f.okey = b.okey \
     LEFT JOIN LATERAL (SELECT p.seq FROM outbox p WHERE p.order_key = b.okey \
     AND p.state = 'pending' ORDER BY p.order_key, p.seq LIMIT 1) q ON TRUE \
     WHERE b.oid IS NOT NULL) k) h ORDER BY h.ord \
     RETURNING seq, id, lease_until) \
     SELECT CAST(json_agg(json_build_array(b.ord, m.id, o.seq) ORDER BY b.ord) AS TEXT) \
     FROM b LEFT JOIN m ON m.uid = b.uid AND b.body IS NOT NULL \
     LEFT JOIN o ON o.id = b.oid AND o.lease_until IS NOT NULL";

const COLUMNS: usize = 24;

fn bind_row<'q>(query: Query<'q>, ord: usize, r: &Row<'_>) -> Query<'q> {
    let e = r.event;
    let d = r.delivery;
    query
        .bind(ord as i64)
        .bind(r.uid.map(str::to_owned))
        .bind(r.chat)
        .bind(r.author.map(str::to_owned))
        .bind(r.agent)
        .bind(r.body.map(str::to_owned))
        .bind(r.dstate)
        .bind(r.now)
        .bind(e.id.to_string())
        .bind(e.kind.as_str().to_owned())
        .bind(e.direction.as_str())
        .bind(e.channel_id)
        .bind(e.payload.to_string())
        .bind(e.at)
        // The outbox row, unless a plugin answered.
        .bind(d.map(|d| d.id.to_string()))
        .bind(d.map(|d| d.event_id.to_string()))
        .bind(d.map(|d| d.kind.clone()))
        .bind(d.map(|d| d.policy.clone()))
        .bind(d.map(|d| d.target_url.clone()))
        .bind(d.map(|d| d.body.clone()))
        .bind(d.map(|d| i64::from(d.chunked)))
        .bind(d.and_then(|d| d.order_key.clone()))
        .bind(d.map(|d| i64::from(d.staged)))
        .bind(d.and_then(|d| d.secret.clone()))
}

/// Index of the statement of the script whose row is the result.
const RESULT_STATEMENT: usize = 7;

static SCRIPTS: Scripts = Scripts::new(MAX_OUTGOING, build_script);

fn build_script(slots: usize) -> String {
    let values = values(COLUMNS, slots);
    [
        // 0, 1, 2: the batch, in a table of this connection.
        "CREATE TEMP TABLE IF NOT EXISTS outgoing_batch (ord INTEGER, uid TEXT, chat INTEGER, \
         author TEXT, agent INTEGER, body TEXT, dstate TEXT, now INTEGER, eid TEXT, kind TEXT, \
         dir TEXT, ch INTEGER, payload TEXT, at INTEGER, oid TEXT, oevent TEXT, okind TEXT, \
         policy TEXT, url TEXT, obody TEXT, chunked INTEGER, okey TEXT, staged INTEGER, \
         secret TEXT)"
            .to_owned(),
        "DELETE FROM temp.outgoing_batch".to_owned(),
        format!("INSERT INTO temp.outgoing_batch VALUES {values}"),
        // 3: the messages (a typing notice has none).
        "INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, created_at) \
         SELECT uid, chat, author, agent, body, dstate, now FROM temp.outgoing_batch \
         WHERE body IS NOT NULL ORDER BY ord"
            .to_owned(),
        // 4: the chats they touched.
        "UPDATE chats SET last_message_at = (SELECT MAX(b.now) FROM temp.outgoing_batch b \
         WHERE b.chat = chats.id AND b.body IS NOT NULL) \
         WHERE id IN (SELECT chat FROM temp.outgoing_batch WHERE body IS NOT NULL)"
            .to_owned(),
        // 5: the event-log rows.
        "INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
         SELECT eid, kind, dir, ch, chat, payload, at FROM temp.outgoing_batch \
         WHERE eid IS NOT NULL ORDER BY ord"
            .to_owned(),
        // 6: the requests to the integrators, with the message each delivers.
        // A row is its key's head when no pending row of the key is queued,
        // in the outbox or earlier in the batch (see migration 12).
        "INSERT INTO outbox (id, event_id, kind, policy, target_url, body, chunked, order_key, \
         message_id, chat_id, state, attempts, next_attempt_at, created_at, staged, secret, head) \
         SELECT b.oid, b.oevent, b.okind, b.policy, b.url, b.obody, b.chunked, b.okey, \
         m.id, b.chat, 'pending', 0, b.now, b.now, b.staged, b.secret, \
         CASE WHEN b.okey IS NULL THEN 1 \
         WHEN EXISTS (SELECT 1 FROM outbox p WHERE p.order_key = b.okey AND p.state = 'pending') \
         OR EXISTS (SELECT 1 FROM temp.outgoing_batch e WHERE e.okey = b.okey \
         AND e.oid IS NOT NULL AND e.ord < b.ord) THEN 0 ELSE 1 END \
         FROM temp.outgoing_batch b LEFT JOIN messages m ON m.uid = b.uid AND b.body IS NOT NULL \
         WHERE b.oid IS NOT NULL ORDER BY b.ord"
            .to_owned(),
        // 7: the result, one JSON array of [ord, message id].
        "SELECT json_group_array(json_array(b.ord, m.id) ORDER BY b.ord) \
         FROM temp.outgoing_batch b LEFT JOIN messages m ON m.uid = b.uid AND b.body IS NOT NULL \
         WHERE b.ord IS NOT NULL"
            .to_owned(),
        "DELETE FROM temp.outgoing_batch".to_owned(),
    ]
    .join(";\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Direction, EventKind};
    use crate::store::outbox::{Finished, finish_many, finish_statement};
    use crate::store::{Durability, NewDelivery, Store};

    /// A typing notice to `chat`, with its outbox row (no message row).
    fn typing(chat: i64) -> OutgoingWrite {
        let event = Event::new(
            EventKind::AGENT_TYPING,
            Direction::Out,
            serde_json::json!({}),
        )
        .in_chat(chat);
        let delivery = NewDelivery::channel_message(
            event.id,
            "typing",
            "http://127.0.0.1:9/".into(),
            "{}".into(),
            false,
            chat,
            true,
        );
        OutgoingWrite {
            chat_id: chat,
            uid: uuid::Uuid::now_v7().to_string(),
            author: Author::Agent,
            agent_id: None,
            body: None,
            answered: false,
            event,
            delivery,
            now: 1_000,
        }
    }

    /// On PostgreSQL an agent-message batch, the chats it reads (and
    /// accepts, with their webhooks' payloads) and the delivery results
    /// after it find their rows by key whatever plan the
    /// server keeps (these statements are prepared once and their plans
    /// kept): a plan made while the tables were small and analyzed as such
    /// (a new database) still reads no table whole once thousands of chats,
    /// messages and outbox rows arrived (a sudden backlog, before any
    /// analyze).
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn agent_batches_and_results_read_no_whole_table_on_postgres_whatever_the_plan() {
        use sqlx::Connection;
        let url = crate::store::required_test_postgres_url().await;
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        let channel = crate::store::test_channel(&store, "plans").await;
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        let fill = |from: i64, to: i64| {
            format!(
                "{}; INSERT INTO messages (uid, chat_id, author, body, created_at) \
                 SELECT 'm' || id, id, 'client', '{{}}', 0 FROM chats \
                 WHERE id NOT IN (SELECT chat_id FROM messages); \
                 INSERT INTO outbox (id, event_id, kind, policy, target_url, body, order_key, \
                 message_id, chat_id, state, next_attempt_at, created_at, head) \
                 SELECT 'o' || id, 'e' || id, 'agent.message', 'channel', \
                 'http://127.0.0.1:9/', '{{}}', 'chat:' || chat_id, id, chat_id, 'delivered', \
                 0, 0, 1 FROM messages WHERE id NOT IN (SELECT message_id FROM outbox)",
                crate::store::test_clients_with_chats_sql(channel, from, to)
            )
        };
        sqlx::raw_sql(&format!(
            "{}; ANALYZE clients; ANALYZE chats; ANALYZE messages; ANALYZE outbox; \
             SET plan_cache_mode = force_generic_plan",
            fill(1, 3)
        ))
        .execute(&mut conn)
        .await
        .expect("a new database's first chats");
        let (chat, message, seq): (i64, i64, i64) =
            sqlx::query_as("SELECT chat_id, message_id, seq FROM outbox ORDER BY seq LIMIT 1")
                .fetch_one(&mut conn)
                .await
                .expect("a row");
        let batch = serde_json::json!([{
            "ord": 0, "uid": "u1", "chat": chat, "author": "agent", "agent": null,
            "body": "{}", "dstate": "pending", "now": 1, "eid": "e1", "kind": "agent.message",
            "dir": "out", "ch": channel, "payload": "{}", "at": 1, "oid": "o1", "oevent": "e1",
            "okind": "agent.message", "policy": "channel", "url": "http://127.0.0.1:9/",
            "obody": "{}", "chunked": 0, "okey": format!("chat:{chat}"), "staged": 0,
            "secret": null
        }])
        .to_string();
        let results = serde_json::json!([{
            "ord": 0, "seq": seq, "state": "delivered", "error": null, "attempts": 1,
            "response": null, "now": 1, "mid": message, "mstate": "delivered", "eid": null,
            "kind": null, "dir": null, "ch": null, "chat": null, "payload": null, "at": null
        }])
        .to_string();
        let quoted = crate::store::batch::quoted;
        let plans = [
            (
                "agent messages",
                PG_SCRIPT.to_owned(),
                format!("{}, 1", quoted(&batch)),
            ),
            (
                "their chats",
                chats_sql(true).to_owned(),
                format!("{}, 1", quoted(&format!("[{chat}]"))),
            ),
            (
                "accepting their chats",
                crate::store::chats::accept_chats_sql(true).to_owned(),
                format!("{}, 1", quoted(&format!("[[{chat}, 1, 1]]"))),
            ),
            (
                "the accepted chats' webhook payloads",
                crate::store::webhooks::chat_cards_sql(true).to_owned(),
                format!("{}, 1", quoted(&format!("[{chat}]"))),
            ),
            (
                "delivery results",
                crate::store::outbox::PG_FINISH.to_owned(),
                format!("{}, 1", quoted(&results)),
            ),
        ];
        crate::store::batch::prepare_plans(&mut conn, &plans).await;
        sqlx::raw_sql(&fill(4, 5000))
            .execute(&mut conn)
            .await
            .expect("a backlog");
        crate::store::batch::assert_read_by_key(
            &mut conn,
            &plans,
            &["chats", "messages", "outbox", "clients"],
        )
        .await;
    }

    /// On PostgreSQL a batch's accepts `EXECUTE` two statements prepared
    /// on its connection in the middle of its transaction, where a missing
    /// one could not be given any more: a connection has them from the
    /// start (made after the migrations), one that lost them all
    /// (deallocated) gets them as the batch begins, and its chats
    /// are accepted, with their agents on their cards and growing numbers.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batch_accepts_chats_on_a_connection_that_lost_its_statements() {
        use crate::store::locks::RowLocks;
        let store = crate::store::test_postgres_one_connection().await;
        let channel = crate::store::test_channel(&store, "accepts").await;
        let one = async |sql: String| -> i64 {
            let (id,): (i64,) = sqlx::query_as(&sql)
                .fetch_one(store.pool())
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            id
        };
        let ann = one("INSERT INTO agents (name, email, token_hash, created_at) \
             VALUES ('Ann', 'ann@example.com', 'h', 0) RETURNING id"
            .to_owned())
        .await;
        let mut last_sequence = 0;
        for round in 0..2 {
            let client = one(format!(
                "INSERT INTO clients (channel_id, external_key, external_id_json, created_at, \
                 updated_at) VALUES ({channel}, 'c{round}', '\"c{round}\"', 0, 0) RETURNING id"
            ))
            .await;
            let chat = one(format!(
                "INSERT INTO chats (channel_id, client_id, state, opened_at, last_message_at) \
                 VALUES ({channel}, {client}, 'open', 0, 0) RETURNING id"
            ))
            .await;
            // One connection: the batch's. Round 0: as it was made;
            // round 1: as the round before's batch prepared them again.
            let (had,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM pg_prepared_statements \
                 WHERE name IN ('hub_accept_chats', 'hub_chat_cards')",
            )
            .fetch_one(store.pool())
            .await
            .expect("statements");
            assert_eq!(had, 2, "round {round}: the connection had both");
            // All of the hub's (sqlx keeps its own there too).
            let names: Vec<(String,)> =
                sqlx::query_as("SELECT name FROM pg_prepared_statements WHERE name LIKE 'hub\\_%'")
                    .fetch_all(store.pool())
                    .await
                    .expect("names");
            for (name,) in names {
                assert!(crate::store::deallocate_if_prepared(&store, &name).await);
            }
            let ids = [chat];
            let locks = RowLocks {
                chats: ids.to_vec(),
                ..RowLocks::default()
            };
            let (mut w, first) = store
                .begin_row_write_reading(&locks, chats_read(&ids, store.backend()).expect("read"))
                .await
                .expect("begun");
            let chats = chats_by_ids(&mut w.tx, &ids, first).await.expect("chats");
            assert_eq!(chats[&chat].state, crate::store::ChatState::Open);
            let accepted = accept_chats(&mut w.tx, &[(chat, ann, 5_000)])
                .await
                .expect("accepted");
            w.commit().await.expect("commit");
            assert_eq!(accepted.cards.len(), 1, "round {round}");
            let card = &accepted.cards[0];
            assert_eq!((card.chat_id, card.parties.client_id), (chat, client));
            assert_eq!(card.parties.agent.as_ref().map(|a| a.id), Some(ann));
            assert_eq!(accepted.sequences.len(), 1);
            assert!(accepted.sequences[0] > last_sequence, "round {round}");
            last_sequence = accepted.sequences[0];
            let (state, agent, at): (String, Option<i64>, Option<i64>) =
                sqlx::query_as("SELECT state, agent_id, accepted_at FROM chats WHERE id = $1")
                    .bind(chat)
                    .fetch_one(store.pool())
                    .await
                    .expect("the chat");
            assert_eq!(
                (state.as_str(), agent, at),
                ("accepted", Some(ann), Some(5_000))
            );
        }
    }

    /// Rows of one chat written in one batch go out one at a time, in
    /// order: only the first is its key's head, also behind a row that
    /// an earlier batch queued.
    #[tokio::test]
    async fn a_batchs_rows_of_one_chat_wait_for_each_other() {
        let (_dir, store) = crate::store::test_sqlite().await;
        rows_of_one_chat(store).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batchs_rows_of_one_chat_wait_for_each_other_on_postgres() {
        rows_of_one_chat(crate::store::required_test_postgres().await).await;
    }

    /// On PostgreSQL, with a deliverer running here, a reply that is its
    /// chat's head is written leased to this process and handed to the
    /// deliverer once committed (not before, not when rolled back): no
    /// claim finds it; one queued behind it is claimed when the result of
    /// the first says it made a new head; a handed row nobody sent is
    /// claimed once its lease ran out (its process died).
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn replies_go_to_this_processs_deliverer_leased_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        let claim = async |store: &Store, now: i64| -> Vec<String> {
            let claimed = store.claim_due(now, 60_000, 64).await.expect("claim");
            claimed.into_iter().map(|c| c.id).collect()
        };
        let id = |row: &OutgoingWrite| row.delivery.id.to_string();
        // No deliverer: nothing is leased as it is written.
        let alone = typing(7);
        let mut w = store.begin_row_write().await.expect("write");
        write_outgoing(&mut w.tx, &[&alone], &[], false)
            .await
            .expect("write");
        w.commit().await.expect("commit");
        assert_eq!(claim(&store, 2_000).await, vec![id(&alone)]);

        store.handoff().open(60_000);
        let rows = [typing(1), typing(2), typing(1)];
        let mut w = store.begin_row_write().await.expect("write");
        let written = write_outgoing(&mut w.tx, &rows.iter().collect::<Vec<_>>(), &[], false)
            .await
            .expect("write");
        let handed: Vec<bool> = written.iter().map(|w| w.handed).collect();
        assert_eq!(handed, [true, true, false], "the second of chat 1 waits");
        assert!(store.handoff().take().is_empty(), "not before the commit");
        w.commit().await.expect("commit");
        let taken = store.handoff().take();
        let ids: Vec<String> = taken.iter().map(|c| c.id.clone()).collect();
        assert_eq!(ids, [id(&rows[0]), id(&rows[1])]);
        for c in &taken {
            let (seq, owner, lease, attempts): (i64, Option<String>, Option<i64>, i64) =
                sqlx::query_as(
                    "SELECT seq, lease_owner, lease_until, attempts FROM outbox WHERE id = $1",
                )
                .bind(&c.id)
                .fetch_one(store.pool())
                .await
                .expect("the row");
            assert_eq!(seq, c.seq);
            assert_eq!(owner.as_deref(), Some(store.identity().id.as_str()));
            assert_eq!(lease, Some(61_000), "leased from the reply's time");
            assert_eq!((attempts, c.attempts), (1, 0), "counted as a claim counts");
        }
        assert!(
            claim(&store, 2_000).await.is_empty(),
            "all in flight or waiting"
        );

        // A transaction rolled back hands nothing over.
        let dropped = typing(3);
        let mut w = store.begin_row_write().await.expect("write");
        write_outgoing(&mut w.tx, &[&dropped], &[], false)
            .await
            .expect("write");
        drop(w);
        assert!(store.handoff().take().is_empty());

        // The results, as the deliverer records them: the first made the
        // second of its chat the head, the other made none.
        let finish = async |c: &crate::store::Claimed| -> bool {
            let done = Finished::delivered(c.seq, 2_000);
            let results = [&done];
            let first = finish_statement(&results, store.backend())
                .expect("statement")
                .map(crate::store::FirstStatement::alone);
            let locks = crate::store::locks::RowLocks {
                outbox_rows: vec![c.seq],
                ..Default::default()
            };
            let (mut w, first) = store
                .begin_row_write_reading(&locks, first)
                .await
                .expect("write");
            let look = finish_many(&mut w.tx, &results, first)
                .await
                .expect("finish");
            w.commit().await.expect("commit");
            look
        };
        assert!(!finish(&taken[1]).await, "chat 2 has nothing behind");
        assert!(claim(&store, 2_000).await.is_empty());
        assert!(
            finish(&taken[0]).await,
            "chat 1's next reply is its head now"
        );
        assert_eq!(claim(&store, 2_000).await, vec![id(&rows[2])]);

        // Handed over to a process that died: taken over after the lease.
        let orphan = typing(4);
        let mut w = store.begin_row_write().await.expect("write");
        write_outgoing(&mut w.tx, &[&orphan], &[], false)
            .await
            .expect("write");
        w.commit().await.expect("commit");
        assert_eq!(store.handoff().take().len(), 1);
        assert!(claim(&store, 60_999).await.is_empty(), "still leased");
        assert_eq!(claim(&store, 61_001).await, vec![id(&orphan)]);

        // The deliverer stopped: rows are claimed again.
        assert!(store.handoff().close().is_empty());
        let late = typing(5);
        let mut w = store.begin_row_write().await.expect("write");
        write_outgoing(&mut w.tx, &[&late], &[], false)
            .await
            .expect("write");
        w.commit().await.expect("commit");
        assert!(store.handoff().take().is_empty());
        assert_eq!(claim(&store, 2_000).await, vec![id(&late)]);
    }

    async fn rows_of_one_chat(store: Store) {
        let rows = [typing(1), typing(2), typing(1), typing(1)];
        let mut w = store.begin_write().await.expect("write");
        write_outgoing(&mut w.tx, &rows.iter().collect::<Vec<_>>(), &[], false)
            .await
            .expect("write");
        w.commit().await.expect("commit");
        let ids = |rows: &[&OutgoingWrite]| -> Vec<String> {
            rows.iter().map(|r| r.delivery.id.to_string()).collect()
        };
        let claim = async |store: &Store| -> Vec<String> {
            let claimed = store.claim_due(2_000, 60_000, 64).await.expect("claim");
            claimed.into_iter().map(|c| c.id).collect()
        };
        assert_eq!(claim(&store).await, ids(&[&rows[0], &rows[1]]));
        let later = typing(2);
        let mut w = store.begin_write().await.expect("write");
        write_outgoing(&mut w.tx, &[&later], &[], false)
            .await
            .expect("write");
        w.commit().await.expect("commit");
        assert!(
            claim(&store).await.is_empty(),
            "both chats have a row in flight"
        );
        // Results recorded in batches, as the deliverer records them.
        for (done, next) in [
            (&[&rows[0], &rows[1]][..], &[&rows[2], &later][..]),
            (&[&rows[2]][..], &[&rows[3]][..]),
        ] {
            let mut results = Vec::new();
            for row in done {
                let (seq,): (i64,) = sqlx::query_as("SELECT seq FROM outbox WHERE id = $1")
                    .bind(row.delivery.id.to_string())
                    .fetch_one(store.pool())
                    .await
                    .expect("the row");
                results.push(Finished::delivered(seq, 2_000));
            }
            // As the results' writer does without plugin effects: the
            // results go with the begin of their transaction, and on
            // PostgreSQL its commit too.
            let results: Vec<&Finished> = results.iter().collect();
            let first = finish_statement(&results, store.backend())
                .expect("statement")
                .map(crate::store::FirstStatement::alone);
            let locks = crate::store::locks::RowLocks {
                outbox_rows: results.iter().map(|r| r.seq).collect(),
                ..Default::default()
            };
            let (mut w, first) = store
                .begin_row_write_reading(&locks, first)
                .await
                .expect("write");
            finish_many(&mut w.tx, &results, first)
                .await
                .expect("finish");
            assert_eq!(
                w.tx.ended(),
                store.backend() == crate::store::Backend::Postgres,
                "committed in the round trip that began it on PostgreSQL only"
            );
            w.commit().await.expect("commit");
            assert_eq!(claim(&store).await, ids(next));
        }
    }
}
