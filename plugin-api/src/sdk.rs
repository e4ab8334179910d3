//! The plugin author's view of the hub: events, outcomes and the host's
//! capabilities as plain Rust, free of any wasm binding so it tests natively.

use std::sync::OnceLock;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

mod config;

pub use config::{Config, strings};

/// Which way an event crosses the hub's boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received by the hub (a customer message, a delivery result).
    Inbound,
    /// About to be sent by the hub (an agent message, a webhook).
    Outbound,
}

impl Direction {
    /// The lowercase name, as plugins write it into JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

/// One event on its way through a route's plugin chain.
///
/// The payload and the context arrive as JSON text and are parsed the first
/// time [`payload`](Event::payload) or [`context`](Event::context) is asked
/// for: a plugin that decides on the kind or the channel alone pays nothing
/// for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// UUID, stable for the event's whole life.
    pub id: String,
    /// Dotted kind, for example `channel.customer_message`.
    pub kind: String,
    pub direction: Direction,
    pub channel_id: Option<i64>,
    pub channel: Option<String>,
    pub chat_id: Option<i64>,
    pub(crate) payload: LazyJson,
    /// When the event was made, Unix milliseconds.
    pub at: i64,
    pub(crate) context: LazyJson,
}

impl Event {
    /// The payload, as the event kind's wire format has it.
    pub fn payload(&self) -> &Value {
        self.payload.get()
    }

    /// The payload, to change in place (tests build variants of an event
    /// this way; a plugin answers with [`Outcome::replace`] instead).
    pub fn payload_mut(&mut self) -> &mut Value {
        self.payload.get_mut()
    }

    /// What the hub knows around the event, e.g. `{"agents_online": 2}`; an
    /// empty object when it gave nothing.
    pub fn context(&self) -> &Value {
        self.context.get()
    }

    /// The context, to change in place (for tests).
    pub fn context_mut(&mut self) -> &mut Value {
        self.context.get_mut()
    }

    /// The payload as a typed wire struct (see the crate's payload modules).
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, String> {
        T::deserialize(self.payload())
            .map_err(|e| format!("payload of {} does not match its type: {e}", self.kind))
    }

    /// Whether the kind matches a glob such as `channel.*`.
    pub fn kind_matches(&self, pattern: &str) -> bool {
        glob_matches(pattern, &self.kind)
    }

    /// The number of the channel's agents online, when the hub said so.
    pub fn agents_online(&self) -> Option<u64> {
        self.context().get("agents_online").and_then(Value::as_u64)
    }

    /// `message.text` of the payload, the field most filters look at.
    pub fn message_text(&self) -> Option<&str> {
        self.payload()
            .pointer("/message/text")
            .and_then(Value::as_str)
    }

    /// `sender.id` of the payload as text: `7` and `"7"` name the same client.
    pub fn sender_key(&self) -> Option<String> {
        match self.payload().pointer("/sender/id")? {
            Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// JSON that the hub handed over as text, parsed on first use.
#[derive(Clone)]
pub(crate) struct LazyJson {
    text: String,
    /// What an empty text stands for (a payload: `null`; a context: `{}`).
    empty: fn() -> Value,
    value: OnceLock<Value>,
}

impl LazyJson {
    /// JSON text as the hub wrote it (the guest side builds these).
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub(crate) fn text(text: String, empty: fn() -> Value) -> LazyJson {
        LazyJson {
            text,
            empty,
            value: OnceLock::new(),
        }
    }

    /// A value that needs no parsing (tests, events built natively).
    pub(crate) fn value(value: Value) -> LazyJson {
        LazyJson {
            text: String::new(),
            empty: || Value::Null,
            value: OnceLock::from(value),
        }
    }

    fn get(&self) -> &Value {
        self.value.get_or_init(|| self.parse())
    }

    fn get_mut(&mut self) -> &mut Value {
        let value = match self.value.take() {
            Some(value) => value,
            None => self.parse(),
        };
        self.value = OnceLock::from(value);
        match self.value.get_mut() {
            Some(value) => value,
            None => unreachable!("set on the line above"),
        }
    }

    /// The hub writes this text with a JSON serializer; text that is not
    /// JSON would be a hub bug, and reads as the empty value.
    fn parse(&self) -> Value {
        if self.text.trim().is_empty() {
            return (self.empty)();
        }
        serde_json::from_str(&self.text).unwrap_or_else(|_| (self.empty)())
    }
}

impl std::fmt::Debug for LazyJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl PartialEq for LazyJson {
    fn eq(&self, other: &LazyJson) -> bool {
        self.get() == other.get()
    }
}

/// An empty JSON object: the context of an event the hub said nothing about.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub(crate) fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// Glob match where `*` stands for any run of characters (also none, dots
/// included) and every other character stands for itself. The hub routes
/// events with this same function.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let mut parts = glob.split('*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all: the whole text must have matched.
        return rest.is_empty();
    };
    // Each middle part at its first place: a later one would leave less
    // text for the parts after it.
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What becomes of the event.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Pass the event on, with its payload replaced when `Some`.
    Continue(Option<Value>),
    /// Stop the event here, for the given reason.
    Drop(String),
    /// Answer on the hub's behalf; what that means depends on the kind.
    Reply(Value),
}

/// A payload for a destination named in `hub.toml`, delivered durably.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    pub destination: String,
    pub payload: Value,
}

/// The result of handling one event: an action plus any forwards.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub action: Action,
    pub forwards: Vec<Forward>,
}

impl Outcome {
    fn with(action: Action) -> Self {
        Outcome {
            action,
            forwards: Vec::new(),
        }
    }

    /// Continue with the event unchanged.
    pub fn pass() -> Self {
        Self::with(Action::Continue(None))
    }

    /// Continue with a changed payload (checked by the hub against the kind's type).
    pub fn replace(payload: Value) -> Self {
        Self::with(Action::Continue(Some(payload)))
    }

    /// Stop the event; the reason is logged and counted by the hub.
    pub fn drop(reason: impl Into<String>) -> Self {
        Self::with(Action::Drop(reason.into()))
    }

    /// Answer on the hub's behalf, e.g. [`channel_reply_text`] for a customer message.
    pub fn reply(payload: Value) -> Self {
        Self::with(Action::Reply(payload))
    }

    /// A bot's answer to `bot.client_message`: the [`bot_text`],
    /// [`bot_markdown`], [`bot_buttons`] and [`bot_invite_agent`] values, applied
    /// by the hub in order. One value is replied as itself, several as an array
    /// (the hub takes at most 5), none means the bot stays silent ([`Outcome::pass`]).
    pub fn bot_answers(mut answers: Vec<Value>) -> Self {
        match answers.len() {
            0 => Self::pass(),
            1 => Self::reply(answers.remove(0)),
            _ => Self::reply(Value::Array(answers)),
        }
    }

    /// Also sends `payload` to `destination` through the hub's outbox.
    #[must_use]
    pub fn forward(mut self, destination: impl Into<String>, payload: Value) -> Self {
        self.forwards.push(Forward {
            destination: destination.into(),
            payload,
        });
        self
    }

    /// Whether the event goes on unchanged.
    pub fn is_pass(&self) -> bool {
        self.action == Action::Continue(None)
    }
}

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// A destination's answer to [`Host::send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The capabilities the hub grants a plugin; nothing else reaches the outside.
pub trait Host {
    /// Writes a line to the hub's log, tagged with the plugin and the event.
    fn log(&mut self, level: Level, message: &str);
    /// The plugin's `config` table from `hub.toml` (an object; empty when absent).
    fn config(&self) -> Value;
    /// Reads from the plugin's own key-value namespace; fails when not granted.
    fn kv_get(&mut self, key: &str) -> Result<Option<String>, String>;
    fn kv_set(&mut self, key: &str, value: &str) -> Result<(), String>;
    fn kv_delete(&mut self, key: &str) -> Result<(), String>;
    /// POSTs JSON to a granted destination and waits for the answer.
    fn send(&mut self, destination: &str, payload: &Value) -> Result<Response, String>;
}

/// A plugin: one call per event, each in a fresh instance, so nothing is kept
/// between calls except through the KV store.
pub trait Plugin {
    /// Handles one event; an error fails this call only, and the route's
    /// `on_error` decides what happens to the event.
    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String>;

    /// Checks the config table when the hub loads the plugin (`hub check`,
    /// `hub serve`, reload), before any event arrives. Return an error that
    /// names the key (the [`Config`] accessors do): the hub refuses the
    /// configuration with it. The default accepts any table.
    fn validate_config(config: &Config) -> Result<(), String> {
        let _ = config;
        Ok(())
    }

    /// What the plugin needs granted in its `[[plugins]]` entry to work with
    /// this config: asked when the hub loads the plugin, after
    /// [`validate_config`](Plugin::validate_config). The hub refuses an entry
    /// that does not grant it (`hub check`, `hub serve`, reload), naming the
    /// plugin, the grant and the line, instead of running a plugin whose
    /// every key-value call or send fails. Declare only what the plugin
    /// cannot work without as configured; the default needs nothing.
    fn needs(config: &Config) -> Result<Needs, String> {
        let _ = config;
        Ok(Needs::none())
    }
}

/// What a plugin needs granted in `hub.toml`, from [`Plugin::needs`]:
/// `Needs::none().kv().destination("crm")`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// A key-value namespace of its own (`kv = true`).
    pub kv: bool,
    /// Destinations it sends or forwards to (`destinations = [...]`).
    pub destinations: Vec<String>,
}

impl Needs {
    /// Nothing: every host import the plugin uses works without a grant.
    pub fn none() -> Needs {
        Needs::default()
    }

    /// Also key-value storage.
    #[must_use]
    pub fn kv(mut self) -> Needs {
        self.kv = true;
        self
    }

    /// Also the destination `name` (once, however often it is named).
    #[must_use]
    pub fn destination(mut self, name: impl Into<String>) -> Needs {
        let name = name.into();
        if !self.destinations.contains(&name) {
            self.destinations.push(name);
        }
        self
    }

    /// Key-value storage when `needed` holds (a feature the config turns on).
    #[must_use]
    pub fn kv_if(self, needed: bool) -> Needs {
        if needed { self.kv() } else { self }
    }

    /// The destination a config key names, when it names one.
    #[must_use]
    pub fn destination_if(self, name: Option<&str>) -> Needs {
        match name {
            Some(name) => self.destination(name),
            None => self,
        }
    }
}

/// A text reply to `channel.customer_message`, which the hub sends to the
/// customer as an automatic message: `{"sender":{"name"},"message":{"type":"text","text"}}`.
pub fn channel_reply_text(text: &str, sender_name: Option<&str>) -> Value {
    let mut reply = Map::new();
    if let Some(name) = sender_name {
        reply.insert("sender".to_owned(), json!({ "name": name }));
    }
    reply.insert(
        "message".to_owned(),
        json!({ "type": "text", "text": text }),
    );
    Value::Object(reply)
}

// Bot answers. The guest has no clock worth trusting, so the timestamps come
// from the event: pass `event.at` as `at_ms`.

/// Unix seconds, as the bot exchange writes `timestamp`, of `at_ms` (Unix ms).
fn bot_timestamp(at_ms: i64) -> i64 {
    at_ms.div_euclid(1000)
}

fn bot_message(message: Value) -> Value {
    json!({ "event": "BOT_MESSAGE", "message": message })
}

/// A plain text answer: `{"event":"BOT_MESSAGE","message":{"type":"TEXT","text","timestamp"}}`.
pub fn bot_text(text: &str, at_ms: i64) -> Value {
    bot_message(json!({ "type": "TEXT", "text": text, "timestamp": bot_timestamp(at_ms) }))
}

/// A Markdown answer; `text` is what channels without Markdown show instead.
pub fn bot_markdown(content: &str, text: &str, at_ms: i64) -> Value {
    bot_message(json!({
        "type": "MARKDOWN",
        "content": content,
        "text": text,
        "timestamp": bot_timestamp(at_ms),
    }))
}

/// An answer offering prepared replies as buttons, with ids `"1"`, `"2"`, `"3"`
/// in order; buttons past [`MAX_BUTTONS`](crate::bot::MAX_BUTTONS) are left out.
///
/// Channels without buttons get `text` instead, and the hub adds one
/// `- <button>` line per button so the customer can type one (an empty
/// `text` shows the message to agents only); a click arrives as a message
/// whose text is the button's text.
pub fn bot_buttons(title: &str, text: &str, buttons: &[&str], at_ms: i64) -> Value {
    let buttons: Vec<Value> = buttons
        .iter()
        .take(crate::bot::MAX_BUTTONS)
        .zip(1..)
        .map(|(b, n)| json!({ "text": b, "id": n.to_string() }))
        .collect();
    bot_message(json!({
        "type": "BUTTONS",
        "title": title,
        "text": text,
        "buttons": buttons,
        "timestamp": bot_timestamp(at_ms),
    }))
}

/// Hands the chat to a human agent: `{"event":"INVITE_AGENT"}`.
pub fn bot_invite_agent() -> Value {
    json!({ "event": "INVITE_AGENT" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, payload: Value, context: Value) -> Event {
        Event {
            id: "e1".into(),
            kind: kind.into(),
            direction: Direction::Inbound,
            channel_id: None,
            channel: None,
            chat_id: None,
            payload: LazyJson::value(payload),
            at: 0,
            context: LazyJson::value(context),
        }
    }

    /// What the guest side builds from the hub's text reads like an event
    /// built from values, and can be changed in place like one.
    #[test]
    fn payload_and_context_given_as_text_read_like_values() {
        let mut from_text = event("channel.customer_message", Value::Null, Value::Null);
        from_text.payload = LazyJson::text(
            r#"{"sender":{"id":7},"message":{"type":"text","text":"hi"}}"#.to_owned(),
            || Value::Null,
        );
        from_text.context = LazyJson::text(String::new(), empty_object);
        let from_values = event(
            "channel.customer_message",
            json!({"sender":{"id":7},"message":{"type":"text","text":"hi"}}),
            json!({}),
        );
        assert_eq!(from_text, from_values);
        assert_eq!(from_text.message_text(), Some("hi"));
        assert_eq!(from_text.sender_key().as_deref(), Some("7"));
        assert_eq!(from_text.context(), &json!({}));
        assert_eq!(from_text.agents_online(), None);

        from_text.payload_mut()["message"]["text"] = json!("changed");
        assert_eq!(from_text.message_text(), Some("changed"));
        from_text.context_mut()["agents_online"] = json!(2);
        assert_eq!(from_text.agents_online(), Some(2));

        let mut unread = event("channel.customer_message", Value::Null, Value::Null);
        unread.payload = LazyJson::text(r#"{"a":1}"#.to_owned(), || Value::Null);
        unread.payload_mut()["b"] = json!(2);
        assert_eq!(unread.payload(), &json!({"a":1,"b":2}));
    }

    #[test]
    fn globs() {
        for (p, t) in [
            ("channel.*", "channel.customer_message"),
            ("*", ""),
            ("*", "anything"),
            ("channel.*_typing", "channel.agent_typing"),
            ("*.*", "a.b"),
            ("a*b*c", "aXbYbZc"),
            ("exact", "exact"),
            ("**", "x"),
        ] {
            assert!(glob_matches(p, t), "{p} should match {t}");
        }
        for (p, t) in [
            ("channel.*", "crm.contact"),
            ("channel.*", "channel"),
            ("exact", "exactly"),
            ("*_typing", "channel.customer_message"),
            ("a*b*c", "aXbYbZ"),
            ("", "x"),
        ] {
            assert!(!glob_matches(p, t), "{p} should not match {t}");
        }
    }

    #[test]
    fn event_helpers() {
        let e = event(
            "channel.customer_message",
            json!({"sender":{"id":7},"message":{"type":"text","text":"hi"}}),
            json!({"agents_online": 3}),
        );
        assert!(e.kind_matches("channel.*"));
        assert_eq!(e.agents_online(), Some(3));
        assert_eq!(e.message_text(), Some("hi"));
        assert_eq!(e.sender_key().as_deref(), Some("7"));
        let m: crate::channel::CustomerMessage = e.payload_as().unwrap();
        assert_eq!(m.sender.id.as_key(), "7");

        let bad = event("channel.customer_message", json!({"x":1}), json!({}));
        assert_eq!(bad.agents_online(), None);
        assert_eq!(bad.message_text(), None);
        assert_eq!(bad.sender_key(), None);
        let err = bad
            .payload_as::<crate::channel::CustomerMessage>()
            .unwrap_err();
        assert!(err.contains("channel.customer_message"), "{err}");
    }

    #[test]
    fn outcomes() {
        assert!(Outcome::pass().is_pass());
        assert!(!Outcome::replace(json!({})).is_pass());
        let o = Outcome::drop("spam")
            .forward("crm", json!({"a":1}))
            .forward("audit", json!(2));
        assert_eq!(o.action, Action::Drop("spam".into()));
        assert_eq!(o.forwards.len(), 2);
        assert_eq!(o.forwards[1].destination, "audit");
        assert_eq!(Outcome::reply(json!(1)).action, Action::Reply(json!(1)));
    }

    #[test]
    fn reply_text_shape() {
        assert_eq!(
            channel_reply_text("hello", Some("Bot")),
            json!({"sender":{"name":"Bot"},"message":{"type":"text","text":"hello"}})
        );
        assert_eq!(
            channel_reply_text("hello", None),
            json!({"message":{"type":"text","text":"hello"}})
        );
    }

    /// The `message` of a `BOT_MESSAGE` answer, as the hub parses it.
    fn parsed_message(answer: &Value) -> crate::bot::Message {
        assert_eq!(answer["event"], "BOT_MESSAGE", "{answer}");
        serde_json::from_value(answer["message"].clone()).expect("the hub parses it")
    }

    #[test]
    fn bot_messages_parse_as_the_hub_reads_them() {
        use crate::bot::{Button, Message};
        let at = 1_665_415_879_999;

        let text = bot_text("Hi", at);
        assert_eq!(
            text,
            json!({"event":"BOT_MESSAGE","message":{"type":"TEXT","text":"Hi","timestamp":1665415879}})
        );
        let Message::Text(m) = parsed_message(&text) else {
            panic!("not TEXT: {text}")
        };
        assert_eq!((m.text.as_str(), m.button_id), ("Hi", None));
        assert_eq!(m.timestamp.unix_seconds(), Some(1_665_415_879));

        let md = bot_markdown("**Hi**", "Hi", at);
        let Message::Markdown(m) = parsed_message(&md) else {
            panic!("not MARKDOWN: {md}")
        };
        assert_eq!((m.content.as_str(), m.text.as_str()), ("**Hi**", "Hi"));

        let buttons = bot_buttons("Pick one", "Pick one:", &["Prices", "Hours"], at);
        let Message::Buttons(m) = parsed_message(&buttons) else {
            panic!("not BUTTONS: {buttons}")
        };
        assert_eq!(m.title, "Pick one");
        assert_eq!(m.text, "Pick one:");
        assert_eq!(
            Message::Buttons(m.clone()).customer_text().as_deref(),
            Some("Pick one:\n- Prices\n- Hours"),
            "the hub adds the button texts for plain channels"
        );
        let button = |text: &str, id: &str| Button {
            text: text.to_owned(),
            id: Some(crate::lenient::Label(id.to_owned())),
        };
        assert_eq!(m.buttons, vec![button("Prices", "1"), button("Hours", "2")]);
        assert_eq!(m.timestamp.unix_seconds(), Some(1_665_415_879));
    }

    #[test]
    fn bot_buttons_fallback_and_limit() {
        let four = bot_buttons("t", "", &["a", "b", "c", "d"], 0);
        let crate::bot::Message::Buttons(m) = parsed_message(&four) else {
            panic!("not BUTTONS: {four}")
        };
        assert_eq!(m.buttons.len(), crate::bot::MAX_BUTTONS);
        assert_eq!(m.text, "");
        assert_eq!(bot_buttons("t", "only", &[], 0)["message"]["text"], "only");
        // Times before 1970 round down, like every other Unix-seconds clock.
        assert_eq!(bot_text("x", -1)["message"]["timestamp"], -1);
    }

    #[test]
    fn bot_answers_one_several_or_none() {
        assert_eq!(bot_invite_agent(), json!({"event":"INVITE_AGENT"}));
        assert!(Outcome::bot_answers(Vec::new()).is_pass());
        assert_eq!(
            Outcome::bot_answers(vec![bot_invite_agent()]).action,
            Action::Reply(bot_invite_agent())
        );
        let two = vec![bot_text("a", 0), bot_invite_agent()];
        assert_eq!(
            Outcome::bot_answers(two.clone()).action,
            Action::Reply(Value::Array(two))
        );
    }

    #[test]
    fn response_success() {
        let r = |status| Response {
            status,
            body: String::new(),
        };
        assert!(r(200).is_success() && r(204).is_success());
        assert!(!r(302).is_success() && !r(500).is_success());
    }
}
