//! The durable outbox: one row per outbound request, written in the same
//! transaction as the state change that caused it, claimed by the deliverer
//! under a lease so a crashed attempt is picked up again.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::batch::{self, Scripts, slots_for, values};
use super::{Backend, Ctx, DeliveryState, Store, StoreError, flag, is_postgres};
use crate::event::Event;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    Pending,
    Delivered,
    /// Failed for good: for webhooks, a dead letter an operator may replay.
    Failed,
    /// Never sent on purpose: dropped by a plugin, or no receiver configured.
    Dropped,
}

impl OutboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxState::Pending => "pending",
            OutboxState::Delivered => "delivered",
            OutboxState::Failed => "failed",
            OutboxState::Dropped => "dropped",
        }
    }

    pub fn parse(s: &str) -> Option<OutboxState> {
        match s {
            "pending" => Some(OutboxState::Pending),
            "delivered" => Some(OutboxState::Delivered),
            "failed" => Some(OutboxState::Failed),
            "dropped" => Some(OutboxState::Dropped),
            _ => None,
        }
    }
}

/// Takes a staged row out of staging with the body its plugins left.
pub async fn unstage(conn: &mut AnyConnection, id: &str, body: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE outbox SET staged = 0, body = $1 WHERE id = $2")
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

fn parse_notes(notes: Option<String>) -> Vec<String> {
    notes
        .and_then(|n| serde_json::from_str(&n).ok())
        .unwrap_or_default()
}

/// When a failed delivery is tried next, given up, and stops holding back
/// later rows of its order key (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub next_at: i64,
    pub give_up_at: i64,
    pub hold_until: i64,
}

/// Names of the retry policies rows are sent under (`delivery::Policies`
/// says what each means); a forward's is `dest:<destination>`.
pub const POLICY_CHANNEL: &str = "channel";
pub const POLICY_TYPING: &str = "typing";
/// `chat_accepted` and `chat_updated`: an agent waits for the reply.
pub const POLICY_WEBHOOK_SYNC: &str = "webhook_sync";
/// Every other event webhook and every CRM webhook.
pub const POLICY_WEBHOOK: &str = "webhook";
pub const POLICY_DESTINATION_PREFIX: &str = "dest:";
/// Requests to bot providers: the spec's 3 s timeout, 3 attempts 3 s apart.
pub const POLICY_BOT: &str = "bot";
/// A row to a plugin bot has this target instead of a URL.
pub const PLUGIN_BOT_PREFIX: &str = "plugin:";

/// Row kinds of webhooks start with these (`webhook.<event_name>`,
/// `crm.<event_type>.<event_name>`); a plugin's forward is `forward`.
pub const EVENT_WEBHOOK_PREFIX: &str = "webhook.";
pub const CRM_WEBHOOK_PREFIX: &str = "crm.";
pub const FORWARD_KIND: &str = "forward";
pub const BOT_PREFIX: &str = "bot.";

/// What an outbox row is. The constructors of [`NewDelivery`] fix, per kind,
/// its policy, order key and staging; the deliverer and the bookkeeping of
/// results match on this instead of on the kind's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// An agent's message or typing notice to the channel's integrator; its
    /// answer is read by the channel's rules (an `{"error"}` body refuses).
    ChannelMessage,
    /// A plugin's forward to a named destination.
    Forward,
    /// An event webhook to a channel's receiver; any 2xx is delivered.
    EventWebhook,
    /// A CRM webhook to the CRM's receiver.
    CrmWebhook,
    /// An event to a bot provider (`bot.*`), or to a plugin bot.
    Bot,
}

impl RowKind {
    /// The kind of a stored row (rows of older versions read by their kind's text).
    pub fn of(kind: &str) -> RowKind {
        if kind == FORWARD_KIND {
            RowKind::Forward
        } else if kind.starts_with(EVENT_WEBHOOK_PREFIX) {
            RowKind::EventWebhook
        } else if kind.starts_with(CRM_WEBHOOK_PREFIX) {
            RowKind::CrmWebhook
        } else if kind.starts_with(BOT_PREFIX) {
            RowKind::Bot
        } else {
            RowKind::ChannelMessage
        }
    }

    pub fn is_webhook(self) -> bool {
        matches!(self, RowKind::EventWebhook | RowKind::CrmWebhook)
    }
}

impl NewDelivery {
    /// An agent's message (or typing notice) to the integrator: in order
    /// per chat, sent as queued. The message's id is filled in when it is
    /// stored with it (`store::outgoing`).
    pub fn channel_message(
        event_id: uuid::Uuid,
        kind: &str,
        target_url: String,
        body: String,
        chunked: bool,
        chat_id: i64,
        typing: bool,
    ) -> NewDelivery {
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: if typing {
                POLICY_TYPING
            } else {
                POLICY_CHANNEL
            }
            .to_owned(),
            target_url,
            body,
            chunked,
            order_key: Some(format!("chat:{chat_id}")),
            message_id: None,
            chat_id: Some(chat_id),
            staged: false,
            secret: None,
        }
    }

    /// An event to a bot (`kind` = `bot.<event>`): staged (the `bot.*`
    /// routes' plugins run when it is first claimed), in order per chat.
    /// `target_url` is the provider's `{endpoint}/{token}`, or
    /// [`PLUGIN_BOT_PREFIX`] and the plugin's name for a plugin bot.
    pub fn bot(
        event_id: uuid::Uuid,
        kind: &str,
        target_url: String,
        body: String,
        chat_id: i64,
    ) -> NewDelivery {
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: POLICY_BOT.to_owned(),
            target_url,
            body,
            chunked: false,
            order_key: Some(bot_order_key(chat_id)),
            message_id: None,
            chat_id: Some(chat_id),
            staged: true,
            secret: None,
        }
    }

    /// A plugin's forward to `destination`: per destination and chat, in the
    /// order the forwards were made.
    pub fn forward(
        event_id: uuid::Uuid,
        destination: &str,
        target_url: String,
        body: String,
        chat_id: Option<i64>,
    ) -> NewDelivery {
        let policy = format!("{POLICY_DESTINATION_PREFIX}{destination}");
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: FORWARD_KIND.to_owned(),
            order_key: chat_id.map(|chat| format!("{policy}:chat:{chat}")),
            policy,
            target_url,
            body,
            chunked: false,
            message_id: None,
            chat_id,
            staged: false,
            secret: None,
        }
    }

    /// An event webhook (`kind` = `webhook.<event_name>`): staged (its plugins
    /// run when it is first claimed), in the order [`webhook_order_key`]
    /// gives it. `sync` for the replies an agent waits for.
    #[allow(clippy::too_many_arguments)]
    pub fn event_webhook(
        event_id: uuid::Uuid,
        kind: &str,
        sync: bool,
        target_url: String,
        body: String,
        chat_id: Option<i64>,
        client_id: Option<i64>,
        secret: Option<String>,
    ) -> NewDelivery {
        let order_key = webhook_order_key(kind, chat_id, client_id);
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: if sync {
                POLICY_WEBHOOK_SYNC
            } else {
                POLICY_WEBHOOK
            }
            .to_owned(),
            target_url,
            body,
            chunked: false,
            order_key,
            message_id: None,
            chat_id,
            staged: true,
            secret,
        }
    }

    /// A CRM webhook (`kind` = `crm.<event_type>.<event_name>`): staged, and
    /// all of them in one order (a retried created_* must not follow its updated_*).
    pub fn crm_webhook(
        event_id: uuid::Uuid,
        kind: &str,
        target_url: String,
        body: String,
        secret: Option<String>,
    ) -> NewDelivery {
        NewDelivery {
            id: uuid::Uuid::now_v7(),
            event_id,
            kind: kind.to_owned(),
            policy: POLICY_WEBHOOK.to_owned(),
            target_url,
            body,
            chunked: false,
            order_key: Some("crm".to_owned()),
            message_id: None,
            chat_id: None,
            staged: true,
            secret,
        }
    }
}

/// The order a chat's requests to its bot keep.
pub fn bot_order_key(chat_id: i64) -> String {
    format!("bot:chat:{chat_id}")
}

/// The order an event webhook keeps among the others. A chat's conversation
/// (`chat_accepted`, `chat_updated`, `chat_assigned`, `chat_finished`,
/// `offline_message`) is one order: a receiver opens its record on
/// `chat_accepted`, links it on `chat_assigned` and closes it on
/// `chat_finished`. A chat's `call_event`s are another: a call's statuses
/// follow each other, but receivers written before calls refuse them, and
/// that must not hold the chat's `chat_finished` back. A client's snapshots
/// are ordered per event name: `sequence` compares snapshots of one kind
/// (`client_updated` and `client_attribute_updated` carry different data,
/// neither supersedes the other), so a receiver refusing one kind must not
/// stall the other.
fn webhook_order_key(kind: &str, chat_id: Option<i64>, client_id: Option<i64>) -> Option<String> {
    let name = kind.strip_prefix(EVENT_WEBHOOK_PREFIX).unwrap_or(kind);
    match (chat_id, client_id) {
        (Some(chat), _) if name == "call_event" => Some(format!("webhook:chat:{chat}:{name}")),
        (Some(chat), _) => Some(format!("webhook:chat:{chat}")),
        (None, Some(client)) => Some(format!("webhook:client:{client}:{name}")),
        (None, None) => None,
    }
}

impl Claimed {
    pub fn row_kind(&self) -> RowKind {
        RowKind::of(&self.kind)
    }

    /// The plugin that answers a row to a plugin bot.
    pub fn plugin_bot(&self) -> Option<&str> {
        self.target_url.strip_prefix(PLUGIN_BOT_PREFIX)
    }

    /// The destination a forward goes to, by name.
    pub fn destination(&self) -> Option<&str> {
        self.policy.strip_prefix(POLICY_DESTINATION_PREFIX)
    }
}

/// A request to be made; `order_key` (the chat) serialises rows that share it.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub id: uuid::Uuid,
    pub event_id: uuid::Uuid,
    pub kind: String,
    pub policy: String,
    pub target_url: String,
    pub body: String,
    pub chunked: bool,
    pub order_key: Option<String>,
    pub message_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// Crosses its plugins when first claimed, not before it is queued.
    pub staged: bool,
    /// Standard Webhooks signing secret of the receiver.
    pub secret: Option<String>,
}

/// A row the deliverer holds a lease on.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub seq: i64,
    pub id: String,
    pub event_id: String,
    pub kind: String,
    pub policy: String,
    pub target_url: String,
    pub body: String,
    pub chunked: bool,
    pub message_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// Attempts started before this claim (a claim counts its own in the
    /// database, so one cut off by a crash is not sent again as the same number).
    pub attempts: i64,
    /// When the first attempt started, if one did.
    pub first_attempt_at: Option<i64>,
    pub give_up_at: Option<i64>,
    pub last_error: Option<String>,
    pub staged: bool,
    pub secret: Option<String>,
    /// The channel of its chat, read with the claim.
    pub channel_id: Option<i64>,
}

const COLUMNS: &str = "seq, id, event_id, kind, policy, target_url, body, chunked, message_id, \
     chat_id, attempts, first_attempt_at, give_up_at, last_error, staged, secret";

fn from_row(row: &AnyRow) -> Result<Claimed, sqlx::Error> {
    Ok(Claimed {
        seq: row.try_get("seq")?,
        id: row.try_get("id")?,
        event_id: row.try_get("event_id")?,
        kind: row.try_get("kind")?,
        policy: row.try_get("policy")?,
        target_url: row.try_get("target_url")?,
        body: row.try_get("body")?,
        chunked: flag(row.try_get("chunked")?),
        message_id: row.try_get("message_id")?,
        chat_id: row.try_get("chat_id")?,
        attempts: row.try_get("attempts")?,
        first_attempt_at: row.try_get("first_attempt_at")?,
        give_up_at: row.try_get("give_up_at")?,
        last_error: row.try_get("last_error")?,
        staged: flag(row.try_get("staged")?),
        secret: row.try_get("secret")?,
        channel_id: row.try_get("channel_id")?,
    })
}

pub async fn enqueue(
    conn: &mut AnyConnection,
    d: &NewDelivery,
    now: i64,
) -> Result<(), StoreError> {
    // The head is decided on the key's pending rows: nobody may queue or
    // finish a row of the key meanwhile (see `locks`).
    if let Some(key) = d.order_key.as_deref() {
        super::locks::order_key_of(conn, key).await?;
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
async fn promote_next(conn: &mut AnyConnection, id: &str) -> Result<(), StoreError> {
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
pub async fn finish_many(conn: &mut AnyConnection, rows: &[&Finished]) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    if is_postgres(conn) {
        return finish_postgres(conn, rows).await;
    }
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
    let query = batch::pad_slots(query, FINISH_COLUMNS, rows.len(), slots);
    batch::run(conn, query, "recording delivery results").await?;
    Ok(())
}

/// PostgreSQL: the batch as the JSON parameter of one statement (PostgreSQL
/// runs no script of several statements with parameters): the results with
/// their messages, the order keys' new heads and the event-log rows: one
/// round trip, not two, while the write turn is held.
async fn finish_postgres(conn: &mut AnyConnection, rows: &[&Finished]) -> Result<(), StoreError> {
    const WHAT: &str = "recording delivery results";
    debug_assert!(rows.iter().all(|r| r.state != OutboxState::Pending));
    let batch: Vec<serde_json::Value> = rows
        .iter()
        .enumerate()
        .map(|(ord, row)| {
            let e = &row.event;
            serde_json::json!({
                "ord": ord, "seq": row.seq, "state": row.state.as_str(), "error": row.error,
                "attempts": row.attempts, "response": row.answer.as_deref().map(kept_answer),
                "now": row.now, "mid": row.message.map(|(id, _)| id),
                "mstate": row.message.map(|(_, state)| state.as_str()),
                "eid": e.id.to_string(), "kind": e.kind.as_str(), "dir": e.direction.as_str(),
                "ch": e.channel_id, "chat": e.chat_id, "payload": e.payload.to_string(),
                "at": e.at,
            })
        })
        .collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    super::locks::order_keys_of_rows(conn, &seqs).await?;
    batch::planned_per_batch(conn, PG_FINISH)
        .bind(serde_json::Value::Array(batch).to_string())
        .bind(rows.len() as i64)
        .execute(&mut *conn)
        .await
        .ctx(WHAT)?;
    Ok(())
}

/// `h`: the next pending row of each finished row's order key is its head
/// now. Every part of one statement sees the rows as they were before it,
/// so the finished rows, still pending there, are left out by hand (a
/// result is always final: delivered, failed or dropped), and `h` never
/// changes a row `u` changes. (`= ANY (ARRAY(…))`, not `IN`: the rows to
/// change are then read by `seq` through the primary key; as a join
/// PostgreSQL may hash the whole outbox for them.)
const PG_FINISH: &str = "WITH b AS (SELECT * FROM json_to_recordset($1::JSON) AS x(ord BIGINT, \
     seq BIGINT, state TEXT, error TEXT, attempts BIGINT, response TEXT, now BIGINT, \
     mid BIGINT, mstate TEXT, eid TEXT, kind TEXT, dir TEXT, ch BIGINT, chat BIGINT, \
     payload TEXT, at BIGINT) LIMIT $2), \
     u AS (UPDATE outbox SET state = b.state, last_error = COALESCE(b.error, outbox.last_error), \
     lease_until = NULL, finished_at = b.now, attempts = b.attempts, \
     response = COALESCE(b.response, outbox.response) FROM b WHERE outbox.seq = b.seq), \
     m AS (UPDATE messages SET delivery_state = b.mstate, delivery_error = b.error \
     FROM b WHERE messages.id = b.mid), \
     h AS (UPDATE outbox SET head = 1 WHERE seq = ANY (ARRAY(SELECT (SELECT MIN(p.seq) \
     FROM outbox p WHERE p.order_key = f.order_key AND p.state = 'pending' \
     AND p.seq <> ALL (ARRAY(SELECT seq FROM b))) \
     FROM outbox f WHERE f.order_key IS NOT NULL AND f.seq IN (SELECT seq FROM b)))) \
     INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
     SELECT eid, kind, dir, ch, chat, payload, at FROM b WHERE eid IS NOT NULL ORDER BY ord";

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

impl Store {
    /// Leases up to `limit` rows that are due and not waiting behind an earlier
    /// row of the same order key. An earlier row holds its key while it is in
    /// flight or until its `hold_until` passes: one failing event delays the
    /// rest of its key for a bounded time, not for its whole retry schedule.
    /// The claim counts the attempt it leads to, so the count survives a crash.
    pub async fn claim_due(
        &self,
        now: i64,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut w = self.begin_row_write().await?;
        let owner = &self.identity().id;
        let claimed = claim_in(&mut w.tx, self.backend(), owner, now, lease_ms, limit).await?;
        if claimed.is_empty() {
            return Ok(claimed);
        }
        w.commit().await?;
        Ok(claimed)
    }

    /// Records a failed attempt that will be tried again (or given up) at
    /// `next_at`; later rows of its order key wait for it until `hold_until`.
    pub async fn reschedule_delivery(
        &self,
        id: &str,
        attempts: i64,
        retry: Retry,
        error: &str,
    ) -> Result<(), StoreError> {
        let mut w = self.begin_row_write().await?;
        sqlx::query(
            "UPDATE outbox SET attempts = $1, next_attempt_at = $2, give_up_at = $3, \
             hold_until = $4, last_error = $5, lease_until = NULL WHERE id = $6",
        )
        .bind(attempts)
        .bind(retry.next_at)
        .bind(retry.give_up_at)
        .bind(retry.hold_until)
        .bind(error)
        .bind(id)
        .execute(&mut *w.tx)
        .await
        .ctx("rescheduling a delivery")?;
        w.commit().await
    }

    /// Gives back every lease in the database: a single instance that starts
    /// owns them all (they were taken by a process that is gone), so its
    /// chats need not wait for leases to expire. Returns how many there were.
    pub async fn reclaim_leases(&self) -> Result<u64, StoreError> {
        let mut w = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE outbox SET lease_until = NULL \
             WHERE state = 'pending' AND lease_until IS NOT NULL",
        )
        .execute(&mut *w.tx)
        .await
        .ctx("reclaiming leases")?;
        w.commit().await?;
        Ok(done.rows_affected())
    }

    /// Gives back leases this process will not use (shutdown), so a restart need not wait.
    pub async fn release_lease(&self, id: &str) -> Result<(), StoreError> {
        let mut w = self.begin_row_write().await?;
        sqlx::query("UPDATE outbox SET lease_until = NULL WHERE id = $1 AND state = 'pending'")
            .bind(id)
            .execute(&mut *w.tx)
            .await
            .ctx("releasing a lease")?;
        w.commit().await
    }

    /// The earliest time after `since` at which a pending row's next
    /// attempt or the hold it puts on its order key falls due: when the
    /// deliverer may find something to claim that nothing kicked it for.
    /// Rows due at `since` are not counted: a claim at `since` took what it
    /// could, and what it could not take waits for a row in flight (whose
    /// end kicks the deliverer). A lease that runs out (an instance that
    /// died) is found by the deliverer's idle poll.
    ///
    /// Why not the exact time the next row becomes claimable: that asks, of
    /// every pending row, whether an earlier one blocks it, a cost that
    /// grows with the backlog (about 200 ms at 100 000 rows behind a
    /// recovering integrator, for every claim); these two are index seeks.
    pub async fn next_due_at(&self, since: i64) -> Result<Option<i64>, StoreError> {
        let row: (Option<i64>, Option<i64>) = sqlx::query_as(next_due_sql(self.backend()))
            .bind(since)
            .fetch_one(self.pool())
            .await
            .ctx("finding the next due delivery")?;
        Ok(match row {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
}

/// [`Store::next_due_at`]'s statement. SQLite's planner would find the
/// earliest hold by reading every pending row through `outbox_due`, so it
/// is told to use `outbox_held` (only held rows are in it).
fn next_due_sql(backend: Backend) -> &'static str {
    static NEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static NEXT_PG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let (cell, indexed) = match backend {
        Backend::Sqlite => (&NEXT, " INDEXED BY outbox_held"),
        Backend::Postgres => (&NEXT_PG, ""),
    };
    cell.get_or_init(|| {
        format!(
            "SELECT (SELECT MIN(next_attempt_at) FROM outbox \
                     WHERE state = 'pending' AND next_attempt_at > $1), \
                    (SELECT MIN(hold_until) FROM outbox{indexed} \
                     WHERE state = 'pending' AND hold_until IS NOT NULL AND hold_until > $1)"
        )
    })
}

/// The claim statement: `$1` the new lease's end, `$2` now, `$3` the most
/// rows to take, `$4` the instance taking them.
fn claim_sql(backend: Backend) -> &'static str {
    static CLAIM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static CLAIM_PG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    // One statement: the rows it leases come back as they were before
    // (attempts started before this claim, and no first attempt yet).
    // On PostgreSQL the candidate rows are locked and rows another
    // transaction holds are skipped, so claims stay exclusive even
    // without the write turn.
    //
    // A row may go when no earlier pending row of its order key holds the
    // key (one in flight or waiting holds it, one whose hold has passed
    // does not). The free rows are read from two small sets, never from
    // the whole backlog: the keys' heads that are due (`outbox_heads`), and
    // the rows behind a head whose hold has passed (`outbox_held`), up to
    // the first row of that key that holds it. SQLite's planner is told
    // which index to read: without statistics it would rather take every
    // due row through `outbox_due`.
    // (`CROSS JOIN` keeps SQLite's loop over the held heads outside;
    // PostgreSQL knows no `CROSS JOIN … ON`.)
    let (cell, heads, held, join, lock) = match backend {
        Backend::Sqlite => (
            &CLAIM,
            " INDEXED BY outbox_heads",
            " INDEXED BY outbox_held",
            "CROSS JOIN",
            "",
        ),
        Backend::Postgres => (&CLAIM_PG, "", "", "JOIN", " FOR UPDATE OF o SKIP LOCKED"),
    };
    cell.get_or_init(|| {
        let returned = COLUMNS.replace(
            "attempts, first_attempt_at",
            "attempts - 1 AS attempts, \
                 CASE WHEN attempts = 1 THEN NULL ELSE first_attempt_at END AS first_attempt_at",
        );
        let free = "o.next_attempt_at <= $2 AND (o.lease_until IS NULL OR o.lease_until < $2)";
        format!(
            "UPDATE outbox SET lease_until = $1, lease_owner = $4, attempts = attempts + 1, \
             first_attempt_at = COALESCE(first_attempt_at, $2) WHERE seq IN ( \
             SELECT free.seq FROM ( \
             SELECT heads.seq FROM (SELECT o.seq FROM outbox o{heads} \
               WHERE o.state = 'pending' AND o.head = 1 AND {free} \
               ORDER BY o.seq LIMIT $3{lock}) AS heads \
             UNION ALL \
             SELECT behind.seq FROM (SELECT o.seq FROM outbox h{held} {join} outbox o \
               ON o.order_key = h.order_key AND o.state = 'pending' AND o.seq > h.seq \
               AND o.seq <= COALESCE((SELECT MIN(p.seq) FROM outbox p \
                 WHERE p.order_key = h.order_key AND p.state = 'pending' \
                 AND (p.hold_until IS NULL OR p.hold_until > $2)), {LAST_SEQ}) \
               WHERE h.state = 'pending' AND h.head = 1 AND h.hold_until IS NOT NULL \
               AND h.hold_until <= $2 AND {free} \
               ORDER BY o.seq LIMIT $3{lock}) AS behind \
             ) AS free ORDER BY free.seq LIMIT $3) RETURNING {returned}, \
             (SELECT c.channel_id FROM chats c WHERE c.id = outbox.chat_id) AS channel_id"
        )
    })
}

/// [`Store::claim_due`]'s work in the caller's transaction: the rows
/// leased, in `seq` order.
async fn claim_in(
    conn: &mut AnyConnection,
    backend: Backend,
    owner: &str,
    now: i64,
    lease_ms: i64,
    limit: i64,
) -> Result<Vec<Claimed>, StoreError> {
    // A claim is a batch too: a plan kept from when the outbox was small
    // would read it whole.
    let rows = batch::planned_per_batch(conn, claim_sql(backend))
        .bind(now + lease_ms)
        .bind(now)
        .bind(limit)
        .bind(owner)
        .fetch_all(&mut *conn)
        .await
        .ctx("leasing due deliveries")?;
    let mut claimed = rows
        .iter()
        .map(from_row)
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading a delivery")?;
    claimed.sort_by_key(|c| c.seq);
    Ok(claimed)
}

/// Greater than any row's `seq`.
const LAST_SEQ: i64 = i64::MAX;

/// [`Store::prune_finished`]'s statement: `$1` the cut-off, `$2` the most
/// rows. Through `outbox_due`: a row's last attempt falls due before it
/// finishes, so the rows old enough are a range of that index.
const PRUNE: &str = "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox \
     WHERE state IN ('delivered', 'dropped') AND next_attempt_at < $1 AND finished_at < $1 \
     LIMIT $2)";

impl Store {
    /// Deletes up to `limit` rows delivered (or dropped by a plugin) before
    /// `before`; how many went. Dead letters stay until they are replayed.
    pub async fn prune_finished(&self, before: i64, limit: i64) -> Result<u64, StoreError> {
        let mut w = self.begin_write().await?;
        let done = sqlx::query(PRUNE)
            .bind(before)
            .bind(limit)
            .execute(&mut *w.tx)
            .await
            .ctx("pruning finished deliveries")?;
        w.commit().await?;
        Ok(done.rows_affected())
    }
}

/// Pending rows of one retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRows {
    pub policy: String,
    pub rows: i64,
    /// When the oldest of them was queued (Unix ms).
    pub oldest_created_at: i64,
}

/// What waits in the outbox and what failed for good, for every instance
/// on the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxDepth {
    /// By policy name, in name order.
    pub pending: Vec<PendingRows>,
    /// Rows in state `failed`.
    pub dead_letters: i64,
}

impl Store {
    /// Counts pending rows by policy (with the oldest) and failed rows, in
    /// one statement over the `(state, …)` index.
    pub async fn outbox_depth(&self) -> Result<OutboxDepth, StoreError> {
        let rows: Vec<(String, String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT state, policy, COUNT(*), MIN(created_at) FROM outbox \
             WHERE state IN ('pending', 'failed') GROUP BY state, policy ORDER BY policy",
        )
        .fetch_all(self.pool())
        .await
        .ctx("measuring the outbox")?;
        let mut depth = OutboxDepth::default();
        for (state, policy, rows, oldest) in rows {
            if state == OutboxState::Failed.as_str() {
                depth.dead_letters += rows;
            } else {
                depth.pending.push(PendingRows {
                    policy,
                    rows,
                    oldest_created_at: oldest.unwrap_or_default(),
                });
            }
        }
        Ok(depth)
    }
}

/// An outbox row as operators see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeliveryView {
    pub id: String,
    pub event_id: String,
    pub kind: String,
    pub state: String,
    pub target_url: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub response: Option<String>,
    pub chat_id: Option<i64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// What operators should know about how the answer was read.
    pub notes: Vec<String>,
    pub body: serde_json::Value,
}

const VIEW_COLUMNS: &str = "id, event_id, kind, state, target_url, attempts, last_error, \
     response, chat_id, created_at, finished_at, notes, body";

fn view_from_row(r: &AnyRow) -> Result<DeliveryView, StoreError> {
    let body: String = r.try_get("body").ctx("reading a delivery")?;
    Ok(DeliveryView {
        id: r.try_get("id").ctx("reading a delivery")?,
        event_id: r.try_get("event_id").ctx("reading a delivery")?,
        kind: r.try_get("kind").ctx("reading a delivery")?,
        state: r.try_get("state").ctx("reading a delivery")?,
        target_url: r.try_get("target_url").ctx("reading a delivery")?,
        attempts: r.try_get("attempts").ctx("reading a delivery")?,
        last_error: r.try_get("last_error").ctx("reading a delivery")?,
        response: r.try_get("response").ctx("reading a delivery")?,
        chat_id: r.try_get("chat_id").ctx("reading a delivery")?,
        created_at: r.try_get("created_at").ctx("reading a delivery")?,
        finished_at: r.try_get("finished_at").ctx("reading a delivery")?,
        notes: parse_notes(r.try_get("notes").ctx("reading a delivery")?),
        body: serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
    })
}

impl Store {
    /// Deliveries in `state`, newest first.
    pub async fn list_deliveries(
        &self,
        state: OutboxState,
        limit: i64,
    ) -> Result<Vec<DeliveryView>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {VIEW_COLUMNS} FROM outbox WHERE state = $1 ORDER BY seq DESC LIMIT $2"
        ))
        .bind(state.as_str())
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .ctx("listing deliveries")?;
        rows.iter().map(view_from_row).collect()
    }

    /// One delivery by id, whatever its state.
    pub async fn delivery(&self, id: &str) -> Result<Option<DeliveryView>, StoreError> {
        let row = sqlx::query(&format!("SELECT {VIEW_COLUMNS} FROM outbox WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .ctx("reading a delivery")?;
        row.as_ref().map(view_from_row).transpose()
    }

    /// Sends dead letters again, with their delivery ids: `ids` or, when
    /// empty, every failed webhook. Returns the ids put back in the queue.
    pub async fn replay_dead(&self, ids: &[String], now: i64) -> Result<Vec<String>, StoreError> {
        let mut w = self.begin_write().await?;
        let candidates: Vec<(String,)> = if ids.is_empty() {
            sqlx::query_as(
                "SELECT id FROM outbox WHERE state = 'failed' \
                 AND (kind LIKE 'webhook.%' OR kind LIKE 'crm.%') ORDER BY seq",
            )
            .fetch_all(&mut *w.tx)
            .await
            .ctx("finding dead letters")?
        } else {
            let mut found = Vec::new();
            for id in ids {
                let row: Option<(String,)> =
                    sqlx::query_as("SELECT id FROM outbox WHERE id = $1 AND state = 'failed'")
                        .bind(id.as_str())
                        .fetch_optional(&mut *w.tx)
                        .await
                        .ctx("finding a dead letter")?;
                found.extend(row);
            }
            found
        };
        for (id,) in &candidates {
            sqlx::query(
                "UPDATE outbox SET state = 'pending', attempts = 0, next_attempt_at = $1, \
                 give_up_at = NULL, first_attempt_at = NULL, hold_until = NULL, \
                 lease_until = NULL, finished_at = NULL, head = 1 WHERE id = $2",
            )
            .bind(now)
            .bind(id.as_str())
            .execute(&mut *w.tx)
            .await
            .ctx("replaying a delivery")?;
            // Back in the queue it may come before rows of its key that
            // are there: the key's first pending row is its head again.
            sqlx::query(
                "UPDATE outbox SET head = CASE WHEN seq = (SELECT MIN(p.seq) FROM outbox p \
                 WHERE p.order_key = outbox.order_key AND p.state = 'pending') THEN 1 ELSE 0 END \
                 WHERE state = 'pending' AND order_key = \
                 (SELECT r.order_key FROM outbox r WHERE r.id = $1)",
            )
            .bind(id.as_str())
            .execute(&mut *w.tx)
            .await
            .ctx("replaying a delivery")?;
        }
        w.commit().await?;
        Ok(candidates.into_iter().map(|(id,)| id).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Durability;

    async fn store(dir: &tempfile::TempDir) -> Store {
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        Store::open(&url, Durability::Normal).await.expect("store")
    }

    /// Queues a forward on chat `chat` (its order key) at `now`; its id.
    async fn queue(store: &Store, chat: Option<i64>, now: i64) -> String {
        let d = NewDelivery::forward(
            uuid::Uuid::now_v7(),
            "crm",
            "http://127.0.0.1:9/".into(),
            "{}".into(),
            chat,
        );
        let mut w = store.begin_write().await.expect("write");
        enqueue(&mut w.tx, &d, now).await.expect("enqueue");
        w.commit().await.expect("commit");
        d.id.to_string()
    }

    /// SQLite's plan for `sql`, one line per step.
    async fn plan(store: &Store, sql: &str, params: &[i64]) -> Vec<String> {
        let mut conn = store.pool().acquire().await.expect("connection");
        let explain = format!("EXPLAIN QUERY PLAN {sql}");
        let mut query = sqlx::query(&explain);
        for param in params {
            query = query.bind(*param);
        }
        query
            .fetch_all(&mut *conn)
            .await
            .expect("plan")
            .iter()
            .map(|row| row.try_get::<String, _>("detail").unwrap_or_default())
            .collect()
    }

    async fn claim(store: &Store, now: i64) -> Vec<String> {
        let claimed = store.claim_due(now, 60_000, 64).await.expect("claim");
        claimed.into_iter().map(|c| c.id).collect()
    }

    /// A claim takes the oldest due rows that nothing earlier on their order
    /// key holds back, in order, and reads only the keys' heads and the rows
    /// behind an expired hold (never every pending row: that cost grew with
    /// the backlog, and was paid in full by a claim that found nothing).
    #[tokio::test]
    async fn a_claim_takes_each_order_keys_first_row_through_the_heads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        let a1 = queue(&store, Some(1), 1_000).await;
        let b1 = queue(&store, Some(2), 1_000).await;
        let a2 = queue(&store, Some(1), 1_000).await;
        let _b2 = queue(&store, Some(2), 1_000).await;
        let n1 = queue(&store, None, 1_000).await;
        let later = queue(&store, None, 9_000).await;
        assert_eq!(claim(&store, 2_000).await, [a1.clone(), b1, n1]);
        assert!(claim(&store, 2_000).await.is_empty(), "the rest wait");
        let mut w = store.begin_write().await.expect("write");
        finish(&mut w.tx, &a1, OutboxState::Delivered, None, 1, 2_500)
            .await
            .expect("finish");
        w.commit().await.expect("commit");
        assert_eq!(claim(&store, 3_000).await, [a2]);
        assert_eq!(claim(&store, 9_000).await, [later]);

        let plan = plan(&store, claim_sql(Backend::Sqlite), &[1, 1, 64]).await;
        let heads = "SCAN o USING COVERING INDEX outbox_heads";
        assert!(plan.iter().any(|step| step == heads), "{plan:?}");
        assert!(
            plan.iter()
                .any(|step| step.starts_with("SEARCH h USING INDEX outbox_held")),
            "{plan:?}"
        );
        // The rows behind a held head, and the key's first row that holds
        // it, come from the index of pending rows by key (migration 13).
        assert!(
            plan.iter()
                .any(|step| step.starts_with("SEARCH o USING INDEX outbox_pending_order")),
            "{plan:?}"
        );
        // Every other read of the outbox is a seek; the co-routines' own
        // scans read the rows they found.
        let table_scan = |step: &&String| {
            let mut words = step.split(' ');
            words.next() == Some("SCAN")
                && matches!(words.next(), Some("o" | "h" | "p" | "outbox"))
                && step.as_str() != heads
        };
        assert!(!plan.iter().any(|step| table_scan(&step)), "{plan:?}");
    }

    /// Pruning deletes what was delivered or dropped before the cut-off, a
    /// batch at a time, through an index range; what waits, what is in
    /// flight, dead letters and recent deliveries stay.
    #[tokio::test]
    async fn pruning_deletes_old_finished_rows_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        pruning(&store).await;
        let plan = plan(&store, PRUNE, &[1, 1]).await;
        assert!(
            plan.iter().any(|step| step.starts_with(
                "SEARCH outbox USING INDEX outbox_due (state=? AND next_attempt_at<?)"
            )),
            "{plan:?}"
        );
        if let Some(store) = crate::store::test_postgres().await {
            pruning(&store).await;
        }
    }

    async fn pruning(store: &Store) {
        let mut old = Vec::new();
        for state in [
            OutboxState::Delivered,
            OutboxState::Dropped,
            OutboxState::Delivered,
        ] {
            let id = queue(store, None, 1_000).await;
            finish_now(store, &id, state, 2_000).await;
            old.push(id);
        }
        let dead = queue(store, None, 1_000).await;
        finish_now(store, &dead, OutboxState::Failed, 2_000).await;
        let recent = queue(store, None, 1_000).await;
        finish_now(store, &recent, OutboxState::Delivered, 9_000).await;
        let in_flight = queue(store, Some(1), 1_000).await;
        let waiting = queue(store, Some(1), 1_000).await;
        assert_eq!(claim(store, 1_500).await, [in_flight.as_str()]);

        assert_eq!(store.prune_finished(5_000, 2).await.expect("prune"), 2);
        assert_eq!(store.prune_finished(5_000, 2).await.expect("prune"), 1);
        assert_eq!(store.prune_finished(5_000, 2).await.expect("prune"), 0);
        for id in &old {
            assert!(store.delivery(id).await.expect("read").is_none(), "{id}");
        }
        for id in [&dead, &recent, &waiting, &in_flight] {
            assert!(store.delivery(id).await.expect("read").is_some(), "{id}");
        }
    }

    async fn finish_now(store: &Store, id: &str, state: OutboxState, now: i64) {
        let mut w = store.begin_write().await.expect("write");
        finish(&mut w.tx, id, state, None, 1, now)
            .await
            .expect("finish");
        w.commit().await.expect("commit");
    }

    /// A failing row holds its key until its hold passes; then the rows
    /// behind it go, one at a time up to the first that holds the key
    /// itself, while the failing row waits for its retry; a dead letter
    /// replayed goes first again.
    #[tokio::test]
    async fn rows_behind_an_expired_hold_go_and_a_replayed_row_goes_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        behind_an_expired_hold(store(&dir).await).await;
        if let Some(store) = crate::store::test_postgres().await {
            behind_an_expired_hold(store).await;
        }
    }

    async fn behind_an_expired_hold(store: Store) {
        let a1 = queue(&store, Some(1), 1_000).await;
        let a2 = queue(&store, Some(1), 1_000).await;
        let a3 = queue(&store, Some(1), 1_000).await;
        assert_eq!(claim(&store, 2_000).await, [a1.as_str()]);
        let retry = Retry {
            next_at: 10_000,
            give_up_at: 20_000,
            hold_until: 4_000,
        };
        store
            .reschedule_delivery(&a1, 1, retry, "refused")
            .await
            .expect("reschedule");
        assert!(claim(&store, 3_000).await.is_empty(), "held");
        assert_eq!(claim(&store, 4_000).await, [a2.as_str()]);
        assert!(claim(&store, 5_000).await.is_empty(), "a2 holds a3");
        finish_now(&store, &a2, OutboxState::Delivered, 5_000).await;
        assert_eq!(claim(&store, 5_000).await, [a3.as_str()]);
        assert_eq!(claim(&store, 10_000).await, [a1.as_str()], "its retry");

        let b1 = queue(&store, Some(2), 1_000).await;
        let b2 = queue(&store, Some(2), 1_000).await;
        assert_eq!(claim(&store, 11_000).await, [b1.as_str()]);
        finish_now(&store, &b1, OutboxState::Failed, 11_000).await;
        assert_eq!(claim(&store, 11_000).await, [b2.as_str()], "next in line");
        finish_now(&store, &b2, OutboxState::Delivered, 11_000).await;
        let b3 = queue(&store, Some(2), 12_000).await;
        let replayed = store
            .replay_dead(std::slice::from_ref(&b1), 12_000)
            .await
            .expect("replay");
        assert_eq!(replayed, [b1.as_str()]);
        assert_eq!(claim(&store, 12_000).await, [b1.as_str()], "b1 before b3");
        finish_now(&store, &b1, OutboxState::Delivered, 12_000).await;
        assert_eq!(claim(&store, 12_000).await, [b3.as_str()]);
    }

    /// Results for `claimed`, as the deliverer records them.
    fn delivered(claimed: &[Claimed], now: i64) -> Vec<Finished> {
        claimed
            .iter()
            .map(|c| Finished::delivered(c.seq, now))
            .collect()
    }

    /// PostgreSQL's counts of what this backend did to the outbox: read
    /// before and after within one transaction, since a backend reports its
    /// counts when idle, and until then this view adds up its earlier
    /// transactions too.
    struct OutboxCounts {
        scans: i64,
        updates: i64,
        hot_updates: i64,
    }

    impl OutboxCounts {
        async fn now(conn: &mut AnyConnection) -> OutboxCounts {
            let (scans, updates, hot_updates): (i64, i64, i64) = sqlx::query_as(
                "SELECT CAST(COALESCE(SUM(seq_scan), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(n_tup_upd), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(n_tup_hot_upd), 0) AS BIGINT) \
                 FROM pg_stat_xact_user_tables WHERE relname = 'outbox'",
            )
            .fetch_one(&mut *conn)
            .await
            .expect("the outbox's counts");
            OutboxCounts {
                scans,
                updates,
                hot_updates,
            }
        }
    }

    /// Records `claimed` as delivered at `now`, as one batch of results.
    async fn deliver_all(store: &Store, claimed: &[Claimed], now: i64) {
        let results = delivered(claimed, now);
        let mut w = store.begin_write().await.expect("write");
        finish_many(&mut w.tx, &results.iter().collect::<Vec<_>>())
            .await
            .expect("results");
        w.commit().await.expect("commit");
    }

    /// On PostgreSQL the claim and the results are planned for the outbox
    /// as it is, not as it was: after many turns of the deliverer on a
    /// nearly empty outbox (a plan the connection kept from then reads the
    /// table whole) and a backlog of 20 000 rows since, a claim and its
    /// results read the outbox only through its indexes (the chats and
    /// messages they also read are empty here: scanning those is right).
    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn behind_a_sudden_backlog_the_deliverer_reads_no_table_whole() {
        let store = crate::store::required_test_postgres().await;
        for round in 0..40 {
            queue(&store, Some(round % 3), 1_000).await;
            let claimed = store.claim_due(2_000, 60_000, 64).await.expect("claim");
            deliver_all(&store, &claimed, 2_000).await;
        }
        let mut w = store.begin_write().await.expect("write");
        sqlx::query(
            "INSERT INTO outbox (id, event_id, kind, policy, target_url, body, order_key, \
             chat_id, state, next_attempt_at, created_at, head) \
             SELECT 'backlog-' || g, 'e', 'forward', 'crm', 'http://127.0.0.1:9/', '{}', \
             'crm:chat:' || (g % 500), g % 500, 'pending', 3000, 3000, \
             CASE WHEN g <= 500 THEN 1 ELSE 0 END FROM generate_series(1, 20000) g",
        )
        .execute(&mut *w.tx)
        .await
        .expect("backlog");
        w.commit().await.expect("commit");

        let mut w = store.begin_write().await.expect("write");
        let before = OutboxCounts::now(&mut w.tx).await;
        let claimed = claim_in(&mut w.tx, Backend::Postgres, "test", 4_000, 60_000, 64)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 64, "the first rows of 64 keys");
        let results = delivered(&claimed, 4_000);
        finish_many(&mut w.tx, &results.iter().collect::<Vec<_>>())
            .await
            .expect("results");
        let after = OutboxCounts::now(&mut w.tx).await;
        assert_eq!(after.scans - before.scans, 0, "the outbox was read whole");
        w.commit().await.expect("commit");
    }

    /// Results written as one batch hand each order key on to its next row,
    /// and only to it, on either database: after two keys' first rows are
    /// delivered together, the next claim takes each key's second row, and
    /// the third rows wait behind them.
    async fn batched_results_hand_each_key_on(store: &Store) {
        let a1 = queue(store, Some(1), 1_000).await;
        let b1 = queue(store, Some(2), 1_000).await;
        let a2 = queue(store, Some(1), 1_000).await;
        let b2 = queue(store, Some(2), 1_000).await;
        queue(store, Some(1), 1_000).await;
        queue(store, Some(2), 1_000).await;
        let first = store.claim_due(2_000, 60_000, 64).await.expect("claim");
        let ids: Vec<&str> = first.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, [a1.as_str(), b1.as_str()]);
        deliver_all(store, &first, 2_500).await;
        assert_eq!(claim(store, 3_000).await, [a2, b2]);
        assert!(claim(store, 3_000).await.is_empty(), "the third rows wait");
    }

    #[tokio::test]
    async fn batched_results_hand_each_key_on_sqlite() {
        let dir = tempfile::tempdir().expect("temp dir");
        batched_results_hand_each_key_on(&store(&dir).await).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn batched_results_hand_each_key_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        batched_results_hand_each_key_on(&store).await;
    }

    /// On PostgreSQL a claim changes no indexed column (migration 14), so
    /// the rows it leases get their new versions on their own pages (HOT
    /// updates) instead of new entries in each of the outbox's indexes.
    /// With `lease_until` in `outbox_heads`, none was.
    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn a_claim_on_postgresql_leaves_the_outbox_indexes_alone() {
        let store = crate::store::required_test_postgres().await;
        // Rows of a typical size: an agent message's delivery body.
        let body = serde_json::json!({ "message": { "type": "text", "text": "x".repeat(300) } });
        let mut w = store.begin_write().await.expect("write");
        for chat in 0..40 {
            let d = NewDelivery::forward(
                uuid::Uuid::now_v7(),
                "crm",
                "http://127.0.0.1:9/".into(),
                body.to_string(),
                Some(chat),
            );
            enqueue(&mut w.tx, &d, 1_000).await.expect("enqueue");
        }
        w.commit().await.expect("commit");

        let mut w = store.begin_write().await.expect("write");
        let before = OutboxCounts::now(&mut w.tx).await;
        let claimed = claim_in(&mut w.tx, Backend::Postgres, "test", 2_000, 60_000, 64)
            .await
            .expect("claim");
        let after = OutboxCounts::now(&mut w.tx).await;
        w.commit().await.expect("commit");
        assert_eq!(claimed.len(), 40);
        let (updated, hot) = (
            after.updates - before.updates,
            after.hot_updates - before.hot_updates,
        );
        assert_eq!(updated, 40, "one update per claimed row");
        // The pages keep room for about half their rows' second versions;
        // the rest move. Before migration 14: none stayed.
        assert!(hot >= updated / 2, "{hot} of {updated} claims were HOT");
    }

    /// The deliverer's next look reads no pending row but through an
    /// index seek: the next attempt through `outbox_due`, the earliest hold
    /// through `outbox_held`.
    #[tokio::test]
    async fn the_next_look_is_two_index_seeks() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        let plan = plan(&store, next_due_sql(Backend::Sqlite), &[1]).await;
        let seeks: Vec<&String> = plan.iter().filter(|s| s.starts_with("SEARCH")).collect();
        assert_eq!(seeks.len(), 2, "{plan:?}");
        assert!(
            seeks[0].contains("outbox_due (state=? AND next_attempt_at>?)"),
            "{plan:?}"
        );
        assert!(seeks[1].contains("outbox_held (hold_until>?)"), "{plan:?}");
    }

    /// The deliverer's next look without a kick: the next attempt or hold
    /// after the claim, never a row that was already due at it (the claim
    /// took what it could; the rest waits for a row in flight).
    #[tokio::test]
    async fn the_next_look_is_the_next_attempt_or_hold_after_the_claim() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir).await;
        assert_eq!(store.next_due_at(1_000).await.expect("next"), None);
        let first = queue(&store, Some(1), 1_000).await;
        queue(&store, Some(1), 1_000).await;
        assert_eq!(store.next_due_at(1_000).await.expect("next"), None);
        queue(&store, None, 8_000).await;
        assert_eq!(store.next_due_at(1_000).await.expect("next"), Some(8_000));
        store
            .reschedule_delivery(
                &first,
                1,
                Retry {
                    next_at: 10_000,
                    give_up_at: 20_000,
                    hold_until: 4_000,
                },
                "refused",
            )
            .await
            .expect("reschedule");
        assert_eq!(store.next_due_at(1_000).await.expect("next"), Some(4_000));
        assert_eq!(store.next_due_at(4_000).await.expect("next"), Some(8_000));
        assert_eq!(store.next_due_at(8_000).await.expect("next"), Some(10_000));
        assert_eq!(store.next_due_at(10_000).await.expect("next"), None);
    }
}
