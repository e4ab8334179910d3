//! The chat actions: an agent accepting or closing a chat, reached only
//! through the door (`door.rs`) with the event that crossed the pipeline;
//! each change, its event row, its webhooks and the bot's notice are one
//! transaction, then the agents' streams hear of it.

use serde_json::json;

use crate::core::bot_hooks::{self};
use crate::core::conversations::Conversations;
use crate::core::error::CoreError;
use crate::core::webhooks::{self};
use crate::pipeline::{Routed, record_in};
use crate::store::chats::{chat_in_tx, set_chat_state};
use crate::store::{Agent, Chat, ChatState, WriteTx};

impl Conversations {
    /// Accepts a chat the agent may see; `routed` is the `agent.accept`
    /// event, recorded with the change.
    pub(super) async fn accept(
        &self,
        agent: &Agent,
        chat_id: i64,
        routed: &Routed,
    ) -> Result<Chat, CoreError> {
        // Decide on the state read under the write turn, so that two agents
        // accepting at once cannot both win.
        let mut w = self.store.begin_write().await?;
        let chat = chat_in_tx(&mut w.tx, chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        match (chat.state, chat.agent_id) {
            (ChatState::Accepted, Some(id)) if id == agent.id => {
                return self.unchanged(w, chat, routed).await;
            }
            (ChatState::Accepted, _) => {
                return Err(CoreError::Conflict(
                    "the chat was accepted by another agent".into(),
                ));
            }
            (ChatState::Closed, _) => return Err(CoreError::Conflict("the chat is closed".into())),
            (ChatState::Open, _) => {}
        }
        let now = self.clock.now_ms();
        set_chat_state(&mut w.tx, chat.id, ChatState::Accepted, Some(agent.id), now).await?;
        webhooks::queue_chat_event(&mut w.tx, chat.id, true, now).await?;
        bot_hooks::on_agent_joined(&mut w.tx, &self.bots.current(), &chat, now).await?;
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.announce(chat_id, "chat.accepted", agent).await
    }

    /// An action that found its work done (accepting a chat one has, closing a
    /// closed one): nothing changes, but the event is logged like any other.
    async fn unchanged(
        &self,
        mut w: WriteTx<'_>,
        chat: Chat,
        routed: &Routed,
    ) -> Result<Chat, CoreError> {
        record_in(&mut w.tx, routed, self.clock.now_ms()).await?;
        w.commit().await?;
        if !routed.forwards.is_empty() {
            self.kick.kick();
        }
        Ok(chat)
    }

    /// After an agent changed a chat's state: wakes the deliverer for the
    /// webhook it queued and tells the agents' streams, with the chat as stored.
    async fn announce(
        &self,
        chat_id: i64,
        kind: &'static str,
        agent: &Agent,
    ) -> Result<Chat, CoreError> {
        self.kick.kick();
        let chat = self
            .store
            .chat_by_id(chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        self.publish(
            &chat,
            kind,
            || json!({ "chat": chat, "agent_id": agent.id }),
        );
        Ok(chat)
    }

    /// Closes a chat the agent may see; `routed` is the `agent.close` event.
    pub(super) async fn close(
        &self,
        agent: &Agent,
        chat_id: i64,
        routed: &Routed,
    ) -> Result<Chat, CoreError> {
        let mut w = self.store.begin_write().await?;
        let chat = chat_in_tx(&mut w.tx, chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        match (chat.state, chat.agent_id) {
            (ChatState::Closed, _) => return self.unchanged(w, chat, routed).await,
            (ChatState::Accepted, Some(id)) if id != agent.id => {
                return Err(CoreError::Conflict(
                    "the chat belongs to another agent".into(),
                ));
            }
            _ => {}
        }
        let now = self.clock.now_ms();
        set_chat_state(&mut w.tx, chat.id, ChatState::Closed, Some(agent.id), now).await?;
        bot_hooks::on_chat_closed(&mut w.tx, &self.bots.current(), &chat, now).await?;
        if let Some((channel_id, event)) =
            webhooks::payload::chat_finished(&mut w.tx, chat.id).await?
        {
            webhooks::queue_event(&mut w.tx, channel_id, Some(chat.id), event, now).await?;
        }
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.announce(chat_id, "chat.closed", agent).await
    }
}
