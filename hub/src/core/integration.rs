//! What agents do with a chat that integrators hear of: linking it to the CRM
//! card a webhook reply offered (`chat_assigned`), client attributes
//! (`client_attribute_updated`) and calls (`call_event`).

use plugin_api::webhook::{Call, CallStatus, CallType};
use serde_json::{Map, Value, json};

use crate::clock::now_ms;
use crate::core::conversations::{Conversations, CoreError};
use crate::core::webhooks::{self, payload, reply::Integration};
use crate::store::Agent;
use crate::store::chats::integration_of;

/// Most attributes one client keeps.
const MAX_ATTRIBUTES: usize = 100;

impl Conversations {
    /// Links the chat's client to the CRM card a `chat_accepted` reply gave
    /// (`crm_link`), and tells the integrator with `chat_assigned`.
    pub async fn link_crm(&self, agent: &Agent, chat_id: i64) -> Result<String, CoreError> {
        let chat = self.visible_chat(agent, chat_id).await?;
        let mut w = self.store.begin_write().await?;
        let shown: Option<Integration> = integration_of(&mut w.tx, chat.id).await?;
        let Some(link) = shown.and_then(|i| i.crm_link) else {
            return Err(CoreError::Conflict(
                "no crm_link was offered for this chat".into(),
            ));
        };
        let now = now_ms();
        sqlx::query("UPDATE clients SET crm_link = $1, updated_at = $2 WHERE id = $3")
            .bind(link.as_str())
            .bind(now)
            .bind(chat.client_id)
            .execute(&mut *w.tx)
            .await
            .map_err(|source| crate::store::StoreError::Db {
                context: "linking a client to the CRM",
                source,
            })?;
        if let Some((channel_id, event)) =
            payload::chat_assigned(&mut w.tx, chat.id, link.clone()).await?
        {
            webhooks::queue_event(&mut w.tx, channel_id, Some(chat.id), event, now).await?;
        }
        w.commit().await?;
        self.kick.kick();
        self.publish(&chat, "chat.crm_linked", json!({ "crm_link": link }));
        Ok(link)
    }

    /// Sets attributes of the chat's client (`null` removes one) and sends
    /// `client_attribute_updated` with all of them.
    pub async fn set_attributes(
        &self,
        agent: &Agent,
        chat_id: i64,
        changes: Map<String, Value>,
    ) -> Result<Map<String, Value>, CoreError> {
        let chat = self.visible_chat(agent, chat_id).await?;
        let mut w = self.store.begin_write().await?;
        let stored: (Option<String>,) =
            sqlx::query_as("SELECT attributes FROM clients WHERE id = $1")
                .bind(chat.client_id)
                .fetch_one(&mut *w.tx)
                .await
                .map_err(|source| crate::store::StoreError::Db {
                    context: "reading client attributes",
                    source,
                })?;
        let mut attributes: Map<String, Value> = stored
            .0
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
        let now = now_ms();
        sqlx::query("UPDATE clients SET attributes = $1, updated_at = $2 WHERE id = $3")
            .bind(Value::Object(attributes.clone()).to_string())
            .bind(now)
            .bind(chat.client_id)
            .execute(&mut *w.tx)
            .await
            .map_err(|source| crate::store::StoreError::Db {
                context: "saving client attributes",
                source,
            })?;
        webhooks::queue_client_attribute_updated(&mut w.tx, chat.client_id, now).await?;
        w.commit().await?;
        self.kick.kick();
        Ok(attributes)
    }

    /// Records a call in a chat (or a new status of one) and sends `call_event`.
    pub async fn report_call(&self, agent: &Agent, report: CallReport) -> Result<Value, CoreError> {
        let now = now_ms();
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
                let (id,): (i64,) = sqlx::query_as(
                    "INSERT INTO calls (chat_id, channel_id, client_id, agent_id, call_type, \
                     phone, status, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, 'start', $7, $7) RETURNING id",
                )
                .bind(chat.id)
                .bind(chat.channel_id)
                .bind(chat.client_id)
                .bind(agent.id)
                .bind(call_type_str(kind))
                .bind(phone.as_str())
                .bind(now)
                .fetch_one(&mut *w.tx)
                .await
                .map_err(|source| crate::store::StoreError::Db {
                    context: "recording a call",
                    source,
                })?;
                let call = Call {
                    kind,
                    phone,
                    status: CallStatus::Start,
                    reason: None,
                    record_url: None,
                };
                self.queue_call(&mut w.tx, chat.id, agent.id, call.clone(), now)
                    .await?;
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
                let row: Option<(Option<i64>, String, String)> = sqlx::query_as(
                    "SELECT chat_id, call_type, phone FROM calls WHERE id = $1 AND agent_id = $2",
                )
                .bind(call_id)
                .bind(agent.id)
                .fetch_optional(&mut *w.tx)
                .await
                .map_err(|source| crate::store::StoreError::Db {
                    context: "reading a call",
                    source,
                })?;
                let Some((Some(chat_id), kind, phone)) = row else {
                    return Err(CoreError::NotFound);
                };
                if status == CallStatus::Error && reason.is_none() {
                    return Err(CoreError::Invalid("a call error needs a reason".into()));
                }
                sqlx::query(
                    "UPDATE calls SET status = $1, reason = $2, record_url = $3, updated_at = $4 \
                     WHERE id = $5",
                )
                .bind(call_status_str(status))
                .bind(reason.as_deref())
                .bind(record_url.as_deref())
                .bind(now)
                .bind(call_id)
                .execute(&mut *w.tx)
                .await
                .map_err(|source| crate::store::StoreError::Db {
                    context: "updating a call",
                    source,
                })?;
                let call = Call {
                    kind: parse_call_type(&kind).unwrap_or(CallType::Outgoing),
                    phone,
                    status,
                    reason,
                    record_url,
                };
                self.queue_call(&mut w.tx, chat_id, agent.id, call.clone(), now)
                    .await?;
                w.commit().await?;
                (call_id, chat_id, call)
            }
        };
        self.kick.kick();
        Ok(json!({ "id": call_id, "chat_id": chat_id, "call": call }))
    }

    async fn queue_call(
        &self,
        conn: &mut sqlx::AnyConnection,
        chat_id: i64,
        agent_id: i64,
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

/// A call the agent reports through `/agent/v1/calls`.
#[derive(Debug)]
pub enum CallReport {
    Start {
        chat_id: i64,
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
