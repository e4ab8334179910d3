//! What the bot remembers of a chat between calls: one small JSON value in KV
//! under `chat:<chat_id>`, or nothing when KV cannot be used.

use plugin_api::sdk::{Event, Host, Level};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatState {
    pub greeted: bool,
    /// Messages in a row the bot found no answer for.
    pub misses: u64,
}

impl ChatState {
    fn parse(stored: &str) -> Option<ChatState> {
        let v: Value = serde_json::from_str(stored).ok()?;
        Some(ChatState {
            greeted: v.get("greeted")?.as_bool()?,
            misses: v.get("misses")?.as_u64()?,
        })
    }

    fn to_json(self) -> String {
        json!({ "greeted": self.greeted, "misses": self.misses }).to_string()
    }
}

/// The chat's state as read at the start of the call, and where it goes back.
pub struct Memory {
    /// `None` when the state is unknown: no chat id, or KV failed.
    slot: Option<(String, ChatState)>,
}

impl Memory {
    /// Reads the chat's state. Failures are logged and leave the bot without
    /// memory rather than failing the call: a failed call hands the chat to
    /// agents, which a KV hiccup does not justify.
    pub fn open(event: &Event, host: &mut dyn Host) -> Memory {
        let Some(chat) = event.chat_id else {
            host.log(
                Level::Warn,
                "event has no chat id; answering without memory",
            );
            return Memory { slot: None };
        };
        let key = format!("chat:{chat}");
        let state = match host.kv_get(&key) {
            Ok(None) => ChatState::default(),
            Ok(Some(stored)) => ChatState::parse(&stored).unwrap_or_else(|| {
                // Starting over greets the customer again, which is harmless.
                host.log(
                    Level::Warn,
                    &format!("{key}: unreadable state, starting over"),
                );
                ChatState::default()
            }),
            Err(e) => {
                host.log(Level::Warn, &format!("answering without memory: kv: {e}"));
                return Memory { slot: None };
            }
        };
        Memory {
            slot: Some((key, state)),
        }
    }

    pub fn state(&self) -> Option<ChatState> {
        self.slot.as_ref().map(|(_, s)| *s)
    }

    /// Stores `next` if it differs from what was read; most answers change
    /// nothing, and each write costs the hub a row in the event's transaction.
    pub fn save(&self, host: &mut dyn Host, next: ChatState) {
        let Some((key, before)) = &self.slot else {
            return;
        };
        if *before == next {
            return;
        }
        if let Err(e) = host.kv_set(key, &next.to_json()) {
            host.log(Level::Warn, &format!("{key} not saved: kv: {e}"));
        }
    }
}
