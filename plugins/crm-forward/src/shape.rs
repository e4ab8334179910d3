//! The record the CRM receives. For the channel message kinds
//! (`channel.customer_message`, `channel.agent_message`):
//!
//! ```json
//! {"source": "hub", "event_id": "…", "event": "channel.customer_message",
//!  "direction": "inbound" | "outbound", "channel": "…", "channel_id": 1,
//!  "chat_id": 2, "at": 1700000000000,
//!  "contact": {"external_id": "…", "name": "…", "email": "…", "phone": "…"},
//!  "author": {"type": "customer" | "agent", "name": "…"},
//!  "message": {"type": "text", "text": "…", "file": "…", "file_name": "…"}}
//! ```
//!
//! `contact` comes from `sender` for customer messages and holds only
//! `external_id` (from `recipient.id`, in the JSON type received) for agent
//! messages. Fields the event does not carry are left out rather than `null`,
//! so that a CRM merging records never blanks a known value; `channel`,
//! `channel_id` and `chat_id` are `null` when the event has none. A location
//! message also carries `latitude` and `longitude`.
//!
//! Any other kind is sent as `{"source", "event_id", "event", "direction",
//! "channel", "channel_id", "chat_id", "at", "data": <payload>}`.

use plugin_api::sdk::Event;
use serde_json::{Map, Value, json};

/// The CRM record of `event`.
pub fn record(event: &Event) -> Value {
    let mut record = json!({
        "source": "hub",
        "event_id": event.id,
        "event": event.kind,
        "direction": event.direction.as_str(),
        "channel": event.channel,
        "channel_id": event.channel_id,
        "chat_id": event.chat_id,
        "at": event.at,
    });
    let Value::Object(fields) = &mut record else {
        return record;
    };
    let payload = event.payload();
    match event.kind.as_str() {
        "channel.customer_message" => {
            let sender = payload.get("sender");
            let pick = |key: &str| sender.and_then(|s| s.get(key)).filter(|v| !v.is_null());
            fields.insert(
                "contact".to_owned(),
                object([
                    ("external_id", pick("id")),
                    ("name", pick("name")),
                    ("email", pick("email")),
                    ("phone", pick("phone")),
                ]),
            );
            fields.insert(
                "author".to_owned(),
                object([("type", Some(&json!("customer"))), ("name", pick("name"))]),
            );
            fields.insert("message".to_owned(), message(payload));
        }
        "channel.agent_message" => {
            let recipient = payload.pointer("/recipient/id").filter(|v| !v.is_null());
            let name = payload.pointer("/sender/name").filter(|v| !v.is_null());
            fields.insert("contact".to_owned(), object([("external_id", recipient)]));
            fields.insert(
                "author".to_owned(),
                object([("type", Some(&json!("agent"))), ("name", name)]),
            );
            fields.insert("message".to_owned(), message(payload));
        }
        _ => {
            fields.insert("data".to_owned(), payload.clone());
        }
    }
    record
}

/// The message fields a CRM timeline shows.
fn message(payload: &Value) -> Value {
    let Some(m) = payload.get("message") else {
        return Value::Object(Map::new());
    };
    let field = |key: &str| m.get(key).filter(|v| !v.is_null());
    // Some integrators name the file link `file_url`.
    let file = field("file").or_else(|| field("file_url"));
    object([
        ("type", field("type")),
        ("text", field("text")),
        ("file", file),
        ("file_name", field("file_name")),
        ("latitude", field("latitude")),
        ("longitude", field("longitude")),
    ])
}

/// An object of the fields that are present.
fn object<const N: usize>(fields: [(&str, Option<&Value>); N]) -> Value {
    let map = fields
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.clone())))
        .collect();
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::testing::event;

    #[test]
    fn customer_message() {
        let e = event(
            "channel.customer_message",
            json!({"sender":{"id":"c-9","name":"Eve","email":"eve@x.io","photo":"https://p"},
                   "message":{"type":"photo","file":"https://f/a.png","file_name":"a.png",
                              "file_size":5,"text":"look"}}),
        );
        assert_eq!(
            record(&e),
            json!({"source":"hub","event_id":"test-event","event":"channel.customer_message",
                   "direction":"inbound","channel":"test","channel_id":1,"chat_id":1,
                   "at":1_700_000_000_000_i64,
                   "contact":{"external_id":"c-9","name":"Eve","email":"eve@x.io"},
                   "author":{"type":"customer","name":"Eve"},
                   "message":{"type":"photo","text":"look","file":"https://f/a.png",
                              "file_name":"a.png"}})
        );
    }

    #[test]
    fn agent_message() {
        let mut e = event(
            "channel.agent_message",
            json!({"sender":{"name":"Ann"},"recipient":{"id":42},
                   "message":{"type":"text","text":"Hello"}}),
        );
        e.chat_id = None;
        let r = record(&e);
        assert_eq!(r["direction"], "outbound");
        assert_eq!(r["chat_id"], Value::Null);
        assert_eq!(r["contact"], json!({"external_id": 42}));
        assert_eq!(r["author"], json!({"type":"agent","name":"Ann"}));
        assert_eq!(r["message"], json!({"type":"text","text":"Hello"}));
    }

    #[test]
    fn other_kinds_carry_the_payload() {
        let e = event("channel.delivery_result", json!({"status": 500}));
        let r = record(&e);
        assert_eq!(r["data"], json!({"status": 500}));
        assert!(r.get("contact").is_none() && r.get("message").is_none());
        assert_eq!(r["event"], "channel.delivery_result");
    }

    #[test]
    fn odd_payloads_do_not_fail() {
        let e = event("channel.customer_message", json!("not an object"));
        let r = record(&e);
        assert_eq!(r["contact"], json!({}));
        assert_eq!(r["message"], json!({}));
    }
}
