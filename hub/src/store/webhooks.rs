//! What event webhooks read: their sequence numbers, a channel's receiver,
//! and the rows their payloads are built from (client, organization,
//! category, agents, tags, chat log). Each takes the caller's connection, so
//! a payload is read in the transaction that queues it; the payloads
//! themselves are built in `core::webhooks::payload`.

use sqlx::any::AnyRow;
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

/// `$1` webhook sequence numbers at once on PostgreSQL, ascending (the
/// `webhook_sequence` sequence): sent in an agent batch's accepting round
/// trip (`outgoing::accept_chats`).
pub(super) const PG_SEQUENCES: &str =
    "SELECT nextval('webhook_sequence') FROM generate_series(1, $1) ORDER BY 1";

/// `count` webhook sequence numbers at once on SQLite, ascending: the
/// counter moved once for a batch that queues that many webhooks (the same
/// guarantees as [`next_sequence`]; PostgreSQL's are [`PG_SEQUENCES`]).
pub(super) async fn next_sequences_on_sqlite(
    conn: &mut AnyConnection,
    count: usize,
) -> Result<Vec<i64>, StoreError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let count = count as i64;
    let (last,): (i64,) = sqlx::query_as(
        "UPDATE counters SET value = value + $1 WHERE name = 'webhook_sequence' RETURNING value",
    )
    .bind(count)
    .fetch_one(conn)
    .await
    .ctx("numbering webhooks")?;
    Ok((last - count + 1..=last).collect())
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
    /// The channel's event webhook receiver.
    pub receiver: ChannelReceiver,
    pub name: Option<String>,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub url: Option<String>,
    pub description: Option<String>,
    pub user_token: Option<String>,
    /// The `attributes` column: a JSON object as text, if any.
    pub attributes: Option<String>,
    pub organization_id: Option<i64>,
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
    /// Its category: `status_id`'s, else the default one (the first by
    /// position of those marked), if any.
    pub status: Option<Titled>,
    /// Its tags, by id.
    pub tags: Vec<Titled>,
}

/// The client `client_id` for a webhook payload, with its category and
/// tags; `None` if there is none.
///
/// One statement: a chat's accept reads it in the agent batch's
/// transaction, and each statement there is a round trip the whole batch
/// waits for.
pub async fn client_card(
    conn: &mut AnyConnection,
    client_id: i64,
) -> Result<Option<ClientCard>, StoreError> {
    let row = sqlx::query(client_card_sql(super::is_postgres(conn)))
        .bind(client_id)
        .fetch_optional(conn)
        .await
        .ctx("reading a client for a webhook")?;
    row.as_ref().map(card_from_row).transpose()
}

fn card_from_row(row: &AnyRow) -> Result<ClientCard, StoreError> {
    let text = |c: &str| row.try_get::<Option<String>, _>(c).ctx("reading a client");
    let number = |c: &str| row.try_get::<Option<i64>, _>(c).ctx("reading a client");
    let status = match (number("status_ref")?, text("status_title")?) {
        (Some(id), Some(title)) => Some(Titled { id, title }),
        _ => None,
    };
    let tags: Vec<(i64, String)> = match text("tags")? {
        Some(tags) => serde_json::from_str(&tags)
            .map_err(|e| StoreError::Corrupt(format!("a client's tags as read: {e}")))?,
        None => Vec::new(),
    };
    Ok(ClientCard {
        channel_id: row.try_get("channel_id").ctx("reading a client")?,
        public_id: row.try_get("public_id").ctx("reading a client")?,
        receiver: ChannelReceiver {
            url: text("webhook_url")?,
            secret: text("webhook_secret")?,
        },
        name: text("name")?,
        email: text("email")?,
        phone: text("phone")?,
        url: text("url")?,
        description: text("description")?,
        user_token: text("user_token")?,
        attributes: text("attributes")?,
        organization_id: number("organization_id")?,
        assigned_agent_id: number("assigned_agent_id")?,
        visitor_number: number("visitor_number")?,
        chats_count: row.try_get("chats_count").ctx("reading a client")?,
        page_title: text("page_title")?,
        utm_json: text("utm_json")?,
        ip: text("ip")?,
        user_agent: text("user_agent")?,
        geoip_json: text("geoip_json")?,
        status,
        tags: tags
            .into_iter()
            .map(|(id, title)| Titled { id, title })
            .collect(),
    })
}

/// [`client_card`]'s statement: `$1` the client's id.
fn client_card_sql(postgres: bool) -> &'static str {
    static SQLITE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static POSTGRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let cell = if postgres { &POSTGRES } else { &SQLITE };
    cell.get_or_init(|| {
        format!(
            "SELECT {} FROM clients c JOIN channels ch ON ch.id = c.channel_id WHERE c.id = $1",
            card_columns(postgres)
        )
    })
}

/// A client card's columns over `clients c` and `channels ch`.
fn card_columns(postgres: bool) -> String {
    let tags = if postgres {
        "CAST(json_agg(json_build_array(t.id, t.title) ORDER BY t.id) AS TEXT)"
    } else {
        "json_group_array(json_array(t.id, t.title) ORDER BY t.id)"
    };
    let category = |column: &str| {
        format!(
            "CASE WHEN c.status_id IS NULL THEN (SELECT s.{column} FROM crm_statuses s \
             WHERE s.is_default = 1 ORDER BY s.position LIMIT 1) \
             ELSE (SELECT s.{column} FROM crm_statuses s WHERE s.id = c.status_id) END"
        )
    };
    format!(
        "c.channel_id, ch.public_id, ch.webhook_url, ch.webhook_secret, c.name, c.email, \
         c.phone, c.url, c.description, c.user_token, c.attributes, c.organization_id, \
         c.status_id, c.assigned_agent_id, c.visitor_number, \
         (SELECT COUNT(*) FROM chats n WHERE n.client_id = c.id) AS chats_count, \
         c.page_title, c.utm_json, c.ip, c.user_agent, c.geoip_json, \
         {} AS status_ref, {} AS status_title, \
         (SELECT {tags} FROM crm_client_tags ct JOIN crm_tags t ON t.id = ct.tag_id \
         WHERE ct.client_id = c.id) AS tags",
        category("id"),
        category("title"),
    )
}

/// A chat as its webhooks describe it: who it is between, with the
/// client's card.
#[derive(Debug, Clone)]
pub struct ChatCard {
    pub chat_id: i64,
    pub parties: ChatParties,
    pub card: ClientCard,
}

/// The chats `chat_ids` (those that exist, in no particular order) for
/// their webhook payloads: one statement however many, so a batch that
/// accepts several chats reads them all in one round trip.
pub async fn chat_cards(
    conn: &mut AnyConnection,
    chat_ids: &[i64],
) -> Result<Vec<ChatCard>, StoreError> {
    if chat_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(chat_cards_sql(super::is_postgres(conn)))
        .bind(serde_json::to_string(chat_ids).unwrap_or_else(|_| "[]".to_owned()))
        .bind(chat_ids.len() as i64)
        .fetch_all(conn)
        .await
        .ctx("reading chats for webhooks")?;
    rows.iter().map(chat_card_from_row).collect()
}

/// A row of [`chat_cards_sql`].
pub(super) fn chat_card_from_row(row: &AnyRow) -> Result<ChatCard, StoreError> {
    let number = |c: &str| row.try_get::<Option<i64>, _>(c).ctx("reading a chat");
    let text = |c: &str| row.try_get::<Option<String>, _>(c).ctx("reading a chat");
    let agent = match (
        number("agent_ref")?,
        text("agent_name")?,
        text("agent_email")?,
    ) {
        (Some(id), Some(name), Some(email)) => Some(AgentRef { id, name, email }),
        _ => None,
    };
    Ok(ChatCard {
        chat_id: row.try_get("chat_ref").ctx("reading a chat")?,
        parties: ChatParties {
            client_id: row.try_get("client_ref").ctx("reading a chat")?,
            agent,
            integration: text("chat_integration")?,
        },
        card: card_from_row(row)?,
    })
}

/// [`chat_cards`]' statement: `$1` the chats' ids as a JSON array, `$2`
/// how many. On PostgreSQL each chat is one lookup by key (`LATERAL`):
/// joined as a set, a kept plan may hash every client of the database for
/// a batch of a few chats.
pub(super) fn chat_cards_sql(postgres: bool) -> &'static str {
    static SQLITE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static POSTGRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let one = |id: &str| {
        format!(
            "SELECT k.id AS chat_ref, k.client_id AS client_ref, \
             k.integration AS chat_integration, a.id AS agent_ref, a.name AS agent_name, \
             a.email AS agent_email, {} \
             FROM chats k JOIN clients c ON c.id = k.client_id \
             JOIN channels ch ON ch.id = c.channel_id LEFT JOIN agents a ON a.id = k.agent_id \
             WHERE k.id {id}",
            card_columns(postgres)
        )
    };
    if postgres {
        POSTGRES.get_or_init(|| {
            format!(
                "SELECT x.* FROM (SELECT value::BIGINT AS id \
                 FROM json_array_elements_text($1::JSON) LIMIT $2) v \
                 CROSS JOIN LATERAL ({} LIMIT 1) x",
                one("= v.id")
            )
        })
    } else {
        SQLITE.get_or_init(|| one("IN (SELECT value FROM json_each($1) LIMIT $2)"))
    }
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

/// Who a chat is between, and what its integration data says (JSON text,
/// unparsed: a payload falls back to the client's URL when it is missing
/// or unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatParties {
    pub client_id: i64,
    /// The chat's agent, if it has one and the agent exists.
    pub agent: Option<AgentRef>,
    pub integration: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn a_client_card_carries_its_category_and_tags_and_a_chat_its_agent_and_page() {
        let (_dir, store) = crate::store::test_sqlite().await;
        cards_and_parties(store).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_client_card_carries_its_category_and_tags_and_a_chat_its_agent_and_page_on_postgres()
    {
        cards_and_parties(crate::store::required_test_postgres().await).await;
    }

    /// What the one-statement reads give is what the payloads read before
    /// them, one statement per part: the category set or else the default
    /// one, the tags by id, the chat's agent and integration data.
    async fn cards_and_parties(store: Store) {
        let channel = crate::store::test_channel(&store, "cards").await;
        let mut w = store.begin_write().await.expect("write");
        let mut id = async |sql: &str| -> i64 {
            let (id,): (i64,) = sqlx::query_as(sql)
                .bind(channel)
                .fetch_one(&mut *w.tx)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            id
        };
        let client = |key: &str, status: &str| {
            format!(
                "INSERT INTO clients (channel_id, external_key, external_id_json, created_at, \
                 updated_at, status_id) VALUES ($1, '{key}', '\"{key}\"', 0, 0, {status}) \
                 RETURNING id"
            )
        };
        let hot = id(
            "INSERT INTO crm_statuses (title, color, position, is_default, created_at) \
             SELECT 'Hot lead', '#f00', 9, 0, $1 RETURNING id",
        )
        .await;
        let plain = id(&client("plain", "NULL")).await;
        let tagged = id(&client("tagged", &hot.to_string())).await;
        let vip =
            id("INSERT INTO crm_tags (title, created_at) SELECT 'vip', $1 RETURNING id").await;
        let beta =
            id("INSERT INTO crm_tags (title, created_at) SELECT 'beta', $1 RETURNING id").await;
        for tag in [beta, vip] {
            id(&format!(
                "INSERT INTO crm_client_tags (client_id, tag_id) SELECT {tagged}, {tag} \
                 WHERE $1 IS NOT NULL RETURNING tag_id"
            ))
            .await;
        }
        let ann = id("INSERT INTO agents (name, email, token_hash, created_at) \
             SELECT 'Ann', 'ann@example.com', 'h', $1 RETURNING id")
        .await;
        let chat = |client: i64, agent: &str, integration: &str| {
            format!(
                "INSERT INTO chats (channel_id, client_id, state, agent_id, opened_at, \
                 last_message_at, integration) VALUES ($1, {client}, 'accepted', {agent}, 0, 0, \
                 {integration}) RETURNING id"
            )
        };
        let answered = id(&chat(
            tagged,
            &ann.to_string(),
            "'{\"page\":{\"url\":\"https://shop.example.com/cart\"}}'",
        ))
        .await;
        let waiting = id(&chat(plain, "NULL", "NULL")).await;

        let card = client_card(&mut w.tx, plain)
            .await
            .expect("read")
            .expect("a card");
        assert_eq!(card.status.expect("the default category").title, "New");
        assert!(card.tags.is_empty(), "{:?}", card.tags);
        let card = client_card(&mut w.tx, tagged)
            .await
            .expect("read")
            .expect("a card");
        assert_eq!(
            card.status,
            Some(Titled {
                id: hot,
                title: "Hot lead".into()
            })
        );
        let titles: Vec<&str> = card.tags.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(titles, ["vip", "beta"], "by id");
        assert_eq!(card.chats_count, 1);
        assert!(
            client_card(&mut w.tx, tagged + 100)
                .await
                .expect("read")
                .is_none()
        );

        let cards = chat_cards(&mut w.tx, &[waiting + 100, answered, waiting])
            .await
            .expect("read");
        assert_eq!(cards.len(), 2, "the chats that exist");
        let card = |chat: i64| {
            cards
                .iter()
                .find(|c| c.chat_id == chat)
                .unwrap_or_else(|| panic!("chat {chat}"))
        };
        let parties = &card(answered).parties;
        assert_eq!(parties.client_id, tagged);
        assert_eq!(
            parties.agent,
            Some(AgentRef {
                id: ann,
                name: "Ann".into(),
                email: "ann@example.com".into()
            })
        );
        assert!(
            parties
                .integration
                .as_deref()
                .is_some_and(|i| i.contains("/cart"))
        );
        let titles: Vec<&str> = card(answered)
            .card
            .tags
            .iter()
            .map(|t| t.title.as_str())
            .collect();
        assert_eq!(titles, ["vip", "beta"], "the client's card with the chat");
        let waiting = card(waiting);
        assert_eq!(waiting.parties.client_id, plain);
        assert_eq!(
            (&waiting.parties.agent, &waiting.parties.integration),
            (&None, &None)
        );
        assert_eq!(waiting.card.status.as_ref().expect("default").title, "New");
    }
}
