//! Auto-reply: answers `channel.customer_message` events on the hub's behalf,
//! by keyword, or with an away message while no agent is online.
//!
//! Config (all optional):
//! - `keywords`: `[{"match": ["price", "cost"], "reply": "…"}]`; `match` is one
//!   string or several, found case-insensitively in `message.text`; the first
//!   rule that matches answers;
//! - `away_message`: the answer when no rule matched and no agent is online,
//!   sent at most once per conversation per `away_every_secs` (default 3600),
//!   tracked in KV under `away:<channel_id or 0>:<sender.id>` (`away:chat:<chat_id>`
//!   for a payload without sender), so an away message needs `kv = true`;
//!   should a KV call fail (a quota), it answers every time;
//! - `sender_name`: the name the answers are signed with (default `Auto-reply`,
//!   `""` for none).

mod rules;

use plugin_api::sdk::{Config, Event, Host, Level, Needs, Outcome, Plugin, channel_reply_text};

use rules::Rule;

pub struct AutoReply;

/// The config, checked.
struct Settings<'a> {
    rules: Vec<Rule>,
    sender_name: Option<&'a str>,
    away_message: Option<&'a str>,
    away_every_secs: u64,
}

impl<'a> Settings<'a> {
    fn read(config: &'a Config) -> Result<Settings<'a>, String> {
        Ok(Settings {
            rules: Rule::parse_all(config.get("keywords"))?,
            sender_name: Some(config.str_or("sender_name", "Auto-reply")?)
                .filter(|n| !n.is_empty()),
            away_message: config.str("away_message")?,
            away_every_secs: config.u64_or("away_every_secs", 3600)?,
        })
    }
}

impl Plugin for AutoReply {
    fn validate_config(config: &Config) -> Result<(), String> {
        Settings::read(config).map(|_| ())
    }

    /// Keyword answers need nothing; without its memory the away message
    /// would go out on every message of a customer.
    fn needs(config: &Config) -> Result<Needs, String> {
        let settings = Settings::read(config)?;
        Ok(Needs::none().kv_if(settings.away_message.is_some()))
    }

    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        if event.kind != "channel.customer_message" {
            return Ok(Outcome::pass());
        }
        let config = Config::new(host.config())?;
        let Settings {
            rules,
            sender_name,
            away_message,
            away_every_secs,
        } = Settings::read(&config)?;

        if let Some(text) = event.message_text()
            && let Some(reply) = rules::first_match(&rules, text)
        {
            return Ok(Outcome::reply(channel_reply_text(reply, sender_name)));
        }
        match away_message {
            Some(away)
                if event.agents_online() == Some(0) && away_due(event, host, away_every_secs) =>
            {
                Ok(Outcome::reply(channel_reply_text(away, sender_name)))
            }
            _ => Ok(Outcome::pass()),
        }
    }
}

/// Whether the client has not had the away message within the period, and if
/// so records that it has now. Without a working KV the answer is yes: an
/// away message too many beats a customer left without one.
fn away_due(event: &Event, host: &mut dyn Host, every_secs: u64) -> bool {
    // Keyed by client, not chat: the hub only knows a customer message's chat
    // once the message is stored, so the first message of a chat comes without
    // one and a chat key would let that chat have the away message twice.
    let key = match (event.sender_key(), event.chat_id) {
        (Some(sender), _) => format!("away:{}:{sender}", event.channel_id.unwrap_or(0)),
        (None, Some(chat)) => format!("away:chat:{chat}"),
        (None, None) => return true,
    };
    let every_ms = i64::try_from(every_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    match host.kv_get(&key) {
        Ok(Some(last)) => {
            if let Ok(last) = last.trim().parse::<i64>()
                && last <= event.at
                && event.at.saturating_sub(last) < every_ms
            {
                return false;
            }
        }
        Ok(None) => {}
        Err(e) => {
            host.log(
                Level::Warn,
                &format!("away message sent untracked: kv: {e}"),
            );
            return true;
        }
    }
    if let Err(e) = host.kv_set(&key, &event.at.to_string()) {
        host.log(
            Level::Warn,
            &format!("away message sent untracked: kv: {e}"),
        );
    }
    true
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(AutoReply);

#[cfg(test)]
mod tests;
