//! `/crm/clients`: the CRM view of the chats' clients, on the agent's channels
//! only (`crm_client` webhooks, each with the whole client; `assigned_status`
//! for a category). Changes the event webhooks name for `client_updated`
//! (assigned agent, category, organization, contacts) queue it too, in the
//! same transaction, so both kinds of receivers hear the same change.

use plugin_api::crm::{
    Client, ClientEvent, ContactSource, ContactType, CrmEvent, DealEvent, StatusAssignment,
    StatusEvent, TaskEvent,
};
use plugin_api::lenient::ExternalId;
use plugin_api::webhook::NumericId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    Answer, Change, ClientPart, CoreError, Crm, Entity, Verb, created, invalid, no_such_change,
    nullable, ok, optional_text, optional_url, title,
};
use crate::store::crm::clients::{self as store, Block, NewClient, ProfilePatch};
use crate::store::crm::deals::DealFilter;
use crate::store::crm::tasks::TaskFilter;
use crate::store::crm::{agent_exists, deals, organizations, statuses, tags, tasks};
use crate::store::{Agent, Conn};

pub(crate) const MISSING: &str = Entity::Client.missing();
/// Most contacts or tags one request may give a client.
const MAX_ITEMS: usize = 100;
/// Largest `custom_data`, as JSON text.
const MAX_CUSTOM_DATA: usize = 16 * 1024;

pub(super) async fn apply(cx: &Crm<'_>, verb: Verb) -> Answer {
    let agent = cx.agent;
    match verb {
        Verb::Create => create(cx, agent, cx.fields()?).await,
        Verb::Update(id) => update(cx, agent, id, cx.fields()?).await,
        Verb::Delete(id) => delete(cx, agent, id).await,
        Verb::Set(id, part) => match part {
            ClientPart::AssignedAgent => assign_agent(cx, agent, id, cx.fields()?).await,
            ClientPart::Status => assign_status(cx, agent, id, cx.fields()?).await,
            ClientPart::Organization => set_organization(cx, agent, id, cx.fields()?).await,
            ClientPart::Blacklist => set_blacklist(cx, agent, id, cx.fields()?).await,
            ClientPart::Contacts => set_contacts(cx, agent, id, cx.fields()?).await,
            ClientPart::Tags => set_tags(cx, agent, id, cx.fields()?).await,
        },
        _ => Err(no_such_change()),
    }
}

/// The CRM client object as the webhooks carry it, plus the integrator's id
/// of the client (`sender.id`, in the JSON type it was sent in).
#[derive(Debug, Serialize)]
pub(crate) struct ClientAnswer {
    #[serde(flatten)]
    client: Client,
    external_id: ExternalId,
}

pub(crate) async fn answer(
    conn: &mut Conn,
    id: i64,
    now_s: i64,
) -> Result<ClientAnswer, CoreError> {
    let client = store::get(conn, id, now_s)
        .await?
        .ok_or(CoreError::Missing(MISSING))?;
    let external_id = store::external_id(conn, id)
        .await?
        .ok_or(CoreError::Missing(MISSING))?;
    Ok(ClientAnswer {
        client,
        external_id,
    })
}

/// Starts a change of a client the agent may reach.
async fn open<'a>(cx: &'a Crm<'a>, agent: &Agent, id: i64) -> Result<Change<'a>, CoreError> {
    let mut change = Change::begin(cx).await?;
    if store::visible_channel(change.conn(), id, &agent.email)
        .await?
        .is_none()
    {
        return Err(CoreError::Missing(MISSING));
    }
    Ok(change)
}

/// Queues the client event (and `client_updated` when the event webhooks
/// name the change), commits, and answers with the client.
async fn finish(
    mut change: Change<'_>,
    id: i64,
    event: fn(Client) -> ClientEvent,
    client_updated: bool,
) -> Answer {
    let now = change.now_s();
    let answer = answer(change.conn(), id, now).await?;
    change
        .crm(CrmEvent::CrmClient(Box::new(event(answer.client.clone()))))
        .await?;
    if client_updated {
        change.client_updated(id).await?;
    }
    change.commit().await?;
    ok(&answer)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContactBody {
    contact_type: ContactType,
    contact: String,
    /// Only `agent_app`: the customer's own contacts come from the channel.
    #[serde(default)]
    channel_type: Option<ContactSource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// The channel's public id or name; the agent must work on it.
    channel: String,
    name: String,
    /// The integrator's id of the client; made up when absent.
    #[serde(default)]
    external_id: Option<ExternalId>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    avatar_url: Option<String>,
    #[serde(default)]
    crm_link: Option<String>,
    #[serde(default)]
    custom_data: Option<Map<String, Value>>,
    #[serde(default)]
    status_id: Option<NumericId>,
    #[serde(default)]
    organization_id: Option<NumericId>,
    #[serde(default)]
    assigned_agent_id: Option<NumericId>,
    #[serde(default)]
    tag_ids: Vec<NumericId>,
    #[serde(default)]
    contacts: Vec<ContactBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    avatar_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    custom_data: Option<Option<Map<String, Value>>>,
    #[serde(default, deserialize_with = "nullable")]
    crm_link: Option<Option<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentBody {
    /// `null` unassigns.
    agent_id: Option<NumericId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusBody {
    status_id: NumericId,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrganizationBody {
    /// `null` takes the client out of its organization.
    organization_id: Option<NumericId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlacklistBody {
    blocked: bool,
    /// Unix seconds; until unblocked when absent.
    #[serde(default)]
    unblock_ts: Option<NumericId>,
    #[serde(default)]
    ip_address: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContactsBody {
    contacts: Vec<ContactBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TagsBody {
    tag_ids: Vec<NumericId>,
}

fn custom_data(value: Option<Map<String, Value>>) -> Result<Option<Map<String, Value>>, CoreError> {
    match value {
        Some(m) if Value::Object(m.clone()).to_string().len() > MAX_CUSTOM_DATA => Err(invalid(
            format!("custom_data: at most {MAX_CUSTOM_DATA} bytes of JSON"),
        )),
        other => Ok(other),
    }
}

/// Checks and normalises contacts: e-mails with an `@`, phones of digits
/// (with `+`, spaces, dashes, dots and brackets); repeats dropped.
fn contacts(body: Vec<ContactBody>) -> Result<Vec<(ContactType, String)>, CoreError> {
    if body.len() > MAX_ITEMS {
        return Err(invalid(format!("contacts: at most {MAX_ITEMS}")));
    }
    let mut out: Vec<(ContactType, String)> = Vec::with_capacity(body.len());
    for (i, c) in body.into_iter().enumerate() {
        if c.channel_type == Some(ContactSource::Widget) {
            return Err(invalid(format!(
                "contacts[{i}].channel_type: agents record agent_app contacts; widget \
                 contacts are the customer's own"
            )));
        }
        let value = c.contact.trim().to_owned();
        let fine = match c.contact_type {
            ContactType::Email => {
                value.len() <= 254
                    && value
                        .split_once('@')
                        .is_some_and(|(user, host)| !user.is_empty() && !host.is_empty())
                    && !value.chars().any(char::is_whitespace)
            }
            ContactType::Phone => {
                value.len() <= 32
                    && value.chars().any(|ch| ch.is_ascii_digit())
                    && value
                        .chars()
                        .all(|ch| ch.is_ascii_digit() || "+-() .".contains(ch))
            }
        };
        if !fine {
            return Err(invalid(format!(
                "contacts[{i}].contact: {value:?} is not a valid {}",
                store::contact_type_str(c.contact_type)
            )));
        }
        if !out.iter().any(|(t, v)| *t == c.contact_type && *v == value) {
            out.push((c.contact_type, value));
        }
    }
    Ok(out)
}

fn tag_ids(body: &[NumericId]) -> Result<Vec<i64>, CoreError> {
    if body.len() > MAX_ITEMS {
        return Err(invalid(format!("tag_ids: at most {MAX_ITEMS}")));
    }
    let mut out: Vec<i64> = Vec::with_capacity(body.len());
    for id in body.iter().map(|n| n.0) {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

async fn check_tags(change: &mut Change<'_>, ids: &[i64]) -> Result<(), CoreError> {
    for id in ids {
        if tags::get(change.conn(), *id).await?.is_none() {
            return Err(invalid(format!("tag_ids: no client tag {id}")));
        }
    }
    Ok(())
}

async fn create(cx: &Crm<'_>, agent: &Agent, body: CreateBody) -> Answer {
    let external_id = match body.external_id {
        Some(id) if id.is_empty() => return Err(invalid("external_id: must not be empty")),
        Some(id) => id,
        None => ExternalId::Str(format!("crm-{}", uuid::Uuid::now_v7())),
    };
    let name = title("name", &body.name)?;
    let avatar_url = optional_url("avatar_url", body.avatar_url.as_deref())?;
    let description = optional_text("description", body.description.as_deref())?;
    let crm_link = optional_url("crm_link", body.crm_link.as_deref())?;
    let custom_data = custom_data(body.custom_data)?;
    let contacts = contacts(body.contacts)?;
    let tag_ids = tag_ids(&body.tag_ids)?;
    let mut change = Change::begin(cx).await?;
    let channel_id = store::agent_channel(change.conn(), &body.channel, &agent.email)
        .await?
        .ok_or_else(|| invalid(format!("channel: no channel {:?} of yours", body.channel)))?;
    if let Some(s) = body.status_id
        && statuses::get(change.conn(), s.0).await?.is_none()
    {
        return Err(invalid(format!("status_id: no client category {s}")));
    }
    if let Some(o) = body.organization_id
        && organizations::get(change.conn(), o.0).await?.is_none()
    {
        return Err(invalid(format!("organization_id: no organization {o}")));
    }
    if let Some(a) = body.assigned_agent_id
        && !agent_exists(change.conn(), a.0).await?
    {
        return Err(invalid(format!("assigned_agent_id: no agent {a}")));
    }
    check_tags(&mut change, &tag_ids).await?;
    let now = change.now_ms();
    let new = NewClient {
        channel_id,
        external_id: external_id.clone(),
        name,
        avatar_url,
        description,
        crm_link,
        custom_data,
    };
    let Some(id) = store::insert(change.conn(), &new, now).await? else {
        return Err(CoreError::Conflict(format!(
            "the channel already has a client with external_id {external_id}"
        )));
    };
    if let Some(s) = body.status_id {
        store::set_status(change.conn(), id, s.0, now).await?;
    }
    if body.organization_id.is_some() {
        store::set_organization(change.conn(), id, body.organization_id.map(|o| o.0), now).await?;
    }
    if body.assigned_agent_id.is_some() {
        store::set_assigned_agent(change.conn(), id, body.assigned_agent_id.map(|a| a.0), now)
            .await?;
    }
    tags::set_of_client(change.conn(), id, &tag_ids).await?;
    store::set_agent_contacts(change.conn(), id, &contacts, now).await?;
    let now_s = change.now_s();
    let answer = answer(change.conn(), id, now_s).await?;
    change
        .commit_with(CrmEvent::CrmClient(Box::new(ClientEvent::CreatedClient(
            answer.client.clone(),
        ))))
        .await?;
    created(&answer)
}

async fn update(cx: &Crm<'_>, agent: &Agent, id: i64, body: UpdateBody) -> Answer {
    let patch = ProfilePatch {
        name: body.name.as_deref().map(|n| title("name", n)).transpose()?,
        description: body
            .description
            .map(|d| optional_text("description", d.as_deref()))
            .transpose()?,
        avatar_url: body
            .avatar_url
            .map(|u| optional_url("avatar_url", u.as_deref()))
            .transpose()?,
        crm_link: body
            .crm_link
            .map(|u| optional_url("crm_link", u.as_deref()))
            .transpose()?,
        custom_data: body.custom_data.map(custom_data).transpose()?,
    };
    let mut change = open(cx, agent, id).await?;
    let now = change.now_ms();
    store::update_profile(change.conn(), id, &patch, now).await?;
    finish(change, id, ClientEvent::UpdatedClient, false).await
}

/// Deletes a client whose chats are all closed, with its deals and tasks
/// (each told as deleted first).
async fn delete(cx: &Crm<'_>, agent: &Agent, id: i64) -> Answer {
    let mut change = open(cx, agent, id).await?;
    if store::live_chats(change.conn(), id).await? > 0 {
        return Err(CoreError::Conflict(
            "the client has a chat that is not closed".to_owned(),
        ));
    }
    let now = change.now_s();
    let answer = answer(change.conn(), id, now).await?;
    let client_tasks = tasks::list(
        change.conn(),
        &TaskFilter {
            client_id: Some(id),
            ..TaskFilter::default()
        },
    )
    .await?;
    for task in client_tasks {
        change
            .crm(CrmEvent::CrmTask(TaskEvent::DeletedTask(task)))
            .await?;
    }
    let client_deals = deals::list(
        change.conn(),
        &DealFilter {
            client_id: Some(id),
            ..DealFilter::default()
        },
    )
    .await?;
    for deal in client_deals {
        change
            .crm(CrmEvent::CrmDeal(DealEvent::DeletedDeal(deal)))
            .await?;
    }
    store::delete(change.conn(), id).await?;
    change
        .commit_with(CrmEvent::CrmClient(Box::new(ClientEvent::DeletedClient(
            answer.client.clone(),
        ))))
        .await?;
    ok(&answer)
}

async fn assign_agent(cx: &Crm<'_>, agent: &Agent, id: i64, body: AgentBody) -> Answer {
    let mut change = open(cx, agent, id).await?;
    let assigned = body.agent_id.map(|a| a.0);
    if let Some(a) = assigned
        && !agent_exists(change.conn(), a).await?
    {
        return Err(invalid(format!("agent_id: no agent {a}")));
    }
    let now = change.now_ms();
    store::set_assigned_agent(change.conn(), id, assigned, now).await?;
    finish(change, id, ClientEvent::AssignedAgentToClient, true).await
}

/// Puts the client in a category: `assigned_status` with the category and
/// the client, and `client_updated`.
async fn assign_status(cx: &Crm<'_>, agent: &Agent, id: i64, body: StatusBody) -> Answer {
    let mut change = open(cx, agent, id).await?;
    let status_id = body.status_id.0;
    if statuses::get(change.conn(), status_id).await?.is_none() {
        return Err(invalid(format!(
            "status_id: no client category {status_id}"
        )));
    }
    let now = change.now_ms();
    store::set_status(change.conn(), id, status_id, now).await?;
    let now_s = change.now_s();
    let answer = answer(change.conn(), id, now_s).await?;
    change
        .crm(CrmEvent::CrmStatus(StatusEvent::AssignedStatus(
            StatusAssignment {
                status: answer.client.status.clone(),
                client: Box::new(answer.client.clone()),
            },
        )))
        .await?;
    change.client_updated(id).await?;
    change.commit().await?;
    ok(&answer)
}

async fn set_organization(cx: &Crm<'_>, agent: &Agent, id: i64, body: OrganizationBody) -> Answer {
    let mut change = open(cx, agent, id).await?;
    let organization = body.organization_id.map(|o| o.0);
    if let Some(o) = organization
        && organizations::get(change.conn(), o).await?.is_none()
    {
        return Err(invalid(format!("organization_id: no organization {o}")));
    }
    let now = change.now_ms();
    store::set_organization(change.conn(), id, organization, now).await?;
    finish(change, id, ClientEvent::ChangedClientCompany, true).await
}

/// Blocks (again, replacing an earlier block) or unblocks the client.
async fn set_blacklist(cx: &Crm<'_>, agent: &Agent, id: i64, body: BlacklistBody) -> Answer {
    let mut change = open(cx, agent, id).await?;
    let now_s = change.now_s();
    if body.blocked {
        let unblock_ts = match body.unblock_ts.map(|n| n.0) {
            Some(ts) if ts <= now_s || ts >= 100_000_000_000 => {
                return Err(invalid(format!(
                    "unblock_ts: expected a future time in Unix seconds, got {ts}"
                )));
            }
            Some(ts) => ts,
            None => 0,
        };
        let ip_address = match body.ip_address.as_deref().map(str::trim) {
            None | Some("") => String::new(),
            Some(ip) => ip
                .parse::<std::net::IpAddr>()
                .map(|ip| ip.to_string())
                .map_err(|_| invalid(format!("ip_address: {ip:?} is not an IP address")))?,
        };
        let block = Block {
            agent_id: agent.id,
            block_ts: now_s,
            unblock_ts,
            ip_address,
        };
        store::block(change.conn(), id, &block).await?;
    } else {
        store::unblock(change.conn(), id).await?;
    }
    finish(change, id, ClientEvent::ChangedClientBlacklist, false).await
}

/// Replaces the contacts agents recorded for the client.
async fn set_contacts(cx: &Crm<'_>, agent: &Agent, id: i64, body: ContactsBody) -> Answer {
    let contacts = contacts(body.contacts)?;
    let mut change = open(cx, agent, id).await?;
    let now = change.now_ms();
    store::set_agent_contacts(change.conn(), id, &contacts, now).await?;
    finish(change, id, ClientEvent::UpdatedClientContacts, true).await
}

/// Replaces the client's tags.
async fn set_tags(cx: &Crm<'_>, agent: &Agent, id: i64, body: TagsBody) -> Answer {
    let ids = tag_ids(&body.tag_ids)?;
    let mut change = open(cx, agent, id).await?;
    check_tags(&mut change, &ids).await?;
    tags::set_of_client(change.conn(), id, &ids).await?;
    // `client_updated` carries the tags, so the integrator hears of it too.
    finish(change, id, ClientEvent::UpdatedClient, true).await
}
