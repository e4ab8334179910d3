//! Properties of the bot exchange's parsers: what a provider posts
//! (`http::bots::parse_event`, the edge's whole reading of a body) and what a
//! plugin bot replies (`plugin_api::bot::parse_answers`, and the pipeline's
//! check of it).

use http::StatusCode;
use plugin_api::bot::{
    BotAnswer, BotEvent, BotMessage, Button, ButtonsMessage, ClientInfo, Contacts, InviteAgent,
    MAX_BUTTONS, MarkdownMessage, Message, TextMessage, Timestamp, parse_answers,
};
use plugin_api::lenient::Label;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{
    PathStep, any_body, any_json, any_text, assert_readable, raw_json, remove_at, set_at,
    unknown_key, wrong_type,
};
use crate::event::EventKind;
use crate::http::bots::parse_event;
use crate::pipeline::check_action;
use crate::runtime::Action;

const FROM_PROVIDERS: [&str; 3] = ["BOT_MESSAGE", "INVITE_AGENT", "CLIENT_INFO"];

fn label() -> BoxedStrategy<Label> {
    any_text().prop_map(Label).boxed()
}

fn timestamp() -> BoxedStrategy<Timestamp> {
    prop_oneof![
        any::<i64>().prop_map(Timestamp::from_unix),
        any::<u32>().prop_map(|n| Timestamp::Text(n.to_string())),
        any_text().prop_map(Timestamp::Text),
    ]
    .boxed()
}

fn button() -> BoxedStrategy<Button> {
    (any_text(), proptest::option::of(label()))
        .prop_map(|(text, id)| Button { text, id })
        .boxed()
}

fn message() -> BoxedStrategy<Message> {
    let text = (any_text(), proptest::option::of(label()), timestamp()).prop_map(
        |(text, button_id, timestamp)| {
            Message::Text(TextMessage {
                text,
                button_id,
                timestamp,
            })
        },
    );
    let markdown = (
        any_text(),
        any_text(),
        proptest::option::of(label()),
        timestamp(),
    )
        .prop_map(|(content, text, button_id, timestamp)| {
            Message::Markdown(MarkdownMessage {
                content,
                text,
                button_id,
                timestamp,
            })
        });
    let buttons = (
        any_text(),
        any_text(),
        prop::collection::vec(button(), 0..=MAX_BUTTONS),
        timestamp(),
    )
        .prop_map(|(title, text, buttons, timestamp)| {
            Message::Buttons(ButtonsMessage {
                title,
                text,
                buttons,
                timestamp,
            })
        });
    prop_oneof![text, markdown, buttons].boxed()
}

fn contacts() -> BoxedStrategy<Contacts> {
    let opt = || proptest::option::of(any_text());
    (opt(), opt(), opt(), opt())
        .prop_map(|(name, email, phone, description)| Contacts {
            name,
            email,
            phone,
            description,
        })
        .boxed()
}

/// An event a provider may send, valid by the interface.
fn provider_event() -> BoxedStrategy<BotEvent> {
    let ids = || {
        (
            proptest::option::of(label()),
            proptest::option::of(label()),
            label(),
        )
    };
    let bot_message = (ids(), message()).prop_map(|((id, client_id, chat_id), message)| {
        BotEvent::BotMessage(BotMessage {
            id,
            client_id,
            chat_id,
            message,
        })
    });
    let invite = ids().prop_map(|(id, client_id, chat_id)| {
        BotEvent::InviteAgent(InviteAgent {
            id,
            client_id,
            chat_id,
        })
    });
    let info = (
        ids(),
        proptest::option::of(contacts()),
        proptest::option::of(contacts()),
        contacts(),
    )
        .prop_map(
            |((id, client_id, chat_id), client_info, contact_info, top_level)| {
                BotEvent::ClientInfo(ClientInfo {
                    id,
                    client_id,
                    chat_id,
                    client_info,
                    contact_info,
                    top_level,
                })
            },
        );
    prop_oneof![3 => bot_message, 1 => invite, 1 => info].boxed()
}

/// Required fields of `event`'s wire form: what is refused when it is dropped.
fn required_of(event: &BotEvent) -> Vec<Vec<PathStep>> {
    use PathStep::{Index, Key};
    let mut out = vec![vec![Key("event")], vec![Key("chat_id")]];
    if let BotEvent::BotMessage(m) = event {
        out.push(vec![Key("message")]);
        out.push(vec![Key("message"), Key("type")]);
        let msg = |k: &'static str| vec![Key("message"), Key(k)];
        match &m.message {
            Message::Text(_) => out.push(msg("text")),
            Message::Markdown(_) => out.push(msg("content")),
            Message::Buttons(b) => {
                out.push(msg("buttons"));
                for i in 0..b.buttons.len() {
                    out.push(vec![Key("message"), Key("buttons"), Index(i), Key("text")]);
                }
            }
        }
    }
    out
}

/// Optional fields that may be present in `event`'s wire form.
fn optional_of(event: &BotEvent) -> Vec<Vec<PathStep>> {
    use PathStep::Key;
    let mut out = vec![vec![Key("id")], vec![Key("client_id")]];
    match event {
        BotEvent::BotMessage(m) => {
            out.push(vec![Key("message"), Key("timestamp")]);
            out.push(vec![Key("message"), Key("button_id")]);
            if !matches!(m.message, Message::Text(_)) {
                out.push(vec![Key("message"), Key("text")]);
            }
            if matches!(m.message, Message::Buttons(_)) {
                out.push(vec![Key("message"), Key("title")]);
            }
        }
        BotEvent::ClientInfo(_) => {
            for k in ["client_info", "contact_info", "name", "email", "phone"] {
                out.push(vec![Key(k)]);
            }
        }
        _ => {}
    }
    out
}

fn last_key(path: &[PathStep]) -> &'static str {
    match path.last() {
        Some(PathStep::Key(k)) => k,
        _ => "",
    }
}

fn parse(v: &Value) -> Result<(BotEvent, Value), (StatusCode, String)> {
    parse_event(v.to_string().as_bytes())
}

/// A provider body whose fields hold arbitrary values.
fn shaped_body() -> BoxedStrategy<Value> {
    let event = prop_oneof![
        4 => prop::sample::select(vec![
            "BOT_MESSAGE",
            "INVITE_AGENT",
            "CLIENT_INFO",
            "CLIENT_MESSAGE",
            "AGENT_JOINED",
            "CHAT_CLOSED",
            "bot_message",
        ])
        .prop_map(Value::from),
        1 => any_json(),
    ];
    let message = (
        prop_oneof![
            3 => prop::sample::select(vec!["TEXT", "MARKDOWN", "BUTTONS", "text"]).prop_map(Value::from),
            1 => any_json(),
        ],
        prop::collection::vec(
            (
                prop::sample::select(vec![
                    "text",
                    "content",
                    "buttons",
                    "title",
                    "button_id",
                    "timestamp",
                ]),
                any_json(),
            ),
            0..5,
        ),
    );
    let top = prop::collection::vec(
        (
            prop::sample::select(vec![
                "id",
                "client_id",
                "chat_id",
                "client_info",
                "contact_info",
                "name",
                "phone",
            ]),
            any_json(),
        ),
        0..5,
    );
    (event, message, top, any::<bool>())
        .prop_map(|(event, (kind, fields), top, with_message)| {
            let mut root: serde_json::Map<String, Value> =
                top.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            root.insert("event".to_owned(), event);
            if with_message {
                let mut m: serde_json::Map<String, Value> =
                    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                m.insert("type".to_owned(), kind);
                root.insert("message".to_owned(), Value::Object(m));
            }
            Value::Object(root)
        })
        .boxed()
}

/// A refusal is one of the two statuses the edge gives for a body, with a reason.
fn assert_refusal(body: &[u8], status: StatusCode, reason: &str) {
    assert_readable(reason);
    let event = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("event").and_then(Value::as_str).map(str::to_owned));
    let foreign = event.is_some_and(|e| !FROM_PROVIDERS.contains(&e.as_str()));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        assert!(foreign, "405 for an event providers send: {reason}");
    } else {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}");
    }
}

/// What every accepted event holds, whatever was sent.
fn assert_sound(event: &BotEvent, payload: &Value) {
    assert!(FROM_PROVIDERS.contains(&event.event_name()));
    assert_eq!(payload["event"], event.event_name());
    if let BotEvent::BotMessage(m) = event {
        if let Message::Buttons(b) = &m.message {
            assert!(b.buttons.len() <= MAX_BUTTONS);
        }
        // What the hub derives from a message for customers and agents.
        let _ = m.message.customer_text();
        let _ = m.message.display_text();
        let _ = m.message.button_for("yes");
        let _ = m.message.timestamp().unix_seconds();
        assert!(payload["message"].get("timestamp").is_some());
    }
    if let BotEvent::ClientInfo(info) = event {
        let _ = info.contacts();
    }
}

proptest! {
    #![proptest_config(super::config())]

    /// (a) Any body is answered, never with a panic: an event, or a 400 or
    /// 405 with a reason.
    #[test]
    fn any_body_is_answered(body in any_body()) {
        match parse_event(&body) {
            Ok((event, payload)) => assert_sound(&event, &payload),
            Err((status, reason)) => assert_refusal(&body, status, &reason),
        }
    }

    /// (a) Arbitrary values in every field of the shape.
    #[test]
    fn arbitrary_fields_are_answered(body in shaped_body()) {
        let bytes = body.to_string().into_bytes();
        match parse_event(&bytes) {
            Ok((event, payload)) => assert_sound(&event, &payload),
            Err((status, reason)) => assert_refusal(&bytes, status, &reason),
        }
    }

    /// (a) A key twice in one object is refused naming the key.
    #[test]
    fn duplicate_keys_are_refused_by_name(raw in raw_json()) {
        let text = raw.text();
        if let Some(dup) = plugin_api::json::duplicate_key(text.as_bytes()) {
            let (status, reason) = parse_event(text.as_bytes()).unwrap_err();
            prop_assert_eq!(status, StatusCode::BAD_REQUEST);
            prop_assert!(reason.contains(&dup.to_string()), "{}", reason);
        }
    }

    /// (a) A plugin bot's reply, whatever it is, is read or refused with a reason.
    #[test]
    fn plugin_bot_replies_are_answered(
        reply in prop_oneof![any_json(), shaped_body(), prop::collection::vec(shaped_body(), 0..7).prop_map(Value::Array)],
        now in any::<i64>(),
    ) {
        match parse_answers(&reply, now) {
            Ok(answers) => {
                prop_assert!(!answers.is_empty() && answers.len() <= plugin_api::bot::MAX_ANSWERS);
                for a in answers {
                    if let BotAnswer::Message(m) = a {
                        let _ = m.display_text();
                    }
                }
            }
            Err(e) => assert_readable(&e),
        }
        let mut action = Action::Reply(reply);
        let _ = check_action(&EventKind::BOT_CLIENT_MESSAGE, &mut action);
    }

    /// (b) A required field dropped is refused naming it; an optional one
    /// dropped is accepted (a missing `timestamp` gets the arrival time).
    #[test]
    fn dropped_fields(event in provider_event(), pick in any::<prop::sample::Index>(), required in any::<bool>()) {
        let wire = serde_json::to_value(&event).unwrap();
        let fields = if required { required_of(&event) } else { optional_of(&event) };
        let path = &fields[pick.index(fields.len())];
        let mut broken = wire;
        if !remove_at(&mut broken, path) {
            return Ok(());
        }
        match parse(&broken) {
            Err((status, reason)) => {
                prop_assert!(required, "optional {:?} dropped: {}", path, reason);
                prop_assert_eq!(status, StatusCode::BAD_REQUEST);
                prop_assert!(
                    reason.contains(&format!("`{}`", last_key(path))),
                    "{} does not name {:?}", reason, path
                );
            }
            Ok((parsed, payload)) => {
                prop_assert!(!required, "required {:?} dropped, accepted", path);
                prop_assert_eq!(parsed.chat_id(), event.chat_id());
                prop_assert_eq!(parsed.event_name(), event.event_name());
                if last_key(path) == "timestamp" {
                    prop_assert!(payload["message"]["timestamp"].is_i64());
                }
            }
        }
    }

    /// (b) A field of the wrong type is refused with a 400 and a reason; the
    /// edge names the field for `event` (serde's own reasons for the others
    /// name the expected type, not the field).
    #[test]
    fn wrong_types_are_refused(
        event in provider_event(),
        pick in any::<prop::sample::Index>(),
        wrong in wrong_type(&["string", "number", "null"]),
    ) {
        let wire = serde_json::to_value(&event).unwrap();
        let fields = required_of(&event);
        let path = &fields[pick.index(fields.len())];
        let mut broken = wire;
        set_at(&mut broken, path, wrong);
        let (status, reason) = parse(&broken).expect_err("a wrong type was accepted");
        prop_assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_readable(&reason);
        if last_key(path) == "event" {
            prop_assert!(reason.contains("`event`"), "{}", reason);
        }
    }

    /// (b) More buttons than the interface allows are refused naming the limit.
    #[test]
    fn too_many_buttons(
        (chat_id, title, buttons) in (label(), any_text(), prop::collection::vec(button(), MAX_BUTTONS + 1..12)),
    ) {
        let event = BotEvent::BotMessage(BotMessage {
            id: None,
            client_id: None,
            chat_id,
            message: Message::Buttons(ButtonsMessage {
                title,
                text: String::new(),
                buttons,
                timestamp: Timestamp::from_unix(1),
            }),
        });
        let (status, reason) = parse(&serde_json::to_value(&event).unwrap()).unwrap_err();
        prop_assert_eq!(status, StatusCode::BAD_REQUEST);
        prop_assert!(reason.contains(&format!("at most {MAX_BUTTONS} buttons")), "{}", reason);
    }

    /// (b) Unknown fields at the top, in the message and in a button are ignored.
    #[test]
    fn unknown_fields_are_ignored(
        event in provider_event(),
        key in unknown_key(),
        value in any_json(),
        at in 0..3usize,
    ) {
        let mut wire = serde_json::to_value(&event).unwrap();
        let path: Vec<PathStep> = match at {
            0 => vec![],
            1 => vec![PathStep::Key("message")],
            _ => vec![PathStep::Key("message"), PathStep::Key("buttons"), PathStep::Index(0)],
        };
        if let Some(o) = super::at_mut(&mut wire, &path).and_then(Value::as_object_mut) {
            o.insert(key, value);
        }
        let (parsed, _) = parse(&wire).unwrap();
        prop_assert_eq!(parsed, event);
    }

    /// (c) A valid event is read as generated, and the recorded payload is the body.
    #[test]
    fn valid_events_round_trip(event in provider_event()) {
        let wire = serde_json::to_value(&event).unwrap();
        let (parsed, payload) = parse(&wire).unwrap();
        prop_assert_eq!(&parsed, &event);
        prop_assert_eq!(payload, wire.clone());
        // A plugin bot answering with the same event asks for the same.
        let answers = parse_answers(&wire, 0).unwrap();
        let expected = match &event {
            BotEvent::BotMessage(m) => BotAnswer::Message(m.message.clone()),
            BotEvent::InviteAgent(_) => BotAnswer::InviteAgent,
            BotEvent::ClientInfo(info) => BotAnswer::ClientInfo(info.contacts()),
            other => panic!("not a provider's event: {other:?}"),
        };
        prop_assert_eq!(answers, vec![expected]);
    }

    /// (c) A message without `timestamp` gets one, and is otherwise as sent.
    #[test]
    fn missing_timestamps_are_filled(chat_id in label(), text in any_text()) {
        let body = json!({"event": "BOT_MESSAGE", "chat_id": chat_id, "message": {"type": "TEXT", "text": text}});
        let (parsed, payload) = parse(&body).unwrap();
        let BotEvent::BotMessage(m) = parsed else { panic!("not a BOT_MESSAGE") };
        prop_assert_eq!(m.message.plain_text(), text.as_str());
        prop_assert!(m.message.timestamp().unix_seconds().is_some());
        prop_assert!(payload["message"]["timestamp"].is_i64());
    }
}
