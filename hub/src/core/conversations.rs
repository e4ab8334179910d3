//! The core's context: what every action shares (the store, the pipeline,
//! the writers, the bots, the live broadcast) and the few things every action
//! does with it (record a dropped event, find a chat an agent may see,
//! publish a live update). The actions are in their own files (`messages.rs`,
//! `chats.rs`, `bots.rs`, `widget.rs`, `integration.rs`, `offline.rs`,
//! `crm/`), reached through the door (`door.rs`).

use std::sync::Arc;

use serde_json::json;

use crate::clock::Clock;
use crate::config::CrmConfig;
use crate::core::batch::{BatchRead, Batcher, ReadBatcher};
use crate::core::bot_hooks::BotDirectory;
use crate::core::error::CoreError;
use crate::core::ingress::Ingress;
use crate::core::live::{Live, LiveEvent};
use crate::core::outgoing::Outgoing;
use crate::core::results::Results;
use crate::core::webhooks::reply;
use crate::delivery::Kick;
use crate::outbound::oauth::TokenCache;
use crate::pipeline::{Pipeline, Routed, record_in};
use crate::store::{Agent, Chat, Client, Store, StoreError};

pub struct Conversations {
    pub(crate) store: Store,
    live: Live,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) kick: Kick,
    /// The Safe URL setting for custom data from webhook replies.
    pub(super) safe_url: bool,
    /// Malformed reply fields left out, for `/metrics`.
    pub(super) reply_skips: reply::SkippedCounts,
    /// Where customer messages are stored, in batches.
    pub(super) ingress: Batcher<Ingress>,
    /// Where delivery results are stored, in batches.
    pub(super) results: Batcher<Results>,
    /// Where agent messages are stored, in batches.
    pub(super) outgoing: Batcher<Outgoing>,
    /// Where agents' requests find their chats, in batches.
    visible: ReadBatcher<VisibleChats>,
    /// The bots, by channel, provider id and id.
    pub(super) bots: BotDirectory,
    /// Bot providers' access tokens (the optional authorization).
    pub(super) tokens: Arc<TokenCache>,
    /// The CRM's account (`site_id`, also of bot events) and webhook receiver.
    pub(super) crm: CrmConfig,
    /// The hub's time: what rows record and what decides by time read it.
    pub(crate) clock: Clock,
}

impl Conversations {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        live: Live,
        pipeline: Arc<Pipeline>,
        kick: Kick,
        safe_url: bool,
        tokens: Arc<TokenCache>,
        crm: CrmConfig,
        clock: Clock,
    ) -> Arc<Conversations> {
        Arc::new(Conversations {
            clock,
            bots: BotDirectory::default(),
            tokens,
            crm,
            store,
            live,
            pipeline,
            kick,
            safe_url,
            reply_skips: reply::SkippedCounts::default(),
            ingress: Batcher::default(),
            results: Batcher::default(),
            outgoing: Batcher::default(),
            visible: ReadBatcher::default(),
        })
    }

    /// The hub's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn reply_skips(&self) -> &reply::SkippedCounts {
        &self.reply_skips
    }

    /// Records an event a plugin dropped: it changes no state, but its log
    /// row and its plugins' forwards and key-value writes are kept.
    pub(crate) async fn record_dropped(&self, routed: &Routed) -> Result<(), CoreError> {
        let mut w = self.store.begin_write().await?;
        record_in(&mut w.tx, routed, self.clock.now_ms()).await?;
        w.commit().await?;
        if !routed.forwards.is_empty() {
            self.kick.kick();
        }
        Ok(())
    }

    /// An agent goes on- or offline: the channel status endpoint and the
    /// context plugins see follow at once.
    pub async fn set_agent_online(&self, agent: &Agent, online: bool) -> Result<(), StoreError> {
        self.store.set_agent_online(agent.id, online).await?;
        self.pipeline.forget_context();
        // Widget pages show whether anyone is there: tell them at once.
        for channel_id in self.store.agent_channel_ids(&agent.email).await? {
            let available = self.store.channel_has_online_agent(channel_id).await?;
            self.publish_to(
                channel_id,
                0,
                "channel.availability",
                || json!({ "online": available }),
            );
        }
        Ok(())
    }

    /// A chat the agent may see, or `NotFound` (also for chats of other channels).
    pub async fn visible_chat(&self, agent: &Agent, chat_id: i64) -> Result<Chat, CoreError> {
        Ok(self.visible_chat_and_client(agent, chat_id).await?.0)
    }

    pub(super) async fn visible_chat_and_client(
        &self,
        agent: &Agent,
        chat_id: i64,
    ) -> Result<(Chat, Client), CoreError> {
        self.visible
            .read(&self.store, (chat_id, agent.email.clone()))
            .await?
            .ok_or(CoreError::NotFound)
    }

    /// The live broadcast this core publishes to.
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// Publishes a live update; `data` is built only when someone receives
    /// it (an open agent or visitor stream, or other instances).
    pub(crate) fn publish(
        &self,
        chat: &Chat,
        kind: &'static str,
        data: impl FnOnce() -> serde_json::Value,
    ) {
        self.publish_to(chat.channel_id, chat.id, kind, data);
    }

    pub(crate) fn publish_to(
        &self,
        channel_id: i64,
        chat_id: i64,
        kind: &'static str,
        data: impl FnOnce() -> serde_json::Value,
    ) {
        if !self.live.is_heard(kind) {
            return;
        }
        self.live.publish(LiveEvent {
            kind,
            channel_id,
            chat_id,
            data: data(),
        });
    }
}

/// A chat and its client, if the chat is in a channel of the agent's
/// (chat id, agent's email).
struct VisibleChats;

impl BatchRead for VisibleChats {
    type Key = (i64, String);
    type Found = Option<(Chat, Client)>;
    const MAX: usize = 128;
    const WHAT: &'static str = "chats";

    async fn read(store: &Store, keys: &[(i64, String)]) -> Result<Vec<Self::Found>, StoreError> {
        store.chats_visible_to(keys).await
    }
}
