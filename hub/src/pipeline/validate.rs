//! A changed payload or a reply from a plugin is held to the same rules as
//! the wire format of its event kind before it goes on.

use plugin_api::channel::{
    AgentMessage, AgentSender, Message, agent_message_body_from_value, customer_message_from_value,
};
use plugin_api::widget::OfflineMessageEvent;
use serde::Deserialize;
use serde_json::Value;

use crate::event::EventKind;
use crate::runtime::Action;

/// Holds a plugin's action to the rules of `kind`: a changed payload must be
/// a valid payload of the kind (and is normalised); a reply to a customer
/// message must be a message the hub can send.
pub fn action(kind: &EventKind, action: &mut Action) -> Result<(), String> {
    match action {
        Action::Continue(Some(changed)) => {
            *changed = payload(kind, std::mem::take(changed))?;
            Ok(())
        }
        Action::Reply(reply) if *kind == EventKind::CUSTOMER_MESSAGE => {
            auto_reply(reply.clone()).map(|_| ())
        }
        // A bot's answer: messages and provider events (`bot::parse_answers`).
        Action::Reply(reply) if *kind == EventKind::BOT_CLIENT_MESSAGE => {
            plugin_api::bot::parse_answers(reply, 0).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// Checks (and normalises) a plugin's replacement payload for `kind`.
pub fn payload(kind: &EventKind, value: Value) -> Result<Value, String> {
    let invalid = |e: String| format!("the changed payload is not a valid {kind}: {e}");
    if *kind == EventKind::CUSTOMER_MESSAGE || *kind == EventKind::CUSTOMER_TYPING {
        let message = customer_message_from_value(value).map_err(|e| invalid(e.0))?;
        if message.message.is_typing() != (*kind == EventKind::CUSTOMER_TYPING) {
            return Err(invalid(
                "a plugin may not turn a message into typing or back".into(),
            ));
        }
        serde_json::to_value(message).map_err(|e| invalid(e.to_string()))
    } else if *kind == EventKind::AGENT_MESSAGE || *kind == EventKind::AGENT_TYPING {
        let mut wire: AgentMessage =
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        let body = serde_json::to_value(&wire.message).map_err(|e| invalid(e.to_string()))?;
        let label = wire.message.label().map(str::to_owned);
        wire.message = agent_message_body_from_value(body).map_err(|e| invalid(e.0))?;
        if let Some(label) = label {
            wire.message.set_label(label);
        }
        if wire.message.is_typing() != (*kind == EventKind::AGENT_TYPING) {
            return Err(invalid(
                "a plugin may not turn a message into typing or back".into(),
            ));
        }
        serde_json::to_value(wire).map_err(|e| invalid(e.to_string()))
    } else if *kind == EventKind::OFFLINE_MESSAGE {
        let form = OfflineMessageEvent::from_value(value).map_err(invalid)?;
        serde_json::to_value(OfflineMessageEvent::from(&form)).map_err(|e| invalid(e.to_string()))
    } else if value.is_object() {
        Ok(value)
    } else {
        Err(invalid("payloads are JSON objects".into()))
    }
}

/// A plugin's answer to a customer message: a message sent to the customer
/// on the hub's behalf, optionally under a sender name of its own.
#[derive(Debug, Clone)]
pub struct AutoReply {
    pub sender: Option<AgentSender>,
    pub message: Message,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AutoReplyWire {
    #[serde(default)]
    sender: Option<AgentSender>,
    message: Value,
}

/// Reads a reply to `channel.customer_message`:
/// `{"sender": {"name", "photo"}?, "message": {"type": "text", "text": …}}`.
pub fn auto_reply(value: Value) -> Result<AutoReply, String> {
    let wire: AutoReplyWire = serde_json::from_value(value)
        .map_err(|e| format!("a reply to a customer message needs `message`: {e}"))?;
    let message = agent_message_body_from_value(wire.message).map_err(|e| e.0)?;
    if message.is_typing() {
        return Err("a reply cannot be a typing notification".into());
    }
    Ok(AutoReply {
        sender: wire.sender,
        message,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn changed_customer_messages_obey_the_channel_rules() {
        let ok = payload(
            &EventKind::CUSTOMER_MESSAGE,
            json!({"sender":{"id":7},"message":{"type":"text","text":"[card]"}}),
        )
        .unwrap();
        assert_eq!(ok["sender"]["id"], 7);
        let err = payload(
            &EventKind::CUSTOMER_MESSAGE,
            json!({"sender":{"id":""},"message":{"type":"text","text":"x"}}),
        )
        .unwrap_err();
        assert!(err.contains("sender.id"), "{err}");
        assert!(
            payload(
                &EventKind::CUSTOMER_MESSAGE,
                json!({"sender":{"id":1},"message":{"type":"typein"}})
            )
            .is_err()
        );
        assert!(
            payload(
                &EventKind::from("webhook.chat_accepted".to_owned()),
                json!([1])
            )
            .is_err()
        );
    }

    #[test]
    fn replies_need_a_real_message() {
        let r = auto_reply(json!({"sender":{"name":"Bot"},"message":{"type":"text","text":"Hi"}}))
            .unwrap();
        assert_eq!(r.sender.unwrap().name, "Bot");
        assert!(auto_reply(json!({"message":{"type":"text"}})).is_err());
        assert!(auto_reply(json!({"text":"Hi"})).is_err());
        assert!(auto_reply(json!({"message":{"type":"typein"}})).is_err());
    }
}
