//! Live updates for agents: every change an agent should see at once is
//! broadcast here and filtered per agent by the stream endpoint. With several
//! instances on one PostgreSQL database, a relay passes each update to the
//! others through the store's notices, so an agent connected to one instance
//! sees what happened on another.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Notify, broadcast, mpsc, watch};

use crate::store::notices::Listener;
use crate::store::{Client, Store};

mod audience;

use audience::Audience;

/// One update on the agent stream (`event:` is `kind`, `data:` is `data`).
#[derive(Debug, Clone, Serialize)]
pub struct LiveEvent {
    pub kind: &'static str,
    pub channel_id: i64,
    pub chat_id: i64,
    pub data: serde_json::Value,
}

/// Every kind of [`LiveEvent`]: one coming from another instance is one of
/// these or is dropped.
const KINDS: &[&str] = &[
    "chat.opened",
    "chat.message",
    "chat.invited",
    "chat.client",
    "chat.call",
    "chat.custom_data",
    "chat.page",
    "chat.typing",
    "chat.accepted",
    "chat.closed",
    "chat.integration",
    "chat.crm_linked",
    "channel.availability",
    "message.delivery",
];

/// What instances tell each other.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Notice {
    Live {
        /// The instance it came from: its own notices come back to it too.
        origin: String,
        kind: String,
        channel_id: i64,
        chat_id: i64,
        data: serde_json::Value,
    },
    /// Bots were created, changed or deleted: reload the bot directory.
    Bots { origin: String },
    /// An instance began listening: the others relay to it from now on.
    Hello { origin: String },
    /// Whether its instance has a stream open (see [`audience`]).
    Audience {
        origin: String,
        watching: bool,
        round: u64,
    },
    /// Its instance relays updates to `to` from now on: the answer to
    /// `to`'s `Audience` of `round` that said it watches.
    Relaying {
        origin: String,
        to: String,
        round: u64,
    },
}

/// The one update whose relay means more than showing something: another
/// instance forgets the sender's live chat it remembers.
const CLOSED: &str = "chat.closed";

/// How the command line's notices name their origin (no instance: nothing
/// to relay to).
const CLI_ORIGIN: &str = "cli-";

/// Updates waiting for the relay; past this many, the relay is behind and
/// further updates reach only this instance's streams.
const RELAY_QUEUE: usize = 10_000;

#[derive(Clone)]
pub struct Live {
    tx: broadcast::Sender<LiveEvent>,
    relay: Option<mpsc::Sender<Notice>>,
    /// Whether another instance may be listening: updates are relayed only
    /// then (see [`Live::others`]).
    others: Arc<AtomicBool>,
    origin: Arc<str>,
    bots_changed: Arc<Notify>,
    /// Which other instances watch, once relaying.
    audience: Option<Arc<Audience>>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            tx: broadcast::channel(4096).0,
            relay: None,
            others: Arc::new(AtomicBool::new(true)),
            origin: crate::ids::random_token().into(),
            bots_changed: Arc::default(),
            audience: None,
        }
    }
}

impl Live {
    pub fn publish(&self, event: LiveEvent) {
        if let Some(relay) = self.relay_for(event.kind) {
            let notice = Notice::Live {
                origin: self.origin.to_string(),
                kind: event.kind.to_owned(),
                channel_id: event.channel_id,
                chat_id: event.chat_id,
                data: event.data.clone(),
            };
            if relay.try_send(notice).is_err() {
                tracing::warn!(
                    kind = event.kind,
                    "live relay is behind; other instances miss an update"
                );
            }
        }
        // No subscriber is not an error: nobody is watching right now.
        let _ = self.tx.send(event);
    }

    /// Whether an update of `kind` published now reaches anyone: a stream
    /// of this instance, or the other instances. Nobody listening is the
    /// common case of a busy channel at night, and building an update costs
    /// microseconds.
    pub fn is_heard(&self, kind: &str) -> bool {
        self.relay_for(kind).is_some() || self.tx.receiver_count() > 0
    }

    /// The relay, if an update of `kind` goes to other instances now: while
    /// another instance may be listening, and for an update that only shows
    /// something, while one of them has a stream open.
    fn relay_for(&self, kind: &str) -> Option<&mpsc::Sender<Notice>> {
        self.relay.as_ref().filter(|_| {
            self.others.load(Ordering::Relaxed)
                && (kind == CLOSED || self.audience.as_ref().is_none_or(|a| a.watched()))
        })
    }

    /// Called as a stream opens, before it reads where it begins: returns
    /// once the other instances relay to this one (at once when they do
    /// already), so that the stream misses nothing they publish after it
    /// opened.
    pub async fn watching(&self) {
        if let Some(audience) = &self.audience {
            audience.watching(self.others.load(Ordering::Relaxed)).await;
        }
    }

    /// Whether another instance may be listening, shared with the
    /// heartbeat, which sets it from the instances' table at each beat (an
    /// instance alone sends nothing: measured, 1.09–1.11× its ingress and
    /// 0.84× its CPU per message); a notice from another instance (one
    /// that starts says hello at once) sets it too.
    pub fn others(&self) -> Arc<AtomicBool> {
        self.others.clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<LiveEvent> {
        self.tx.subscribe()
    }

    /// Tells the other instances that bots changed (this one reloads itself).
    pub fn announce_bots_changed(&self) {
        if let Some(relay) = &self.relay {
            let notice = Notice::Bots {
                origin: self.origin.to_string(),
            };
            if relay.try_send(notice).is_err() {
                tracing::warn!("live relay is behind; other instances miss a bot change");
            }
        }
    }

    /// Wakes when another instance changed bots.
    pub fn bots_changed(&self) -> Arc<Notify> {
        self.bots_changed.clone()
    }

    /// Connects this instance to the others on the PostgreSQL database at
    /// `url`: updates published here are sent to them, theirs are published
    /// here. Call before the `Live` is cloned. Runs until `shutdown`.
    /// `peers`: how many other instances beat lately (None: unknown).
    pub async fn relay(
        &mut self,
        store: Store,
        url: &str,
        peers: Option<usize>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), crate::store::StoreError> {
        let listener = Listener::connect(store.clone(), url).await?;
        let (tx, rx) = mpsc::channel(RELAY_QUEUE);
        // Listening already: what the others relay once they hear this
        // reaches it.
        let hello = Notice::Hello {
            origin: self.origin.to_string(),
        };
        if tx.try_send(hello).is_err() {
            tracing::warn!("live relay is behind; other instances learn of this one late");
        }
        let audience = Arc::new(Audience::new(
            self.origin.clone(),
            tx.clone(),
            peers,
            Instant::now(),
        ));
        self.relay = Some(tx);
        self.audience = Some(audience.clone());
        tokio::spawn(send_notices(store, rx));
        tokio::spawn(tend(audience.clone(), self.tx.clone(), shutdown.clone()));
        tokio::spawn(receive_notices(
            listener,
            Received {
                tx: self.tx.clone(),
                origin: self.origin.clone(),
                bots_changed: self.bots_changed.clone(),
                others: self.others.clone(),
                audience,
            },
            shutdown,
        ));
        Ok(())
    }
}

/// Tells every hub running on this (PostgreSQL) database that bots changed,
/// from outside a running hub (the command line). Nothing on SQLite.
pub async fn announce_bots_changed(store: &Store) -> Result<(), crate::store::StoreError> {
    let notice = Notice::Bots {
        origin: format!("{CLI_ORIGIN}{}", crate::ids::random_token()),
    };
    match serde_json::to_string(&notice) {
        Ok(payload) => store.notify(&payload).await,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a notice");
            Ok(())
        }
    }
}

/// Keeps [`Audience`] current, once a second, until `shutdown`.
async fn tend(
    audience: Arc<Audience>,
    streams: broadcast::Sender<LiveEvent>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.changed() => return,
        }
        audience.tend(streams.receiver_count(), Instant::now());
    }
}

/// Most notices the relay sends in one statement.
const RELAY_BATCH: usize = 256;

/// Sends what waits, as many notices at a time as are queued: the relay
/// keeps up with a busy hub by writing fewer, larger statements.
async fn send_notices(store: Store, mut rx: mpsc::Receiver<Notice>) {
    let mut notices = Vec::with_capacity(RELAY_BATCH);
    while rx.recv_many(&mut notices, RELAY_BATCH).await > 0 {
        let payloads: Vec<String> = notices
            .drain(..)
            .filter_map(|notice| match serde_json::to_string(&notice) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a notice");
                    None
                }
            })
            .collect();
        let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
        if let Err(e) = store.notify_all(&payloads).await {
            tracing::warn!(
                error = %e,
                count = payloads.len(),
                "cannot tell other instances of updates"
            );
        }
    }
}

/// Where [`receive_notices`] puts what it hears.
struct Received {
    tx: broadcast::Sender<LiveEvent>,
    origin: Arc<str>,
    bots_changed: Arc<Notify>,
    others: Arc<AtomicBool>,
    audience: Arc<Audience>,
}

async fn receive_notices(
    mut listener: Listener,
    received: Received,
    mut shutdown: watch::Receiver<bool>,
) {
    let Received {
        tx,
        origin,
        bots_changed,
        others,
        audience,
    } = received;
    loop {
        let received = tokio::select! {
            r = listener.recv() => r,
            _ = shutdown.changed() => return,
        };
        let payload = match received {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "lost the notices of other instances; listening again");
                // Bot changes may have been missed too.
                bots_changed.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let notice = serde_json::from_str::<Notice>(&payload);
        if let Ok(
            Notice::Live { origin: from, .. }
            | Notice::Bots { origin: from }
            | Notice::Hello { origin: from }
            | Notice::Audience { origin: from, .. }
            | Notice::Relaying { origin: from, .. },
        ) = &notice
            && **from != *origin
            && !from.starts_with(CLI_ORIGIN)
        {
            others.store(true, Ordering::Relaxed);
        }
        if let Ok(n @ (Notice::Hello { .. } | Notice::Audience { .. } | Notice::Relaying { .. })) =
            &notice
        {
            audience.heard(n, Instant::now());
        }
        match notice {
            Ok(Notice::Live {
                origin: from,
                kind,
                channel_id,
                chat_id,
                data,
            }) if *from != *origin => {
                let Some(kind) = KINDS.iter().copied().find(|k| *k == kind) else {
                    tracing::warn!(%kind, "an update of an unknown kind from another instance");
                    continue;
                };
                if kind == CLOSED {
                    // A sender's live chat this instance remembers may have
                    // ended (store::live). An opened chat cannot make an
                    // entry wrong: only a sender without a live chat gets one.
                    crate::store::live::chats_changed();
                }
                let _ = tx.send(LiveEvent {
                    kind,
                    channel_id,
                    chat_id,
                    data,
                });
            }
            Ok(Notice::Bots { origin: from }) if *from != *origin => bots_changed.notify_one(),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "a malformed notice from another instance"),
        }
    }
}

/// The client as agents see it.
pub fn client_view(client: &Client) -> serde_json::Value {
    json!({
        "id": client.id,
        "external_id": client.external_id,
        "name": client.display_name(),
        "visitor_number": client.visitor_number,
        "phone": client.phone,
        "email": client.email,
        "photo": client.photo,
        "url": client.url,
        "invite": client.invite,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_is_heard_only_while_a_stream_is_open() {
        let live = Live::default();
        assert!(!live.is_heard("chat.message"), "nobody subscribed yet");
        let mut stream = live.subscribe();
        assert!(live.is_heard("chat.message"));
        live.publish(LiveEvent {
            kind: "chat.message",
            channel_id: 1,
            chat_id: 2,
            data: serde_json::json!({ "n": 1 }),
        });
        let got = stream.try_recv().expect("the open stream gets the update");
        assert_eq!((got.kind, got.chat_id), ("chat.message", 2));
        drop(stream);
        assert!(!live.is_heard("chat.message"), "the last stream closed");
    }
}
