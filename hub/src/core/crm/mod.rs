//! An agent's CRM changes (pipelines, client categories, tags, deals, tasks,
//! organizations and clients) and their rules. The agent API parses a
//! request into a [`CrmChange`]; the door turns it into an `agent.crm.<entity>.<verb>`
//! event that crosses the pipeline before anything is written, so a plugin
//! may refuse, drop or change it. What the plugins left (`fields`) is then
//! checked and written here in one transaction with the event itself, its
//! CRM webhook and, for the client changes the event webhooks name,
//! `client_updated`; the deliverer is woken once it commits. Clients are
//! reachable only on the agent's channels; the other CRM entities are shared
//! by all agents.

pub(crate) mod clients;
mod deals;
mod organizations;
mod pipelines;
mod statuses;
mod tags;
mod tasks;

use plugin_api::crm::CrmEvent;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

use crate::config::CrmConfig;
use crate::core::conversations::Conversations;
use crate::core::error::CoreError;
use crate::event::{Direction, Event, EventKind};
use crate::pipeline::{Routed, record_in};
use crate::store::{Agent, Conn, StoreError, WriteTx};

/// Longest title, name or text line the CRM keeps, in characters.
const MAX_TITLE: usize = 255;
/// Longest free text (deal and task texts, descriptions), in characters.
const MAX_TEXT: usize = 10_000;

/// What a CRM change is about; its name is the event kind's middle part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entity {
    Pipeline,
    /// A client category (the spec's "status").
    Status,
    Tag,
    Deal,
    Task,
    Organization,
    Client,
}

impl Entity {
    pub fn name(self) -> &'static str {
        match self {
            Entity::Pipeline => "pipeline",
            Entity::Status => "status",
            Entity::Tag => "tag",
            Entity::Deal => "deal",
            Entity::Task => "task",
            Entity::Organization => "organization",
            Entity::Client => "client",
        }
    }

    /// What a 404 about one says.
    pub const fn missing(self) -> &'static str {
        match self {
            Entity::Pipeline => "no such pipeline",
            Entity::Status => "no such client category",
            Entity::Tag => "no such client tag",
            Entity::Deal => "no such deal",
            Entity::Task => "no such task",
            Entity::Organization => "no such organization",
            Entity::Client => "no such client",
        }
    }
}

/// The part of a client one request sets (`/crm/clients/{id}/<part>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientPart {
    AssignedAgent,
    Status,
    Organization,
    Blacklist,
    Contacts,
    Tags,
}

impl ClientPart {
    pub fn parse(part: &str) -> Option<ClientPart> {
        Some(match part {
            "assigned_agent" => ClientPart::AssignedAgent,
            "status" => ClientPart::Status,
            "organization" => ClientPart::Organization,
            "blacklist" => ClientPart::Blacklist,
            "contacts" => ClientPart::Contacts,
            "tags" => ClientPart::Tags,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            ClientPart::AssignedAgent => "assigned_agent",
            ClientPart::Status => "status",
            ClientPart::Organization => "organization",
            ClientPart::Blacklist => "blacklist",
            ClientPart::Contacts => "contacts",
            ClientPart::Tags => "tags",
        }
    }
}

/// What a CRM change does; its name is the event kind's last part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Create,
    Update(i64),
    Delete(i64),
    /// A task done.
    Complete(i64),
    /// Tags folded into one.
    Merge,
    /// The client categories' order.
    Reorder,
    /// An entity's settings flag.
    Settings,
    /// One part of a client.
    Set(i64, ClientPart),
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Update(_) => "update",
            Verb::Delete(_) => "delete",
            Verb::Complete(_) => "complete",
            Verb::Merge => "merge",
            Verb::Reorder => "reorder",
            Verb::Settings => "settings",
            Verb::Set(_, part) => part.name(),
        }
    }

    fn id(self) -> Option<i64> {
        match self {
            Verb::Update(id) | Verb::Delete(id) | Verb::Complete(id) | Verb::Set(id, _) => Some(id),
            Verb::Create | Verb::Merge | Verb::Reorder | Verb::Settings => None,
        }
    }
}

/// A CRM change as the agent API parsed it: `fields` is the request's
/// JSON body (`{}` when it has none).
#[derive(Debug)]
pub struct CrmChange {
    pub entity: Entity,
    pub verb: Verb,
    pub fields: Value,
}

impl CrmChange {
    /// The change's inbound event `agent.crm.<entity>.<verb>`: the agent, the id
    /// the path names (when it names one) and the fields.
    pub(super) fn event(&self, agent: &Agent) -> Event {
        let kind = format!("agent.crm.{}.{}", self.entity.name(), self.verb.name());
        let mut payload = json!({
            "agent": { "id": agent.id, "name": agent.name, "email": agent.email },
        });
        if let (Some(id), Some(p)) = (self.verb.id(), payload.as_object_mut()) {
            p.insert("id".to_owned(), Value::from(id));
        }
        if let Some(p) = payload.as_object_mut() {
            p.insert("fields".to_owned(), self.fields.clone());
        }
        Event::new(EventKind::from(kind), Direction::In, payload)
    }
}

/// What a CRM change came to: the entity as it is now (`created` for a new one).
#[derive(Debug)]
pub struct Done {
    pub created: bool,
    pub body: Value,
}

pub(crate) type Answer = Result<Done, CoreError>;

/// One CRM change after the pipeline: who asked, the routed event (written
/// with the change) and the fields the plugins left.
pub(crate) struct Crm<'a> {
    conversations: &'a Conversations,
    agent: &'a Agent,
    routed: &'a Routed,
    fields: Value,
    /// A plugin changed the fields: what does not parse is its fault.
    changed: bool,
}

impl Crm<'_> {
    /// The fields as `T`: a type error is the agent's 400, or a plugin's
    /// fault when a plugin changed them.
    fn fields<T: DeserializeOwned>(&self) -> Result<T, CoreError> {
        serde_path_to_error::deserialize(self.fields.clone()).map_err(|e| {
            let at = e.path().to_string();
            let reason = if at == "." {
                e.inner().to_string()
            } else {
                format!("{at}: {}", e.inner())
            };
            if self.changed {
                tracing::warn!(%reason, "CRM change refused: a plugin's fields are unusable");
                CoreError::Unavailable(reason)
            } else {
                invalid(format!("invalid JSON body: {reason}"))
            }
        })
    }

    fn config(&self) -> &CrmConfig {
        &self.conversations.crm
    }
}

impl Conversations {
    /// Applies a CRM change that crossed the pipeline as `routed`. Only
    /// the fields a plugin changes are used: the agent and the id stay those
    /// of the request.
    pub(super) async fn crm_change(
        &self,
        agent: &Agent,
        change: CrmChange,
        routed: &Routed,
    ) -> Result<Done, CoreError> {
        let (fields, changed) = match routed.event.payload.get("fields") {
            Some(f) if routed.changed => (f.clone(), true),
            None if routed.changed => {
                return Err(CoreError::Unavailable(
                    "a plugin left no fields of the CRM change".into(),
                ));
            }
            _ => (change.fields, false),
        };
        let cx = Crm {
            conversations: self,
            agent,
            routed,
            fields,
            changed,
        };
        match change.entity {
            Entity::Pipeline => pipelines::apply(&cx, change.verb).await,
            Entity::Status => statuses::apply(&cx, change.verb).await,
            Entity::Tag => tags::apply(&cx, change.verb).await,
            Entity::Deal => deals::apply(&cx, change.verb).await,
            Entity::Task => tasks::apply(&cx, change.verb).await,
            Entity::Organization => organizations::apply(&cx, change.verb).await,
            Entity::Client => clients::apply(&cx, change.verb).await,
        }
    }
}

/// An entity asked to do what it does not do (the edge routes only changes
/// that exist, so this is a mistake of the hub).
fn no_such_change() -> CoreError {
    CoreError::Missing("no such endpoint")
}

pub(crate) fn invalid(message: impl Into<String>) -> CoreError {
    CoreError::Invalid(message.into())
}

fn answer(value: &impl serde::Serialize, created: bool) -> Answer {
    let body = serde_json::to_value(value)
        .map_err(|e| StoreError::Corrupt(format!("cannot encode a CRM answer: {e}")))?;
    Ok(Done { created, body })
}

pub(crate) fn ok(value: &impl serde::Serialize) -> Answer {
    answer(value, false)
}

pub(crate) fn created(value: &impl serde::Serialize) -> Answer {
    answer(value, true)
}

/// Turns a store read's "none" into the entity's 404.
pub(crate) fn found<T>(value: Option<T>, missing: &'static str) -> Result<T, CoreError> {
    value.ok_or(CoreError::Missing(missing))
}

/// Deletes an entity that needs nothing but its one webhook, which carries
/// the entity as it was; answers with that same entity.
pub(crate) async fn remove<T: serde::Serialize + Clone>(
    cx: &Crm<'_>,
    id: i64,
    missing: &'static str,
    get: impl AsyncFnOnce(&mut Conn, i64) -> Result<Option<T>, StoreError>,
    delete: impl AsyncFnOnce(&mut Conn, i64) -> Result<(), StoreError>,
    event: fn(T) -> CrmEvent,
) -> Answer {
    let mut change = Change::begin(cx).await?;
    let gone = change.find(get, id, missing).await?;
    delete(change.conn(), id).await?;
    change.commit_with(event(gone.clone())).await?;
    ok(&gone)
}

/// For `Option<Option<T>>` fields: absent is `None`, `null` is `Some(None)`.
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A required title or name: trimmed, not empty, at most `MAX_TITLE` characters.
pub(crate) fn title(field: &str, value: &str) -> Result<String, CoreError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(invalid(format!("{field}: must not be empty")));
    }
    if v.chars().count() > MAX_TITLE {
        return Err(invalid(format!("{field}: at most {MAX_TITLE} characters")));
    }
    Ok(v.to_owned())
}

/// Free text of at most `MAX_TEXT` characters (may be empty).
pub(crate) fn long_text(field: &str, value: &str) -> Result<String, CoreError> {
    if value.chars().count() > MAX_TEXT {
        return Err(invalid(format!("{field}: at most {MAX_TEXT} characters")));
    }
    Ok(value.to_owned())
}

/// Optional free text; empty reads as absent.
pub(crate) fn optional_text(field: &str, value: Option<&str>) -> Result<Option<String>, CoreError> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => long_text(field, v).map(Some),
        None => Ok(None),
    }
}

/// A HEX colour: `#RGB` or `#RRGGBB`.
pub(crate) fn color(field: &str, value: &str) -> Result<String, CoreError> {
    let v = value.trim();
    let ok = v.strip_prefix('#').is_some_and(|h| {
        (h.len() == 3 || h.len() == 6) && h.chars().all(|c| c.is_ascii_hexdigit())
    });
    if !ok {
        return Err(invalid(format!(
            "{field}: expected a HEX colour like #4caf50, got {value:?}"
        )));
    }
    Ok(v.to_owned())
}

/// An optional http(s) URL; empty reads as absent.
pub(crate) fn optional_url(field: &str, value: Option<&str>) -> Result<Option<String>, CoreError> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) if crate::config::is_http_url(v) && v.len() <= 2048 => Ok(Some(v.to_owned())),
        Some(v) => Err(invalid(format!(
            "{field}: expected an http(s) URL, got {v:?}"
        ))),
        None => Ok(None),
    }
}

/// One change: its write transaction, which records the change's event and
/// the webhooks queued in it, then a kick of the deliverer once it is
/// committed. Dropped without `commit`, nothing of it happened.
pub(crate) struct Change<'a> {
    cx: &'a Crm<'a>,
    w: WriteTx<'a>,
    now_ms: i64,
}

impl<'a> Change<'a> {
    pub(crate) async fn begin(cx: &'a Crm<'a>) -> Result<Change<'a>, CoreError> {
        let w = cx.conversations.store.begin_write().await?;
        Ok(Change {
            cx,
            w,
            now_ms: cx.conversations.clock.now_ms(),
        })
    }

    pub(crate) fn conn(&mut self) -> &mut Conn {
        &mut self.w.tx
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// The CRM's clock: Unix seconds.
    pub(crate) fn now_s(&self) -> i64 {
        self.now_ms / 1000
    }

    /// Queues a CRM webhook in this transaction.
    pub(crate) async fn crm(&mut self, event: CrmEvent) -> Result<(), CoreError> {
        crate::core::webhooks::queue_crm(&mut self.w.tx, self.cx.config(), event, self.now_ms)
            .await?;
        Ok(())
    }

    /// Queues the event webhook `client_updated` in this transaction.
    pub(crate) async fn client_updated(&mut self, client_id: i64) -> Result<(), CoreError> {
        crate::core::webhooks::queue_client_updated(&mut self.w.tx, client_id, self.now_ms).await?;
        Ok(())
    }

    /// Reads the entity `id` inside this change, or fails with its 404.
    pub(crate) async fn find<T>(
        &mut self,
        get: impl AsyncFnOnce(&mut Conn, i64) -> Result<Option<T>, StoreError>,
        id: i64,
        missing: &'static str,
    ) -> Result<T, CoreError> {
        found(get(self.conn(), id).await?, missing)
    }

    /// Queues the change's one CRM webhook and commits: the usual end of a
    /// create, update or delete.
    pub(crate) async fn commit_with(mut self, event: CrmEvent) -> Result<(), CoreError> {
        self.crm(event).await?;
        self.commit().await
    }

    /// Records the change's event (and its plugins' effects) and commits.
    pub(crate) async fn commit(mut self) -> Result<(), CoreError> {
        record_in(&mut self.w.tx, self.cx.routed, self.now_ms).await?;
        self.w.commit().await?;
        self.cx.conversations.kick.kick();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_and_titles() {
        assert!(color("color", "#4caf50").is_ok());
        assert!(color("color", "#FFF").is_ok());
        assert!(color("color", "red").is_err());
        assert!(color("color", "#12345").is_err());
        assert!(title("title", "  ").is_err());
        assert_eq!(title("title", " Sales ").ok().as_deref(), Some("Sales"));
    }
}
