//! The one way in: every inbound action an edge parsed becomes an [`Event`]
//! (kind, direction, channel, chat, payload), crosses the pipeline, and only
//! then is dispatched by kind to the action that changes state. No action is
//! reachable from an edge without crossing the pipeline: the actions are
//! private to `core`, and [`Conversations::handle`] is their only caller.

use std::sync::Arc;

use plugin_api::bot::BotEvent;
use plugin_api::channel::{CustomerMessage, Message};
use plugin_api::widget::OfflineMessageInput;
use serde_json::{Map, Value, json};
use tracing::Instrument;

use crate::core::bots::BotOutcome;
use crate::core::conversations::Conversations;
use crate::core::crm::{CrmChange, Done};
use crate::core::error::{CoreError, Passage};
use crate::core::integration::CallReport;
use crate::core::messages::Ingested;
use crate::core::offline::OfflineOutcome;
use crate::core::widget::{Session, VisitorKeys, WidgetAction};
use crate::event::{Direction, Event, EventKind};
use crate::pipeline::{Routed, Verdict};
use crate::store::widget::PageReport;
use crate::store::{Agent, Bot, Channel, Chat, Client, MessageRow};

/// An inbound action, as an edge parsed it.
#[derive(Debug)]
pub enum Inbound<'a> {
    /// A customer message or typing notice from the integrator.
    CustomerMessage {
        channel: &'a Channel,
        message: CustomerMessage,
    },
    /// The widget's offline form; `visitor` when the page sent its visitor
    /// token (the form then goes under the visitor's client).
    OfflineMessage {
        channel: &'a Channel,
        form: OfflineMessageInput,
        visitor: Option<&'a Client>,
    },
    /// An agent's reply or typing notice.
    AgentMessage {
        agent: &'a Agent,
        chat_id: i64,
        message: Message,
    },
    Accept {
        agent: &'a Agent,
        chat_id: i64,
    },
    Close {
        agent: &'a Agent,
        chat_id: i64,
    },
    /// Link the chat's client to the CRM card a webhook reply offered.
    LinkCrm {
        agent: &'a Agent,
        chat_id: i64,
    },
    /// Set (or with `null`, remove) attributes of the chat's client.
    SetAttributes {
        agent: &'a Agent,
        chat_id: i64,
        changes: Map<String, Value>,
    },
    Call {
        agent: &'a Agent,
        report: CallReport,
    },
    /// A widget page starting (or resuming, with a genuine token) its
    /// visitor's session.
    WidgetSession {
        channel: &'a Channel,
        keys: &'a VisitorKeys,
        token: Option<&'a str>,
        page: PageReport<'a>,
    },
    /// A widget visitor's `widget_api` call.
    Widget {
        channel: &'a Channel,
        visitor: &'a Client,
        action: WidgetAction,
    },
    /// An agent's change to the CRM (`agent.crm.<entity>.<verb>`).
    Crm {
        agent: &'a Agent,
        change: CrmChange,
    },
    /// A bot provider's event (`BOT_MESSAGE`, `INVITE_AGENT`, `CLIENT_INFO`),
    /// with its payload as posted.
    Bot {
        bot: &'a Arc<Bot>,
        event: BotEvent,
        payload: Value,
    },
}

/// What an inbound action came to.
#[derive(Debug)]
pub enum Handled {
    Customer(Ingested),
    Offline(OfflineOutcome),
    /// The stored agent message (`None` for typing).
    AgentMessage(Option<MessageRow>),
    Chat(Chat),
    CrmLink(String),
    Attributes(Map<String, Value>),
    Call(Value),
    Bot(BotOutcome),
    Widget,
    Session(Box<Session>),
    Crm(Done),
}

impl Conversations {
    /// The door: turns `inbound` into its event, runs the pipeline, and
    /// dispatches by kind.
    pub async fn handle(&self, inbound: Inbound<'_>) -> Result<Handled, CoreError> {
        match inbound {
            Inbound::CustomerMessage { channel, message } => self
                .customer_message(channel, message)
                .await
                .map(Handled::Customer),
            Inbound::OfflineMessage {
                channel,
                form,
                visitor,
            } => self
                .offline_message(channel, form, visitor)
                .await
                .map(Handled::Offline),
            Inbound::AgentMessage {
                agent,
                chat_id,
                message,
            } => {
                if !message.is_typing() {
                    self.join_bot_chat(agent, chat_id).await?;
                }
                self.agent_message(agent, chat_id, message)
                    .await
                    .map(Handled::AgentMessage)
            }
            Inbound::Accept { agent, chat_id } => {
                let (chat, event) = self
                    .agent_event(agent, chat_id, EventKind::AGENT_ACCEPT, json!({}))
                    .await?;
                let routed = self.through(event, "accept").await?;
                self.accept(agent, chat.id, &routed)
                    .await
                    .map(Handled::Chat)
            }
            Inbound::Close { agent, chat_id } => {
                let (chat, event) = self
                    .agent_event(agent, chat_id, EventKind::AGENT_CLOSE, json!({}))
                    .await?;
                let routed = self.through(event, "close").await?;
                self.close(agent, chat.id, &routed).await.map(Handled::Chat)
            }
            Inbound::LinkCrm { agent, chat_id } => {
                let (chat, event) = self
                    .agent_event(agent, chat_id, EventKind::AGENT_CRM_LINK, json!({}))
                    .await?;
                let routed = self.through(event, "CRM link").await?;
                self.link_crm(chat, &routed).await.map(Handled::CrmLink)
            }
            Inbound::SetAttributes {
                agent,
                chat_id,
                changes,
            } => {
                let extra = json!({ "attributes": changes });
                let (chat, event) = self
                    .agent_event(agent, chat_id, EventKind::AGENT_ATTRIBUTES, extra)
                    .await?;
                let routed = self.through(event, "attributes").await?;
                // A plugin may have changed them (say, masked a value).
                let changes = match routed.event.payload.get("attributes") {
                    Some(Value::Object(m)) => m.clone(),
                    _ => return Err(plugin_fault("a plugin left no attributes object".into())),
                };
                self.set_attributes(chat, changes, &routed)
                    .await
                    .map(Handled::Attributes)
            }
            Inbound::WidgetSession {
                channel,
                keys,
                token,
                page,
            } => self
                .widget_session(channel, keys, token, page)
                .await
                .map(|s| Handled::Session(Box::new(s))),
            Inbound::Widget {
                channel,
                visitor,
                action,
            } => self
                .widget_action(channel, visitor, action)
                .await
                .map(|()| Handled::Widget),
            Inbound::Bot {
                bot,
                event,
                payload,
            } => self
                .provider_event(bot, event, payload)
                .await
                .map(Handled::Bot),
            Inbound::Crm { agent, change } => {
                let event = change.event(agent);
                let routed = self.through(event, "CRM change").await?;
                self.crm_change(agent, change, &routed)
                    .await
                    .map(Handled::Crm)
            }
            Inbound::Call { agent, report } => {
                let chat_id = report.chat_id();
                let mut event = Event::new(
                    EventKind::AGENT_CALL,
                    Direction::In,
                    json!({ "agent": agent_json(agent), "call": report.to_json() }),
                );
                if let Some(chat_id) = chat_id {
                    let chat = self.visible_chat(agent, chat_id).await?;
                    event = event.on_channel(chat.channel_id).in_chat(chat.id);
                }
                let routed = self.through(event, "call").await?;
                let report = match routed.event.payload.get("call") {
                    Some(call) if routed.changed => CallReport::from_json(call).map_err(|e| {
                        plugin_fault(format!("a plugin changed the call report: {e}"))
                    })?,
                    _ => report,
                };
                self.report_call(agent, report, &routed)
                    .await
                    .map(Handled::Call)
            }
        }
    }

    /// An agent writing in a waiting chat a bot had accepts it first, as
    /// its own `agent.accept` event, so the bot hears `AGENT_JOINED`.
    async fn join_bot_chat(&self, agent: &Agent, chat_id: i64) -> Result<(), CoreError> {
        if self.bots().is_empty() {
            return Ok(());
        }
        let chat = self.visible_chat(agent, chat_id).await?;
        if chat.state != crate::store::ChatState::Open {
            return Ok(());
        }
        match self.store.chat_bot(chat.id).await? {
            Some(cb) if !cb.state.is_done() => {}
            _ => return Ok(()),
        }
        let (chat, event) = self
            .agent_event(agent, chat.id, EventKind::AGENT_ACCEPT, json!({}))
            .await?;
        let routed = self.through(event, "accept").await?;
        self.accept(agent, chat.id, &routed).await.map(|_| ())
    }

    /// The event of an agent action on a chat the agent may see.
    async fn agent_event(
        &self,
        agent: &Agent,
        chat_id: i64,
        kind: EventKind,
        extra: Value,
    ) -> Result<(Chat, Event), CoreError> {
        let chat = self.visible_chat(agent, chat_id).await?;
        let mut payload = json!({ "agent": agent_json(agent), "chat_id": chat.id });
        if let (Some(fields), Value::Object(more)) = (payload.as_object_mut(), extra) {
            fields.extend(more);
        }
        let event = Event::new(kind, Direction::In, payload)
            .on_channel(chat.channel_id)
            .in_chat(chat.id);
        Ok((chat, event))
    }

    /// Runs the pipeline on an agent action, in the event's span: a drop is
    /// a conflict the agent is told of, a refusal a 503, a reply means nothing.
    async fn through(&self, event: Event, what: &'static str) -> Result<Routed, CoreError> {
        let span = event.span();
        match self.pass(event, what).instrument(span).await? {
            Passage::Through(routed) => Ok(*routed),
            Passage::Dropped(reason) => Err(CoreError::Conflict(format!(
                "dropped by a plugin: {reason}"
            ))),
        }
    }

    /// Runs the pipeline and settles what ends there: a refusal is an error,
    /// a drop is recorded (with the plugins' effects) and reported.
    pub(crate) async fn pass(&self, event: Event, what: &str) -> Result<Passage, CoreError> {
        let routed = self.pipeline.run(event).await;
        match routed.verdict {
            Verdict::Reject(ref reason) => {
                tracing::warn!(%reason, "{what} refused by a plugin");
                Err(CoreError::Unavailable(reason.clone()))
            }
            Verdict::Drop(ref reason) => {
                tracing::info!(%reason, "{what} dropped by a plugin");
                let reason = reason.clone();
                self.record_dropped(&routed).await?;
                Ok(Passage::Dropped(reason))
            }
            Verdict::Continue | Verdict::Reply(_) => Ok(Passage::Through(Box::new(routed))),
        }
    }
}

/// A plugin left an event the action cannot use: logged here, where the
/// reason is known; the client gets the generic 503.
fn plugin_fault(reason: String) -> CoreError {
    tracing::warn!(%reason, "action refused: a plugin's output is unusable");
    CoreError::Unavailable(reason)
}

fn agent_json(agent: &Agent) -> Value {
    json!({ "id": agent.id, "name": agent.name, "email": agent.email })
}
