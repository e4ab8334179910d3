//! What event webhooks read: their sequence numbers, a channel's receiver,
//! and the rows their payloads are built from (client, organization,
//! category, agents, tags, chat log). Each takes the caller's connection, so
//! a payload is read in the transaction that queues it; the payloads
//! themselves are built in `core::webhooks::payload`.

use sqlx::{AnyConnection, Row};

use super::{Ctx, StoreError};

/// The next webhook sequence number, taken in the caller's transaction so
/// the numbers follow the order of the commits: on SQLite all of them
/// (`counters.webhook_sequence`, one writer); on PostgreSQL those of any one
/// client, whose sender lock or the exclusive turn the caller holds (the
/// `webhook_sequence` sequence: no row every writer would wait for).
pub async fn next_sequence(conn: &mut AnyConnection) -> Result<i64, StoreError> {
    let sql = if super::is_postgres(conn) {
        "SELECT nextval('webhook_sequence')"
    } else {
        "UPDATE counters SET value = value + 1 WHERE name = 'webhook_sequence' RETURNING value"
    };
    let row: (i64,) = sqlx::query_as(sql)
        .fetch_one(conn)
        .await
        .ctx("numbering a webhook")?;
    Ok(row.0)
}

/// A channel's event webhook receiver as stored (an empty URL is kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelReceiver {
    pub url: Option<String>,
    pub secret: Option<String>,
}

/// The webhook receiver of `channel_id`; `None` if there is no such channel.
pub async fn channel_receiver(
    conn: &mut AnyConnection,
    channel_id: i64,
) -> Result<Option<ChannelReceiver>, StoreError> {
    let row: Option<(Option<String>, Option<String>)> =
        sqlx::query_as("SELECT webhook_url, webhook_secret FROM channels WHERE id = $1")
            .bind(channel_id)
            .fetch_optional(conn)
            .await
            .ctx("reading a channel's webhook receiver")?;
    Ok(row.map(|(url, secret)| ChannelReceiver { url, secret }))
}

/// A client as every chat and client webhook describes it, with its channel's
/// public id and the ids of what it is linked to.
#[derive(Debug, Clone)]
pub struct ClientCard {
    pub channel_id: i64,
    /// The channel's `public_id` (the payloads' `widget_id`).
    pub public_id: String,
    pub name: Option<String>,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub url: Option<String>,
    pub description: Option<String>,
    pub user_token: Option<String>,
    /// The `attributes` column: a JSON object as text, if any.
    pub attributes: Option<String>,
    pub organization_id: Option<i64>,
    pub status_id: Option<i64>,
    pub assigned_agent_id: Option<i64>,
    pub visitor_number: Option<i64>,
    /// How many chats the client has had.
    pub chats_count: i64,
    /// What a widget visitor's page reported.
    pub page_title: Option<String>,
    /// `utm_json` as JSON text.
    pub utm_json: Option<String>,
    pub ip: Option<String>,
    pub user_agent: Option<String>,
    /// Country, region, city of `ip` (JSON text), with a GeoIP database.
    pub geoip_json: Option<String>,
}

/// The client `client_id` for a webhook payload; `None` if there is none.
pub async fn client_card(
    conn: &mut AnyConnection,
    client_id: i64,
) -> Result<Option<ClientCard>, StoreError> {
    let row = sqlx::query(
        "SELECT c.channel_id, ch.public_id, c.name, c.email, c.phone, c.url, c.description, \
         c.user_token, c.attributes, c.organization_id, c.status_id, c.assigned_agent_id, \
         c.visitor_number, (SELECT COUNT(*) FROM chats WHERE client_id = c.id) AS chats_count, \
         c.page_title, c.utm_json, c.ip, c.user_agent, c.geoip_json \
         FROM clients c JOIN channels ch ON ch.id = c.channel_id WHERE c.id = $1",
    )
    .bind(client_id)
    .fetch_optional(conn)
    .await
    .ctx("reading a client for a webhook")?;
    let Some(row) = row else { return Ok(None) };
    let text = |c: &str| row.try_get::<Option<String>, _>(c).ctx("reading a client");
    let number = |c: &str| row.try_get::<Option<i64>, _>(c).ctx("reading a client");
    Ok(Some(ClientCard {
        channel_id: row.try_get("channel_id").ctx("reading a client")?,
        public_id: row.try_get("public_id").ctx("reading a client")?,
        name: text("name")?,
        email: text("email")?,
        phone: text("phone")?,
        url: text("url")?,
        description: text("description")?,
        user_token: text("user_token")?,
        attributes: text("attributes")?,
        organization_id: number("organization_id")?,
        status_id: number("status_id")?,
        assigned_agent_id: number("assigned_agent_id")?,
        visitor_number: number("visitor_number")?,
        chats_count: row.try_get("chats_count").ctx("reading a client")?,
        page_title: text("page_title")?,
        utm_json: text("utm_json")?,
        ip: text("ip")?,
        user_agent: text("user_agent")?,
        geoip_json: text("geoip_json")?,
    }))
}

/// An organization: id and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrganizationRef {
    pub id: i64,
    pub name: String,
}

pub async fn organization(
    conn: &mut AnyConnection,
    id: i64,
) -> Result<Option<OrganizationRef>, StoreError> {
    let row: Option<(i64, String)> =
        sqlx::query_as("SELECT id, name FROM crm_organizations WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await
            .ctx("reading an organization")?;
    Ok(row.map(|(id, name)| OrganizationRef { id, name }))
}

/// A client category or a tag: id and title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Titled {
    pub id: i64,
    pub title: String,
}

/// The client category `id`.
pub async fn status(conn: &mut AnyConnection, id: i64) -> Result<Option<Titled>, StoreError> {
    let row: Option<(i64, String)> =
        sqlx::query_as("SELECT id, title FROM crm_statuses WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await
            .ctx("reading a category")?;
    Ok(row.map(|(id, title)| Titled { id, title }))
}

/// The default client category (the first by position), if one is marked.
pub async fn default_status(conn: &mut AnyConnection) -> Result<Option<Titled>, StoreError> {
    let row: Option<(i64, String)> = sqlx::query_as(
        "SELECT id, title FROM crm_statuses WHERE is_default = 1 ORDER BY position LIMIT 1",
    )
    .fetch_optional(conn)
    .await
    .ctx("reading the default category")?;
    Ok(row.map(|(id, title)| Titled { id, title }))
}

/// The client's tags, by id.
pub async fn client_tags(
    conn: &mut AnyConnection,
    client_id: i64,
) -> Result<Vec<Titled>, StoreError> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT t.id, t.title FROM crm_client_tags ct JOIN crm_tags t ON t.id = ct.tag_id \
         WHERE ct.client_id = $1 ORDER BY t.id",
    )
    .bind(client_id)
    .fetch_all(conn)
    .await
    .ctx("reading client tags")?;
    Ok(rows
        .into_iter()
        .map(|(id, title)| Titled { id, title })
        .collect())
}

/// An agent as webhooks name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRef {
    pub id: i64,
    pub name: String,
    pub email: String,
}

pub async fn agent(conn: &mut AnyConnection, id: i64) -> Result<Option<AgentRef>, StoreError> {
    let row: Option<(i64, String, String)> =
        sqlx::query_as("SELECT id, name, email FROM agents WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await
            .ctx("reading an agent")?;
    Ok(row.map(|(id, name, email)| AgentRef { id, name, email }))
}

/// Who a chat is between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatParties {
    pub client_id: i64,
    pub agent_id: Option<i64>,
}

pub async fn chat_parties(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<ChatParties>, StoreError> {
    let row: Option<(i64, Option<i64>)> =
        sqlx::query_as("SELECT client_id, agent_id FROM chats WHERE id = $1")
            .bind(chat_id)
            .fetch_optional(conn)
            .await
            .ctx("reading a chat")?;
    Ok(row.map(|(client_id, agent_id)| ChatParties {
        client_id,
        agent_id,
    }))
}

/// The chat's integration data as stored (JSON text), unparsed: a payload
/// falls back to the client's URL when it is missing or unreadable.
pub async fn chat_integration_text(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<String>, StoreError> {
    let row: Option<(Option<String>,)> =
        sqlx::query_as("SELECT integration FROM chats WHERE id = $1")
            .bind(chat_id)
            .fetch_optional(conn)
            .await
            .ctx("reading a chat")?;
    Ok(row.and_then(|(text,)| text))
}

/// One message of a chat log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// `client`, `agent`, `auto` or `bot`.
    pub author: String,
    pub agent_id: Option<i64>,
    /// A bot's name (bot messages).
    pub author_name: Option<String>,
    /// The channel `Message` as JSON text.
    pub body: String,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// The chat's messages in the order they were stored.
pub async fn chat_log(conn: &mut AnyConnection, chat_id: i64) -> Result<Vec<LogEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT author, agent_id, author_name, body, created_at FROM messages \
         WHERE chat_id = $1 ORDER BY id",
    )
    .bind(chat_id)
    .fetch_all(conn)
    .await
    .ctx("reading a chat log")?;
    rows.iter()
        .map(|row| {
            Ok(LogEntry {
                author: row.try_get("author").ctx("reading a message")?,
                agent_id: row.try_get("agent_id").ctx("reading a message")?,
                author_name: row.try_get("author_name").ctx("reading a message")?,
                body: row.try_get("body").ctx("reading a message")?,
                created_at: row.try_get("created_at").ctx("reading a message")?,
            })
        })
        .collect()
}

/// How a chat ended: the visitor's rating and whether the client is blacklisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatEnd {
    /// `positive`, `negative` or whatever else was stored.
    pub rate: Option<String>,
    pub blacklisted: bool,
}

/// The end of chat `chat_id`; an error if there is no such chat.
pub async fn chat_end(conn: &mut AnyConnection, chat_id: i64) -> Result<ChatEnd, StoreError> {
    let (rate, blacklisted): (Option<String>, i64) = sqlx::query_as(
        "SELECT ch.rate, (SELECT COUNT(*) FROM crm_blacklist b WHERE b.client_id = ch.client_id) \
         FROM chats ch WHERE ch.id = $1",
    )
    .bind(chat_id)
    .fetch_one(conn)
    .await
    .ctx("reading a chat")?;
    Ok(ChatEnd {
        rate,
        blacklisted: blacklisted > 0,
    })
}
