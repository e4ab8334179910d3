//! FAQ bot: the bot of a channel. It answers `bot.client_message` events (the
//! `CLIENT_MESSAGE` the hub would post to a bot provider) with `BOT_MESSAGE`s
//! and `INVITE_AGENT`; other kinds pass.
//!
//! Config (all optional):
//! - `greeting`: the first answer of every chat (default `Hello! How can I help?`);
//! - `menu`: up to 3 topics, offered as buttons with the greeting and after a
//!   message the bot did not understand; a click arrives as the topic's text,
//!   so each topic should contain a keyword of `answers`;
//! - `menu_title`: the title of the menu after a miss (default `Choose a topic`);
//! - `answers`: a table `keyword = "answer"`; a keyword found case-insensitively
//!   anywhere in the message answers it; of several, the longest keyword wins,
//!   then the alphabetically first.
//!
//! Per message, in order: a text containing `agent` or `person` invites an
//! agent; the first message of a chat gets the greeting with the menu (and the
//! answer after it, if one matches); later messages get the matching answer,
//! or the menu on a first miss and an agent on the second miss in a row.
//!
//! Per-chat state lives in KV under `chat:<chat_id>` as
//! `{"greeted":bool,"misses":n}`, so the plugin needs `kv = true`: the hub
//! refuses an entry without it. Should a KV call still fail (a quota), the bot
//! answers with no memory: no greeting, the answer or else the menu, never an
//! agent for misses.

mod settings;
mod state;

use plugin_api::bot::ClientMessage;
use plugin_api::sdk::{
    Config, Event, Host, Needs, Outcome, Plugin, bot_buttons, bot_invite_agent, bot_text,
};
use serde_json::Value;

use settings::Settings;
use state::{ChatState, Memory};

pub struct FaqBot;

impl Plugin for FaqBot {
    fn validate_config(config: &Config) -> Result<(), String> {
        Settings::read(config).map(|_| ())
    }

    /// Without its memory the bot never greets and never hands a chat over
    /// after misses: it cannot do its job.
    fn needs(_config: &Config) -> Result<Needs, String> {
        Ok(Needs::none().kv())
    }

    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        if event.kind != "bot.client_message" {
            return Ok(Outcome::pass());
        }
        let settings = Settings::read(&Config::new(host.config())?)?;
        let message: ClientMessage = event.payload_as()?;
        let text = message.message.plain_text();
        let memory = Memory::open(event, host);

        // Every answer leaves the chat greeted; only a first miss is remembered.
        let (answers, misses) = if wants_agent(text) {
            (vec![bot_invite_agent()], 0)
        } else {
            let answer = settings.answer(text).map(|a| bot_text(a, event.at));
            match memory.state() {
                // Unknown history: neither greet nor count misses on a guess.
                None => (vec![answer.unwrap_or_else(|| menu(&settings, event.at))], 0),
                Some(s) if !s.greeted => {
                    let mut answers = vec![greeting(&settings, event.at)];
                    answers.extend(answer);
                    (answers, 0)
                }
                Some(_) if answer.is_some() => (answer.into_iter().collect(), 0),
                Some(s) if s.misses == 0 => (vec![menu(&settings, event.at)], 1),
                Some(_) => (vec![bot_invite_agent()], 0),
            }
        };
        memory.save(
            host,
            ChatState {
                greeted: true,
                misses,
            },
        );
        Ok(Outcome::bot_answers(answers))
    }
}

/// Whether the customer asks for a human, which beats every answer.
fn wants_agent(text: &str) -> bool {
    let text = text.to_lowercase();
    text.contains("agent") || text.contains("person")
}

fn greeting(settings: &Settings, at_ms: i64) -> Value {
    buttons_or_text(&settings.greeting, &settings.menu, at_ms)
}

fn menu(settings: &Settings, at_ms: i64) -> Value {
    buttons_or_text(&settings.menu_title, &settings.menu, at_ms)
}

/// Buttons need something to click; without a menu the title goes as text.
fn buttons_or_text(title: &str, menu: &[String], at_ms: i64) -> Value {
    if menu.is_empty() {
        return bot_text(title, at_ms);
    }
    let topics: Vec<&str> = menu.iter().map(String::as_str).collect();
    bot_buttons(title, title, &topics, at_ms)
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(FaqBot);

#[cfg(test)]
mod tests;
