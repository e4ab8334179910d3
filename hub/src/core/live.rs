//! Live updates for agents: every change an agent should see at once is
//! broadcast here and filtered per agent by the stream endpoint.

use serde::Serialize;
use tokio::sync::broadcast;

/// One update on the agent stream (`event:` is `kind`, `data:` is `data`).
#[derive(Debug, Clone, Serialize)]
pub struct LiveEvent {
    pub kind: &'static str,
    pub channel_id: i64,
    pub chat_id: i64,
    pub data: serde_json::Value,
}

#[derive(Clone)]
pub struct Live {
    tx: broadcast::Sender<LiveEvent>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            tx: broadcast::channel(4096).0,
        }
    }
}

impl Live {
    pub fn publish(&self, event: LiveEvent) {
        // No subscriber is not an error: nobody is watching right now.
        let _ = self.tx.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<LiveEvent> {
        self.tx.subscribe()
    }
}
