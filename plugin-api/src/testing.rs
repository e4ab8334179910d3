//! A native stand-in for the hub, so a plugin's rules are unit-tested with
//! `cargo test` and no wasm runtime: in-memory KV, scripted sends, captured logs.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Value, json};

use crate::sdk::{Direction, Event, Host, LazyJson, Level, Response};

/// The answer scripted for one `send` call.
#[derive(Debug, Clone)]
enum Scripted {
    Answer(Response),
    Fail(String),
}

/// A [`Host`] that records what a plugin does.
///
/// Sends to a destination without a script fail like a not-granted destination
/// on the hub. Scripts for a destination are used in order; the last one repeats.
#[derive(Debug, Clone)]
pub struct FakeHost {
    config: Value,
    kv: BTreeMap<String, String>,
    kv_error: Option<String>,
    scripts: HashMap<String, VecDeque<Scripted>>,
    logs: Vec<(Level, String)>,
    sent: Vec<(String, Value)>,
}

impl FakeHost {
    /// A host granting KV and no destinations, with this plugin config.
    pub fn new(config: Value) -> Self {
        FakeHost {
            config,
            kv: BTreeMap::new(),
            kv_error: None,
            scripts: HashMap::new(),
            logs: Vec::new(),
            sent: Vec::new(),
        }
    }

    /// Scripts an answer of `destination` (which also grants it).
    #[must_use]
    pub fn respond(mut self, destination: &str, status: u16, body: &str) -> Self {
        let answer = Scripted::Answer(Response {
            status,
            body: body.to_owned(),
        });
        self.script(destination, answer);
        self
    }

    /// Scripts a failed call to `destination`, e.g. a connection error.
    #[must_use]
    pub fn fail_send(mut self, destination: &str, error: &str) -> Self {
        self.script(destination, Scripted::Fail(error.to_owned()));
        self
    }

    /// Makes every KV call fail, as when the plugin is not granted `kv`.
    #[must_use]
    pub fn without_kv(mut self) -> Self {
        self.kv_error = Some("kv is not granted to this plugin".to_owned());
        self
    }

    /// Pre-fills one KV entry.
    #[must_use]
    pub fn with_kv(mut self, key: &str, value: &str) -> Self {
        self.kv.insert(key.to_owned(), value.to_owned());
        self
    }

    /// The KV store as it is now.
    pub fn kv(&self) -> &BTreeMap<String, String> {
        &self.kv
    }

    /// Every line logged so far.
    pub fn logs(&self) -> &[(Level, String)] {
        &self.logs
    }

    /// Every `send` call so far (answered or not), as (destination, payload).
    pub fn sent(&self) -> &[(String, Value)] {
        &self.sent
    }

    /// Replaces the plugin config between calls.
    pub fn set_config(&mut self, config: Value) {
        self.config = config;
    }

    fn script(&mut self, destination: &str, answer: Scripted) {
        self.scripts
            .entry(destination.to_owned())
            .or_default()
            .push_back(answer);
    }

    fn kv_check(&self) -> Result<(), String> {
        match &self.kv_error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Host for FakeHost {
    fn log(&mut self, level: Level, message: &str) {
        self.logs.push((level, message.to_owned()));
    }

    fn config(&self) -> Value {
        self.config.clone()
    }

    fn kv_get(&mut self, key: &str) -> Result<Option<String>, String> {
        self.kv_check()?;
        Ok(self.kv.get(key).cloned())
    }

    fn kv_set(&mut self, key: &str, value: &str) -> Result<(), String> {
        self.kv_check()?;
        self.kv.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    fn kv_delete(&mut self, key: &str) -> Result<(), String> {
        self.kv_check()?;
        self.kv.remove(key);
        Ok(())
    }

    fn send(&mut self, destination: &str, payload: &Value) -> Result<Response, String> {
        self.sent.push((destination.to_owned(), payload.clone()));
        let Some(queue) = self.scripts.get_mut(destination) else {
            return Err(format!(
                "destination `{destination}` is not granted to this plugin"
            ));
        };
        let next = if queue.len() > 1 {
            queue.pop_front()
        } else {
            queue.front().cloned()
        };
        match next {
            Some(Scripted::Answer(r)) => Ok(r),
            Some(Scripted::Fail(e)) => Err(e),
            None => Err(format!("no answer scripted for `{destination}`")),
        }
    }
}

/// An event as the hub would hand it over: id `test-event`, channel 1 `test`,
/// chat 1, `at` 1 700 000 000 000, context `{"agents_online":1}`, and outbound
/// for `channel.agent_*` kinds, inbound otherwise.
pub fn event(kind: &str, payload: Value) -> Event {
    let direction = if kind.starts_with("channel.agent_") {
        Direction::Outbound
    } else {
        Direction::Inbound
    };
    Event {
        id: "test-event".to_owned(),
        kind: kind.to_owned(),
        direction,
        channel_id: Some(1),
        channel: Some("test".to_owned()),
        chat_id: Some(1),
        payload: LazyJson::value(payload),
        at: 1_700_000_000_000,
        context: LazyJson::value(json!({ "agents_online": 1 })),
    }
}

/// A `channel.customer_message` with a text from customer `sender_id`.
pub fn customer_text(sender_id: &str, text: &str) -> Event {
    event(
        "channel.customer_message",
        json!({
            "sender": { "id": sender_id, "name": "Customer" },
            "message": { "type": "text", "text": text },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_round_trip_and_denial() {
        let mut host = FakeHost::new(json!({})).with_kv("a", "1");
        assert_eq!(host.kv_get("a").unwrap().as_deref(), Some("1"));
        host.kv_set("b", "2").unwrap();
        host.kv_delete("a").unwrap();
        assert_eq!(host.kv_get("a").unwrap(), None);
        assert_eq!(host.kv().get("b").map(String::as_str), Some("2"));

        let mut denied = FakeHost::new(json!({})).without_kv();
        assert!(denied.kv_get("a").is_err());
        assert!(denied.kv_set("a", "1").is_err());
        assert!(denied.kv().is_empty());
    }

    #[test]
    fn sends_follow_scripts() {
        let mut host = FakeHost::new(json!({}))
            .respond("crm", 500, "oops")
            .respond("crm", 200, "ok")
            .fail_send("down", "connection refused");
        let p = json!({"x":1});
        assert_eq!(host.send("crm", &p).unwrap().status, 500);
        assert_eq!(host.send("crm", &p).unwrap().status, 200);
        assert_eq!(host.send("crm", &p).unwrap().body, "ok");
        assert_eq!(host.send("down", &p).unwrap_err(), "connection refused");
        let err = host.send("elsewhere", &p).unwrap_err();
        assert!(err.contains("not granted"), "{err}");
        assert_eq!(host.sent().len(), 5);
        assert_eq!(host.sent()[0], ("crm".to_owned(), p));
    }

    #[test]
    fn logs_and_config() {
        let mut host = FakeHost::new(json!({"k":"v"}));
        host.log(Level::Warn, "careful");
        assert_eq!(host.logs(), &[(Level::Warn, "careful".to_owned())]);
        assert_eq!(host.config()["k"], "v");
        host.set_config(json!({}));
        assert_eq!(host.config(), json!({}));
    }

    #[test]
    fn event_defaults() {
        let e = event("channel.agent_message", json!({}));
        assert_eq!(e.direction, Direction::Outbound);
        assert_eq!(e.agents_online(), Some(1));
        assert_eq!(
            event("channel.customer_message", json!({})).direction,
            Direction::Inbound
        );
        let c = customer_text("42", "hello");
        assert_eq!(c.message_text(), Some("hello"));
        assert!(c.payload_as::<crate::channel::CustomerMessage>().is_ok());
    }
}
