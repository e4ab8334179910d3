//! Customer messages written in batches: the client upserts, the chats they
//! open or join, the messages and their event-log rows, for a whole batch in
//! two round trips to the database and a fixed number of statements.
//!
//! Why: on SQLite every statement, and every row it returns, is a hand-off
//! to the driver's thread and back; that, not SQLite, was the cost of a
//! message. Here a batch is bound as rows of parameters, copied once into a
//! temporary table, and every step is one set-based statement over it.
//!
//! The result is what writing the messages one by one, in order, would have
//! done: a later message of the batch sees what the earlier ones wrote (the
//! client they created, the chat they opened, the profile they merged).

use std::collections::HashMap;

use plugin_api::channel::CustomerSender;
use serde_json::{Value, json};
use sqlx::{AnyConnection, Row};

use super::batch::{
    Literal, Query, Scripts, json_cell, pad_slots, run, run_script, slots_for, values,
};
use super::chats::CLIENT_MERGE;
use super::prepared;
use super::{
    Author, Backend, Chat, ChatState, Client, Ctx, FirstRows, FirstStatement, MessageRow,
    StoreError, TxConn, is_postgres,
};
use crate::event::Event;

/// What failures of this module's statements say.
const WHAT: &str = "storing customer messages";

/// Largest batch the writer takes at once.
pub const MAX_BATCH: usize = 128;

/// One customer message (or typing notice) to store.
pub struct CustomerWrite {
    pub channel_id: i64,
    pub sender: CustomerSender,
    /// The message as stored; `None` for a typing notice (it opens no chat
    /// and writes nothing but its event).
    pub body: Option<String>,
    pub uid: String,
    /// Its event-log row; the chat is filled in here.
    pub event: Event,
    pub now: i64,
}

/// What the caller of [`write_customer_messages`] writes after the batch,
/// in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Something, whatever the messages did.
    More,
    /// Only the `chat_updated` webhooks of messages that change a known
    /// sender's profile and open no chat: a batch without one ends its
    /// transaction.
    ChatUpdates,
}

/// What storing one customer message did.
#[derive(Debug)]
pub struct CustomerWritten {
    pub client: Client,
    /// Whether the message changed the name, phone or e-mail agents saw.
    pub profile_changed: bool,
    /// The client's live chat (`None` only for typing without one).
    pub chat: Option<Chat>,
    /// Whether this message opened `chat`.
    pub opened: bool,
    pub message: Option<MessageRow>,
}

/// The subquery of a client's live chat (`c` is the client). Ordered by
/// `lc.id + 0`, which no index gives: by `lc.id` a kept plan may walk the
/// chats' primary key down from the newest and read every chat that is not
/// the client's (auto_explain in the channel bench on PostgreSQL: 513 chats
/// read per message, nearly all of a slow known-clients read); so the
/// client's chats are found by `chats_client_state` and sorted.
const LIVE_CHAT: &str = "(SELECT lc.id FROM chats lc WHERE lc.client_id = c.id \
     AND lc.state <> 'closed' ORDER BY lc.id + 0 DESC LIMIT 1)";
/// Joins each batch row `b` to its client `c` (`CROSS` keeps the small batch
/// as the outer loop, so each client is one index lookup).
const BATCH_CLIENT: &str =
    "temp.ingress_batch b CROSS JOIN clients c ON c.channel_id = b.ch AND c.external_key = b.k";

/// Stores `items` in order, in the caller's transaction: a snapshot of the
/// batch's known clients, then the writes (SQLite and PostgreSQL each in
/// their own set-based statements).
///
/// On PostgreSQL the transaction is exclusive or holds the items' senders
/// ([`Store::begin_row_write_locking`]): the snapshot must not change under
/// the plan.
///
/// `known`: what [`known_read`] read as the transaction began, if it was
/// sent then (else it is read here). `then`: what the caller writes after
/// them; when it is nothing, PostgreSQL's last statement carries the
/// commit ([`TxConn::finish`]).
///
/// [`Store::begin_row_write_locking`]: super::Store::begin_row_write_locking
pub async fn write_customer_messages(
    conn: &mut TxConn<'_>,
    items: &[&CustomerWrite],
    known: Option<FirstRows>,
    then: Then,
) -> Result<Vec<CustomerWritten>, StoreError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let known = known_clients(conn, items, known).await?;
    let plan = Plan::new(items, known);
    let results = if is_postgres(conn) {
        let last = conn.can_finish()
            && match then {
                Then::More => false,
                Then::ChatUpdates => !plan.steps.iter().any(|s| s.profile_changed && !s.opens),
            };
        write_postgres(conn, items, &plan, last).await?
    } else {
        write_sqlite(conn, items, &plan).await?
    };
    if results.len() != items.len() {
        return Err(StoreError::Corrupt(format!(
            "the batch script returned {} results for {} messages",
            results.len(),
            items.len()
        )));
    }
    let mut written = Vec::with_capacity(items.len());
    for (result, (item, step)) in results.into_iter().zip(items.iter().zip(plan.steps)) {
        let (
            _,
            client_id,
            visitor_number,
            chat_id,
            state,
            agent,
            opened,
            accepted,
            closed,
            last,
            message_id,
        ) = result;
        let [name, phone, email, photo, url, invite] = step.profile;
        let chat = match (chat_id, state) {
            (Some(id), Some(state)) => Some(Chat {
                id,
                channel_id: item.channel_id,
                client_id,
                state: ChatState::parse(&state)?,
                agent_id: agent,
                opened_at: opened.unwrap_or(item.now),
                accepted_at: accepted,
                closed_at: closed,
                last_message_at: last.unwrap_or(item.now),
            }),
            _ => None,
        };
        let message = match (message_id, chat_id, &item.body) {
            (Some(id), Some(chat_id), Some(body)) => Some(MessageRow {
                id,
                author_name: None,
                uid: item.uid.clone(),
                chat_id,
                author: Author::Client,
                agent_id: None,
                body: serde_json::from_str(body)
                    .map_err(|e| StoreError::Corrupt(format!("message body: {e}")))?,
                delivery: None,
                delivery_error: None,
                created_at: item.now,
            }),
            _ => None,
        };
        written.push(CustomerWritten {
            client: Client {
                id: client_id,
                channel_id: item.channel_id,
                external_id: item.sender.id.clone(),
                name,
                phone,
                email,
                photo,
                url,
                invite,
                visitor_number: visitor_number.unwrap_or_default(),
            },
            profile_changed: step.profile_changed,
            chat,
            opened: step.opens,
            message,
        });
    }
    Ok(written)
}

/// One message's result: seq, client id, visitor number, its live chat (id,
/// state, agent, opened, accepted, closed, last message) and its message id.
type ResultRow = (
    i64,
    i64,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// A known client in the snapshot: channel, key, profile, has a live chat.
type KnownRow = (
    i64,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
);

/// A client as the batch found it: its profile and whether it has a live chat.
struct Known {
    profile: Profile,
    live_chat: bool,
}

type Profile = [Option<String>; 6];

fn profile_of(sender: &CustomerSender) -> Profile {
    [
        sender.name.clone(),
        sender.phone.clone(),
        sender.email.clone(),
        sender.photo.clone(),
        sender.url.clone(),
        sender.invite.clone(),
    ]
}

/// The batch's keys, the known clients' statement's `$1`.
fn keys_of(items: &[&CustomerWrite]) -> String {
    let keys: Vec<Value> = items
        .iter()
        .map(|i| json!({ "ch": i.channel_id, "k": i.sender.id.as_key() }))
        .collect();
    Value::Array(keys).to_string()
}

/// The known clients' read, sent with the begin of the batch's
/// transaction ([`Store::begin_row_write_reading`]); its rows go to
/// [`write_customer_messages`].
///
/// [`Store::begin_row_write_reading`]: super::Store::begin_row_write_reading
pub fn known_read(
    items: &[&CustomerWrite],
    backend: Backend,
) -> Result<Option<FirstStatement>, StoreError> {
    if items.is_empty() {
        return Ok(None);
    }
    if backend == Backend::Sqlite {
        let query = sqlx::query(known_sql(false)).bind(keys_of(items));
        return FirstStatement::sqlite(query, false, WHAT).map(Some);
    }
    prepared::KNOWN_CLIENTS
        .read(&[Literal::Text(&keys_of(items))])
        .map(Some)
}

/// First round trip (or the begin's, `first`): the batch's existing
/// clients and the visitor sequence.
async fn known_clients(
    conn: &mut AnyConnection,
    items: &[&CustomerWrite],
    first: Option<FirstRows>,
) -> Result<(HashMap<(i64, String), Known>, i64), StoreError> {
    let statements = match first {
        Some(FirstRows(rows)) => vec![rows],
        None => {
            let sql = known_sql(is_postgres(conn));
            run_script(conn, sql, keys_of(items), WHAT).await?
        }
    };
    let sequence = statements
        .first()
        .and_then(|rows| rows.first())
        .map(|row| row.try_get::<Option<i64>, _>(0))
        .transpose()
        .ctx("reading the visitor sequence")?
        .flatten()
        .ok_or_else(|| StoreError::Corrupt("the visitor sequence is missing".into()))?;
    let rows: Vec<KnownRow> = json_cell(statements.first(), 1)?;
    let mut known = HashMap::with_capacity(rows.len());
    for (channel, key, name, phone, email, photo, url, invite, live) in rows {
        known.insert(
            (channel, key),
            Known {
                profile: [name, phone, email, photo, url, invite],
                live_chat: live != 0,
            },
        );
    }
    Ok((known, sequence))
}

/// [`known_clients`]' statement: `$1` the batch's `{"ch", "k"}` keys as a
/// JSON array; one row of the visitor sequence and a JSON array of
/// [`KnownRow`]s.
pub(super) fn known_sql(postgres: bool) -> &'static str {
    static SQLITE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static POSTGRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let (cell, group, array, keys) = if postgres {
        (
            &POSTGRES,
            "json_agg",
            "json_build_array",
            // `LATERAL … LIMIT 1`: one index lookup per key, whatever the
            // plan kept for the statement guesses of the JSON's length (a
            // hash join over every client of the database, otherwise).
            "json_array_elements($1::JSON) j CROSS JOIN LATERAL (SELECT k.id FROM clients k \
             WHERE k.channel_id = (j->>'ch')::BIGINT AND k.external_key = j->>'k' LIMIT 1) k",
        )
    } else {
        (
            &SQLITE,
            "json_group_array",
            "json_array",
            "json_each($1) j CROSS JOIN clients k \
             ON k.channel_id = json_extract(j.value, '$.ch') \
             AND k.external_key = json_extract(j.value, '$.k')",
        )
    };
    cell.get_or_init(|| {
        // `CAST(… AS TEXT)`: PostgreSQL's `json` comes back as text, as
        // SQLite's JSON functions give it.
        format!(
            "SELECT (SELECT value FROM counters WHERE name = 'visitor_number'), \
             (SELECT CAST({group}({array}(c.channel_id, c.external_key, c.name, c.phone, \
             c.email, c.photo, c.url, c.invite, \
             CASE WHEN {LIVE_CHAT} IS NULL THEN 0 ELSE 1 END)) AS TEXT) FROM clients c \
             WHERE c.id IN (SELECT k.id FROM {keys}))"
        )
    })
}

/// SQLite: the whole batch as one script over a temporary table; one
/// [`ResultRow`] per message, in order.
async fn write_sqlite(
    conn: &mut AnyConnection,
    items: &[&CustomerWrite],
    plan: &Plan,
) -> Result<Vec<ResultRow>, StoreError> {
    let slots = slots_for(items.len());
    let mut query = sqlx::query(WRITE_SCRIPTS.get(slots));
    for (seq, (item, step)) in items.iter().zip(&plan.steps).enumerate() {
        query = bind_row(query, seq, item, step);
    }
    let query = pad_slots(query, BATCH_COLUMNS.len(), items.len(), slots);
    let statements = run(conn, query, WHAT).await?;
    json_cell(statements.get(FINAL_STATEMENT), 0)
}

/// PostgreSQL: the batch as JSON parameters, in two set-based statements
/// (PostgreSQL runs no script of several statements with parameters): the
/// clients with the chats the batch opens, then the messages, the chats
/// they touch, the event-log rows and the result. One [`ResultRow`] per
/// message, in order.
///
/// One `INSERT … ON CONFLICT DO UPDATE` may not change a row twice, so the
/// clients go in once each, with the profile the plan merged for the last
/// of their messages: what upserting them message by message leaves.
///
/// `last`: nothing is written after the batch, so its last statement (the
/// messages', or the new visitors' numbers) carries the commit.
async fn write_postgres(
    conn: &mut TxConn<'_>,
    items: &[&CustomerWrite],
    plan: &Plan,
    last: bool,
) -> Result<Vec<ResultRow>, StoreError> {
    let mut clients: Vec<Value> = Vec::new();
    // Whether each of `clients` is written: a known sender whose messages
    // change nothing of it and open no chat is not (a row version, its
    // index entries and a conflict check saved per message).
    let mut writes: Vec<bool> = Vec::new();
    let mut index: HashMap<(i64, String), usize> = HashMap::new();
    let mut opening = Vec::new();
    for (seq, (item, step)) in items.iter().zip(&plan.steps).enumerate() {
        let key = (item.channel_id, item.sender.id.as_key());
        let [name, phone, email, photo, url, invite] = &step.profile;
        match index.get(&key) {
            Some(&i) => {
                writes[i] |= step.writes_client;
                let client = &mut clients[i];
                for (field, value) in [
                    ("name", name),
                    ("phone", phone),
                    ("email", email),
                    ("photo", photo),
                    ("url", url),
                    ("invite", invite),
                ] {
                    client[field] = json!(value);
                }
                client["updated"] = json!(item.now);
            }
            None => {
                clients.push(json!({
                    "ord": clients.len(), "ch": item.channel_id, "k": key.1,
                    "idj": serde_json::to_string(&item.sender.id).unwrap_or_default(),
                    "name": name, "phone": phone, "email": email, "photo": photo,
                    "url": url, "invite": invite, "created": item.now, "updated": item.now,
                    // Numbered at the end (see `number_new_clients`).
                    "number": None::<i64>,
                }));
                writes.push(step.writes_client);
                index.insert(key.clone(), clients.len() - 1);
            }
        }
        if step.opens {
            opening.push(json!({ "seq": seq, "ch": item.channel_id, "k": key.1, "now": item.now }));
        }
    }
    let clients: Vec<Value> = clients
        .into_iter()
        .zip(writes)
        .filter_map(|(client, writes)| writes.then_some(client))
        .collect();
    if !clients.is_empty() {
        sqlx::query(pg_clients_sql())
            .bind(Value::Array(clients).to_string())
            .bind(Value::Array(opening).to_string())
            .execute(&mut **conn)
            .await
            .ctx(WHAT)?;
    }
    let rows: Vec<PgMessageRow> = items
        .iter()
        .enumerate()
        .map(|(seq, item)| PgMessageRow {
            seq,
            ch: item.channel_id,
            k: item.sender.id.as_key(),
            now: item.now,
            typing: i64::from(item.body.is_none()),
            uid: &item.uid,
            body: item.body.as_deref(),
            eid: item.event.id.to_string(),
            kind: item.event.kind.as_str(),
            payload: super::batch::PayloadCell::of(&item.event.payload),
            at: item.event.at,
        })
        .collect();
    let rows = serde_json::to_string(&rows)
        .map_err(|e| StoreError::Corrupt(format!("encoding a batch of messages: {e}")))?;
    let numbers = plan.steps.iter().any(|s| s.number.is_some());
    let statements = if last && !numbers {
        let sql = prepared::CUSTOMER_MESSAGES.execute(&[Literal::Text(&rows)])?;
        conn.finish(&sql, WHAT).await?
    } else {
        run_script(conn, PG_MESSAGES, rows, WHAT).await?
    };
    let mut results: Vec<ResultRow> = json_cell(statements.first(), 0)?;
    number_new_clients(conn, &plan.steps, &mut results, last).await?;
    Ok(results)
}

/// One row of [`PG_MESSAGES`]' `$1`, borrowed from the batch.
#[derive(serde::Serialize)]
struct PgMessageRow<'a> {
    seq: usize,
    ch: i64,
    k: String,
    now: i64,
    typing: i64,
    uid: &'a str,
    body: Option<&'a str>,
    eid: String,
    kind: &'a str,
    payload: super::batch::PayloadCell<'a>,
    at: i64,
}

/// PostgreSQL: gives the clients the batch created their visitor numbers,
/// in the order of their first messages, as the transaction's last
/// statement: the counter's row is then locked only from here to the
/// commit, and only by batches that create clients. The senders' locks make
/// the plan's "new" exact, so no number is taken for a client another
/// writer created (the numbers have no gaps). `last`: it carries the
/// commit.
async fn number_new_clients(
    conn: &mut TxConn<'_>,
    steps: &[Step],
    results: &mut [ResultRow],
    last: bool,
) -> Result<(), StoreError> {
    let new: Vec<i64> = steps
        .iter()
        .zip(results.iter())
        .filter(|(step, _)| step.number.is_some())
        .map(|(_, result)| result.1)
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let ids = serde_json::to_string(&new).unwrap_or_else(|_| "[]".into());
    let numbered: Vec<(i64, i64)> = if last {
        let sql =
            prepared::NUMBERING.execute(&[Literal::Text(&ids), Literal::Int(new.len() as i64)])?;
        let statements = conn.finish(&sql, "numbering new visitors").await?;
        statements
            .first()
            .into_iter()
            .flatten()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .ctx("numbering new visitors")?
    } else {
        sqlx::query_as(PG_NUMBERING)
            .bind(ids)
            .bind(new.len() as i64)
            .fetch_all(&mut **conn)
            .await
            .ctx("numbering new visitors")?
    };
    if numbered.len() != new.len() {
        return Err(StoreError::Corrupt(format!(
            "{} of {} new visitors were numbered",
            numbered.len(),
            new.len()
        )));
    }
    let numbers: HashMap<i64, i64> = numbered.into_iter().collect();
    for result in results.iter_mut() {
        if let Some(&number) = numbers.get(&result.1) {
            result.2 = Some(number);
        }
    }
    Ok(())
}

/// PostgreSQL: `$1` the new clients' ids in the order they are numbered,
/// `$2` how many. The clients by key (`= ANY`), each numbered by a look
/// into the batch's few: joined as a set, PostgreSQL may hash every client.
pub(super) const PG_NUMBERING: &str = "WITH n AS (UPDATE counters SET value = value + $2 \
     WHERE name = 'visitor_number' RETURNING value - $2 AS base), \
     x AS (SELECT CAST(value AS BIGINT) AS id, ordinality AS i \
      FROM json_array_elements_text($1::JSON) WITH ORDINALITY) \
     UPDATE clients SET visitor_number = (SELECT base FROM n) \
     + (SELECT x.i FROM x WHERE x.id = clients.id) \
     WHERE clients.id = ANY (ARRAY(SELECT id FROM x)) \
     RETURNING clients.id, clients.visitor_number";

/// PostgreSQL, first statement: `$1` the batch's clients (one each, in the
/// order the batch first names them), `$2` the messages that open a chat.
/// The chats join the clients the upsert returns, new or updated.
fn pg_clients_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "WITH up AS (INSERT INTO clients (channel_id, external_key, external_id_json, name, \
             phone, email, photo, url, invite, created_at, updated_at, visitor_number) \
             SELECT ch, k, idj, name, phone, email, photo, url, invite, created, updated, number \
             FROM json_to_recordset($1::JSON) AS x(ord BIGINT, ch BIGINT, k TEXT, idj TEXT, \
             name TEXT, phone TEXT, email TEXT, photo TEXT, url TEXT, invite TEXT, \
             created BIGINT, updated BIGINT, number BIGINT) ORDER BY ord \
             {CLIENT_MERGE} RETURNING id, channel_id, external_key) \
             INSERT INTO chats (channel_id, client_id, state, opened_at, last_message_at) \
             SELECT o.ch, up.id, 'open', o.now, o.now \
             FROM json_to_recordset($2::JSON) AS o(seq BIGINT, ch BIGINT, k TEXT, now BIGINT) \
             JOIN up ON up.channel_id = o.ch AND up.external_key = o.k ORDER BY o.seq"
        )
    })
}

/// PostgreSQL, second statement: `$1` the batch's messages. Each joins its
/// client's live chat (opened by the first statement if it had none); the
/// result reads the chats as the touch left them. Each message's client and
/// chat are one index lookup each (`LATERAL … LIMIT 1`, as in [`known_sql`];
/// the chat ordered as in [`LIVE_CHAT`]).
pub(super) const PG_MESSAGES: &str = "WITH b AS (SELECT x.*, c.id AS client_id, c.visitor_number, \
     (SELECT lc.id FROM chats lc WHERE lc.client_id = c.id AND lc.state <> 'closed' \
      ORDER BY lc.id + 0 DESC LIMIT 1) AS chat_id \
     FROM json_to_recordset($1::JSON) AS x(seq BIGINT, ch BIGINT, k TEXT, now BIGINT, \
     typing BIGINT, uid TEXT, body TEXT, eid TEXT, kind TEXT, payload TEXT, at BIGINT) \
     CROSS JOIN LATERAL (SELECT c.id, c.visitor_number FROM clients c \
     WHERE c.channel_id = x.ch AND c.external_key = x.k LIMIT 1) c), \
     m AS (INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, \
     created_at) SELECT uid, chat_id, 'client', NULL, body, NULL, now FROM b \
     WHERE typing = 0 ORDER BY seq RETURNING id, uid, chat_id, created_at), \
     t AS (UPDATE chats SET last_message_at = l.last FROM (SELECT chat_id, \
     MAX(created_at) AS last FROM m GROUP BY chat_id) l WHERE chats.id = l.chat_id \
     RETURNING chats.id, chats.last_message_at), \
     e AS (INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
     SELECT eid, kind, 'in', ch, chat_id, payload, at FROM b ORDER BY seq) \
     SELECT CAST(json_agg(json_build_array(b.seq, b.client_id, b.visitor_number, h.id, h.state, \
     h.agent_id, h.opened_at, h.accepted_at, h.closed_at, \
     COALESCE(t.last_message_at, h.last_message_at), m.id) ORDER BY b.seq) AS TEXT) \
     FROM b LEFT JOIN LATERAL (SELECT * FROM chats h WHERE h.id = b.chat_id LIMIT 1) h ON TRUE \
     LEFT JOIN t ON t.id = b.chat_id LEFT JOIN m ON m.uid = b.uid";

/// What each message will do, worked out in order from what the database
/// held before the batch.
struct Plan {
    steps: Vec<Step>,
}

struct Step {
    opens: bool,
    profile_changed: bool,
    /// Whether the client's row is written for this message: a new client,
    /// a profile the message changes (any field), or a chat it opens (the
    /// chat joins the upserted row on PostgreSQL). The others are left
    /// alone: a row version and its index entries saved per message.
    writes_client: bool,
    /// The client's profile after this message.
    profile: Profile,
    /// A new client's visitor number.
    number: Option<i64>,
}

impl Plan {
    fn new(items: &[&CustomerWrite], known: (HashMap<(i64, String), Known>, i64)) -> Plan {
        let (mut clients, mut sequence) = known;
        let mut steps = Vec::with_capacity(items.len());
        for item in items {
            let key = (item.channel_id, item.sender.id.as_key().to_owned());
            let sent = profile_of(&item.sender);
            // A new client takes the next visitor number; later messages of
            // the batch from it find it known.
            let (number, profile_changed, rewrites, profile) = match clients.get_mut(&key) {
                Some(client) => {
                    let merged: Profile = std::array::from_fn(|i| {
                        sent[i].clone().or_else(|| client.profile[i].clone())
                    });
                    let changed = merged[..3] != client.profile[..3];
                    let rewrites = merged != client.profile;
                    client.profile = merged.clone();
                    (None, changed, rewrites, merged)
                }
                None => {
                    sequence += 1;
                    clients.insert(
                        key.clone(),
                        Known {
                            profile: sent.clone(),
                            live_chat: false,
                        },
                    );
                    (Some(sequence), false, true, sent.clone())
                }
            };
            let typing = item.body.is_none();
            let opens = match clients.get_mut(&key) {
                Some(client) if !typing && !client.live_chat => {
                    client.live_chat = true;
                    true
                }
                _ => false,
            };
            steps.push(Step {
                opens,
                profile_changed,
                writes_client: rewrites || opens,
                profile,
                number,
            });
        }
        Plan { steps }
    }
}

/// Columns of the batch table, bound in this order for each message.
const BATCH_COLUMNS: [&str; 21] = [
    "seq", "ch", "k", "idj", "name", "phone", "email", "photo", "url", "invite", "now", "typing",
    "opens", "wc", "number", "uid", "body", "eid", "kind", "payload", "at",
];

/// Binds one message as a row of [`BATCH_COLUMNS`].
fn bind_row<'q>(query: Query<'q>, seq: usize, item: &CustomerWrite, step: &Step) -> Query<'q> {
    let s = &item.sender;
    query
        .bind(seq as i64)
        .bind(item.channel_id)
        .bind(s.id.as_key().to_owned())
        .bind(serde_json::to_string(&s.id).unwrap_or_default())
        // The profile sent, not the merged one: the upsert merges it.
        .bind(s.name.clone())
        .bind(s.phone.clone())
        .bind(s.email.clone())
        .bind(s.photo.clone())
        .bind(s.url.clone())
        .bind(s.invite.clone())
        .bind(item.now)
        .bind(i64::from(item.body.is_none()))
        .bind(i64::from(step.opens))
        .bind(i64::from(step.writes_client))
        .bind(step.number)
        .bind(item.uid.clone())
        .bind(item.body.clone())
        .bind(item.event.id.to_string())
        .bind(item.event.kind.as_str().to_owned())
        .bind(item.event.payload.to_string())
        .bind(item.event.at)
}

/// Index of the statement of [`write_script`] whose rows are the result.
const FINAL_STATEMENT: usize = 8;

/// Second round trip: every write of the batch, then one row per message
/// (`seq`, the client, its live chat, the message), in order.
static WRITE_SCRIPTS: Scripts = Scripts::new(MAX_BATCH, build_write_script);

fn build_write_script(slots: usize) -> String {
    let values = values(BATCH_COLUMNS.len(), slots);
    [
        // 0, 1, 2: the batch, in a table of this connection.
        "CREATE TEMP TABLE IF NOT EXISTS ingress_batch (seq INTEGER, ch INTEGER, \
         k TEXT, idj TEXT, name TEXT, phone TEXT, email TEXT, photo TEXT, url TEXT, \
         invite TEXT, now INTEGER, typing INTEGER, opens INTEGER, wc INTEGER, number INTEGER, \
         uid TEXT, body TEXT, eid TEXT, kind TEXT, payload TEXT, at INTEGER)"
            .to_owned(),
        "DELETE FROM temp.ingress_batch".to_owned(),
        format!("INSERT INTO temp.ingress_batch VALUES {values}"),
        // 3: clients, in order: an existing one merges the profile sent, a
        // new one takes the visitor number the plan gave it; a known one
        // its message changes nothing of, opening no chat, is left alone.
        format!(
            "INSERT INTO clients (channel_id, external_key, external_id_json, name, phone, \
             email, photo, url, invite, created_at, updated_at, visitor_number) \
             SELECT ch, k, idj, name, phone, email, photo, url, invite, now, now, number \
             FROM temp.ingress_batch WHERE ch IS NOT NULL AND wc = 1 ORDER BY seq \
             {CLIENT_MERGE}"
        ),
        // 4: the chats messages open.
        format!(
            "INSERT INTO chats (channel_id, client_id, state, opened_at, last_message_at) \
             SELECT b.ch, c.id, 'open', b.now, b.now FROM {BATCH_CLIENT} \
             WHERE b.opens = 1 ORDER BY b.seq"
        ),
        // 5: the messages, in their clients' live chats.
        format!(
            "INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, \
             created_at) SELECT b.uid, {LIVE_CHAT}, 'client', NULL, b.body, NULL, b.now \
             FROM {BATCH_CLIENT} WHERE b.typing = 0 ORDER BY b.seq"
        ),
        // 6: the chats they touched.
        "UPDATE chats SET last_message_at = (SELECT MAX(m.created_at) \
         FROM temp.ingress_batch b CROSS JOIN messages m ON m.uid = b.uid \
         WHERE m.chat_id = chats.id) \
         WHERE id IN (SELECT m.chat_id FROM temp.ingress_batch b CROSS JOIN messages m \
         ON m.uid = b.uid)"
            .to_owned(),
        // 7: the event-log rows.
        format!(
            "INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
             SELECT b.eid, b.kind, 'in', b.ch, {LIVE_CHAT}, b.payload, b.at \
             FROM {BATCH_CLIENT} ORDER BY b.seq"
        ),
        // 8: the result, one JSON array (see `json_cell`).
        format!(
            "SELECT json_group_array(json_array(b.seq, c.id, c.visitor_number, h.id, h.state, \
             h.agent_id, h.opened_at, h.accepted_at, h.closed_at, h.last_message_at, m.id) \
             ORDER BY b.seq) FROM {BATCH_CLIENT} \
             LEFT JOIN chats h ON h.id = {LIVE_CHAT} \
             LEFT JOIN messages m ON m.uid = b.uid"
        ),
        "DELETE FROM temp.ingress_batch".to_owned(),
    ]
    .join(";\n")
}

#[cfg(test)]
mod tests {
    use plugin_api::lenient::ExternalId;

    use super::*;
    use crate::event::{Direction, EventKind};
    use crate::store::{Durability, Store, required_test_postgres, test_channel};

    fn sender(id: &str, name: Option<&str>, phone: Option<&str>) -> CustomerSender {
        CustomerSender {
            id: ExternalId::Str(id.to_owned()),
            name: name.map(str::to_owned),
            phone: phone.map(str::to_owned),
            email: None,
            photo: None,
            url: None,
            invite: None,
        }
    }

    /// A message (or, without `text`, a typing notice) from `sender` at `now`.
    fn from(channel: i64, sender: CustomerSender, text: Option<&str>, now: i64) -> CustomerWrite {
        let (kind, body) = match text {
            Some(text) => (
                EventKind::CUSTOMER_MESSAGE,
                Some(json!({"type": "text", "text": text}).to_string()),
            ),
            None => (EventKind::CUSTOMER_TYPING, None),
        };
        CustomerWrite {
            channel_id: channel,
            sender,
            body,
            uid: uuid::Uuid::now_v7().to_string(),
            event: Event::new(kind, Direction::In, json!({"text": text})).on_channel(channel),
            now,
        }
    }

    async fn write(store: &Store, items: &[CustomerWrite]) -> Vec<CustomerWritten> {
        let mut w = store.begin_write().await.expect("write");
        let items: Vec<&CustomerWrite> = items.iter().collect();
        let written = write_customer_messages(&mut w.tx, &items, None, Then::More)
            .await
            .expect("batch");
        w.commit().await.expect("commit");
        written
    }

    /// A client deleted with its closed chat takes the chat's messages
    /// with it, on PostgreSQL too, where messages have no foreign key to
    /// cascade from (migration 18): nothing of the client is left to show.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_deleted_clients_messages_go_with_it_on_postgres() {
        let store = required_test_postgres().await;
        let channel = test_channel(&store, "deleted").await;
        let written = write(
            &store,
            &[
                from(channel, sender("ann", None, None), Some("hi"), 1),
                from(channel, sender("ann", None, None), Some("again"), 2),
                from(channel, sender("bob", None, None), Some("stays"), 3),
            ],
        )
        .await;
        let messages = async |client: i64| -> i64 {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM messages m JOIN chats h ON h.id = m.chat_id \
                 WHERE h.client_id = $1",
            )
            .bind(client)
            .fetch_one(store.pool())
            .await
            .expect("count");
            n
        };
        let (ann, bob) = (written[0].client.id, written[2].client.id);
        let ann_chat = written[0].chat.as_ref().map(|c| c.id).expect("a chat");
        assert_eq!((messages(ann).await, messages(bob).await), (2, 1));
        let mut w = store.begin_write().await.expect("write");
        sqlx::query("UPDATE chats SET state = 'closed' WHERE id = $1")
            .bind(ann_chat)
            .execute(&mut *w.tx)
            .await
            .expect("close");
        crate::store::crm::clients::delete(&mut w.tx, ann)
            .await
            .expect("delete");
        w.commit().await.expect("commit");
        let (left,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM messages WHERE chat_id = $1")
            .bind(ann_chat)
            .fetch_one(store.pool())
            .await
            .expect("count");
        assert_eq!(left, 0, "the deleted client's messages");
        assert_eq!(messages(bob).await, 1, "another client's");
    }

    /// On PostgreSQL a batch's known clients come back with the begin of its
    /// transaction (an `EXECUTE` of a statement prepared on the connection);
    /// a connection without the statement (deallocated) gets it and the
    /// batch is written as if it always had: the known sender stays in its
    /// chat.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batch_begun_with_its_known_clients_on_a_connection_without_the_statement() {
        use crate::store::locks::RowLocks;
        // One connection: the statement deallocated is the one the batch uses.
        let store = crate::store::test_postgres_one_connection().await;
        let channel = test_channel(&store, "first-read").await;
        let first = write(
            &store,
            &[from(channel, sender("ann", None, None), Some("hi"), 1)],
        )
        .await;
        for round in 0..2 {
            // Round 0: as the connection was made (after the migrations);
            // round 1: as the round before prepared it again.
            let had = crate::store::deallocate_if_prepared(&store, "hub_known_clients").await;
            assert!(had, "round {round}: the connection had the statement");
            let items = [from(
                channel,
                sender("ann", None, None),
                Some("again"),
                2 + round,
            )];
            let refs: Vec<&CustomerWrite> = items.iter().collect();
            let locks = RowLocks {
                senders: vec![(channel, "ann".to_owned())],
                ..RowLocks::default()
            };
            let read = known_read(&refs, store.backend()).expect("read");
            let (mut w, known) = store
                .begin_row_write_reading(&locks, read)
                .await
                .expect("begun");
            assert!(known.is_some(), "the read came back with the begin");
            // Nothing after it: its last statement commits it.
            let written = write_customer_messages(&mut w.tx, &refs, known, Then::ChatUpdates)
                .await
                .expect("batch");
            w.commit().await.expect("commit");
            assert_eq!(written[0].client.id, first[0].client.id, "round {round}");
            assert!(!written[0].opened, "ann's chat is open: round {round}");
            assert_eq!(
                written[0].chat.as_ref().map(|c| c.id),
                first[0].chat.as_ref().map(|c| c.id),
                "round {round}"
            );
        }
        // A transaction dropped before its commit leaves nothing, also once
        // its connection serves the next one.
        let messages = async || -> i64 {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM messages")
                .fetch_one(store.pool())
                .await
                .expect("count");
            n
        };
        let before = messages().await;
        let items = [from(channel, sender("ann", None, None), Some("dropped"), 9)];
        let refs: Vec<&CustomerWrite> = items.iter().collect();
        let read = known_read(&refs, store.backend()).expect("read");
        let (mut w, known) = store
            .begin_row_write_reading(&RowLocks::default(), read)
            .await
            .expect("begun");
        write_customer_messages(&mut w.tx, &refs, known, Then::More)
            .await
            .expect("batch");
        assert!(!w.tx.ended(), "more to write: not committed");
        drop(w);
        write(
            &store,
            &[from(channel, sender("bob", None, None), Some("hi"), 10)],
        )
        .await;
        assert_eq!(messages().await, before + 1, "bob's, not the dropped one");
        let (clients,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM clients")
            .fetch_one(store.pool())
            .await
            .expect("count");
        assert_eq!(clients, 2, "ann and bob");
    }

    /// On PostgreSQL a batch its caller writes nothing after is committed
    /// by its last statement (the new visitors' numbers, else the
    /// messages'): stored once that round trip returns, before its commit
    /// is awaited. A batch that changes a known chat's profile (its caller
    /// queues that chat's webhook) or has more after it is not; one whose
    /// statement the server refuses leaves nothing.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batch_with_nothing_after_it_is_committed_by_its_last_statement_on_postgres() {
        use crate::store::locks::RowLocks;
        let store = crate::store::required_test_postgres().await;
        let channel = test_channel(&store, "last").await;
        let messages = async || -> i64 {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM messages")
                .fetch_one(store.pool())
                .await
                .expect("count");
            n
        };
        let begin = async |items: &[&CustomerWrite]| {
            let read = known_read(items, store.backend()).expect("read");
            store
                .begin_row_write_reading(&RowLocks::default(), read)
                .await
                .expect("begun")
        };
        // (what, the batch, whether its last statement commits it)
        let cases = [
            (
                "a new sender",
                from(channel, sender("ann", None, None), Some("hi"), 1),
                true,
            ),
            (
                "a known sender",
                from(channel, sender("ann", None, None), Some("again"), 2),
                true,
            ),
            (
                "a known sender's new name",
                from(channel, sender("ann", Some("Ann"), None), Some("named"), 3),
                false,
            ),
        ];
        for (what, item, ends) in cases {
            let before = messages().await;
            let refs = [&item];
            let (mut w, known) = begin(&refs).await;
            let written = write_customer_messages(&mut w.tx, &refs, known, Then::ChatUpdates)
                .await
                .expect("batch");
            assert_eq!(w.tx.ended(), ends, "{what}");
            let seen = messages().await;
            assert_eq!(
                seen,
                before + i64::from(ends),
                "{what}: stored before its commit"
            );
            assert_eq!(written[0].client.visitor_number, 1, "{what}");
            w.commit().await.expect("commit");
            assert_eq!(messages().await, before + 1, "{what}: stored once");
        }
        // The server refuses the batch (its event's id is taken): the
        // transaction ends with nothing of it.
        let before = messages().await;
        let mut item = from(channel, sender("bob", None, None), Some("dup"), 4);
        let (taken,): (String,) = sqlx::query_as("SELECT id FROM events LIMIT 1")
            .fetch_one(store.pool())
            .await
            .expect("an event");
        item.event.id = taken.parse().expect("an event id");
        let refs = [&item];
        let (mut w, known) = begin(&refs).await;
        let refused = write_customer_messages(&mut w.tx, &refs, known, Then::ChatUpdates).await;
        assert!(refused.is_err(), "the event's id is taken");
        assert!(!w.tx.ended(), "refused, not ended");
        drop(w);
        let bob = from(channel, sender("bob", None, None), Some("hi"), 5);
        let (mut w, known) = begin(&[&bob]).await;
        let written = write_customer_messages(&mut w.tx, &[&bob], known, Then::ChatUpdates)
            .await
            .expect("after a refused batch");
        w.commit().await.expect("commit");
        assert_eq!(messages().await, before + 1, "bob's second message only");
        assert_eq!(
            written[0].client.visitor_number, 2,
            "no number taken by the refused one"
        );
    }

    /// One batch leaves what its messages written one by one, in order,
    /// would: a new sender's first message opens its chat and takes the
    /// next visitor number, its later ones join that chat and merge their
    /// profile; a known sender stays in its chat; a typing notice opens
    /// nothing of its own.
    #[tokio::test]
    async fn a_batch_writes_what_its_messages_one_by_one_would() {
        let (_dir, store) = crate::store::test_sqlite().await;
        one_batch(store).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batch_writes_what_its_messages_one_by_one_would_on_postgres() {
        one_batch(required_test_postgres().await).await;
    }

    /// On PostgreSQL a batch finds its clients and chats by key, whatever
    /// plan the server keeps: under the generic plan a prepared statement
    /// runs after five executions, over thousands of clients and chats, no
    /// statement of the batch reads a whole table (it did: a hash join over
    /// every client and chat, per batch of two messages).
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batch_reads_no_whole_table_on_postgres_whatever_the_plan() {
        batch_plans_read_by_key(true).await;
    }

    /// The same on a young database: plans kept while its tables held
    /// hundreds of rows and were never analyzed still find clients and
    /// chats by key, neither scanning a table nor walking its primary key,
    /// once thousands arrived (or, replanned by an autoanalyze, with the
    /// write transactions' settings).
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_young_databases_kept_batch_plans_read_by_key_on_postgres() {
        batch_plans_read_by_key(false).await;
    }

    /// `analyzed`: thousands of clients and chats, analyzed, before the
    /// plans are made; else three, never analyzed, and the thousands after.
    async fn batch_plans_read_by_key(analyzed: bool) {
        use sqlx::Connection;
        let url = crate::store::required_test_postgres_url().await;
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        let channel = test_channel(&store, "plans").await;
        let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
        let fill = |from: i64, to: i64| {
            format!(
                "{}; ",
                crate::store::test_clients_with_chats_sql(channel, from, to)
            )
        };
        let first = if analyzed {
            format!("{} ANALYZE clients; ANALYZE chats;", fill(1, 3000))
        } else {
            fill(1, 600)
        };
        sqlx::raw_sql(&format!("{first} SET plan_cache_mode = force_generic_plan"))
            .execute(&mut conn)
            .await
            .expect("the first clients");
        let keys = json!([{"ch": channel, "k": "5"}, {"ch": channel, "k": "7"}]).to_string();
        let messages = json!([
            {"seq": 0, "ch": channel, "k": "5", "now": 1, "typing": 0, "uid": "u1",
             "body": "{}", "eid": "e1", "kind": "customer.message", "payload": "{}", "at": 1},
            {"seq": 1, "ch": channel, "k": "7", "now": 1, "typing": 0, "uid": "u2",
             "body": "{}", "eid": "e2", "kind": "customer.message", "payload": "{}", "at": 1}
        ])
        .to_string();
        let chats: Vec<(i64,)> = sqlx::query_as("SELECT id FROM chats ORDER BY id LIMIT 2")
            .fetch_all(&mut conn)
            .await
            .expect("chats");
        let chat_ids: Vec<i64> = chats.iter().map(|(id,)| *id).collect();
        let chat_ids = serde_json::to_string(&chat_ids).expect("ids");
        let quoted = crate::store::batch::quoted;
        let plans = [
            ("known clients", known_sql(true).to_owned(), quoted(&keys)),
            ("messages", PG_MESSAGES.to_owned(), quoted(&messages)),
            (
                "visitor numbers",
                PG_NUMBERING.to_owned(),
                "'[1, 2]', 2".to_owned(),
            ),
            (
                "the chats' locks",
                crate::store::locks::chats_prepared().to_owned(),
                format!("{}, '[]'", quoted(&chat_ids)),
            ),
        ];
        crate::store::batch::prepare_plans(&mut conn, &plans).await;
        if !analyzed {
            sqlx::raw_sql(&fill(601, 3000))
                .execute(&mut conn)
                .await
                .expect("a busy day's clients");
        }
        crate::store::batch::assert_read_by_key(&mut conn, &plans, &["clients", "chats"]).await;
    }

    async fn one_batch(store: Store) {
        let channel = test_channel(&store, "batch").await;
        let earlier = write(
            &store,
            &[from(
                channel,
                sender("k", Some("Kim"), None),
                Some("hi"),
                10,
            )],
        )
        .await;
        let kim_chat = earlier[0].chat.as_ref().expect("kim's chat").id;

        let written = write(
            &store,
            &[
                from(channel, sender("a", Some("Ann"), None), Some("one"), 20),
                from(channel, sender("b", None, None), None, 21),
                from(
                    channel,
                    sender("k", None, Some("+1 555")),
                    Some("again"),
                    22,
                ),
                from(channel, sender("a", None, Some("+2 555")), Some("two"), 23),
                from(channel, sender("b", Some("Bo"), None), Some("three"), 24),
            ],
        )
        .await;
        let [ann1, bo_typing, kim, ann2, bo] = &written[..] else {
            panic!("five results: {written:?}");
        };

        // Visitor numbers in the order the senders first wrote.
        let numbers: Vec<i64> = [&earlier[0], ann1, bo_typing, bo]
            .iter()
            .map(|w| w.client.visitor_number)
            .collect();
        assert_eq!(
            numbers[1..],
            [numbers[0] + 1, numbers[0] + 2, numbers[0] + 2]
        );

        let ann_chat = ann1.chat.as_ref().expect("ann's chat");
        assert!(ann1.opened && !ann2.opened);
        assert_eq!(ann2.chat.as_ref().map(|c| c.id), Some(ann_chat.id));
        assert_eq!(ann1.client.id, ann2.client.id);
        assert_eq!(ann1.client.phone, None);
        assert_eq!(
            (ann2.client.name.as_deref(), ann2.client.phone.as_deref()),
            (Some("Ann"), Some("+2 555"))
        );
        assert!(ann2.profile_changed, "a phone was added");
        assert_eq!(ann2.chat.as_ref().map(|c| c.last_message_at), Some(23));

        // A typing notice stores no message and opens nothing; the chat it
        // reports is the one the sender's next message of the batch opens
        // (the batch reads chats after it has opened them all).
        assert!(bo_typing.message.is_none() && !bo_typing.opened && bo.opened);
        assert_eq!(
            bo_typing.chat.as_ref().map(|c| c.id),
            bo.chat.as_ref().map(|c| c.id)
        );
        assert_eq!(bo.client.name.as_deref(), Some("Bo"));

        assert_eq!(kim.chat.as_ref().map(|c| c.id), Some(kim_chat));
        assert!(!kim.opened && kim.profile_changed);
        assert_eq!(
            (kim.client.name.as_deref(), kim.client.phone.as_deref()),
            (Some("Kim"), Some("+1 555"))
        );

        // Messages numbered in the batch's order.
        let ids: Vec<i64> = [ann1, kim, ann2, bo]
            .iter()
            .map(|w| w.message.as_ref().expect("a message").id)
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

        // What a later read finds agrees with what the batch answered.
        let again = write(
            &store,
            &[from(channel, sender("a", None, None), Some("four"), 30)],
        )
        .await;
        assert_eq!(again[0].chat.as_ref().map(|c| c.id), Some(ann_chat.id));
        assert_eq!(again[0].client.phone.as_deref(), Some("+2 555"));
        assert!(!again[0].profile_changed);
    }
}
