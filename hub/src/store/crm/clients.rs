//! The CRM side of clients: profile, category, organization, assigned agent,
//! tags, contacts and blacklist, read as the spec's CRM `Client` object.
//! The clients are the chats' clients; an agent reaches only clients of the
//! channels it works on.

use plugin_api::crm::{
    AgentRef, AssignedAgentRef, Blacklist, Client, Contact, ContactSource, ContactType, Flag,
    WidgetRef,
};
use plugin_api::lenient::{ExternalId, Label};
use plugin_api::webhook::NumericId;
use serde_json::{Map, Value};
use sqlx::{AnyConnection, Row};

use super::{organizations, statuses, tags};
use crate::store::chats::NEXT_VISITOR_NUMBER;
use crate::store::{Ctx, StoreError};

/// A client created through the CRM rather than by a customer message.
#[derive(Debug, Clone)]
pub struct NewClient {
    pub channel_id: i64,
    pub external_id: ExternalId,
    pub name: String,
    pub avatar_url: Option<String>,
    pub description: Option<String>,
    pub crm_link: Option<String>,
    pub custom_data: Option<Map<String, Value>>,
}

/// Profile fields to change; `None` leaves a field as it is, `Some(None)` clears it.
#[derive(Debug, Clone, Default)]
pub struct ProfilePatch {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub avatar_url: Option<Option<String>>,
    pub crm_link: Option<Option<String>>,
    pub custom_data: Option<Option<Map<String, Value>>>,
}

/// A block of a client.
#[derive(Debug, Clone)]
pub struct Block {
    pub agent_id: i64,
    pub block_ts: i64,
    /// 0: until unblocked.
    pub unblock_ts: i64,
    pub ip_address: String,
}

/// Which clients to list (always only those of the agent's channels).
#[derive(Debug, Clone, Default)]
pub struct ClientFilter {
    pub channel_id: Option<i64>,
    pub status_id: Option<i64>,
    pub organization_id: Option<i64>,
    pub assigned_agent_id: Option<i64>,
    pub tag_id: Option<i64>,
    /// Part of the name, e-mail or phone, any case.
    pub search: Option<String>,
    /// Clients with a larger id only: the page after the one that ended here.
    pub after_id: Option<i64>,
    pub limit: i64,
}

fn corrupt_json(what: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("client {what}: {e}"))
}

/// The whole CRM client object, as every `crm_client` event carries it.
pub async fn get(
    conn: &mut AnyConnection,
    id: i64,
    now_s: i64,
) -> Result<Option<Client>, StoreError> {
    let row = sqlx::query(
        "SELECT c.id, ch.public_id, c.name, c.email, c.phone, c.photo, c.description, \
         c.assigned_agent_id, c.status_id, c.organization_id, c.crm_link, c.custom_data, \
         c.visits_count, \
         (SELECT COUNT(*) FROM chats WHERE client_id = c.id) AS chats_count, \
         (SELECT COUNT(*) FROM crm_deals WHERE client_id = c.id) AS deals_count \
         FROM clients c JOIN channels ch ON ch.id = c.channel_id WHERE c.id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .ctx("reading a client")?;
    let Some(row) = row else { return Ok(None) };
    let text = |c: &str| row.try_get::<Option<String>, _>(c).ctx("reading a client");
    let int = |c: &str| row.try_get::<Option<i64>, _>(c).ctx("reading a client");
    let count = |c: &str| {
        row.try_get::<i64, _>(c)
            .ctx("reading a client")
            .map(|n| u64::try_from(n).unwrap_or(0))
    };
    let custom_data = text("custom_data")?
        .map(|s| {
            serde_json::from_str::<Map<String, Value>>(&s)
                .map_err(|e| corrupt_json("custom_data", e))
        })
        .transpose()?;
    let email = text("email")?;
    let phone = text("phone")?;
    let status = statuses::of_client(conn, int("status_id")?).await?;
    let organization = match int("organization_id")? {
        Some(org) => organizations::get(conn, org).await?,
        None => None,
    };
    let client = Client {
        client_id: NumericId(id),
        widget: WidgetRef {
            widget_id: Label(row.try_get("public_id").ctx("reading a client")?),
        },
        // The spec shows nameless customers as Anonymous.
        name: text("name")?.unwrap_or_else(|| "Anonymous".to_owned()),
        avatar_url: text("photo")?,
        description: text("description")?,
        social: None,
        assigned_agent: AssignedAgentRef {
            assigned_agent_id: int("assigned_agent_id")?.map(NumericId),
        },
        crm_link: text("crm_link")?,
        chats_count: count("chats_count")?,
        visits_count: count("visits_count")?,
        custom_data,
        status,
        organization,
        tags: tags::of_client(conn, id).await?,
        has_deal: Flag(count("deals_count")? > 0),
        contacts: contacts(conn, id, email, phone).await?,
        blacklist: blacklist(conn, id, now_s).await?,
    };
    Ok(Some(client))
}

fn contact_type(s: &str) -> Result<ContactType, StoreError> {
    match s {
        "phone" => Ok(ContactType::Phone),
        "email" => Ok(ContactType::Email),
        other => Err(StoreError::Corrupt(format!("contact type `{other}`"))),
    }
}

pub fn contact_type_str(t: ContactType) -> &'static str {
    match t {
        ContactType::Phone => "phone",
        ContactType::Email => "email",
    }
}

fn contact_source(s: &str) -> Result<ContactSource, StoreError> {
    match s {
        "agent_app" => Ok(ContactSource::AgentApp),
        "widget" => Ok(ContactSource::Widget),
        other => Err(StoreError::Corrupt(format!(
            "contact channel type `{other}`"
        ))),
    }
}

fn contact_source_str(s: ContactSource) -> &'static str {
    match s {
        ContactSource::AgentApp => "agent_app",
        ContactSource::Widget => "widget",
    }
}

/// The contacts the customer gave (its e-mail and phone, `widget`), then the
/// ones agents recorded (`agent_app`), without repeats.
async fn contacts(
    conn: &mut AnyConnection,
    id: i64,
    email: Option<String>,
    phone: Option<String>,
) -> Result<Vec<Contact>, StoreError> {
    let mut out: Vec<Contact> = Vec::new();
    for (kind, value) in [(ContactType::Phone, phone), (ContactType::Email, email)] {
        if let Some(contact) = value.filter(|v| !v.trim().is_empty()) {
            out.push(Contact {
                contact_type: kind,
                contact,
                channel_type: ContactSource::Widget,
            });
        }
    }
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT contact_type, contact, channel_type FROM crm_client_contacts \
         WHERE client_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(conn)
    .await
    .ctx("reading a client's contacts")?;
    for (kind, contact, source) in rows {
        let kind = contact_type(&kind)?;
        if out
            .iter()
            .any(|c| c.contact_type == kind && c.contact == contact)
        {
            continue;
        }
        out.push(Contact {
            contact_type: kind,
            contact,
            channel_type: contact_source(&source)?,
        });
    }
    Ok(out)
}

/// The client's block, unless there is none or it has run out.
async fn blacklist(
    conn: &mut AnyConnection,
    id: i64,
    now_s: i64,
) -> Result<Option<Blacklist>, StoreError> {
    let row: Option<(i64, i64, i64, String)> = sqlx::query_as(
        "SELECT agent_id, block_ts, unblock_ts, ip_address FROM crm_blacklist WHERE client_id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
    .ctx("reading a client's block")?;
    Ok(row
        .filter(|(_, _, unblock, _)| *unblock == 0 || *unblock > now_s)
        .map(|(agent, block, unblock, ip)| Blacklist {
            agent: AgentRef {
                agent_id: NumericId(agent),
            },
            block_datetime_ts: block,
            unblock_datetime_ts: unblock,
            ip_address: ip,
        }))
}

/// The client's channel, if the client exists and `agent_email` works on it.
pub async fn visible_channel(
    conn: &mut AnyConnection,
    id: i64,
    agent_email: &str,
) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT c.channel_id FROM clients c JOIN channel_agents ca ON ca.channel_id = c.channel_id \
         WHERE c.id = $1 AND ca.agent_email = $2",
    )
    .bind(id)
    .bind(agent_email.to_lowercase())
    .fetch_optional(conn)
    .await
    .ctx("checking a client's channel")?;
    Ok(row.map(|(c,)| c))
}

/// The client's `sender.id`, in the JSON type the integrator used.
pub async fn external_id(
    conn: &mut AnyConnection,
    id: i64,
) -> Result<Option<ExternalId>, StoreError> {
    let row: Option<(String,)> =
        sqlx::query_as("SELECT external_id_json FROM clients WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await
            .ctx("reading a client's external id")?;
    row.map(|(json,)| serde_json::from_str(&json).map_err(|e| corrupt_json("external id", e)))
        .transpose()
}

/// A channel `agent_email` works on, named by public id or by name.
pub async fn agent_channel(
    conn: &mut AnyConnection,
    key: &str,
    agent_email: &str,
) -> Result<Option<i64>, StoreError> {
    for column in ["public_id", "name"] {
        let row: Option<(i64,)> = sqlx::query_as(&format!(
            "SELECT ch.id FROM channels ch JOIN channel_agents ca ON ca.channel_id = ch.id \
             WHERE ch.{column} = $1 AND ca.agent_email = $2"
        ))
        .bind(key)
        .bind(agent_email.to_lowercase())
        .fetch_optional(&mut *conn)
        .await
        .ctx("finding a channel")?;
        if let Some((id,)) = row {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// Ids of the clients matching `filter` on the channels of `agent_email`.
pub async fn list(
    conn: &mut AnyConnection,
    agent_email: &str,
    filter: &ClientFilter,
) -> Result<Vec<i64>, StoreError> {
    let default_status = statuses::default_id(conn).await?;
    let search = filter.search.as_ref().map(|s| {
        let escaped = s
            .to_lowercase()
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        format!("%{escaped}%")
    });
    // NULL parameters switch their condition off.
    let rows: Vec<(i64,)> = sqlx::query_as(
        "SELECT c.id FROM clients c JOIN channel_agents ca ON ca.channel_id = c.channel_id \
         WHERE ca.agent_email = $1 \
         AND ($2 IS NULL OR c.channel_id = $2) \
         AND ($3 IS NULL OR COALESCE(c.status_id, $4) = $3) \
         AND ($5 IS NULL OR c.organization_id = $5) \
         AND ($6 IS NULL OR c.assigned_agent_id = $6) \
         AND ($7 IS NULL OR EXISTS (SELECT 1 FROM crm_client_tags t \
              WHERE t.client_id = c.id AND t.tag_id = $7)) \
         AND ($8 IS NULL OR LOWER(COALESCE(c.name, '')) LIKE $8 ESCAPE '\\' \
              OR LOWER(COALESCE(c.email, '')) LIKE $8 ESCAPE '\\' \
              OR COALESCE(c.phone, '') LIKE $8 ESCAPE '\\') \
         AND c.id > $9 \
         ORDER BY c.id LIMIT $10",
    )
    .bind(agent_email.to_lowercase())
    .bind(filter.channel_id)
    .bind(filter.status_id)
    .bind(default_status)
    .bind(filter.organization_id)
    .bind(filter.assigned_agent_id)
    .bind(filter.tag_id)
    .bind(search)
    .bind(filter.after_id.unwrap_or(0))
    .bind(filter.limit)
    .fetch_all(conn)
    .await
    .ctx("listing clients")?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Inserts a client; `None` when the channel already has one with this external id.
pub async fn insert(
    conn: &mut AnyConnection,
    new: &NewClient,
    now_ms: i64,
) -> Result<Option<i64>, StoreError> {
    let id_json = serde_json::to_string(&new.external_id)
        .map_err(|e| StoreError::Corrupt(format!("client id: {e}")))?;
    let custom_data = new
        .custom_data
        .as_ref()
        .map(|m| Value::Object(m.clone()).to_string());
    let sql = format!(
        "INSERT INTO clients (channel_id, external_key, external_id_json, name, photo, \
         description, crm_link, custom_data, created_at, updated_at, visitor_number) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, {NEXT_VISITOR_NUMBER}) \
         ON CONFLICT (channel_id, external_key) DO NOTHING RETURNING id"
    );
    let row: Option<(i64,)> = sqlx::query_as(&sql)
        .bind(new.channel_id)
        .bind(new.external_id.as_key())
        .bind(id_json)
        .bind(new.name.as_str())
        .bind(new.avatar_url.as_deref())
        .bind(new.description.as_deref())
        .bind(new.crm_link.as_deref())
        .bind(custom_data)
        .bind(now_ms)
        .fetch_optional(conn)
        .await
        .ctx("inserting a client")?;
    Ok(row.map(|(id,)| id))
}

/// A value for one client column.
enum Column<'a> {
    Text(Option<&'a str>),
    Int(Option<i64>),
}

/// Sets one column of a client; `column` is always a literal of this module.
async fn set_column(
    conn: &mut AnyConnection,
    id: i64,
    column: &'static str,
    value: Column<'_>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let sql = format!("UPDATE clients SET {column} = $1, updated_at = $2 WHERE id = $3");
    let query = sqlx::query(&sql);
    let query = match value {
        Column::Text(v) => query.bind(v),
        Column::Int(v) => query.bind(v),
    };
    query
        .bind(now_ms)
        .bind(id)
        .execute(conn)
        .await
        .ctx("updating a client")?;
    Ok(())
}

/// Writes the profile fields present in `patch`.
pub async fn update_profile(
    conn: &mut AnyConnection,
    id: i64,
    patch: &ProfilePatch,
    now_ms: i64,
) -> Result<(), StoreError> {
    if let Some(name) = &patch.name {
        set_column(conn, id, "name", Column::Text(Some(name)), now_ms).await?;
    }
    if let Some(v) = &patch.description {
        set_column(conn, id, "description", Column::Text(v.as_deref()), now_ms).await?;
    }
    if let Some(v) = &patch.avatar_url {
        set_column(conn, id, "photo", Column::Text(v.as_deref()), now_ms).await?;
    }
    if let Some(v) = &patch.crm_link {
        set_column(conn, id, "crm_link", Column::Text(v.as_deref()), now_ms).await?;
    }
    if let Some(v) = &patch.custom_data {
        let json = v.as_ref().map(|m| Value::Object(m.clone()).to_string());
        set_column(
            conn,
            id,
            "custom_data",
            Column::Text(json.as_deref()),
            now_ms,
        )
        .await?;
    }
    Ok(())
}

pub async fn set_assigned_agent(
    conn: &mut AnyConnection,
    id: i64,
    agent_id: Option<i64>,
    now_ms: i64,
) -> Result<(), StoreError> {
    set_column(conn, id, "assigned_agent_id", Column::Int(agent_id), now_ms).await
}

pub async fn set_status(
    conn: &mut AnyConnection,
    id: i64,
    status_id: i64,
    now_ms: i64,
) -> Result<(), StoreError> {
    set_column(conn, id, "status_id", Column::Int(Some(status_id)), now_ms).await
}

pub async fn set_organization(
    conn: &mut AnyConnection,
    id: i64,
    organization_id: Option<i64>,
    now_ms: i64,
) -> Result<(), StoreError> {
    set_column(
        conn,
        id,
        "organization_id",
        Column::Int(organization_id),
        now_ms,
    )
    .await
}

/// Blocks the client (again, replacing an earlier block).
pub async fn block(conn: &mut AnyConnection, id: i64, b: &Block) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO crm_blacklist (client_id, agent_id, block_ts, unblock_ts, ip_address) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (client_id) DO UPDATE SET \
         agent_id = excluded.agent_id, block_ts = excluded.block_ts, \
         unblock_ts = excluded.unblock_ts, ip_address = excluded.ip_address",
    )
    .bind(id)
    .bind(b.agent_id)
    .bind(b.block_ts)
    .bind(b.unblock_ts)
    .bind(b.ip_address.as_str())
    .execute(conn)
    .await
    .ctx("blocking a client")?;
    Ok(())
}

pub async fn unblock(conn: &mut AnyConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM crm_blacklist WHERE client_id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("unblocking a client")?;
    Ok(())
}

/// Replaces the contacts agents recorded (`agent_app`); the customer's own stay.
pub async fn set_agent_contacts(
    conn: &mut AnyConnection,
    id: i64,
    contacts: &[(ContactType, String)],
    now_ms: i64,
) -> Result<(), StoreError> {
    let source = contact_source_str(ContactSource::AgentApp);
    sqlx::query("DELETE FROM crm_client_contacts WHERE client_id = $1 AND channel_type = $2")
        .bind(id)
        .bind(source)
        .execute(&mut *conn)
        .await
        .ctx("clearing a client's contacts")?;
    for (kind, contact) in contacts {
        sqlx::query(
            "INSERT INTO crm_client_contacts (client_id, contact_type, contact, channel_type) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (client_id, contact_type, contact) DO NOTHING",
        )
        .bind(id)
        .bind(contact_type_str(*kind))
        .bind(contact.as_str())
        .bind(source)
        .execute(&mut *conn)
        .await
        .ctx("saving a client's contact")?;
    }
    sqlx::query("UPDATE clients SET updated_at = $1 WHERE id = $2")
        .bind(now_ms)
        .bind(id)
        .execute(conn)
        .await
        .ctx("updating a client")?;
    Ok(())
}

/// Chats of the client that are not closed.
pub async fn live_chats(conn: &mut AnyConnection, id: i64) -> Result<i64, StoreError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM chats WHERE client_id = $1 AND state <> 'closed'")
            .bind(id)
            .fetch_one(conn)
            .await
            .ctx("counting a client's chats")?;
    Ok(n)
}

/// Deletes the client with its closed chats and their messages, deals,
/// tasks, tags, contacts and block.
pub async fn delete(conn: &mut AnyConnection, id: i64) -> Result<(), StoreError> {
    crate::store::live::chats_changed();
    // PostgreSQL's messages have no foreign key to cascade from their chat
    // (migration 18); SQLite's would, and finds none left.
    sqlx::query(
        "DELETE FROM messages WHERE chat_id IN (SELECT id FROM chats WHERE client_id = $1)",
    )
    .bind(id)
    .execute(&mut *conn)
    .await
    .ctx("deleting a client's messages")?;
    sqlx::query("DELETE FROM clients WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting a client")?;
    Ok(())
}
