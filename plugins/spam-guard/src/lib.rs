//! Spam guard: drops `channel.customer_message` events whose text contains a
//! configured pattern, or whose client sends too many messages too fast.
//!
//! Config (all optional):
//! - `patterns`: strings matched case-insensitively as substrings of `message.text`;
//! - `max_messages` (default 20) per `window_secs` (default 60) and client, a
//!   fixed window kept in KV under `rate:<channel_id or 0>:<sender.id>`, so
//!   the limit needs `kv = true`; `max_messages = 0` turns it off (and the
//!   need with it); should a KV call fail (a quota), the message passes;
//! - `forward_to`: a destination (which it then needs granted) told about
//!   every dropped message.

mod rate;

use plugin_api::sdk::{Config, Event, Host, Level, Needs, Outcome, Plugin};
use serde_json::json;

use rate::{Window, count};

pub struct SpamGuard;

/// The config, checked.
struct Settings {
    patterns: Vec<String>,
    limit: u64,
    window_secs: u64,
    forward_to: Option<String>,
}

impl Settings {
    fn read(config: &Config) -> Result<Settings, String> {
        let window_secs = config.u64_or("window_secs", 60)?;
        if window_secs == 0 {
            return Err("config: window_secs must be at least 1".to_owned());
        }
        Ok(Settings {
            patterns: config.strings("patterns")?.unwrap_or_default(),
            limit: config.u64_or("max_messages", 20)?,
            window_secs,
            forward_to: config.str("forward_to")?.map(str::to_owned),
        })
    }
}

impl Plugin for SpamGuard {
    fn validate_config(config: &Config) -> Result<(), String> {
        Settings::read(config).map(|_| ())
    }

    fn needs(config: &Config) -> Result<Needs, String> {
        let settings = Settings::read(config)?;
        Ok(Needs::none()
            .kv_if(settings.limit > 0)
            .destination_if(settings.forward_to.as_deref()))
    }

    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        if event.kind != "channel.customer_message" {
            return Ok(Outcome::pass());
        }
        let Settings {
            patterns,
            limit,
            window_secs,
            forward_to,
        } = Settings::read(&Config::new(host.config())?)?;
        let forward_to = forward_to.as_deref();

        let reason = match spam_pattern(event.message_text(), &patterns) {
            Some(p) => Some(format!("spam pattern \"{p}\"")),
            None if limit > 0 => over_limit(event, host, limit, window_secs)
                .then(|| format!("rate limit: more than {limit} messages in {window_secs} s")),
            None => None,
        };
        let Some(reason) = reason else {
            return Ok(Outcome::pass());
        };
        let outcome = Outcome::drop(reason.clone());
        Ok(match forward_to {
            Some(destination) => outcome.forward(
                destination,
                json!({
                    "event_id": event.id,
                    "kind": event.kind,
                    "channel": event.channel,
                    "chat_id": event.chat_id,
                    "reason": reason,
                    "sender_id": event.payload().pointer("/sender/id"),
                }),
            ),
            None => outcome,
        })
    }
}

/// The first pattern found in the text, compared in lowercase.
fn spam_pattern<'p>(text: Option<&str>, patterns: &'p [String]) -> Option<&'p str> {
    let text = text?.to_lowercase();
    patterns
        .iter()
        .find(|p| !p.is_empty() && text.contains(&p.to_lowercase()))
        .map(String::as_str)
}

/// Counts the message in its client's window; true when that exceeds the limit.
/// A KV the plugin cannot use turns the limit off rather than failing the event.
fn over_limit(event: &Event, host: &mut dyn Host, limit: u64, window_secs: u64) -> bool {
    let Some(sender) = event.sender_key() else {
        return false;
    };
    let key = format!("rate:{}:{sender}", event.channel_id.unwrap_or(0));
    let window_ms = i64::try_from(window_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let stored = match host.kv_get(&key) {
        Ok(stored) => stored,
        Err(e) => {
            host.log(Level::Warn, &format!("rate limit skipped: kv: {e}"));
            return false;
        }
    };
    let window = count(Window::parse(stored.as_deref()), event.at, window_ms);
    if let Err(e) = host.kv_set(&key, &window.to_json()) {
        host.log(Level::Warn, &format!("rate limit skipped: kv: {e}"));
        return false;
    }
    window.count > limit
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(SpamGuard);

#[cfg(test)]
mod tests;
