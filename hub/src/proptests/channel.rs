//! Properties of the channel's customer-message parser
//! (`plugin_api::channel::parse_customer_message`, what `http::channel`
//! runs on every body), of the agent API's message bodies
//! (`agent_message_body_from_value` behind `parse_json`), and of the
//! pipeline's check of payloads and replies plugins hand back.

use plugin_api::channel::{
    CustomerMessage, CustomerSender, Location, MAX_TEXT_CHARS, Media, Message, Text,
    agent_message_body_from_value, customer_message_from_value, parse_customer_message,
};
use plugin_api::lenient::{ExternalId, Label};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    PathStep, any_body, any_json, any_text, assert_readable, http_url, non_blank, raw_json,
    remove_at, set_at, unknown_key, wrong_type,
};
use crate::event::EventKind;
use crate::pipeline::{auto_reply, check_action};
use crate::runtime::Action;

const TYPES: [&str; 10] = [
    "text", "video", "audio", "voice", "photo", "sticker", "document", "location", "typein",
    "typeout",
];

fn cut(text: &str) -> String {
    text.chars().take(MAX_TEXT_CHARS).collect()
}

fn external_id() -> BoxedStrategy<ExternalId> {
    prop_oneof![
        any::<i64>().prop_map(ExternalId::Int),
        non_blank().prop_map(ExternalId::Str),
    ]
    .boxed()
}

fn label() -> BoxedStrategy<Option<Label>> {
    proptest::option::of(any_text().prop_map(Label)).boxed()
}

fn sender() -> BoxedStrategy<CustomerSender> {
    let profile = || proptest::option::of(non_blank());
    (
        external_id(),
        (profile(), profile(), profile()),
        proptest::option::of(http_url(true)),
        (profile(), profile()),
    )
        .prop_map(
            |(id, (name, phone, email), photo, (url, invite))| CustomerSender {
                id,
                name,
                phone,
                email,
                photo,
                url,
                invite,
            },
        )
        .boxed()
}

fn positive() -> BoxedStrategy<u64> {
    prop_oneof![1..1000u64, 1..=u64::MAX].boxed()
}

fn media() -> BoxedStrategy<Media> {
    let opt = || proptest::option::of(any_text());
    (
        (label(), http_url(true), any_text(), positive()),
        (
            proptest::option::of(http_url(true)),
            opt(),
            proptest::option::of(positive()),
        ),
        (
            proptest::option::of(positive()),
            proptest::option::of(positive()),
        ),
        (opt(), opt(), opt()),
    )
        .prop_map(
            |(
                (id, file, file_name, file_size),
                (thumb, emoji, duration),
                (width, height),
                (text, performer, title),
            )| Media {
                id,
                file,
                file_name,
                file_size,
                thumb,
                emoji,
                duration,
                width,
                height,
                text,
                performer,
                title,
            },
        )
        .boxed()
}

/// A valid message body, as the parser leaves it (text within the limit).
fn message() -> BoxedStrategy<Message> {
    let text = (label(), non_blank()).prop_map(|(id, t)| {
        // Cut on the generated side so the round trip compares like with like;
        // a cut that leaves only blanks is padded back to a real text.
        let t = cut(&t);
        let text = if t.trim().is_empty() {
            "x".to_owned()
        } else {
            t
        };
        Message::Text(Text { id, text })
    });
    // Micro-degrees, as devices report them: such decimals read back exactly
    // (see `exact_number`; `long_coordinates_are_close` covers the rest).
    let degrees =
        |bound: i64| (-bound * 1_000_000..=bound * 1_000_000).prop_map(|n| n as f64 / 1e6);
    let location = (
        label(),
        degrees(90),
        degrees(180),
        proptest::option::of(any_text()),
        proptest::option::of(any_text()),
    )
        .prop_map(|(id, latitude, longitude, text, title)| {
            Message::Location(Location {
                id,
                latitude,
                longitude,
                text,
                title,
            })
        });
    let media = (0..6usize, media()).prop_map(|(kind, m)| match kind {
        0 => Message::Video(m),
        1 => Message::Audio(m),
        2 => Message::Voice(m),
        3 => Message::Photo(m),
        4 => Message::Sticker(m),
        _ => Message::Document(m),
    });
    prop_oneof![
        3 => text,
        3 => media,
        1 => location,
        1 => Just(Message::Typein),
        1 => Just(Message::Typeout),
    ]
    .boxed()
}

fn customer_message() -> BoxedStrategy<CustomerMessage> {
    (sender(), message())
        .prop_map(|(sender, message)| CustomerMessage { sender, message })
        .boxed()
}

/// What a field of the wire accepts, and so what breaks it.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// `sender`, `message`.
    Object,
    /// `sender.id`: a non-empty string or an integer.
    Id,
    /// `message.type`.
    Type,
    /// `message.id`: a string or a number.
    Label,
    /// Optional or required strings; `null` is absent.
    Text,
    /// `file_size`, `duration`, `width`, `height`.
    Positive,
    /// `latitude`, `longitude`: a number or a numeric string.
    Coordinate,
}

impl Field {
    fn wrong(self) -> BoxedStrategy<Value> {
        match self {
            Field::Object => wrong_type(&["object"]),
            Field::Id => prop_oneof![
                wrong_type(&["null", "string", "number"]),
                Just(json!(1.5)),
                Just(json!(u64::MAX)),
            ]
            .boxed(),
            Field::Type => wrong_type(&["string"]),
            Field::Label => wrong_type(&["null", "string", "number"]),
            Field::Text => wrong_type(&["null", "string"]),
            Field::Positive => prop_oneof![
                wrong_type(&["null", "number"]),
                Just(json!(0)),
                Just(json!(-3)),
                Just(json!(2.5)),
            ]
            .boxed(),
            Field::Coordinate => prop_oneof![
                wrong_type(&["null", "number", "string"]),
                Just(json!("north")),
                Just(json!(1000)),
            ]
            .boxed(),
        }
    }
}

/// Every field of `message`'s wire form, with what it accepts and whether it is required.
fn fields_of(m: &CustomerMessage) -> Vec<(Vec<PathStep>, Field, bool)> {
    use PathStep::Key;
    let mut out = vec![
        (vec![Key("sender")], Field::Object, true),
        (vec![Key("message")], Field::Object, true),
        (vec![Key("sender"), Key("id")], Field::Id, true),
        (vec![Key("message"), Key("type")], Field::Type, true),
    ];
    for key in ["name", "phone", "email", "photo", "url", "invite"] {
        out.push((vec![Key("sender"), Key(key)], Field::Text, false));
    }
    let msg = |k: &'static str| vec![Key("message"), Key(k)];
    match &m.message {
        Message::Typein | Message::Typeout => {}
        Message::Text(_) => {
            out.push((msg("id"), Field::Label, false));
            out.push((msg("text"), Field::Text, true));
        }
        Message::Location(_) => {
            out.push((msg("id"), Field::Label, false));
            out.push((msg("latitude"), Field::Coordinate, true));
            out.push((msg("longitude"), Field::Coordinate, true));
            out.push((msg("text"), Field::Text, false));
            out.push((msg("title"), Field::Text, false));
        }
        _ => {
            out.push((msg("id"), Field::Label, false));
            for (key, required) in [("file", true), ("file_name", true)] {
                out.push((msg(key), Field::Text, required));
            }
            out.push((msg("file_size"), Field::Positive, true));
            for key in ["thumb", "emoji", "text", "performer", "title"] {
                out.push((msg(key), Field::Text, false));
            }
            for key in ["duration", "width", "height"] {
                out.push((msg(key), Field::Positive, false));
            }
        }
    }
    out
}

/// `sender.id`, `message.file_size`: how the parser names a field in its reasons.
fn dotted(path: &[PathStep]) -> String {
    path.iter()
        .filter_map(|s| match s {
            PathStep::Key(k) => Some(*k),
            PathStep::Index(_) => None,
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn parse_value(v: &Value) -> Result<CustomerMessage, String> {
    parse_customer_message(v.to_string().as_bytes()).map_err(|e| e.0)
}

/// A message body whose fields hold arbitrary values, so every branch of the
/// parser meets them.
fn shaped_body() -> BoxedStrategy<Value> {
    let sender = prop::collection::vec(
        (
            prop::sample::select(vec![
                "id", "name", "phone", "email", "photo", "url", "invite",
            ]),
            any_json(),
        ),
        0..5,
    );
    let message = (
        prop_oneof![
            4 => prop::sample::select(TYPES.to_vec()).prop_map(Value::from),
            1 => any_json(),
        ],
        prop::collection::vec(
            (
                prop::sample::select(vec![
                    "id",
                    "text",
                    "file",
                    "file_url",
                    "file_name",
                    "file_size",
                    "thumb",
                    "emoji",
                    "duration",
                    "width",
                    "height",
                    "latitude",
                    "longitude",
                    "title",
                    "performer",
                ]),
                any_json(),
            ),
            0..8,
        ),
    );
    (sender, message)
        .prop_map(|(sender, (kind, fields))| {
            let mut m: serde_json::Map<String, Value> =
                fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            m.insert("type".to_owned(), kind);
            let s: serde_json::Map<String, Value> =
                sender.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            json!({ "sender": s, "message": m })
        })
        .boxed()
}

/// What every accepted message holds, whatever was sent.
fn assert_sound(m: &CustomerMessage) {
    assert!(!m.sender.id.is_empty(), "an empty sender.id passed");
    for url in [&m.sender.photo].into_iter().flatten() {
        assert!(url.trim_start().to_ascii_lowercase().starts_with("http"));
    }
    match &m.message {
        Message::Text(t) => {
            assert!(t.text.chars().count() <= MAX_TEXT_CHARS);
            assert!(!t.text.trim().is_empty());
        }
        Message::Location(l) => {
            assert!(l.latitude.is_finite() && l.latitude.abs() <= 90.0);
            assert!(l.longitude.is_finite() && l.longitude.abs() <= 180.0);
        }
        Message::Typein | Message::Typeout => {}
        Message::Video(x)
        | Message::Audio(x)
        | Message::Voice(x)
        | Message::Photo(x)
        | Message::Sticker(x)
        | Message::Document(x) => {
            assert!(x.file_size > 0);
            assert!(x.duration.is_none_or(|d| d > 0));
            assert!(x.width.is_none_or(|d| d > 0));
            assert!(x.height.is_none_or(|d| d > 0));
        }
    }
}

proptest! {
    #![proptest_config(super::config())]

    /// (a) Any body is answered, never with a panic; a refusal says why.
    #[test]
    fn any_body_is_answered(body in any_body()) {
        match parse_customer_message(&body) {
            Ok(m) => assert_sound(&m),
            Err(e) => assert_readable(&e.0),
        }
    }

    /// (a) A body with a key twice in one object is refused naming the key,
    /// whatever else is wrong after it.
    #[test]
    fn duplicate_keys_are_refused_by_name(raw in raw_json()) {
        let text = raw.text();
        if let Some(dup) = plugin_api::json::duplicate_key(text.as_bytes()) {
            let err = parse_customer_message(text.as_bytes()).unwrap_err();
            prop_assert_eq!(err.0, dup.to_string());
            prop_assert!(dup.to_string().contains(&dup.key));
        }
    }

    /// (a) Arbitrary values in every field of the shape: never a panic, and
    /// what is accepted keeps every rule of the spec.
    #[test]
    fn arbitrary_fields_keep_the_rules(body in shaped_body()) {
        match parse_value(&body) {
            Ok(m) => assert_sound(&m),
            Err(e) => assert_readable(&e),
        }
        // A plugin returning the same value meets the same rules.
        let _ = customer_message_from_value(body.clone());
        if let Some(message) = body.get("message") {
            let _ = agent_message_body_from_value(message.clone());
        }
    }

    /// (a) The agent API's message body: any body is answered.
    #[test]
    fn agent_bodies_are_answered(body in any_body()) {
        let parsed: Result<Value, String> = crate::http::respond::parse_json(&body);
        match parsed {
            Ok(v) => {
                if let Err(e) = agent_message_body_from_value(v) {
                    assert_readable(&e.0);
                }
            }
            Err(e) => assert_readable(&e),
        }
    }

    /// (a) What a plugin hands back for a channel event is checked, never a panic.
    #[test]
    fn plugin_payloads_and_replies_are_checked(
        value in prop_oneof![any_json(), shaped_body()],
        kind in prop::sample::select(vec![
            EventKind::CUSTOMER_MESSAGE,
            EventKind::CUSTOMER_TYPING,
            EventKind::AGENT_MESSAGE,
            EventKind::AGENT_TYPING,
            EventKind::OFFLINE_MESSAGE,
        ]),
    ) {
        let mut changed = Action::Continue(Some(value.clone()));
        if let Err(e) = check_action(&kind, &mut changed) {
            assert_readable(&e);
        }
        let mut reply = Action::Reply(value.clone());
        let _ = check_action(&kind, &mut reply);
        if let Ok(r) = auto_reply(value) {
            prop_assert!(!r.message.is_typing());
        }
    }

    /// (b) A required field dropped is refused naming it; an optional one
    /// dropped leaves the rest as it was.
    #[test]
    fn dropped_fields(m in customer_message(), pick in any::<prop::sample::Index>()) {
        let wire = serde_json::to_value(&m).unwrap();
        let fields = fields_of(&m);
        let (path, _, required) = &fields[pick.index(fields.len())];
        let mut broken = wire.clone();
        if !remove_at(&mut broken, path) {
            // An optional field the generated message did not have.
            return Ok(());
        }
        match parse_value(&broken) {
            Err(e) => {
                prop_assert!(*required, "optional {} dropped: {}", dotted(path), e);
                prop_assert!(e.contains(&dotted(path)), "{e} does not name {}", dotted(path));
            }
            Ok(parsed) => {
                prop_assert!(!required, "required {} dropped, accepted", dotted(path));
                prop_assert_eq!(serde_json::to_value(&parsed).unwrap(), broken);
            }
        }
    }

    /// (b) A field of the wrong type is refused, naming the field.
    #[test]
    fn wrong_types_are_refused_by_name(
        (m, pick, wrong) in customer_message().prop_flat_map(|m| {
            let n = fields_of(&m).len();
            (Just(m), 0..n).prop_flat_map(|(m, i)| {
                let field = fields_of(&m)[i].1;
                (Just(m), Just(i), field.wrong())
            })
        }),
    ) {
        let wire = serde_json::to_value(&m).unwrap();
        let (path, _, _) = &fields_of(&m)[pick];
        let mut broken = wire;
        set_at(&mut broken, path, wrong.clone());
        let err = parse_value(&broken).expect_err("a wrong type was accepted");
        prop_assert!(
            err.contains(&dotted(path)),
            "{} = {} refused as {:?}, without naming it", dotted(path), wrong, err
        );
    }

    /// (b) Text past the limit is cut to it (in characters); other strings
    /// have no limit but the body's size and are kept whole.
    #[test]
    fn long_strings(m in customer_message(), extra in 1..3000usize, c in any::<char>()) {
        let mut wire = serde_json::to_value(&m).unwrap();
        let long: String = std::iter::repeat_n(c, MAX_TEXT_CHARS + extra).collect();
        let long = format!("x{long}");
        match &m.message {
            Message::Text(_) => {
                set_at(&mut wire, &[PathStep::Key("message"), PathStep::Key("text")], json!(long));
                let parsed = parse_value(&wire).unwrap();
                let Message::Text(t) = parsed.message else { panic!("not text") };
                prop_assert_eq!(t.text, cut(&long));
            }
            _ => {
                set_at(&mut wire, &[PathStep::Key("sender"), PathStep::Key("name")], json!(long));
                let parsed = parse_value(&wire).unwrap();
                prop_assert_eq!(parsed.sender.name, Some(long));
            }
        }
    }

    /// (b) Unknown fields anywhere are ignored: integrators add their own.
    #[test]
    fn unknown_fields_are_ignored(
        m in customer_message(),
        key in unknown_key(),
        value in any_json(),
        at in 0..3usize,
    ) {
        let mut wire = serde_json::to_value(&m).unwrap();
        let path: Vec<PathStep> = match at {
            0 => vec![],
            1 => vec![PathStep::Key("sender")],
            _ => vec![PathStep::Key("message")],
        };
        if let Some(o) = super::at_mut(&mut wire, &path).and_then(Value::as_object_mut) {
            o.insert(key, value);
        }
        prop_assert_eq!(parse_value(&wire).unwrap(), m);
    }

    /// (c) A valid message is read as generated, and what the hub stores
    /// (its serialization) reads back the same, so a plugin's unchanged
    /// payload passes the pipeline's check unchanged.
    #[test]
    fn valid_messages_round_trip(m in customer_message()) {
        let wire = serde_json::to_value(&m).unwrap();
        let parsed = parse_customer_message(wire.to_string().as_bytes()).unwrap();
        prop_assert_eq!(&parsed, &m);
        let kind = if m.message.is_typing() {
            EventKind::CUSTOMER_TYPING
        } else {
            EventKind::CUSTOMER_MESSAGE
        };
        let mut action = Action::Continue(Some(wire.clone()));
        check_action(&kind, &mut action).unwrap();
        let Action::Continue(Some(checked)) = action else { panic!("action changed") };
        // The ingress reads a checked payload back with serde alone.
        prop_assert_eq!(&CustomerMessage::deserialize(&checked).unwrap(), &m);
        prop_assert_eq!(checked, wire);
    }

    /// (c) Coordinates of any precision are read to within a unit or two in
    /// the last place (serde_json's fast float reading), never out of range.
    #[test]
    fn long_coordinates_are_close(lat in -90.0..=90.0f64, lon in -180.0..=180.0f64) {
        let body = json!({"sender": {"id": 1}, "message": {"type": "location", "latitude": lat, "longitude": lon}});
        let m = parse_value(&body).unwrap();
        let Message::Location(l) = m.message else { panic!("not a location") };
        for (got, sent) in [(l.latitude, lat), (l.longitude, lon)] {
            prop_assert!((got - sent).abs() <= 4.0 * f64::EPSILON * sent.abs().max(1.0), "{} read as {}", sent, got);
        }
    }

    /// (c) An agent's message body is read as written, never cut.
    #[test]
    fn agent_bodies_round_trip(m in message(), extra in proptest::option::of(non_blank())) {
        let m = match (m, extra) {
            (Message::Text(t), Some(more)) => Message::Text(Text {
                id: t.id,
                text: format!("{}{}", t.text, more.repeat(2)),
            }),
            (m, _) => m,
        };
        let wire = serde_json::to_value(&m).unwrap();
        let body = wire.to_string();
        let parsed: Value = crate::http::respond::parse_json(body.as_bytes()).unwrap();
        prop_assert_eq!(agent_message_body_from_value(parsed).unwrap(), m.clone());
        let reply = auto_reply(json!({ "message": wire }));
        prop_assert_eq!(reply.is_ok(), !m.is_typing());
    }
}
