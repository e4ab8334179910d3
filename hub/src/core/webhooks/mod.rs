//! Event webhooks and CRM webhooks: what the hub tells integrators and CRMs.
//! A webhook is queued in the transaction of the change that caused it (a
//! staged outbox row plus its event); it crosses its plugins when the
//! deliverer first picks it up, and the receiver's reply comes back through
//! [`reply`].

pub(crate) mod payload;
pub(crate) mod reply;

use plugin_api::crm::{CrmEvent, CrmWebhook};
use plugin_api::webhook::{NumericId, WebhookEvent};
use serde_json::Value;

use crate::config::CrmConfig;
use crate::event::{Direction, Event, EventKind};
use crate::store::events::insert_event;
use crate::store::outbox::enqueue;
use crate::store::outgoing::{Accepted, Queued};
use crate::store::{Conn, NewDelivery, StoreError, webhooks as rows};

/// Outbox `kind`s of webhooks start with these; delivery results of them are
/// `webhook.delivery_result` events.
pub use crate::store::outbox::{
    CRM_WEBHOOK_PREFIX as CRM_PREFIX, EVENT_WEBHOOK_PREFIX as EVENT_PREFIX,
};

/// Where a webhook goes. Without a URL it still crosses its plugins, which
/// may forward it; then it is done.
#[derive(Debug, Clone, Default)]
pub struct Receiver {
    pub url: Option<String>,
    pub secret: Option<String>,
}

/// One webhook to queue.
#[derive(Debug)]
pub struct Outgoing {
    /// `webhook.<event_name>` or `crm.<event_type>.<event_name>`.
    pub kind: EventKind,
    pub payload: Value,
    pub channel_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// The client the event is about, when it is not a chat's: its snapshots
    /// go out in order too.
    pub client_id: Option<i64>,
}

/// Added to every webhook payload: a number that grows with every webhook
/// the hub queues (in the order of the changes), and the change's Unix time
/// in seconds, so a receiver can discard a stale snapshot that arrives late.
pub const SEQUENCE_FIELD: &str = "sequence";
pub const TIME_FIELD: &str = "event_ts";

/// A webhook's order fields, as queued.
pub struct OrderFields([Option<Value>; 2]);

impl OrderFields {
    pub fn of(payload: &Value) -> OrderFields {
        OrderFields([SEQUENCE_FIELD, TIME_FIELD].map(|f| payload.get(f).cloned()))
    }

    /// Puts them back into a payload plugins changed: a plugin may change
    /// what a webhook says, not where it stands in order.
    pub fn restore(self, changed: &mut Value) {
        if let Some(to) = changed.as_object_mut() {
            for (field, value) in [SEQUENCE_FIELD, TIME_FIELD].into_iter().zip(self.0) {
                match value {
                    Some(v) => to.insert(field.to_owned(), v),
                    None => to.remove(field),
                };
            }
        }
    }
}

/// Queues `out` for `to` in the caller's transaction and logs its event.
pub async fn queue(
    conn: &mut Conn,
    out: Outgoing,
    to: &Receiver,
    now: i64,
) -> Result<uuid::Uuid, StoreError> {
    let sequence = rows::next_sequence(conn).await?;
    let row = stamp(out, to, sequence, now);
    insert_event(conn, &row.event).await?;
    enqueue(conn, &row.delivery, now).await?;
    Ok(row.delivery.id)
}

/// `out` as the rows that queue it: its event with its place in the order
/// (`sequence`, the time), and its outbox row.
fn stamp(out: Outgoing, to: &Receiver, sequence: i64, now: i64) -> Queued {
    let mut payload = out.payload;
    if let Some(fields) = payload.as_object_mut() {
        fields.insert(SEQUENCE_FIELD.to_owned(), sequence.into());
        fields.insert(TIME_FIELD.to_owned(), (now / 1000).into());
    }
    let mut event = Event::new(out.kind, Direction::Out, payload);
    event.channel_id = out.channel_id;
    event.chat_id = out.chat_id;
    let sync = matches!(
        event.kind.as_str(),
        "webhook.chat_accepted" | "webhook.chat_updated"
    );
    // A chat's webhooks reach the receiver in the order they happened; so do
    // a client's snapshots of each kind and CRM webhooks (which rows share an
    // order: `NewDelivery::event_webhook`). The order holds for a bounded
    // time (`[webhooks] order_hold_ms`), so one failing event cannot stall the rest.
    let url = to.url.clone().unwrap_or_default();
    let body = event.payload.to_string();
    let delivery = if event.kind.as_str().starts_with(CRM_PREFIX) {
        NewDelivery::crm_webhook(event.id, event.kind.as_str(), url, body, to.secret.clone())
    } else {
        NewDelivery::event_webhook(
            event.id,
            event.kind.as_str(),
            sync,
            url,
            body,
            event.chat_id,
            out.client_id,
            to.secret.clone(),
        )
    };
    Queued {
        event,
        delivery,
        now,
    }
}

/// Queues a CRM webhook `{site_id, event_type, event}` for the CRM's receiver.
pub async fn queue_crm(
    conn: &mut Conn,
    crm: &CrmConfig,
    event: CrmEvent,
    now: i64,
) -> Result<(), StoreError> {
    let kind = format!("{CRM_PREFIX}{}.{}", event.event_type(), event.event_name());
    let body = CrmWebhook {
        site_id: NumericId(crm.site_id),
        event,
    };
    let payload = serde_json::to_value(&body)
        .map_err(|e| StoreError::Corrupt(format!("cannot encode a CRM webhook: {e}")))?;
    let to = Receiver {
        url: crm.webhook_url.clone(),
        secret: crm.webhook_secret.clone(),
    };
    let out = Outgoing {
        kind: EventKind::from(kind),
        payload,
        channel_id: None,
        chat_id: None,
        client_id: None,
    };
    queue(conn, out, &to, now).await.map(|_| ())
}

/// The event webhook receiver of a channel.
pub async fn channel_receiver(conn: &mut Conn, channel_id: i64) -> Result<Receiver, StoreError> {
    Ok(rows::channel_receiver(conn, channel_id)
        .await?
        .map(Receiver::from)
        .unwrap_or_default())
}

impl From<rows::ChannelReceiver> for Receiver {
    /// An empty URL is no URL.
    fn from(rows::ChannelReceiver { url, secret }: rows::ChannelReceiver) -> Receiver {
        Receiver {
            url: url.filter(|u| !u.is_empty()),
            secret,
        }
    }
}

/// Queues an event webhook for the receiver of `channel_id`.
pub async fn queue_event(
    conn: &mut Conn,
    channel_id: i64,
    chat_id: Option<i64>,
    event: WebhookEvent,
    now: i64,
) -> Result<(), StoreError> {
    queue_about(conn, channel_id, chat_id, None, event, now).await
}

/// Queues an event webhook about a client outside a chat (kept in order per client).
async fn queue_client_event(
    conn: &mut Conn,
    channel_id: i64,
    client_id: i64,
    event: WebhookEvent,
    now: i64,
) -> Result<(), StoreError> {
    queue_about(conn, channel_id, None, Some(client_id), event, now).await
}

async fn queue_about(
    conn: &mut Conn,
    channel_id: i64,
    chat_id: Option<i64>,
    client_id: Option<i64>,
    event: WebhookEvent,
    now: i64,
) -> Result<(), StoreError> {
    let out = Outgoing::event(event, channel_id, chat_id, client_id)?;
    let to = channel_receiver(conn, channel_id).await?;
    queue(conn, out, &to, now).await.map(|_| ())
}

impl Outgoing {
    /// An event webhook of channel `channel_id`.
    fn event(
        event: WebhookEvent,
        channel_id: i64,
        chat_id: Option<i64>,
        client_id: Option<i64>,
    ) -> Result<Outgoing, StoreError> {
        Ok(Outgoing {
            kind: EventKind::from(format!("{EVENT_PREFIX}{}", event.event_name())),
            payload: serde_json::to_value(&event)
                .map_err(|e| StoreError::Corrupt(format!("cannot encode a webhook: {e}")))?,
            channel_id: Some(channel_id),
            chat_id,
            client_id,
        })
    }
}

/// Queues `client_updated` for the client's channel: call it in the
/// transaction that changed the client's data.
pub async fn queue_client_updated(
    conn: &mut Conn,
    client_id: i64,
    now: i64,
) -> Result<(), StoreError> {
    match payload::client_updated(conn, client_id).await? {
        Some((channel_id, event)) => {
            queue_client_event(conn, channel_id, client_id, event, now).await
        }
        None => Ok(()),
    }
}

/// Queues `client_attribute_updated` with the client's attributes as stored.
pub async fn queue_client_attribute_updated(
    conn: &mut Conn,
    client_id: i64,
    now: i64,
) -> Result<(), StoreError> {
    match payload::client_attribute_updated(conn, client_id).await? {
        Some((channel_id, event)) => {
            queue_client_event(conn, channel_id, client_id, event, now).await
        }
        None => Ok(()),
    }
}

/// Queues `chat_accepted` (or `chat_updated`) for a chat.
pub async fn queue_chat_event(
    conn: &mut Conn,
    chat_id: i64,
    accepted: bool,
    now: i64,
) -> Result<(), StoreError> {
    let Some(card) = rows::chat_cards(conn, &[chat_id]).await?.pop() else {
        return Ok(());
    };
    let sequence = rows::next_sequence(conn).await?;
    let row = chat_event_row(conn, card, sequence, accepted, now).await?;
    insert_event(conn, &row.event).await?;
    enqueue(conn, &row.delivery, now).await?;
    Ok(())
}

/// The `chat_accepted` webhooks of the chats an agent batch accepted
/// (`chats`: chat, time), as the rows that queue them with the batch's
/// messages, from what accepting them read (`store::outgoing::accept_chats`:
/// their cards and a sequence number each, in one round trip).
pub async fn chat_accepted_rows(
    conn: &mut Conn,
    accepted: Accepted,
    chats: &[(i64, i64)],
) -> Result<Vec<Queued>, StoreError> {
    let Accepted {
        mut cards,
        sequences,
    } = accepted;
    // In the batch's order, so the numbers follow it.
    let place = |chat: i64| chats.iter().position(|(c, _)| *c == chat);
    cards.sort_by_key(|c| place(c.chat_id));
    let mut queued = Vec::with_capacity(cards.len());
    for (card, sequence) in cards.into_iter().zip(sequences) {
        let now = place(card.chat_id).map_or(0, |i| chats[i].1);
        queued.push(chat_event_row(conn, card, sequence, true, now).await?);
    }
    Ok(queued)
}

/// `chat_accepted` (or `chat_updated`) of a chat as the rows that queue it.
async fn chat_event_row(
    conn: &mut Conn,
    card: rows::ChatCard,
    sequence: i64,
    accepted: bool,
    now: i64,
) -> Result<Queued, StoreError> {
    let e = payload::chat_event_of(conn, card).await?;
    let event = if accepted {
        WebhookEvent::ChatAccepted(e.body)
    } else {
        WebhookEvent::ChatUpdated(e.body)
    };
    let out = Outgoing::event(event, e.channel_id, Some(e.chat_id), None)?;
    Ok(stamp(out, &Receiver::from(e.receiver), sequence, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plugin_cannot_move_a_webhook_in_the_order() {
        let queued = json!({ "event_name": "client_updated", "sequence": 7, "event_ts": 1700 });
        let order = OrderFields::of(&queued);
        let mut changed = json!({ "event_name": "client_updated", "sequence": 99, "note": "x" });
        order.restore(&mut changed);
        assert_eq!(
            changed,
            json!({ "event_name": "client_updated", "sequence": 7, "note": "x", "event_ts": 1700 })
        );
    }
}
