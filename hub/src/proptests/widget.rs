//! Properties of the widget's parsers: the `widget_api` calls
//! (`http::widget::parse_call`, then the core's `WidgetAction::validate`),
//! `startCall` (`CallBody` and `is_phone`) and `sendOfflineMessage`
//! (`OfflineMessageInput` and its `validate`), each behind `parse_json`.

use plugin_api::widget::{
    ContactInfo, CustomDataField, MAX_CUSTOM_DATA_FIELDS, MAX_OFFLINE_MESSAGE_CHARS,
    OfflineMessageInput,
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::{
    any_body, any_json, any_key, any_text, assert_readable, non_blank, raw_json, unknown_key,
    wrong_type,
};
use crate::core::widget::{WidgetAction, is_phone};
use crate::http::respond::parse_json;
use crate::http::widget::{CallBody, parse_call};

const ENDPOINTS: [&str; 6] = [
    "contacts",
    "custom-data",
    "user-token",
    "page",
    "attributes",
    "clear",
];

/// Longest page field kept (`http::widget`'s bound).
const MAX_PAGE_FIELD: usize = 2048;

/// A call as the edge and then the core read it; the reason of a refusal.
fn call(endpoint: &str, body: &[u8]) -> Result<WidgetAction, String> {
    let action = parse_call(endpoint, body)?;
    action.validate()?;
    Ok(action)
}

/// `startCall`'s body as `http::widget::start_call` reads it.
fn phone_of(body: &[u8]) -> Result<String, String> {
    let b: CallBody = parse_json(body)?;
    match b.phone {
        Value::String(p) if is_phone(&p) => Ok(p),
        _ => Err("invalid phone number".to_owned()),
    }
}

/// `sendOfflineMessage`'s body as the edge and `core::offline` read it.
fn offline_of(body: &[u8]) -> Result<OfflineMessageInput, String> {
    let form: OfflineMessageInput = parse_json(body)?;
    form.validate()?;
    Ok(form)
}

/// What every accepted call holds, whatever was sent.
fn assert_sound(endpoint: &str, action: &WidgetAction) {
    match action {
        WidgetAction::CustomData(fields) => {
            assert_eq!(endpoint, "custom-data");
            assert!(fields.len() <= MAX_CUSTOM_DATA_FIELDS);
        }
        WidgetAction::UserToken(t) => {
            assert_eq!(endpoint, "user-token");
            assert!(!t.trim().is_empty() && t.len() <= 1024);
        }
        WidgetAction::Page {
            url,
            title,
            referrer,
        } => {
            assert_eq!(endpoint, "page");
            for v in [url, title, referrer].into_iter().flatten() {
                assert!(!v.is_empty() && v.chars().count() <= MAX_PAGE_FIELD);
            }
        }
        WidgetAction::Attributes(a) => {
            assert_eq!(endpoint, "attributes");
            assert!(!a.is_empty());
        }
        WidgetAction::Contacts(c) => {
            assert_eq!(endpoint, "contacts");
            assert!(
                c.email
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e.contains('@'))
            );
        }
        WidgetAction::ClearHistory => assert_eq!(endpoint, "clear"),
        WidgetAction::StartCall(_) => panic!("a call endpoint started a call"),
    }
}

fn object(entries: Vec<(&'static str, Value)>) -> Value {
    Value::Object(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Map<_, _>>(),
    )
}

/// A call body whose fields hold arbitrary values.
fn shaped_body() -> BoxedStrategy<Value> {
    let keys = vec![
        "fields",
        "token",
        "attributes",
        "url",
        "title",
        "referrer",
        "name",
        "email",
        "phone",
        "description",
        "message",
    ];
    let field = prop::collection::vec(
        (
            prop::sample::select(vec!["content", "title", "link", "key"]),
            any_json(),
        ),
        0..4,
    )
    .prop_map(object);
    prop::collection::vec(
        (
            prop::sample::select(keys),
            prop_oneof![
                3 => any_json(),
                1 => prop::collection::vec(field, 0..14).prop_map(Value::Array),
            ],
        ),
        0..5,
    )
    .prop_map(object)
    .boxed()
}

fn email() -> BoxedStrategy<String> {
    (any_text(), any_text())
        .prop_map(|(a, b)| format!("{a}@{b}"))
        .boxed()
}

fn contacts() -> BoxedStrategy<ContactInfo> {
    (
        proptest::option::of(any_text()),
        proptest::option::of(email()),
        proptest::option::of(any_text()),
        proptest::option::of(any_text()),
    )
        .prop_map(|(name, email, phone, description)| ContactInfo {
            name,
            email,
            phone,
            description,
        })
        .boxed()
}

fn custom_field() -> BoxedStrategy<CustomDataField> {
    let opt = || proptest::option::of(any_text());
    (any_text(), opt(), opt(), opt())
        .prop_map(|(content, title, link, key)| CustomDataField {
            content,
            title,
            link,
            key,
        })
        .boxed()
}

fn phone() -> BoxedStrategy<String> {
    (
        any::<bool>(),
        prop::collection::vec(
            (0..10u8, prop::sample::select(vec!["", " ", "-", "(", ")"])),
            6..=20,
        ),
    )
        .prop_map(|(plus, digits)| {
            let mut p = if plus { "+".to_owned() } else { String::new() };
            let n = digits.len();
            for (i, (d, sep)) in digits.into_iter().enumerate() {
                p.push(char::from(b'0' + d));
                // Separators only while the digits still to come fit in 32 bytes.
                if p.len() + sep.len() + (n - i - 1) <= 32 {
                    p.push_str(sep);
                }
            }
            p
        })
        .boxed()
}

fn offline_form() -> BoxedStrategy<OfflineMessageInput> {
    (
        proptest::option::of(any_text()),
        prop_oneof![
            (email(), proptest::option::of(any_text())).prop_map(|(e, p)| (Some(e), p)),
            (proptest::option::of(email()), phone()).prop_map(|(e, p)| (e, Some(p))),
        ],
        proptest::option::of(any_text()),
        non_blank(),
    )
        .prop_map(|(name, (email, phone), description, message)| {
            let message: String = message.chars().take(MAX_OFFLINE_MESSAGE_CHARS).collect();
            let message = if message.trim().is_empty() {
                "x".to_owned()
            } else {
                message
            };
            OfflineMessageInput {
                name,
                email,
                phone,
                description,
                message,
            }
        })
        .boxed()
}

proptest! {
    #![proptest_config(super::config())]

    /// (a) Any body to any endpoint is answered, never with a panic.
    #[test]
    fn any_body_is_answered(
        endpoint in prop_oneof![4 => prop::sample::select(ENDPOINTS.to_vec()).prop_map(str::to_owned), 1 => any_text()],
        body in prop_oneof![any_body(), shaped_body().prop_map(|v| v.to_string().into_bytes())],
    ) {
        match call(&endpoint, &body) {
            Ok(action) => assert_sound(&endpoint, &action),
            Err(reason) => assert_readable(&reason),
        }
        if let Err(reason) = phone_of(&body) {
            assert_readable(&reason);
        }
        if let Err(reason) = offline_of(&body) {
            assert_readable(&reason);
        }
    }

    /// (a) `clear` reads no body; an endpoint that does not exist takes none.
    #[test]
    fn clear_and_unknown_endpoints(body in any_body(), name in any_key()) {
        prop_assert!(matches!(call("clear", &body), Ok(WidgetAction::ClearHistory)));
        if !ENDPOINTS.contains(&name.as_str()) {
            prop_assert_eq!(call(&name, &body).unwrap_err(), "no such endpoint");
        }
    }

    /// (a) A key twice in one object is refused naming the key.
    #[test]
    fn duplicate_keys_are_refused_by_name(raw in raw_json(), endpoint in prop::sample::select(ENDPOINTS[..5].to_vec())) {
        let text = raw.text();
        if let Some(dup) = plugin_api::json::duplicate_key(text.as_bytes()) {
            prop_assert_eq!(call(endpoint, text.as_bytes()).unwrap_err(), dup.to_string());
            prop_assert_eq!(offline_of(text.as_bytes()).unwrap_err(), dup.to_string());
        }
    }

    /// (a) Whatever a visitor types as a phone number is checked, never a panic.
    #[test]
    fn any_phone_is_checked(p in prop_oneof![any_text(), phone(), "[+0-9 ()-]{0,40}"]) {
        if is_phone(&p) {
            let digits = p.chars().filter(char::is_ascii_digit).count();
            prop_assert!((6..=20).contains(&digits) && p.len() <= 32);
        }
    }

    /// (b) A missing or mistyped field of a call is refused naming it where
    /// the edge words its own reason (`fields`, `token`, `attributes`, and
    /// serde's `missing field` for the rest).
    #[test]
    fn broken_calls_are_refused_by_name(
        wrong_fields in wrong_type(&["array", "null"]),
        wrong_token in wrong_type(&["string"]),
        wrong_attributes in wrong_type(&["object"]),
        wrong_entry in wrong_type(&["object"]),
    ) {
        let expect = |endpoint: &str, body: Value, name: &str| {
            let err = call(endpoint, body.to_string().as_bytes()).unwrap_err();
            assert!(err.contains(name), "{endpoint} {body}: {err} does not name {name}");
        };
        expect("custom-data", json!({}), "`fields`");
        expect("custom-data", json!({ "fields": wrong_fields }), "fields");
        expect("custom-data", json!({ "fields": [wrong_entry] }), "fields");
        expect("custom-data", json!({ "fields": [{ "title": "t" }] }), "`content`");
        expect("user-token", json!({}), "`token`");
        expect("user-token", json!({ "token": wrong_token }), "token");
        expect("attributes", json!({}), "`attributes`");
        expect("attributes", json!({ "attributes": wrong_attributes }), "attributes");
        let missing = phone_of(b"{}").unwrap_err();
        prop_assert!(missing.contains("`phone`"), "{}", missing);
    }

    /// (b) Mistyped contact and page fields are refused (serde's reason
    /// names the expected type and the place in the text, not the field).
    #[test]
    fn mistyped_strings_are_refused(
        key in prop::sample::select(vec!["name", "email", "phone", "description"]),
        page_key in prop::sample::select(vec!["url", "title", "referrer"]),
        wrong in wrong_type(&["null", "string"]),
    ) {
        let err = call("contacts", json!({ key: wrong }).to_string().as_bytes()).unwrap_err();
        prop_assert!(err.contains("invalid type"), "{}", err);
        let err = call("page", json!({ page_key: wrong }).to_string().as_bytes()).unwrap_err();
        prop_assert!(err.contains("invalid type"), "{}", err);
    }

    /// (b) Past a limit: custom data, the user token and the offline message
    /// are refused naming what is too long; page fields are cut.
    #[test]
    fn long_values(
        fields in prop::collection::vec(custom_field(), MAX_CUSTOM_DATA_FIELDS + 1..20),
        extra in 1..2000usize,
        c in any::<char>(),
        form in offline_form(),
    ) {
        let body = json!({ "fields": fields }).to_string();
        prop_assert!(matches!(parse_call("custom-data", body.as_bytes()), Ok(WidgetAction::CustomData(_))));
        let err = call("custom-data", body.as_bytes()).unwrap_err();
        prop_assert!(err.contains("custom data fields"), "{}", err);

        let long: String = format!("x{}", std::iter::repeat_n(c, 1024 + extra).collect::<String>());
        let err = call("user-token", json!({ "token": long }).to_string().as_bytes()).unwrap_err();
        prop_assert!(err.contains("user token"), "{}", err);

        let long_page: String = format!("x{}", std::iter::repeat_n(c, MAX_PAGE_FIELD + extra).collect::<String>());
        let action = call("page", json!({ "url": long_page, "title": long_page }).to_string().as_bytes()).unwrap();
        let WidgetAction::Page { url, title, .. } = action else { panic!("not a page") };
        let cut: String = long_page.chars().take(MAX_PAGE_FIELD).collect();
        prop_assert_eq!(url.as_deref(), Some(cut.as_str()));
        prop_assert_eq!(title.as_deref(), Some(cut.as_str()));

        let mut wire = serde_json::to_value(&form).unwrap();
        wire["message"] = json!(format!("x{}", std::iter::repeat_n(c, MAX_OFFLINE_MESSAGE_CHARS + extra).collect::<String>()));
        let err = offline_of(wire.to_string().as_bytes()).unwrap_err();
        prop_assert!(err.contains("message"), "{}", err);
    }

    /// (b) The offline form refuses a field it does not know, naming it, and
    /// a form without its message.
    #[test]
    fn offline_form_fields(form in offline_form(), key in unknown_key(), value in any_json()) {
        let mut wire = serde_json::to_value(&form).unwrap();
        wire[key.as_str()] = value;
        let err = offline_of(wire.to_string().as_bytes()).unwrap_err();
        prop_assert!(err.contains(&format!("`{key}`")), "{}", err);

        let mut wire = serde_json::to_value(&form).unwrap();
        wire.as_object_mut().unwrap().shift_remove("message");
        let err = offline_of(wire.to_string().as_bytes()).unwrap_err();
        prop_assert!(err.contains("`message`"), "{}", err);
    }

    /// (b) Unknown fields of a call are ignored (the script may be newer than the hub).
    #[test]
    fn unknown_call_fields_are_ignored(contacts in contacts(), key in unknown_key(), value in any_json()) {
        let mut wire = serde_json::to_value(&contacts).unwrap();
        wire[key.as_str()] = value;
        let action = call("contacts", wire.to_string().as_bytes()).unwrap();
        let WidgetAction::Contacts(got) = action else { panic!("not contacts") };
        prop_assert_eq!(got, contacts);
    }

    /// (c) Valid calls are read as sent.
    #[test]
    fn valid_calls_round_trip(
        contacts in contacts(),
        fields in prop::collection::vec(custom_field(), 0..=MAX_CUSTOM_DATA_FIELDS),
        token in non_blank().prop_map(|t| t.chars().take(200).collect::<String>()),
        page in (non_blank(), proptest::option::of(non_blank()), proptest::option::of(non_blank())),
        attributes in prop::collection::vec((any_text(), super::exact_json()), 1..6),
        phone in phone(),
        form in offline_form(),
    ) {
        let body = |v: Value| v.to_string().into_bytes();
        let got = call("contacts", &body(serde_json::to_value(&contacts).unwrap())).unwrap();
        prop_assert!(matches!(got, WidgetAction::Contacts(c) if c == contacts));

        let got = call("custom-data", &body(json!({ "fields": fields }))).unwrap();
        prop_assert!(matches!(got, WidgetAction::CustomData(f) if f == fields));

        let got = call("user-token", &body(json!({ "token": token }))).unwrap();
        prop_assert!(matches!(got, WidgetAction::UserToken(t) if t == token));

        let (url, title, referrer) = page;
        let bounded = |s: &str| s.chars().take(MAX_PAGE_FIELD).collect::<String>();
        let got = call("page", &body(json!({ "url": url, "title": title, "referrer": referrer }))).unwrap();
        let WidgetAction::Page { url: u, title: t, referrer: r } = got else { panic!("not a page") };
        prop_assert_eq!(u, Some(bounded(&url)));
        prop_assert_eq!(t, title.as_deref().map(bounded));
        prop_assert_eq!(r, referrer.as_deref().map(bounded));

        let attributes: Map<String, Value> = attributes.into_iter().collect();
        let got = call("attributes", &body(json!({ "attributes": attributes }))).unwrap();
        prop_assert!(matches!(got, WidgetAction::Attributes(a) if a == attributes));

        prop_assert_eq!(phone_of(&body(json!({ "phone": phone }))).unwrap(), phone);
        prop_assert_eq!(offline_of(&body(serde_json::to_value(&form).unwrap())).unwrap(), form);
    }
}
