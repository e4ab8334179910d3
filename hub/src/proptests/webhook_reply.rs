//! Properties of how receivers' answers are read: the integrator's reply to
//! `chat_accepted` / `chat_updated` (`core::webhooks::reply::read`, after the
//! deliverer's lossy UTF-8 decoding) and the status and body of any answer
//! (`outbound::AnswerRule::read`).

use bytes::Bytes;
use http::StatusCode;
use plugin_api::webhook::Page;
use plugin_api::widget::CustomDataField;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::{
    PathStep, any_body, any_json, any_text, assert_readable, http_url, non_blank, set_at,
    unknown_key, wrong_type,
};
use crate::config::is_http_url;
use crate::core::webhooks::payload::escape_html;
use crate::core::webhooks::reply::{
    Integration, MAX_CUSTOM_FIELDS, Reply, ReplyContact, host_of, read,
};
use crate::outbound::{AnswerRule, Attempt};

const RECEIVER: &str = "crm.example.com";
const FIELDS: [&str; 5] = [
    "custom_data",
    "contact_info",
    "enable_assign",
    "crm_link",
    "page",
];

/// A body as the deliverer hands it to `read`.
fn read_bytes(body: &[u8], safe_url: bool) -> Option<Reply> {
    read(&String::from_utf8_lossy(body), Some(RECEIVER), safe_url)
}

/// What every read reply holds, whatever the receiver sent.
fn assert_sound(reply: &Reply, safe_url: bool) {
    let i = &reply.integration;
    assert!(i.custom_data.len() <= MAX_CUSTOM_FIELDS);
    for f in &i.custom_data {
        for text in [Some(&f.content), f.title.as_ref(), f.key.as_ref()]
            .into_iter()
            .flatten()
        {
            assert!(
                !text.contains(['<', '>', '"', '\'']),
                "unescaped text reached the agent: {text:?}"
            );
        }
        if let Some(link) = &f.link {
            assert!(is_http_url(link), "{link}");
            if safe_url {
                assert_eq!(host_of(link), Some(RECEIVER), "{link}");
            }
        }
    }
    if let Some(link) = &i.crm_link {
        assert!(is_http_url(link), "{link}");
    }
    if let Some(page) = &i.page {
        assert!(is_http_url(&page.url), "{}", page.url);
    }
    if let Some(c) = &i.contact_info {
        assert!(*c != ReplyContact::default());
    }
    for s in &reply.skipped {
        assert!(FIELDS.contains(&s.field), "{}", s.field);
        assert!(s.path.starts_with(s.field), "{} under {}", s.path, s.field);
        assert_readable(&s.problem);
    }
}

/// An ok reply whose fields hold arbitrary values.
fn shaped_reply() -> BoxedStrategy<Value> {
    let entry = prop::collection::vec(
        (
            prop::sample::select(vec!["content", "title", "key", "link"]),
            prop_oneof![3 => any_json(), 1 => http_url(false).prop_map(Value::from)],
        ),
        0..5,
    )
    .prop_map(|kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Map<_, _>>(),
        )
    });
    let custom_data = prop_oneof![
        3 => prop::collection::vec(prop_oneof![4 => entry, 1 => any_json()], 0..14).prop_map(Value::Array),
        1 => any_json(),
    ];
    let object_of = |keys: Vec<&'static str>| {
        prop::collection::vec((prop::sample::select(keys), any_json()), 0..4).prop_map(|kv| {
            Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>(),
            )
        })
    };
    (
        prop::sample::select(vec!["ok", "OK", "Ok", "fail", "FAILURE", ""]),
        proptest::option::of(custom_data),
        proptest::option::of(prop_oneof![
            object_of(vec!["name", "phone", "email"]),
            any_json()
        ]),
        proptest::option::of(any_json()),
        proptest::option::of(prop_oneof![
            http_url(false).prop_map(Value::from),
            any_json()
        ]),
        proptest::option::of(prop_oneof![object_of(vec!["url", "title"]), any_json()]),
    )
        .prop_map(
            |(result, custom_data, contact_info, enable_assign, crm_link, page)| {
                let mut root = Map::new();
                root.insert("result".to_owned(), Value::from(result));
                for (k, v) in [
                    ("custom_data", custom_data),
                    ("contact_info", contact_info),
                    ("enable_assign", enable_assign),
                    ("crm_link", crm_link),
                    ("page", page),
                ] {
                    if let Some(v) = v {
                        root.insert(k.to_owned(), v);
                    }
                }
                Value::Object(root)
            },
        )
        .boxed()
}

/// A valid reply and the integration the agent should see from it.
#[derive(Debug, Clone)]
struct Valid {
    wire: Value,
    expected: Integration,
}

fn custom_field(safe_url: bool) -> BoxedStrategy<(Value, CustomDataField)> {
    let link = if safe_url {
        any_text()
            .prop_map(|path| format!("https://{RECEIVER}/{path}"))
            .boxed()
    } else {
        http_url(false)
    };
    (
        any_text(),
        proptest::option::of(non_blank()),
        proptest::option::of(non_blank()),
        proptest::option::of(link),
    )
        .prop_map(|(content, title, key, link)| {
            let mut wire = json!({ "content": content });
            for (k, v) in [("title", &title), ("key", &key), ("link", &link)] {
                if let Some(v) = v {
                    wire[k] = json!(v);
                }
            }
            let field = CustomDataField {
                content: escape_html(&content),
                title: title.as_deref().map(escape_html),
                key: key.as_deref().map(escape_html),
                link,
            };
            (wire, field)
        })
        .boxed()
}

fn valid_reply(safe_url: bool) -> BoxedStrategy<Valid> {
    let contact = (
        proptest::option::of(non_blank()),
        proptest::option::of(non_blank()),
        proptest::option::of(non_blank()),
    )
        .prop_map(|(name, phone, email)| ReplyContact { name, phone, email });
    let page = (http_url(false), proptest::option::of(non_blank()))
        .prop_map(|(url, title)| Page { url, title });
    (
        prop::sample::select(vec!["ok", "OK", "Ok", "oK"]),
        prop::collection::vec(custom_field(safe_url), 0..=MAX_CUSTOM_FIELDS),
        proptest::option::of(contact),
        any::<bool>(),
        proptest::option::of(http_url(false)),
        proptest::option::of(page),
    )
        .prop_map(|(result, fields, contact, enable_assign, crm_link, page)| {
            let (wire_fields, custom_data): (Vec<Value>, Vec<CustomDataField>) =
                fields.into_iter().unzip();
            let contact_info = contact.filter(|c| *c != ReplyContact::default());
            let mut wire = json!({
                "result": result,
                "custom_data": wire_fields,
                "enable_assign": enable_assign,
            });
            if let Some(c) = &contact_info {
                wire["contact_info"] = serde_json::to_value(c).unwrap();
            }
            if let Some(l) = &crm_link {
                wire["crm_link"] = json!(l);
            }
            if let Some(p) = &page {
                wire["page"] = serde_json::to_value(p).unwrap();
            }
            Valid {
                wire,
                expected: Integration {
                    custom_data,
                    contact_info,
                    enable_assign,
                    crm_link,
                    page,
                },
            }
        })
        .boxed()
}

/// A field a mutation may break, with the note that must name it.
fn breakable(v: &Valid) -> Vec<(Vec<PathStep>, &'static str, BoxedStrategy<Value>)> {
    use PathStep::{Index, Key};
    // Text fields take text and numbers; an empty list, object or text is
    // "not given": what breaks them is a boolean or a non-empty container.
    let not_text = || wrong_type(&["null", "string", "number"]);
    let mut out = vec![
        (
            vec![Key("custom_data")],
            "custom_data",
            wrong_type(&["null", "array"]),
        ),
        (
            vec![Key("enable_assign")],
            "enable_assign",
            prop_oneof![
                Just(json!("maybe")),
                Just(json!(7)),
                Just(json!([true])),
                Just(json!({"a": 1})),
            ]
            .boxed(),
        ),
        (
            vec![Key("crm_link")],
            "crm_link",
            prop_oneof![not_text(), Just(json!("ftp://crm.example.com")),].boxed(),
        ),
        (
            vec![Key("contact_info")],
            "contact_info",
            wrong_type(&["null", "object"]),
        ),
        (vec![Key("page")], "page", wrong_type(&["null", "object"])),
    ];
    let fields = v.wire["custom_data"].as_array().map_or(0, Vec::len);
    for i in 0..fields {
        for k in ["content", "title", "key"] {
            out.push((
                vec![Key("custom_data"), Index(i), Key(k)],
                "custom_data",
                not_text(),
            ));
        }
        out.push((
            vec![Key("custom_data"), Index(i), Key("link")],
            "custom_data",
            prop_oneof![not_text(), Just(json!("javascript:alert(1)")),].boxed(),
        ));
    }
    if v.wire.get("contact_info").is_some() {
        for k in ["name", "phone", "email"] {
            out.push((
                vec![Key("contact_info"), Key(k)],
                "contact_info",
                not_text(),
            ));
        }
    }
    if v.wire.get("page").is_some() {
        out.push((
            vec![Key("page"), Key("url")],
            "page",
            prop_oneof![not_text(), Just(json!("/relative")),].boxed(),
        ));
        out.push((vec![Key("page"), Key("title")], "page", not_text()));
    }
    out
}

/// `custom_data[2].content`: how a note names a place.
fn note_path(path: &[PathStep]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            PathStep::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            PathStep::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A valid reply with one field broken, the path broken, and the note's field.
fn broken_reply() -> BoxedStrategy<(Valid, Vec<PathStep>, &'static str, Value)> {
    valid_reply(false)
        .prop_flat_map(|v| {
            let n = breakable(&v).len();
            (Just(v), 0..n)
        })
        .prop_flat_map(|(v, i)| {
            let (path, field, wrong) = breakable(&v).swap_remove(i);
            (Just(v), Just(path), Just(field), wrong)
        })
        .boxed()
}

proptest! {
    #![proptest_config(super::config())]

    /// (a) Any answer body is read or ignored, never a panic.
    #[test]
    fn any_body_is_read(body in any_body(), safe_url in any::<bool>()) {
        if let Some(reply) = read_bytes(&body, safe_url) {
            assert_sound(&reply, safe_url);
        }
    }

    /// (a) Arbitrary values in every field of an ok reply: what reaches the
    /// agent keeps the rules, and every field left out is noted by name.
    #[test]
    fn arbitrary_fields_keep_the_rules(reply in shaped_reply(), safe_url in any::<bool>()) {
        let body = reply.to_string();
        let read = read_bytes(body.as_bytes(), safe_url);
        let ok = reply["result"].as_str().is_some_and(|r| r.eq_ignore_ascii_case("ok"));
        prop_assert_eq!(read.is_some(), ok);
        if let Some(r) = read {
            assert_sound(&r, safe_url);
        }
    }

    /// (a) Any answer of any status is classified, with a reason when refused.
    #[test]
    fn any_answer_is_classified(status in 100..=999u16, body in any_body()) {
        let status = StatusCode::from_u16(status).unwrap();
        for rule in [AnswerRule::Channel, AnswerRule::Webhook, AnswerRule::Bot] {
            match rule.read(status, Bytes::from(body.clone())) {
                Attempt::Delivered(_) => prop_assert!(status.is_success()),
                Attempt::Rejected(reason) => {
                    prop_assert!(rule != AnswerRule::Bot);
                    prop_assert!(!status.is_server_error());
                    assert_readable(&reason);
                }
                Attempt::Transient(reason) => {
                    prop_assert!(rule == AnswerRule::Bot || status.is_server_error());
                    assert_readable(&reason);
                }
            }
        }
        if status.is_success() {
            prop_assert!(matches!(
                AnswerRule::Webhook.read(status, Bytes::from(body)),
                Attempt::Delivered(_)
            ));
        }
    }

    /// (a) The host of any URL-ish text is found or not, never a panic.
    #[test]
    fn host_of_any_text(text in prop_oneof![any_text(), http_url(true), "https?://[\\[\\]@:a-z0-9\\\\/?#.]{0,30}"]) {
        if let Some(host) = host_of(&text) {
            prop_assert!(!host.is_empty());
        }
    }

    /// (b) A field of the wrong type is left out with a note naming it, and
    /// the other fields still apply.
    #[test]
    fn wrong_types_are_noted_by_name((valid, path, field, wrong) in broken_reply()) {
        let mut wire = valid.wire.clone();
        set_at(&mut wire, &path, wrong);
        let reply = read_bytes(wire.to_string().as_bytes(), false).expect("an ok reply");
        assert_sound(&reply, false);
        let at = note_path(&path);
        prop_assert!(
            reply.skipped.iter().any(|s| s.field == field && s.path == at),
            "no note names {}: {:?}", at, reply.skipped
        );
        let (got, want) = (&reply.integration, &valid.expected);
        if field != "custom_data" {
            prop_assert_eq!(&got.custom_data, &want.custom_data);
        }
        if field != "contact_info" {
            prop_assert_eq!(&got.contact_info, &want.contact_info);
        }
        if field != "crm_link" {
            prop_assert_eq!(&got.crm_link, &want.crm_link);
        }
        if field != "page" {
            prop_assert_eq!(&got.page, &want.page);
        }
        if field != "enable_assign" {
            prop_assert_eq!(got.enable_assign, want.enable_assign);
        }
    }

    /// (b) Without an ok `result`, nothing applies.
    #[test]
    fn without_ok_nothing_applies(valid in valid_reply(false), result in prop_oneof![
        Just(None),
        any_json().prop_map(Some),
        Just(Some(json!("FAILURE"))),
    ]) {
        let mut wire = valid.wire;
        match result {
            None => {
                wire.as_object_mut().unwrap().shift_remove("result");
            }
            Some(r) => wire["result"] = r,
        }
        let ok = wire["result"].as_str().is_some_and(|r| r.eq_ignore_ascii_case("ok"));
        prop_assert_eq!(read_bytes(wire.to_string().as_bytes(), false).is_some(), ok);
    }

    /// (b) Unknown fields change nothing and are not noted.
    #[test]
    fn unknown_fields_are_ignored(valid in valid_reply(false), key in unknown_key(), value in any_json(), deep in any::<bool>()) {
        let mut wire = valid.wire.clone();
        let target = if deep {
            wire.get_mut("custom_data").and_then(|c| c.get_mut(0)).and_then(Value::as_object_mut)
        } else {
            wire.as_object_mut()
        };
        if let Some(o) = target {
            o.insert(key, value);
        }
        let reply = read_bytes(wire.to_string().as_bytes(), false).expect("an ok reply");
        prop_assert_eq!(reply.integration, valid.expected);
        prop_assert!(reply.skipped.is_empty(), "{:?}", reply.skipped);
    }

    /// (b) Custom data past the limit: the first ten show, the rest is noted.
    #[test]
    fn too_much_custom_data(fields in prop::collection::vec(custom_field(false), MAX_CUSTOM_FIELDS + 1..30)) {
        let (wire, expected): (Vec<Value>, Vec<CustomDataField>) = fields.into_iter().unzip();
        let body = json!({ "result": "ok", "custom_data": wire }).to_string();
        let reply = read_bytes(body.as_bytes(), false).expect("an ok reply");
        prop_assert_eq!(&reply.integration.custom_data[..], &expected[..MAX_CUSTOM_FIELDS]);
        prop_assert!(reply.skipped.iter().any(|s| s.path == "custom_data"));
    }

    /// (c) A valid reply shows the agent what it says (texts escaped), with no note.
    #[test]
    fn valid_replies_round_trip(valid in valid_reply(false)) {
        let reply = read_bytes(valid.wire.to_string().as_bytes(), false).expect("an ok reply");
        prop_assert_eq!(reply.integration, valid.expected);
        prop_assert!(reply.skipped.is_empty(), "{:?}", reply.skipped);
    }

    /// (c) With Safe URL on, links to the receiver's own host stay.
    #[test]
    fn safe_links_stay(valid in valid_reply(true)) {
        let reply = read_bytes(valid.wire.to_string().as_bytes(), true).expect("an ok reply");
        prop_assert_eq!(reply.integration, valid.expected);
    }
}
