//! What agents do with a chat that integrators hear of: linking it to the CRM
//! card a webhook reply offered (`chat_assigned`), client attributes
//! (`client_attribute_updated`) and calls (`call_event`).

use plugin_api::webhook::{Call, CallStatus, CallType};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::core::conversations::Conversations;
use crate::core::error::CoreError;
use crate::core::webhooks::{self, payload, reply::Integration};
use crate::pipeline::Routed;
use crate::pipeline::record_in;
use crate::store::calls::{self, CallUpdate, NewCall, StoredCall};
use crate::store::chats::{client_attributes, integration_of, set_client_attributes, set_crm_link};
use crate::store::{Agent, Chat, Conn};

/// Most attributes one client keeps.
const MAX_ATTRIBUTES: usize = 100;

impl Conversations {
    /// Links the chat's client to the CRM card a `chat_accepted` reply gave
    /// (`crm_link`), and tells the integrator with `chat_assigned`.
    pub(super) async fn link_crm(&self, chat: Chat, routed: &Routed) -> Result<String, CoreError> {
        let mut w = self.store.begin_write().await?;
        let shown: Option<Integration> = integration_of(&mut w.tx, chat.id).await?;
        let Some(link) = shown.and_then(|i| i.crm_link) else {
            return Err(CoreError::Conflict(
                "no crm_link was offered for this chat".into(),
            ));
        };
        let now = self.clock.now_ms();
        set_crm_link(&mut w.tx, chat.client_id, link.as_str(), now).await?;
        if let Some((channel_id, event)) =
            payload::chat_assigned(&mut w.tx, chat.id, link.clone()).await?
        {
            webhooks::queue_event(&mut w.tx, channel_id, Some(chat.id), event, now).await?;
        }
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.kick.kick();
        self.publish(&chat, "chat.crm_linked", || json!({ "crm_link": link }));
        Ok(link)
    }

    /// Sets attributes of the chat's client (`null` removes one) and sends
    /// `client_attribute_updated` with all of them.
    pub(super) async fn set_attributes(
        &self,
        chat: Chat,
        changes: Map<String, Value>,
        routed: &Routed,
    ) -> Result<Map<String, Value>, CoreError> {
        let mut w = self.store.begin_write().await?;
        let now = self.clock.now_ms();
        let attributes = merge_attributes(&mut w.tx, chat.client_id, changes, now).await?;
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.kick.kick();
        Ok(attributes)
    }

    /// Records a call in a chat (or a new status of one) and sends `call_event`.
    pub(super) async fn report_call(
        &self,
        agent: &Agent,
        report: CallReport,
        routed: &Routed,
    ) -> Result<Value, CoreError> {
        let now = self.clock.now_ms();
        let (call_id, chat_id, call) = match report {
            CallReport::Start {
                chat_id,
                kind,
                phone,
            } => {
                let chat = self.visible_chat(agent, chat_id).await?;
                if phone.trim().is_empty() {
                    return Err(CoreError::Invalid("phone must not be empty".into()));
                }
                let mut w = self.store.begin_write().await?;
                let new = NewCall {
                    chat_id: chat.id,
                    channel_id: chat.channel_id,
                    client_id: chat.client_id,
                    agent_id: agent.id,
                    call_type: call_type_str(kind),
                    phone: phone.as_str(),
                    now,
                };
                let id = calls::insert(&mut w.tx, &new).await?;
                let call = Call {
                    kind,
                    phone,
                    status: CallStatus::Start,
                    reason: None,
                    record_url: None,
                };
                self.queue_call(&mut w.tx, chat.id, Some(agent.id), call.clone(), now)
                    .await?;
                record_in(&mut w.tx, routed, now).await?;
                w.commit().await?;
                (id, chat.id, call)
            }
            CallReport::Status {
                call_id,
                status,
                reason,
                record_url,
            } => {
                let mut w = self.store.begin_write().await?;
                let row = calls::of_agent(&mut w.tx, call_id, agent.id).await?;
                let Some(StoredCall {
                    chat_id: Some(chat_id),
                    call_type: kind,
                    phone,
                }) = row
                else {
                    return Err(CoreError::NotFound);
                };
                if status == CallStatus::Error && reason.is_none() {
                    return Err(CoreError::Invalid("a call error needs a reason".into()));
                }
                let update = CallUpdate {
                    status: call_status_str(status),
                    reason: reason.as_deref(),
                    record_url: record_url.as_deref(),
                    now,
                };
                calls::update(&mut w.tx, call_id, &update).await?;
                let call = Call {
                    kind: parse_call_type(&kind).unwrap_or(CallType::Outgoing),
                    phone,
                    status,
                    reason,
                    record_url,
                };
                self.queue_call(&mut w.tx, chat_id, Some(agent.id), call.clone(), now)
                    .await?;
                record_in(&mut w.tx, routed, now).await?;
                w.commit().await?;
                (call_id, chat_id, call)
            }
        };
        self.kick.kick();
        // Agents and a widget visitor's page follow the call live.
        if let Some(chat) = self.store.chat_by_id(chat_id).await? {
            self.publish(
                &chat,
                "chat.call",
                || json!({ "id": call_id, "call": call, "agent_id": agent.id }),
            );
        }
        Ok(json!({ "id": call_id, "chat_id": chat_id, "call": call }))
    }

    pub(super) async fn queue_call(
        &self,
        conn: &mut Conn,
        chat_id: i64,
        agent_id: Option<i64>,
        call: Call,
        now: i64,
    ) -> Result<(), CoreError> {
        if let Some((channel_id, event)) =
            payload::call_event(conn, chat_id, agent_id, call).await?
        {
            webhooks::queue_event(conn, channel_id, Some(chat_id), event, now).await?;
        }
        Ok(())
    }
}

/// A call the agent reports through `/agent/v1/calls`; plugins see it as
/// the `call` of an `agent.call` event.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "report", rename_all = "snake_case", deny_unknown_fields)]
pub enum CallReport {
    Start {
        chat_id: i64,
        #[serde(rename = "type")]
        kind: CallType,
        phone: String,
    },
    Status {
        call_id: i64,
        status: CallStatus,
        reason: Option<String>,
        record_url: Option<String>,
    },
}

impl CallReport {
    /// The chat of a new call (a status names its call, not the chat).
    pub fn chat_id(&self) -> Option<i64> {
        match self {
            CallReport::Start { chat_id, .. } => Some(*chat_id),
            CallReport::Status { .. } => None,
        }
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    pub fn from_json(value: &Value) -> Result<CallReport, String> {
        CallReport::deserialize(value).map_err(|e| e.to_string())
    }
}

fn call_type_str(t: CallType) -> &'static str {
    match t {
        CallType::Callback => "callback",
        CallType::Incoming => "incoming",
        CallType::Outgoing => "outgoing",
    }
}

fn parse_call_type(s: &str) -> Option<CallType> {
    serde_json::from_value(Value::String(s.to_owned())).ok()
}

fn call_status_str(s: CallStatus) -> &'static str {
    match s {
        CallStatus::Start => "start",
        CallStatus::End => "end",
        CallStatus::AgentConnected => "agent_connected",
        CallStatus::ClientConnected => "client_connected",
        CallStatus::Error => "error",
    }
}

/// Merges `changes` into the client's attributes (`null` removes one) and
/// queues `client_attribute_updated`, in the caller's transaction (an
/// agent's call, the widget's `setClientAttributes`).
pub(super) async fn merge_attributes(
    conn: &mut Conn,
    client_id: i64,
    changes: Map<String, Value>,
    now: i64,
) -> Result<Map<String, Value>, CoreError> {
    let stored = client_attributes(conn, client_id).await?;
    let mut attributes: Map<String, Value> = stored
        .and_then(|a| serde_json::from_str(&a).ok())
        .unwrap_or_default();
    for (k, v) in changes {
        if k.trim().is_empty() {
            return Err(CoreError::Invalid(
                "attribute names must not be empty".into(),
            ));
        }
        if v.is_null() {
            attributes.remove(&k);
        } else {
            attributes.insert(k, v);
        }
    }
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(CoreError::Invalid(format!(
            "a client has at most {MAX_ATTRIBUTES} attributes"
        )));
    }
    let text = Value::Object(attributes.clone()).to_string();
    set_client_attributes(conn, client_id, &text, now).await?;
    webhooks::queue_client_attribute_updated(conn, client_id, now).await?;
    Ok(attributes)
}
