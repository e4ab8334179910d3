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

use super::batch::{Query, Scripts, json_cell, run, run_script, slots_for, values};
use super::chats::{CHAT_COLUMNS, CLIENT_MERGE, chat_from_row, upsert_client};
use super::{Author, Chat, ChatState, Client, Ctx, MessageRow, StoreError, is_postgres};
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

/// The subquery of a client's live chat (`c` is the client).
const LIVE_CHAT: &str = "(SELECT lc.id FROM chats lc WHERE lc.client_id = c.id \
     AND lc.state <> 'closed' ORDER BY lc.id DESC LIMIT 1)";
/// Joins each batch row `b` to its client `c` (`CROSS` keeps the small batch
/// as the outer loop, so each client is one index lookup).
const BATCH_CLIENT: &str =
    "temp.ingress_batch b CROSS JOIN clients c ON c.channel_id = b.ch AND c.external_key = b.k";

/// Stores `items` in order, in the caller's transaction.
pub async fn write_customer_messages(
    conn: &mut AnyConnection,
    items: &[&CustomerWrite],
) -> Result<Vec<CustomerWritten>, StoreError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    if is_postgres(conn) {
        let mut written = Vec::with_capacity(items.len());
        for item in items {
            written.push(write_one(conn, item).await?);
        }
        return Ok(written);
    }
    let known = known_clients(conn, items).await?;
    let plan = Plan::new(items, known);
    let slots = slots_for(items.len());
    let mut query = sqlx::query(WRITE_SCRIPTS.get(slots));
    for (seq, (item, step)) in items.iter().zip(&plan.steps).enumerate() {
        query = bind_row(query, seq, item, step);
    }
    for _ in items.len()..slots {
        for _ in BATCH_COLUMNS {
            query = query.bind(None::<String>);
        }
    }
    let statements = run(conn, query, WHAT).await?;
    let results: Vec<ResultRow> = json_cell(statements.get(FINAL_STATEMENT), 0)?;
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

/// PostgreSQL: one message with one statement per step, what the batch
/// script does for it. (PostgreSQL runs no script of several statements
/// with parameters, and one statement cannot see its own rows, so the
/// script's set-based steps would not see the batch's earlier messages.)
async fn write_one(
    conn: &mut AnyConnection,
    item: &CustomerWrite,
) -> Result<CustomerWritten, StoreError> {
    let before: Option<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT name, phone, email FROM clients WHERE channel_id = $1 AND external_key = $2",
    )
    .bind(item.channel_id)
    .bind(item.sender.id.as_key())
    .fetch_optional(&mut *conn)
    .await
    .ctx(WHAT)?;
    let mut client = upsert_client(conn, item.channel_id, &item.sender, item.now).await?;
    // As the batch answers: the id as this message sent it.
    client.external_id = item.sender.id.clone();
    let profile_changed = before.is_some_and(|(name, phone, email)| {
        name != client.name || phone != client.phone || email != client.email
    });
    let live = sqlx::query(&format!(
        "SELECT {CHAT_COLUMNS} FROM chats WHERE client_id = $1 AND state <> 'closed' \
         ORDER BY id DESC LIMIT 1"
    ))
    .bind(client.id)
    .fetch_optional(&mut *conn)
    .await
    .ctx(WHAT)?;
    let mut chat = live.as_ref().map(chat_from_row).transpose()?;
    let mut opened = false;
    let mut message = None;
    if let Some(body) = &item.body {
        let mut live = match chat {
            Some(chat) => chat,
            None => {
                opened = true;
                super::chats::insert_chat(conn, item.channel_id, client.id, item.now).await?
            }
        };
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, \
             created_at) VALUES ($1, $2, 'client', NULL, $3, NULL, $4) RETURNING id",
        )
        .bind(item.uid.as_str())
        .bind(live.id)
        .bind(body.as_str())
        .bind(item.now)
        .fetch_one(&mut *conn)
        .await
        .ctx(WHAT)?;
        sqlx::query("UPDATE chats SET last_message_at = $1 WHERE id = $2")
            .bind(item.now)
            .bind(live.id)
            .execute(&mut *conn)
            .await
            .ctx(WHAT)?;
        live.last_message_at = item.now;
        message = Some(MessageRow {
            id,
            author_name: None,
            uid: item.uid.clone(),
            chat_id: live.id,
            author: Author::Client,
            agent_id: None,
            body: serde_json::from_str(body)
                .map_err(|e| StoreError::Corrupt(format!("message body: {e}")))?,
            delivery: None,
            delivery_error: None,
            created_at: item.now,
        });
        chat = Some(live);
    }
    let e = &item.event;
    sqlx::query(
        "INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
         VALUES ($1, $2, 'in', $3, $4, $5, $6)",
    )
    .bind(e.id.to_string())
    .bind(e.kind.as_str())
    .bind(item.channel_id)
    .bind(chat.as_ref().map(|c| c.id))
    .bind(e.payload.to_string())
    .bind(e.at)
    .execute(&mut *conn)
    .await
    .ctx(WHAT)?;
    Ok(CustomerWritten {
        client,
        profile_changed,
        chat,
        opened,
        message,
    })
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

/// First round trip: the batch's existing clients and the visitor sequence.
async fn known_clients(
    conn: &mut AnyConnection,
    items: &[&CustomerWrite],
) -> Result<(HashMap<(i64, String), Known>, i64), StoreError> {
    let keys: Vec<Value> = items
        .iter()
        .map(|i| json!({ "ch": i.channel_id, "k": i.sender.id.as_key() }))
        .collect();
    let sql = format!(
        "SELECT (SELECT value FROM counters WHERE name = 'visitor_number'), \
         (SELECT json_group_array(json_array(c.channel_id, c.external_key, c.name, c.phone, \
         c.email, c.photo, c.url, c.invite, {LIVE_CHAT} IS NOT NULL)) FROM clients c \
         WHERE c.id IN (SELECT k.id FROM json_each($1) j CROSS JOIN clients k \
         ON k.channel_id = json_extract(j.value, '$.ch') \
         AND k.external_key = json_extract(j.value, '$.k')))"
    );
    let statements = run_script(conn, &sql, Value::Array(keys).to_string(), WHAT).await?;
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

/// What each message will do, worked out in order from what the database
/// held before the batch.
struct Plan {
    steps: Vec<Step>,
}

struct Step {
    opens: bool,
    profile_changed: bool,
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
            let (number, profile_changed, profile) = match clients.get_mut(&key) {
                Some(client) => {
                    let merged: Profile = std::array::from_fn(|i| {
                        sent[i].clone().or_else(|| client.profile[i].clone())
                    });
                    let changed = merged[..3] != client.profile[..3];
                    client.profile = merged.clone();
                    (None, changed, merged)
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
                    (Some(sequence), false, sent.clone())
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
                profile,
                number,
            });
        }
        Plan { steps }
    }
}

/// Columns of the batch table, bound in this order for each message.
const BATCH_COLUMNS: [&str; 20] = [
    "seq", "ch", "k", "idj", "name", "phone", "email", "photo", "url", "invite", "now", "typing",
    "opens", "number", "uid", "body", "eid", "kind", "payload", "at",
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
         invite TEXT, now INTEGER, typing INTEGER, opens INTEGER, number INTEGER, uid TEXT, \
         body TEXT, eid TEXT, kind TEXT, payload TEXT, at INTEGER)"
            .to_owned(),
        "DELETE FROM temp.ingress_batch".to_owned(),
        format!("INSERT INTO temp.ingress_batch VALUES {values}"),
        // 3: clients, in order: an existing one merges the profile sent, a
        // new one takes the visitor number the plan gave it.
        format!(
            "INSERT INTO clients (channel_id, external_key, external_id_json, name, phone, \
             email, photo, url, invite, created_at, updated_at, visitor_number) \
             SELECT ch, k, idj, name, phone, email, photo, url, invite, now, now, number \
             FROM temp.ingress_batch WHERE ch IS NOT NULL ORDER BY seq {CLIENT_MERGE}"
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
