//! Clients, chats and messages: the conversation state agents work on.
//! Writers take a connection so the caller can group them in one transaction.

use plugin_api::channel::CustomerSender;
use plugin_api::lenient::ExternalId;
use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::live::Generation;
use super::{Ctx, Store, StoreError};

#[derive(Debug, Clone, Serialize)]
pub struct Client {
    pub id: i64,
    pub channel_id: i64,
    /// The integrator's `sender.id`, in the JSON type it was sent in.
    pub external_id: ExternalId,
    pub name: Option<String>,
    pub phone: Option<String>,
    pub email: Option<String>,
    pub photo: Option<String>,
    pub url: Option<String>,
    pub invite: Option<String>,
    /// Sequential per site (1, 2, 3, ...), given once when the client is created.
    pub visitor_number: i64,
}

impl Client {
    /// The name agents see; the spec shows nameless customers as Anonymous.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or("Anonymous")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatState {
    /// Waiting for an agent.
    Open,
    Accepted,
    Closed,
}

impl ChatState {
    fn as_str(self) -> &'static str {
        match self {
            ChatState::Open => "open",
            ChatState::Accepted => "accepted",
            ChatState::Closed => "closed",
        }
    }
    pub(super) fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "open" => Ok(ChatState::Open),
            "accepted" => Ok(ChatState::Accepted),
            "closed" => Ok(ChatState::Closed),
            other => Err(StoreError::Corrupt(format!("chat state `{other}`"))),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Chat {
    pub id: i64,
    pub channel_id: i64,
    pub client_id: i64,
    pub state: ChatState,
    pub agent_id: Option<i64>,
    pub opened_at: i64,
    pub accepted_at: Option<i64>,
    pub closed_at: Option<i64>,
    pub last_message_at: i64,
}

/// A chat as listed for an agent.
#[derive(Debug, Clone, Serialize)]
pub struct ChatSummary {
    #[serde(flatten)]
    pub chat: Chat,
    pub channel: String,
    pub client_name: String,
    /// The bot the chat started with and where it stands (`bot`: the bot
    /// holds it; `invited`/`unavailable`: handed off, waiting for an agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bot: Option<BotBrief>,
}

/// A chat's bot as agents see it.
#[derive(Debug, Clone, Serialize)]
pub struct BotBrief {
    pub name: Option<String>,
    pub state: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Author {
    Client,
    Agent,
    /// Sent on the hub's behalf by a plugin's reply (an auto-reply).
    Auto,
    /// A bot's message (a provider's `BOT_MESSAGE` or a plugin bot's answer).
    Bot,
}

impl Author {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Author::Client => "client",
            Author::Agent => "agent",
            Author::Auto => "auto",
            Author::Bot => "bot",
        }
    }
    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "client" => Ok(Author::Client),
            "agent" => Ok(Author::Agent),
            "auto" => Ok(Author::Auto),
            "bot" => Ok(Author::Bot),
            other => Err(StoreError::Corrupt(format!("message author `{other}`"))),
        }
    }
}

/// Where an agent message stands on its way to the integrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Pending,
    Delivered,
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }
    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "pending" => Ok(DeliveryState::Pending),
            "delivered" => Ok(DeliveryState::Delivered),
            "failed" => Ok(DeliveryState::Failed),
            other => Err(StoreError::Corrupt(format!("delivery state `{other}`"))),
        }
    }
}

// Deserialize: the widget's stream reads it back from a live event.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct MessageRow {
    pub id: i64,
    pub uid: String,
    pub chat_id: i64,
    pub author: Author,
    pub agent_id: Option<i64>,
    /// The author's name when no agent row names it (a bot's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_name: Option<String>,
    /// The channel `message` object as stored (after plugins).
    pub body: serde_json::Value,
    pub delivery: Option<DeliveryState>,
    pub delivery_error: Option<String>,
    pub created_at: i64,
}

pub(super) const CLIENT_COLUMNS: &str =
    "id, channel_id, external_id_json, name, phone, email, photo, url, invite, visitor_number";

/// The visitor number a client inserted now takes: the site's sequence plus
/// one (a trigger advances the sequence only when the row is really inserted,
/// so an upsert that updates burns no number).
pub(crate) const NEXT_VISITOR_NUMBER: &str =
    "(SELECT value + 1 FROM counters WHERE name = 'visitor_number')";
/// A client upsert's conflict clause: an existing client merges the
/// profile fields sent now (absent ones keep their value).
pub(super) const CLIENT_MERGE: &str = "ON CONFLICT (channel_id, external_key) DO UPDATE SET \
     name = COALESCE(excluded.name, clients.name), \
     phone = COALESCE(excluded.phone, clients.phone), \
     email = COALESCE(excluded.email, clients.email), \
     photo = COALESCE(excluded.photo, clients.photo), \
     url = COALESCE(excluded.url, clients.url), \
     invite = COALESCE(excluded.invite, clients.invite), \
     updated_at = excluded.updated_at";
pub(super) const CHAT_COLUMNS: &str = "id, channel_id, client_id, state, agent_id, opened_at, accepted_at, \
     closed_at, last_message_at";
pub(super) const MESSAGE_COLUMNS: &str = "id, uid, chat_id, author, agent_id, body, delivery_state, delivery_error, created_at, \
     author_name";

// The readers take columns by position, from `base` on, in the order of the
// `*_COLUMNS` lists: a join can then read several entities from one row.

/// A `*_COLUMNS` list with each column taken from table `alias`.
pub(super) fn qualified(alias: &str, columns: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn client_from_row(row: &AnyRow) -> Result<Client, StoreError> {
    client_at(row, 0)
}

pub(super) fn client_at(row: &AnyRow, base: usize) -> Result<Client, StoreError> {
    let get = |i: usize| base + i;
    let json: String = row.try_get(get(2)).ctx("reading a client")?;
    let external_id = serde_json::from_str(&json)
        .map_err(|e| StoreError::Corrupt(format!("client external id: {e}")))?;
    Ok(Client {
        id: row.try_get(get(0)).ctx("reading a client")?,
        channel_id: row.try_get(get(1)).ctx("reading a client")?,
        external_id,
        name: row.try_get(get(3)).ctx("reading a client")?,
        phone: row.try_get(get(4)).ctx("reading a client")?,
        email: row.try_get(get(5)).ctx("reading a client")?,
        photo: row.try_get(get(6)).ctx("reading a client")?,
        url: row.try_get(get(7)).ctx("reading a client")?,
        invite: row.try_get(get(8)).ctx("reading a client")?,
        visitor_number: row
            .try_get::<Option<i64>, _>(get(9))
            .ctx("reading a client")?
            .unwrap_or_default(),
    })
}

pub(super) fn chat_from_row(row: &AnyRow) -> Result<Chat, StoreError> {
    chat_at(row, 0)
}

pub(super) fn chat_at(row: &AnyRow, base: usize) -> Result<Chat, StoreError> {
    let get = |i: usize| base + i;
    let state: String = row.try_get(get(3)).ctx("reading a chat")?;
    Ok(Chat {
        id: row.try_get(get(0)).ctx("reading a chat")?,
        channel_id: row.try_get(get(1)).ctx("reading a chat")?,
        client_id: row.try_get(get(2)).ctx("reading a chat")?,
        state: ChatState::parse(&state)?,
        agent_id: row.try_get(get(4)).ctx("reading a chat")?,
        opened_at: row.try_get(get(5)).ctx("reading a chat")?,
        accepted_at: row.try_get(get(6)).ctx("reading a chat")?,
        closed_at: row.try_get(get(7)).ctx("reading a chat")?,
        last_message_at: row.try_get(get(8)).ctx("reading a chat")?,
    })
}

pub(super) fn message_from_row(row: &AnyRow) -> Result<MessageRow, StoreError> {
    message_at(row, 0)
}

pub(super) fn message_at(row: &AnyRow, base: usize) -> Result<MessageRow, StoreError> {
    let get = |i: usize| base + i;
    let author: String = row.try_get(get(3)).ctx("reading a message")?;
    let body: String = row.try_get(get(5)).ctx("reading a message")?;
    let delivery: Option<String> = row.try_get(get(6)).ctx("reading a message")?;
    Ok(MessageRow {
        id: row.try_get(get(0)).ctx("reading a message")?,
        uid: row.try_get(get(1)).ctx("reading a message")?,
        chat_id: row.try_get(get(2)).ctx("reading a message")?,
        author: Author::parse(&author)?,
        agent_id: row.try_get(get(4)).ctx("reading a message")?,
        body: serde_json::from_str(&body)
            .map_err(|e| StoreError::Corrupt(format!("message body: {e}")))?,
        delivery: delivery.as_deref().map(DeliveryState::parse).transpose()?,
        delivery_error: row.try_get(get(7)).ctx("reading a message")?,
        created_at: row.try_get(get(8)).ctx("reading a message")?,
        author_name: row.try_get(get(9)).ctx("reading a message")?,
    })
}

/// Creates the client on first contact and merges any profile fields sent now.
pub async fn upsert_client(
    conn: &mut AnyConnection,
    channel_id: i64,
    sender: &CustomerSender,
    now: i64,
) -> Result<Client, StoreError> {
    let id_json = serde_json::to_string(&sender.id)
        .map_err(|e| StoreError::Corrupt(format!("client id: {e}")))?;
    let row = sqlx::query(&format!(
        "INSERT INTO clients (channel_id, external_key, external_id_json, name, phone, email, \
         photo, url, invite, created_at, updated_at, visitor_number) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, {NEXT_VISITOR_NUMBER}) \
         {CLIENT_MERGE} RETURNING {CLIENT_COLUMNS}"
    ))
    .bind(channel_id)
    .bind(sender.id.as_key())
    .bind(id_json)
    .bind(sender.name.as_deref())
    .bind(sender.phone.as_deref())
    .bind(sender.email.as_deref())
    .bind(sender.photo.as_deref())
    .bind(sender.url.as_deref())
    .bind(sender.invite.as_deref())
    .bind(now)
    .fetch_one(conn)
    .await
    .ctx("saving a client")?;
    client_from_row(&row)
}

/// What webhook replies showed the agent in a chat (`chats.integration`).
pub async fn integration_of<T: serde::de::DeserializeOwned>(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<T>, StoreError> {
    let row: Option<(Option<String>,)> =
        sqlx::query_as("SELECT integration FROM chats WHERE id = $1")
            .bind(chat_id)
            .fetch_optional(conn)
            .await
            .ctx("reading a chat's integration data")?;
    match row.and_then(|(i,)| i) {
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("chat integration data: {e}"))),
        None => Ok(None),
    }
}

pub async fn set_integration(
    conn: &mut AnyConnection,
    chat_id: i64,
    value: &impl Serialize,
) -> Result<(), StoreError> {
    let text = serde_json::to_string(value)
        .map_err(|e| StoreError::Corrupt(format!("chat integration data: {e}")))?;
    sqlx::query("UPDATE chats SET integration = $1 WHERE id = $2")
        .bind(text)
        .bind(chat_id)
        .execute(conn)
        .await
        .ctx("saving a chat's integration data")?;
    Ok(())
}

/// Contact details given for the client (a webhook reply, the widget's
/// contact form): what is set replaces what was known.
pub async fn set_client_contact(
    conn: &mut AnyConnection,
    client_id: i64,
    contact: ContactUpdate<'_>,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE clients SET name = COALESCE($1, name), phone = COALESCE($2, phone), \
         email = COALESCE($3, email), updated_at = $4 WHERE id = $5",
    )
    .bind(contact.name)
    .bind(contact.phone)
    .bind(contact.email)
    .bind(now)
    .bind(client_id)
    .execute(conn)
    .await
    .ctx("saving contact details")?;
    Ok(())
}

/// Contact details to set on a client; `None` keeps what is stored.
#[derive(Debug, Clone, Copy, Default)]
pub struct ContactUpdate<'a> {
    pub name: Option<&'a str>,
    pub phone: Option<&'a str>,
    pub email: Option<&'a str>,
}

/// Sets the client's description (the offline form's).
pub async fn set_client_description(
    conn: &mut AnyConnection,
    client_id: i64,
    description: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE clients SET description = $1 WHERE id = $2")
        .bind(description)
        .bind(client_id)
        .execute(conn)
        .await
        .ctx("saving a client description")?;
    Ok(())
}

/// Links the client to a CRM card (`crm_link`).
pub async fn set_crm_link(
    conn: &mut AnyConnection,
    client_id: i64,
    link: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE clients SET crm_link = $1, updated_at = $2 WHERE id = $3")
        .bind(link)
        .bind(now)
        .bind(client_id)
        .execute(conn)
        .await
        .ctx("linking a client to the CRM")?;
    Ok(())
}

/// The client's `attributes` as stored (a JSON object as text, if any); an
/// error if there is no such client.
pub async fn client_attributes(
    conn: &mut AnyConnection,
    client_id: i64,
) -> Result<Option<String>, StoreError> {
    let (stored,): (Option<String>,) =
        sqlx::query_as("SELECT attributes FROM clients WHERE id = $1")
            .bind(client_id)
            .fetch_one(conn)
            .await
            .ctx("reading client attributes")?;
    Ok(stored)
}

/// Replaces the client's `attributes` (a JSON object as text).
pub async fn set_client_attributes(
    conn: &mut AnyConnection,
    client_id: i64,
    attributes: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE clients SET attributes = $1, updated_at = $2 WHERE id = $3")
        .bind(attributes)
        .bind(now)
        .bind(client_id)
        .execute(conn)
        .await
        .ctx("saving client attributes")?;
    Ok(())
}

/// A chat read inside a write transaction: the caller holds the write turn
/// (SQLite's one writer, PostgreSQL's advisory lock: `Store::begin_write`),
/// so a decision taken on this state cannot race another writer.
pub async fn chat_in_tx(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<Chat>, StoreError> {
    let row = sqlx::query(&format!("SELECT {CHAT_COLUMNS} FROM chats WHERE id = $1"))
        .bind(chat_id)
        .fetch_optional(conn)
        .await
        .ctx("looking up a chat")?;
    row.as_ref().map(chat_from_row).transpose()
}

pub async fn insert_chat(
    conn: &mut AnyConnection,
    channel_id: i64,
    client_id: i64,
    now: i64,
) -> Result<Chat, StoreError> {
    // The client's newest live chat may be this one from now on.
    super::live::chats_changed();
    let row = sqlx::query(&format!(
        "INSERT INTO chats (channel_id, client_id, state, opened_at, last_message_at) \
         VALUES ($1, $2, 'open', $3, $3) RETURNING {CHAT_COLUMNS}"
    ))
    .bind(channel_id)
    .bind(client_id)
    .bind(now)
    .fetch_one(conn)
    .await
    .ctx("opening a chat")?;
    chat_from_row(&row)
}

pub struct NewMessage<'a> {
    pub uid: &'a str,
    pub chat_id: i64,
    pub author: Author,
    pub agent_id: Option<i64>,
    pub body: &'a serde_json::Value,
    pub delivery: Option<DeliveryState>,
    pub now: i64,
}

pub async fn insert_message(
    conn: &mut AnyConnection,
    m: NewMessage<'_>,
) -> Result<MessageRow, StoreError> {
    let row = sqlx::query(&format!(
        "INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {MESSAGE_COLUMNS}"
    ))
    .bind(m.uid)
    .bind(m.chat_id)
    .bind(m.author.as_str())
    .bind(m.agent_id)
    .bind(m.body.to_string())
    .bind(m.delivery.map(DeliveryState::as_str))
    .bind(m.now)
    .fetch_one(&mut *conn)
    .await
    .ctx("inserting a message")?;
    sqlx::query("UPDATE chats SET last_message_at = $1 WHERE id = $2")
        .bind(m.now)
        .bind(m.chat_id)
        .execute(conn)
        .await
        .ctx("touching a chat")?;
    message_from_row(&row)
}

/// Moves a chat to `state`; `agent_id` is recorded when accepting.
pub async fn set_chat_state(
    conn: &mut AnyConnection,
    chat_id: i64,
    state: ChatState,
    agent_id: Option<i64>,
    now: i64,
) -> Result<(), StoreError> {
    let sql = match state {
        ChatState::Accepted => {
            "UPDATE chats SET state = $1, agent_id = $2, accepted_at = $3 WHERE id = $4"
        }
        ChatState::Closed => {
            "UPDATE chats SET state = $1, agent_id = COALESCE(agent_id, $2), closed_at = $3 \
             WHERE id = $4"
        }
        ChatState::Open => {
            "UPDATE chats SET state = $1, agent_id = $2, opened_at = $3 WHERE id = $4"
        }
    };
    if state != ChatState::Accepted {
        super::live::chats_changed();
    }
    sqlx::query(sql)
        .bind(state.as_str())
        .bind(agent_id)
        .bind(now)
        .bind(chat_id)
        .execute(conn)
        .await
        .ctx("changing a chat's state")?;
    Ok(())
}

/// Marks the chats of `accepts` (chat, agent, time) accepted by their
/// agents, in one statement however many ([`accept_chats_sql`]).
pub(super) async fn mark_accepted(
    conn: &mut AnyConnection,
    accepts: &[(i64, i64, i64)],
) -> Result<(), StoreError> {
    sqlx::query(accept_chats_sql(super::is_postgres(conn)))
        .bind(accepts_json(accepts))
        .bind(accepts.len() as i64)
        .execute(conn)
        .await
        .ctx("accepting chats")?;
    Ok(())
}

/// `accepts` as [`accept_chats_sql`]'s `$1`.
pub(super) fn accepts_json(accepts: &[(i64, i64, i64)]) -> String {
    let list: Vec<[i64; 3]> = accepts.iter().map(|&(c, a, t)| [c, a, t]).collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// Accepting chats: `$1` a JSON array of `[chat, agent, time]`,
/// `$2` how many. On PostgreSQL the chats are found by key (`= ANY`)
/// whatever plan the server keeps.
pub(super) fn accept_chats_sql(postgres: bool) -> &'static str {
    if postgres {
        "UPDATE chats SET state = 'accepted', agent_id = x.agent, accepted_at = x.at \
         FROM (SELECT (v->>0)::BIGINT AS chat, (v->>1)::BIGINT AS agent, (v->>2)::BIGINT AS at \
         FROM json_array_elements($1::JSON) v LIMIT $2) x \
         WHERE chats.id = x.chat AND chats.id = ANY (ARRAY(SELECT (v->>0)::BIGINT \
         FROM json_array_elements($1::JSON) v LIMIT $2))"
    } else {
        "UPDATE chats SET state = 'accepted', agent_id = x.agent, accepted_at = x.at \
         FROM (SELECT value ->> 0 AS chat, value ->> 1 AS agent, value ->> 2 AS at \
         FROM json_each($1) LIMIT $2) x WHERE chats.id = x.chat"
    }
}

pub async fn set_message_delivery(
    conn: &mut AnyConnection,
    message_id: i64,
    state: DeliveryState,
    error: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE messages SET delivery_state = $1, delivery_error = $2 WHERE id = $3")
        .bind(state.as_str())
        .bind(error)
        .bind(message_id)
        .execute(conn)
        .await
        .ctx("recording a delivery result")?;
    Ok(())
}

/// The chats of the client `$2` names on channel `$1` that are not closed,
/// found by the client's key, then its chats.
const SENDER_CHATS: &str = "SELECT h.id FROM chats h WHERE h.client_id = (SELECT c.id \
     FROM clients c WHERE c.channel_id = $1 AND c.external_key = $2) AND h.state <> 'closed'";

impl Store {
    /// The open chat of the client `sender` names on a channel, if there is
    /// one; `at` was taken before the caller started (remembered chats count
    /// only if no chat changed since).
    pub async fn live_chat_of_sender(
        &self,
        at: Generation,
        channel_id: i64,
        sender: &CustomerSender,
    ) -> Result<Option<i64>, StoreError> {
        let key = sender.id.as_key();
        if let Some(chat) = self.live_chats.get(channel_id, &key) {
            return Ok(Some(chat));
        }
        let mut conn = self.read().await?;
        let ids: Vec<i64> = if self.backend() == super::Backend::Postgres {
            // Planned for each read (a simple query, the values written
            // in): a kept plan made while the tables were new went on
            // scanning every chat, newest first, for each new sender
            // (`ORDER BY id DESC LIMIT 1` over the primary key, 0.1 ms at
            // a thousand chats and growing with them). A read happens only
            // when the sender's chat is not remembered, so planning it
            // each time costs little; without `ORDER BY` no plan can walk
            // the chats in id order.
            let sql = super::batch::inline(
                SENDER_CHATS,
                &[
                    super::batch::Literal::Int(channel_id),
                    super::batch::Literal::Text(&key),
                ],
            )?;
            let statements =
                super::batch::run_simple(&mut conn, &sql, "finding the sender's chat").await?;
            statements
                .first()
                .map(|rows| rows.iter().map(|r| r.try_get::<i64, _>(0)).collect())
                .unwrap_or(Ok(Vec::new()))
                .ctx("finding the sender's chat")?
        } else {
            sqlx::query_scalar(SENDER_CHATS)
                .bind(channel_id)
                .bind(&key)
                .fetch_all(&mut *conn)
                .await
                .ctx("finding the sender's chat")?
        };
        drop(conn);
        // One chat is live per sender; the newest if ever more.
        let chat = ids.into_iter().max();
        if let Some(chat) = chat {
            self.live_chats.put(at, channel_id, key, chat);
        }
        Ok(chat)
    }

    /// Remembers `chat` as the live chat of `sender_key` on a channel, as a
    /// message just written to it found it.
    pub fn remember_live_chat(
        &self,
        at: Generation,
        channel_id: i64,
        sender_key: String,
        chat: i64,
    ) {
        self.live_chats.put(at, channel_id, sender_key, chat);
    }

    /// What webhook replies showed the agent in a chat, as stored.
    pub async fn chat_integration(
        &self,
        chat_id: i64,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let mut conn = self.pool().acquire().await.ctx("opening a connection")?;
        integration_of(&mut conn, chat_id).await
    }

    pub async fn chat_by_id(&self, id: i64) -> Result<Option<Chat>, StoreError> {
        let row = sqlx::query(&format!("SELECT {CHAT_COLUMNS} FROM chats WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .ctx("looking up a chat")?;
        row.as_ref().map(chat_from_row).transpose()
    }

    /// For each (chat id, agent's email), in the order asked: the chat with
    /// its client if it is on a channel that agent works on (else `None`),
    /// all in one query.
    pub async fn chats_visible_to(
        &self,
        wanted: &[(i64, String)],
    ) -> Result<Vec<Option<(Chat, Client)>>, StoreError> {
        static SQLITE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static POSTGRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let columns = || {
            format!(
                "{}, {}",
                qualified("h", CHAT_COLUMNS),
                qualified("c", CLIENT_COLUMNS)
            )
        };
        let sql = match self.backend() {
            // `LATERAL … LIMIT 1`: one index lookup per pair, whatever the
            // plan kept for the statement guesses of the JSON's length.
            super::Backend::Postgres => POSTGRES.get_or_init(|| {
                format!(
                    "SELECT x.ord, v.* FROM json_to_recordset($1::JSON) AS x(ord BIGINT, \
                     id BIGINT, email TEXT) CROSS JOIN LATERAL (SELECT {} FROM chats h \
                     JOIN clients c ON c.id = h.client_id WHERE h.id = x.id AND EXISTS \
                     (SELECT 1 FROM channel_agents a WHERE a.channel_id = h.channel_id \
                     AND a.agent_email = x.email) LIMIT 1) v",
                    columns()
                )
            }),
            super::Backend::Sqlite => SQLITE.get_or_init(|| {
                format!(
                    "SELECT json_extract(j.value, '$.ord'), {} FROM json_each($1) j \
                     CROSS JOIN chats h ON h.id = json_extract(j.value, '$.id') \
                     JOIN clients c ON c.id = h.client_id WHERE EXISTS (SELECT 1 \
                     FROM channel_agents a WHERE a.channel_id = h.channel_id \
                     AND a.agent_email = json_extract(j.value, '$.email'))",
                    columns()
                )
            }),
        };
        let list: Vec<serde_json::Value> = wanted
            .iter()
            .enumerate()
            .map(|(ord, (id, email))| {
                serde_json::json!({ "ord": ord, "id": id, "email": email.to_lowercase() })
            })
            .collect();
        let query = sqlx::query(sql).bind(serde_json::Value::Array(list).to_string());
        let rows = self.fetch_all_hot(query, "looking up chats").await?;
        let mut found: Vec<Option<(Chat, Client)>> = wanted.iter().map(|_| None).collect();
        for row in &rows {
            let ord: i64 = row.try_get(0).ctx("looking up chats")?;
            let chat = chat_at(row, 1)?;
            let client = client_at(row, 1 + CHAT_COLUMNS.split(',').count())?;
            match usize::try_from(ord).ok().and_then(|i| found.get_mut(i)) {
                Some(slot) => *slot = Some((chat, client)),
                None => return Err(StoreError::Corrupt(format!("a lookup came back as {ord}"))),
            }
        }
        Ok(found)
    }

    pub async fn client_by_id(&self, id: i64) -> Result<Option<Client>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {CLIENT_COLUMNS} FROM clients WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .ctx("looking up a client")?;
        row.as_ref().map(client_from_row).transpose()
    }

    /// Chats on the channels `agent_email` is assigned to, newest activity first.
    pub async fn chats_for_agent(
        &self,
        agent_email: &str,
        include_closed: bool,
        limit: i64,
    ) -> Result<Vec<ChatSummary>, StoreError> {
        let filter = if include_closed {
            ""
        } else {
            "AND c.state <> 'closed'"
        };
        let rows = sqlx::query(&format!(
            "SELECT c.id, c.channel_id, c.client_id, c.state, c.agent_id, c.opened_at, \
             c.accepted_at, c.closed_at, c.last_message_at, ch.name AS channel_name, \
             cl.name AS client_name, cb.state AS bot_state, b.name AS bot_name \
             FROM chats c JOIN channel_agents ca ON ca.channel_id = c.channel_id \
             JOIN channels ch ON ch.id = c.channel_id JOIN clients cl ON cl.id = c.client_id \
             LEFT JOIN chat_bots cb ON cb.chat_id = c.id LEFT JOIN bots b ON b.id = cb.bot_id \
             WHERE ca.agent_email = $1 {filter} ORDER BY c.last_message_at DESC, c.id DESC \
             LIMIT $2"
        ))
        .bind(agent_email.to_lowercase())
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .ctx("listing chats")?;
        rows.iter()
            .map(|row| {
                let client_name: Option<String> =
                    row.try_get("client_name").ctx("reading a chat")?;
                Ok(ChatSummary {
                    chat: chat_from_row(row)?,
                    channel: row.try_get("channel_name").ctx("reading a chat")?,
                    client_name: client_name.unwrap_or_else(|| "Anonymous".to_owned()),
                    bot: row
                        .try_get::<Option<String>, _>("bot_state")
                        .ctx("reading a chat")?
                        .map(|state| -> Result<BotBrief, StoreError> {
                            Ok(BotBrief {
                                name: row.try_get("bot_name").ctx("reading a chat")?,
                                state,
                            })
                        })
                        .transpose()?,
                })
            })
            .collect()
    }

    pub async fn messages_of_chat(&self, chat_id: i64) -> Result<Vec<MessageRow>, StoreError> {
        // Agent messages carry the agent's name as it is now: agents see who
        // of them wrote what.
        let rows = sqlx::query(
            "SELECT m.id, m.uid, m.chat_id, m.author, m.agent_id, m.body, m.delivery_state, \
             m.delivery_error, m.created_at, COALESCE(m.author_name, a.name) \
             FROM messages m LEFT JOIN agents a ON a.id = m.agent_id \
             WHERE m.chat_id = $1 ORDER BY m.id",
        )
        .bind(chat_id)
        .fetch_all(self.pool())
        .await
        .ctx("listing messages")?;
        rows.iter().map(message_from_row).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On PostgreSQL a sender's chat is found by the client's key, then its
    /// chats, whatever the tables' statistics say: on a database analyzed
    /// while new and grown since (thousands of chats before any analyze), a
    /// new sender's read walks no table, and a known sender gets its live
    /// chat, the newest that is not closed.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_senders_chat_is_found_by_key_on_a_grown_database_on_postgres() {
        let store = crate::store::required_test_postgres().await;
        let channel = crate::store::test_channel(&store, "senders").await;
        let fill =
            |from: i64, to: i64| crate::store::test_clients_with_chats_sql(channel, from, to);
        let run = async |sql: String| {
            sqlx::raw_sql(&sql)
                .execute(store.pool())
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        };
        run(format!("{}; ANALYZE clients; ANALYZE chats", fill(1, 3))).await;
        run(fill(4, 5000)).await;
        let sender = |id: &str| -> CustomerSender {
            serde_json::from_value(serde_json::json!({ "id": id })).expect("sender")
        };

        let explain = format!(
            "EXPLAIN {}",
            super::super::batch::inline(
                SENDER_CHATS,
                &[
                    super::super::batch::Literal::Int(channel),
                    super::super::batch::Literal::Text("new"),
                ],
            )
            .expect("inline")
        );
        let plan: Vec<String> = sqlx::query_scalar(&explain)
            .fetch_all(store.pool())
            .await
            .expect("plan");
        let walks = |l: &&String| l.contains("Seq Scan") || l.contains("Index Scan Backward");
        assert!(!plan.iter().any(|l| walks(&l)), "{}", plan.join("\n"));
        let live = |id: &'static str| {
            let store = &store;
            async move {
                store
                    .live_chat_of_sender(Generation::now(), channel, &sender(id))
                    .await
                    .expect("read")
            }
        };
        assert_eq!(live("new").await, None);
        let chat_of = async |key: &str| -> i64 {
            let (id,): (i64,) = sqlx::query_as(&format!(
                "SELECT MIN(h.id) FROM chats h JOIN clients c ON c.id = h.client_id \
                 WHERE c.external_key = '{key}'"
            ))
            .fetch_one(store.pool())
            .await
            .expect("the chat");
            id
        };
        let first = chat_of("77").await;
        assert_eq!(live("77").await, Some(first));
        // 78's first chat closed, a newer one open.
        let closed = chat_of("78").await;
        run(format!(
            "UPDATE chats SET state = 'closed' WHERE id = {closed}; \
             INSERT INTO chats (channel_id, client_id, state, opened_at, last_message_at) \
             SELECT channel_id, client_id, 'open', 1, 1 FROM chats WHERE id = {closed}"
        ))
        .await;
        let later = live("78").await.expect("a live chat");
        assert!(later > closed, "the newer chat: {later} after {closed}");
    }
}
