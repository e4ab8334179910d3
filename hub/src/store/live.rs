//! The live chat of each recent sender, remembered so that a customer
//! message's plugins learn its chat without a database read per message.
//!
//! Why it stays right: every change that can end or replace a sender's live
//! chat (a close, a chat opened outside the ingress batch, a client deleted)
//! moves a process-wide generation on, and an entry counts only under the
//! generation it was read under. A change still uncommitted when an entry was
//! read is the one race left, the same one as without the cache (the chat a
//! plugin sees is read before the message is written); the batch that writes
//! the message remembers its real chat, so a wrong entry serves at most one
//! message.
//!
//! On PostgreSQL another instance may close a chat: its `chat.closed`
//! updates, relayed to this one (`core::live`), move the generation on too. One that never arrives (the relay was behind, or the
//! command line closed the chat) is the race above, for one message of the
//! sender: the batch finds the real live chat itself, under the sender's lock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries kept at most; past it the map starts over (a burst of new
/// senders is cheaper to read again than to track).
const MAX_ENTRIES: usize = 65_536;

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Called by every store function that may end a sender's live chat or
/// give it a newer one.
pub(crate) fn chats_changed() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// A point in the history of chat changes, taken before reading a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(u64);

impl Generation {
    pub fn now() -> Generation {
        Generation(GENERATION.load(Ordering::Acquire))
    }
}

/// Senders by channel, each with its chat and the generation it was read under.
#[derive(Default)]
pub(super) struct LiveChats(Mutex<Entries>);

#[derive(Default)]
struct Entries {
    by_channel: HashMap<i64, HashMap<String, (u64, i64)>>,
    count: usize,
}

impl LiveChats {
    /// The remembered live chat of `sender` on `channel`, if it is still
    /// current.
    pub(super) fn get(&self, channel: i64, sender: &str) -> Option<i64> {
        let now = GENERATION.load(Ordering::Acquire);
        let entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .by_channel
            .get(&channel)?
            .get(sender)
            .filter(|(generation, _)| *generation == now)
            .map(|(_, chat)| *chat)
    }

    /// Remembers `chat` as read (or written) under `at`; ignored when chats
    /// changed since.
    pub(super) fn put(&self, at: Generation, channel: i64, sender: String, chat: i64) {
        if GENERATION.load(Ordering::Acquire) != at.0 {
            return;
        }
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if entries.count >= MAX_ENTRIES {
            entries.by_channel.clear();
            entries.count = 0;
        }
        let added = entries
            .by_channel
            .entry(channel)
            .or_default()
            .insert(sender, (at.0, chat))
            .is_none();
        entries.count += usize::from(added);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_counts_until_chats_change() {
        let live = LiveChats::default();
        let at = Generation::now();
        live.put(at, 1, "42".into(), 7);
        // Other tests move the generation too; retry until a quiet moment.
        if Generation::now() == at {
            assert_eq!(live.get(1, "42"), Some(7));
        }
        assert_eq!(live.get(2, "42"), None, "another channel");
        chats_changed();
        assert_eq!(live.get(1, "42"), None, "after a change");
        // Read before the change, remembered after it: not kept.
        live.put(at, 1, "43".into(), 8);
        assert_eq!(live.get(1, "43"), None);
    }
}
