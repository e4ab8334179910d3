//! Customer messages written in batches: the client upserts, the chats they
//! open or join, the messages and their event-log rows, for a whole batch in
//! two round trips to the database and a fixed number of statements.
//!
//! Why: on SQLite every statement, and every row it returns, is a hand-off
//! to the driver's thread and back; that, not SQLite, was the cost of a
//! message. Here a batch is one JSON parameter, copied once into a temporary
//! table, and every step is one set-based statement over it.
//!
//! The result is what writing the messages one by one, in order, would have
//! done: a later message of the batch sees what the earlier ones wrote (the
//! client they created, the chat they opened, the profile they merged).

use std::collections::HashMap;

use futures_util::{Stream, StreamExt};
use plugin_api::channel::CustomerSender;
use serde_json::{Value, json};
use sqlx::any::{AnyQueryResult, AnyRow};
use sqlx::{AnyConnection, Either, Row};

use super::chats::{
    CHAT_COLUMNS, CLIENT_COLUMNS, CLIENT_MERGE, MESSAGE_COLUMNS, chat_at, client_at, message_at,
};
use super::{Chat, Client, Ctx, MessageRow, StoreError};
use crate::event::Event;

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
    let known = known_clients(conn, items).await?;
    let plan = Plan::new(items, known);
    let slots = slots_for(items.len());
    let mut query = sqlx::query(write_script(slots));
    for row in &plan.batch {
        for value in row {
            query = bind_value(query, value);
        }
    }
    for _ in items.len()..slots {
        for _ in BATCH_COLUMNS {
            query = query.bind(None::<String>);
        }
    }
    let rows = collect(sqlx::Executor::fetch_many(conn, query)).await?;
    let Some(rows) = rows.into_iter().nth(FINAL_STATEMENT) else {
        return Err(StoreError::Corrupt(
            "the batch script returned nothing".into(),
        ));
    };
    if rows.len() != items.len() {
        return Err(StoreError::Corrupt(format!(
            "the batch script returned {} rows for {} messages",
            rows.len(),
            items.len()
        )));
    }
    let client_base = 1;
    let chat_base = client_base + columns(CLIENT_COLUMNS);
    let message_base = chat_base + columns(CHAT_COLUMNS);
    let mut written = Vec::with_capacity(items.len());
    for (row, step) in rows.iter().zip(&plan.steps) {
        let chat_id: Option<i64> = row.try_get(chat_base).ctx("reading a batch row")?;
        let message_id: Option<i64> = row.try_get(message_base).ctx("reading a batch row")?;
        written.push(CustomerWritten {
            client: client_at(row, client_base)?,
            profile_changed: step.profile_changed,
            chat: chat_id.map(|_| chat_at(row, chat_base)).transpose()?,
            opened: step.opens,
            message: message_id
                .map(|_| message_at(row, message_base))
                .transpose()?,
        });
    }
    Ok(written)
}

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
        "SELECT DISTINCT c.channel_id, c.external_key, c.name, c.phone, c.email, c.photo, \
         c.url, c.invite, {LIVE_CHAT} IS NOT NULL \
         FROM json_each($1) j CROSS JOIN clients c ON c.channel_id = json_extract(j.value, '$.ch') \
         AND c.external_key = json_extract(j.value, '$.k'); \
         SELECT value FROM counters WHERE name = 'visitor_number';"
    );
    let mut results = run_script(conn, &sql, Value::Array(keys).to_string()).await?;
    let sequence = match results.get(1).and_then(|rows| rows.first()) {
        Some(row) => row
            .try_get::<i64, _>(0)
            .ctx("reading the visitor sequence")?,
        None => {
            return Err(StoreError::Corrupt(
                "the visitor sequence is missing".into(),
            ));
        }
    };
    let mut known = HashMap::new();
    for row in results.swap_remove(0) {
        let get = |i: usize| row.try_get::<Option<String>, _>(i);
        let profile = [get(2), get(3), get(4), get(5), get(6), get(7)];
        let mut fields: Profile = Default::default();
        for (slot, value) in fields.iter_mut().zip(profile) {
            *slot = value.ctx("reading a client")?;
        }
        known.insert(
            (
                row.try_get(0).ctx("reading a client")?,
                row.try_get(1).ctx("reading a client")?,
            ),
            Known {
                profile: fields,
                live_chat: row.try_get::<i64, _>(8).ctx("reading a client")? != 0,
            },
        );
    }
    Ok((known, sequence))
}

/// What each message will do, worked out in order from what the database
/// held before the batch, and the batch parameter that carries it.
struct Plan {
    steps: Vec<Step>,
    /// One row of [`BATCH_COLUMNS`] per message.
    batch: Vec<[Value; BATCH_COLUMNS.len()]>,
}

struct Step {
    opens: bool,
    profile_changed: bool,
}

impl Plan {
    fn new(items: &[&CustomerWrite], known: (HashMap<(i64, String), Known>, i64)) -> Plan {
        let (mut clients, mut sequence) = known;
        let mut steps = Vec::with_capacity(items.len());
        let mut rows = Vec::with_capacity(items.len());
        for (seq, item) in items.iter().enumerate() {
            let key = (item.channel_id, item.sender.id.as_key().to_owned());
            let sent = profile_of(&item.sender);
            // A new client takes the next visitor number; later messages of
            // the batch from it find it known.
            let (number, profile_changed) = match clients.get_mut(&key) {
                Some(client) => {
                    let merged: Profile = std::array::from_fn(|i| {
                        sent[i].clone().or_else(|| client.profile[i].clone())
                    });
                    let changed = merged[..3] != client.profile[..3];
                    client.profile = merged;
                    (None, changed)
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
                    (Some(sequence), false)
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
            });
            let [name, phone, email, photo, url, invite] = sent.map(|v| json!(v));
            rows.push([
                json!(seq),
                json!(item.channel_id),
                json!(key.1),
                json!(serde_json::to_string(&item.sender.id).unwrap_or_default()),
                name,
                phone,
                email,
                photo,
                url,
                invite,
                json!(item.now),
                json!(i64::from(typing)),
                json!(i64::from(opens)),
                json!(number),
                json!(item.uid),
                json!(item.body),
                json!(item.event.id.to_string()),
                json!(item.event.kind.as_str()),
                json!(item.event.payload.to_string()),
                json!(item.event.at),
            ]);
        }
        Plan { steps, batch: rows }
    }
}

/// Columns of the batch table, bound in this order for each message.
const BATCH_COLUMNS: [&str; 20] = [
    "seq", "ch", "k", "idj", "name", "phone", "email", "photo", "url", "invite", "now", "typing",
    "opens", "number", "uid", "body", "eid", "kind", "payload", "at",
];

/// Index of the statement of [`write_script`] whose rows are the result.
const FINAL_STATEMENT: usize = 8;

/// Second round trip: every write of the batch, then one row per message
/// (`seq`, the client, its live chat, the message), in order. The batch
/// is bound as `slots` rows of parameters, padded with NULL rows (which
/// join no client) so that a few prepared scripts serve every batch size.
fn write_script(slots: usize) -> &'static str {
    static SCRIPTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let scripts = SCRIPTS.get_or_init(|| {
        (0..=MAX_BATCH.trailing_zeros())
            .map(|power| build_write_script(1 << power))
            .collect()
    });
    let power = slots.trailing_zeros() as usize;
    scripts.get(power).map(String::as_str).unwrap_or_default()
}

/// The smallest power of two that holds `n` messages.
fn slots_for(n: usize) -> usize {
    n.next_power_of_two()
}

fn build_write_script(slots: usize) -> String {
    let prefixed = |table: &str, columns: &str| {
        columns
            .split(',')
            .map(|c| format!("{table}.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let width = BATCH_COLUMNS.len();
    let values = (0..slots)
        .map(|row| {
            let params: Vec<String> = (1..=width)
                .map(|c| format!("${}", row * width + c))
                .collect();
            format!("({})", params.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
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
        // 8: the result.
        format!(
            "SELECT b.seq, {}, {}, {} FROM {BATCH_CLIENT} \
             LEFT JOIN chats h ON h.id = {LIVE_CHAT} \
             LEFT JOIN messages m ON m.uid = b.uid ORDER BY b.seq",
            prefixed("c", CLIENT_COLUMNS),
            prefixed("h", CHAT_COLUMNS),
            prefixed("m", MESSAGE_COLUMNS)
        ),
        "DELETE FROM temp.ingress_batch".to_owned(),
    ]
    .join(";\n")
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds a planned value with its SQL type.
fn bind_value<'q>(query: Query<'q>, value: &Value) -> Query<'q> {
    match value {
        Value::Number(n) => query.bind(n.as_i64()),
        Value::String(s) => query.bind(s.clone()),
        _ => query.bind(None::<String>),
    }
}

fn columns(list: &str) -> usize {
    list.split(',').count()
}

/// Runs a script of statements with one text parameter; the rows of each
/// statement, in order.
async fn run_script(
    conn: &mut AnyConnection,
    sql: &str,
    param: String,
) -> Result<Vec<Vec<AnyRow>>, StoreError> {
    let results = sqlx::Executor::fetch_many(conn, sqlx::query(sql).bind(param));
    collect(results).await
}

async fn collect(
    results: impl Stream<Item = Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>>,
) -> Result<Vec<Vec<AnyRow>>, StoreError> {
    let mut statements = Vec::new();
    let mut current = Vec::new();
    let mut results = std::pin::pin!(results);
    while let Some(result) = results.next().await {
        match result.ctx("storing customer messages")? {
            Either::Right(row) => current.push(row),
            Either::Left(_) => statements.push(std::mem::take(&mut current)),
        }
    }
    Ok(statements)
}
