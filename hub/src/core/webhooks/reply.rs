//! The integrator's answer to `chat_accepted` / `chat_updated`: what of it
//! reaches the agent. Nothing is applied unless `result` is ok
//! (case-insensitive); the body is read as JSON whatever its Content-Type.
//! Each field is then read on its own, leniently (receivers in PHP write an
//! empty object as `[]`, databases hand out numbers): a malformed field is
//! left out with a note and the others still apply.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use plugin_api::webhook::Page;
use plugin_api::widget::CustomDataField;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::payload::escape_html;
use crate::config::is_http_url;

/// The spec's limit on custom data fields.
pub const MAX_CUSTOM_FIELDS: usize = 10;

/// Reply fields left out, by (event, top-level field), for `/metrics`. Both
/// labels come from small fixed sets, so the map stays tiny.
#[derive(Debug, Default)]
pub struct SkippedCounts(Mutex<BTreeMap<(String, &'static str), u64>>);

impl SkippedCounts {
    pub fn count(&self, event: &str, field: &'static str) {
        *self.lock().entry((event.to_owned(), field)).or_default() += 1;
    }

    pub fn snapshot(&self) -> Vec<((String, &'static str), u64)> {
        self.lock().iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, &'static str), u64>> {
        // Counting never panics while holding the lock; a poisoned map is still usable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What the agent sees from a reply, kept on the chat (`chats.integration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Integration {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_data: Vec<CustomDataField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact_info: Option<ReplyContact>,
    /// Whether the agent gets the button that links the client to the CRM.
    #[serde(default)]
    pub enable_assign: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crm_link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<Page>,
}

/// Contact details from a reply. Any of them may be missing: a receiver that
/// only knows the phone number still gets it shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyContact {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

/// A reply field that was left out because it could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The top-level field (`custom_data`, `contact_info`, `enable_assign`,
    /// `crm_link`, `page`): a fixed set, so fit for a metric label.
    pub field: &'static str,
    /// Where exactly, e.g. `custom_data[2].content`.
    pub path: String,
    /// What was wrong, e.g. `expected text, got an object`.
    pub problem: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// An ok reply: what it shows the agent and what of it was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub integration: Integration,
    pub skipped: Vec<Skipped>,
}

/// Reads a reply; `None` when it is not an ok reply (nothing applies then).
/// `receiver_host` is the host of the webhook URL: with Safe URL on,
/// custom-data links to any other host are dropped.
pub fn read(body: &str, receiver_host: Option<&str>, safe_url: bool) -> Option<Reply> {
    let Ok(Value::Object(reply)) = serde_json::from_str::<Value>(body.trim()) else {
        return None;
    };
    // Integrators write both `ok` and `OK`; nothing else lets the data through.
    match reply.get("result") {
        Some(Value::String(result)) if result.eq_ignore_ascii_case("ok") => {}
        _ => return None,
    }
    let mut notes = Notes(Vec::new());
    let integration = Integration {
        custom_data: custom_data(
            reply.get("custom_data"),
            receiver_host,
            safe_url,
            &mut notes,
        ),
        contact_info: contact_info(reply.get("contact_info"), &mut notes),
        enable_assign: enable_assign(reply.get("enable_assign"), &mut notes),
        crm_link: crm_link(reply.get("crm_link"), &mut notes),
        page: page(reply.get("page"), &mut notes),
    };
    Some(Reply {
        integration,
        skipped: notes.0,
    })
}

/// The notes gathered while reading one reply.
struct Notes(Vec<Skipped>);

impl Notes {
    fn skip(&mut self, field: &'static str, path: impl Into<String>, problem: impl Into<String>) {
        self.0.push(Skipped {
            field,
            path: path.into(),
            problem: problem.into(),
        });
    }
}

/// `null`, `""`, `[]` and `{}` stand for "not given": PHP's `json_encode`
/// writes an empty associative array as `[]`, and receivers fill unknown
/// fields with null or an empty string.
fn is_absent(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// A present value, or `None` for a missing or absent one.
fn given(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !is_absent(v))
}

/// A value as a note names it; texts are cut short and quoted so a note
/// stays one short line whatever the receiver sent.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => {
            format!("the text {:?}…", s.chars().take(40).collect::<String>())
        }
        Value::String(s) => format!("the text {s:?}"),
        Value::Array(a) if a.is_empty() => "an empty list".to_owned(),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(o) if o.is_empty() => "an empty object".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// Text where text is expected: numbers become text (databases and PHP hand
/// out phone numbers and counts as numbers); absent values are `None`.
fn text(v: Option<&Value>) -> Result<Option<String>, String> {
    match given(v) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(format!("expected text, got {}", describe(other))),
    }
}

/// An optional text field: a malformed one is noted and left out.
fn optional_text(
    obj: &Map<String, Value>,
    key: &str,
    field: &'static str,
    prefix: &str,
    notes: &mut Notes,
) -> Option<String> {
    text(obj.get(key)).unwrap_or_else(|problem| {
        notes.skip(field, format!("{prefix}.{key}"), problem);
        None
    })
}

const CUSTOM_DATA: &str = "custom_data";
const CONTACT_INFO: &str = "contact_info";
const ENABLE_ASSIGN: &str = "enable_assign";
const CRM_LINK: &str = "crm_link";
const PAGE: &str = "page";

/// Up to ten usable entries, in order; a malformed entry is skipped alone.
fn custom_data(
    v: Option<&Value>,
    receiver_host: Option<&str>,
    safe_url: bool,
    notes: &mut Notes,
) -> Vec<CustomDataField> {
    let Some(v) = given(v) else {
        return Vec::new();
    };
    let Value::Array(entries) = v else {
        notes.skip(
            CUSTOM_DATA,
            CUSTOM_DATA,
            format!("expected a list, got {}", describe(v)),
        );
        return Vec::new();
    };
    let mut kept = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if kept.len() == MAX_CUSTOM_FIELDS {
            notes.skip(
                CUSTOM_DATA,
                CUSTOM_DATA,
                format!(
                    "only {MAX_CUSTOM_FIELDS} entries are shown; the last {} were ignored",
                    entries.len() - i
                ),
            );
            break;
        }
        if let Some(field) = custom_field(i, entry, receiver_host, safe_url, notes) {
            kept.push(field);
        }
    }
    kept
}

/// One custom-data entry. Without usable `content` the entry is skipped; a
/// malformed `title`, `key` or `link` is left out and the entry kept.
fn custom_field(
    i: usize,
    entry: &Value,
    receiver_host: Option<&str>,
    safe_url: bool,
    notes: &mut Notes,
) -> Option<CustomDataField> {
    let at = format!("{CUSTOM_DATA}[{i}]");
    // An empty entry (`null`, `{}`, `[]`) says nothing: skipped without a note.
    let entry = given(Some(entry))?;
    let Value::Object(f) = entry else {
        notes.skip(
            CUSTOM_DATA,
            at,
            format!("expected an object, got {}", describe(entry)),
        );
        return None;
    };
    // `content` is what the agent reads, so an empty text is still kept as
    // the receiver sent it; only a missing or non-text value drops the entry.
    let content = match f.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        None | Some(Value::Null) => {
            notes.skip(CUSTOM_DATA, format!("{at}.content"), "missing");
            return None;
        }
        Some(other) => {
            notes.skip(
                CUSTOM_DATA,
                format!("{at}.content"),
                format!("expected text, got {}", describe(other)),
            );
            return None;
        }
    };
    let title = optional_text(f, "title", CUSTOM_DATA, &at, notes);
    let key = optional_text(f, "key", CUSTOM_DATA, &at, notes);
    let link = match optional_text(f, "link", CUSTOM_DATA, &at, notes) {
        Some(link) if !is_http_url(&link) => {
            notes.skip(CUSTOM_DATA, format!("{at}.link"), "not an http(s) URL");
            None
        }
        // Safe URL is the operator's policy, not a fault of the reply: no note.
        Some(link) if safe_url && host_of(&link) != receiver_host => None,
        link => link,
    };
    Some(CustomDataField {
        content: escape_html(&content),
        title: title.map(|t| escape_html(&t)),
        key: key.map(|k| escape_html(&k)),
        link,
    })
}

/// Name, phone and e-mail, each optional; none usable means absent.
fn contact_info(v: Option<&Value>, notes: &mut Notes) -> Option<ReplyContact> {
    let v = given(v)?;
    let Value::Object(c) = v else {
        notes.skip(
            CONTACT_INFO,
            CONTACT_INFO,
            format!("expected an object, got {}", describe(v)),
        );
        return None;
    };
    let contact = ReplyContact {
        name: optional_text(c, "name", CONTACT_INFO, CONTACT_INFO, notes),
        phone: optional_text(c, "phone", CONTACT_INFO, CONTACT_INFO, notes),
        email: optional_text(c, "email", CONTACT_INFO, CONTACT_INFO, notes),
    };
    (contact != ReplyContact::default()).then_some(contact)
}

/// A yes/no as receivers write it: `true`/`false`, `1`/`0`, or those as text.
fn enable_assign(v: Option<&Value>, notes: &mut Notes) -> bool {
    let Some(v) = given(v) else {
        return false;
    };
    let flag = match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) if n.as_f64() == Some(1.0) => Some(true),
        Value::Number(n) if n.as_f64() == Some(0.0) => Some(false),
        Value::String(s) if s.eq_ignore_ascii_case("true") || s == "1" => Some(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") || s == "0" => Some(false),
        _ => None,
    };
    flag.unwrap_or_else(|| {
        notes.skip(
            ENABLE_ASSIGN,
            ENABLE_ASSIGN,
            format!("expected true or false, got {}", describe(v)),
        );
        false
    })
}

/// An http(s) URL.
fn crm_link(v: Option<&Value>, notes: &mut Notes) -> Option<String> {
    match text(v) {
        Ok(Some(link)) if is_http_url(&link) => Some(link),
        Ok(Some(_)) => {
            notes.skip(CRM_LINK, CRM_LINK, "not an http(s) URL");
            None
        }
        Ok(None) => None,
        Err(problem) => {
            notes.skip(CRM_LINK, CRM_LINK, problem);
            None
        }
    }
}

/// `{url, title?}` with an http(s) `url`; a malformed title is left out.
fn page(v: Option<&Value>, notes: &mut Notes) -> Option<Page> {
    let v = given(v)?;
    let Value::Object(p) = v else {
        notes.skip(
            PAGE,
            PAGE,
            format!("expected an object, got {}", describe(v)),
        );
        return None;
    };
    let url = match text(p.get("url")) {
        Ok(Some(url)) if is_http_url(&url) => url,
        Ok(Some(_)) => {
            notes.skip(PAGE, "page.url", "not an http(s) URL");
            return None;
        }
        Ok(None) => {
            notes.skip(PAGE, "page.url", "missing");
            return None;
        }
        Err(problem) => {
            notes.skip(PAGE, "page.url", problem);
            return None;
        }
    };
    let title = optional_text(p, "title", PAGE, PAGE, notes);
    Some(Page { url, title })
}

/// The host of an http(s) URL, without port or credentials.
pub fn host_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    // Browsers read `\` as `/` in http(s) URLs: `http://a\@b/` goes to `a`.
    let authority = rest.split(['/', '?', '#', '\\']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = match host.find(']') {
        // An IPv6 literal, brackets included: `[2001:db8::1]`.
        Some(end) if host.starts_with('[') => &host[..=end],
        _ => host.split(':').next()?,
    };
    (!host.is_empty()).then_some(host)
}

impl Integration {
    /// A later reply replaces what an earlier one showed, field by field;
    /// contact details too, so a reply with only a phone keeps the name.
    pub fn merge(&mut self, newer: Integration) {
        if !newer.custom_data.is_empty() {
            self.custom_data = newer.custom_data;
        }
        if let Some(newer) = newer.contact_info {
            let contact = self.contact_info.get_or_insert_with(ReplyContact::default);
            if newer.name.is_some() {
                contact.name = newer.name;
            }
            if newer.phone.is_some() {
                contact.phone = newer.phone;
            }
            if newer.email.is_some() {
                contact.email = newer.email;
            }
        }
        self.enable_assign |= newer.enable_assign;
        if newer.crm_link.is_some() {
            self.crm_link = newer.crm_link;
        }
        if newer.page.is_some() {
            self.page = newer.page;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Reads an ok reply made of `fields` (plus `"result":"ok"`).
    fn ok_reply(fields: Value) -> Reply {
        let mut body = json!({ "result": "ok" });
        if let (Some(body), Value::Object(fields)) = (body.as_object_mut(), fields) {
            body.extend(fields);
        }
        read(&body.to_string(), None, false).expect("an ok reply is read")
    }

    /// The notes of a reply as `path: problem` lines.
    fn notes(reply: &Reply) -> Vec<String> {
        reply.skipped.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn only_ok_replies_are_applied_whatever_the_case() {
        assert!(
            read(
                r#"{"result":"OK","crm_link":"https://crm.example.com/c/1"}"#,
                None,
                false
            )
            .is_some()
        );
        assert!(read(r#"{"result":"ok"}"#, None, false).is_some());
        assert!(
            read(
                r#"{"result":"FAILURE","crm_link":"https://x"}"#,
                None,
                false
            )
            .is_none()
        );
        assert!(read("FAILURE", None, false).is_none());
        assert!(read(r#"{"custom_data":[]}"#, None, false).is_none());
        assert!(read(r#"{"result":true}"#, None, false).is_none());
        assert!(read(r#"["ok"]"#, None, false).is_none());
        assert!(read(r#"{"result":"ok","#, None, false).is_none());
    }

    #[test]
    fn custom_data_is_text_at_most_ten_fields_and_safe_url_drops_foreign_links() {
        let fields: Vec<String> = (0..12)
            .map(|i| format!(r#"{{"title":"t{i}","content":"<b>{i}</b>","link":"https://other.example/{i}"}}"#))
            .collect();
        let body = format!(
            r#"{{"result":"ok","custom_data":[{},{{"content":"mine","link":"https://crm.example.com/x"}}]}}"#,
            fields.join(",")
        );
        let open = read(&body, Some("crm.example.com"), false)
            .unwrap()
            .integration;
        assert_eq!(open.custom_data.len(), 10);
        assert_eq!(open.custom_data[0].content, "&lt;b&gt;0&lt;/b&gt;");
        assert!(open.custom_data[0].link.is_some());
        let safe = read(&body, Some("crm.example.com"), true).unwrap();
        assert!(
            safe.integration
                .custom_data
                .iter()
                .all(|f| f.link.is_none())
        );
        // Safe URL is policy, not a fault of the reply; the cut is noted.
        assert_eq!(
            notes(&safe),
            ["custom_data: only 10 entries are shown; the last 3 were ignored"]
        );
        let body = r#"{"result":"ok","custom_data":[{"content":"mine","link":"https://crm.example.com:8443/x"}]}"#;
        let safe = read(body, Some("crm.example.com"), true).unwrap();
        assert!(safe.integration.custom_data[0].link.is_some());
    }

    #[test]
    fn hosts_ignore_ports_paths_and_credentials() {
        assert_eq!(host_of("https://a.example:8080/p?q"), Some("a.example"));
        assert_eq!(host_of("http://u:p@b.example/"), Some("b.example"));
        assert_eq!(host_of("ftp://c"), None);
        assert_eq!(
            host_of("http://evil.example\\@b.example/"),
            Some("evil.example")
        );
        assert_eq!(host_of("http://[2001:db8::1]:8080/"), Some("[2001:db8::1]"));
    }

    #[test]
    fn a_php_reply_with_an_empty_array_for_contact_info_is_applied() {
        let reply = read(
            r#"{"result":"ok","custom_data":[{"title":"Lead","content":"x"}],"contact_info":[],"enable_assign":false,"crm_link":"https://crm.example.com/c/1"}"#,
            None,
            false,
        )
        .expect("an ok reply");
        assert_eq!(
            reply.integration,
            Integration {
                custom_data: vec![CustomDataField {
                    content: "x".into(),
                    title: Some("Lead".into()),
                    link: None,
                    key: None,
                }],
                contact_info: None,
                enable_assign: false,
                crm_link: Some("https://crm.example.com/c/1".into()),
                page: None,
            }
        );
        assert!(reply.skipped.is_empty(), "{:?}", reply.skipped);
    }

    #[test]
    fn empty_values_mean_absent_and_are_not_noted() {
        for empty in [json!(null), json!(""), json!([]), json!({})] {
            let reply = ok_reply(json!({
                "custom_data": empty, "contact_info": empty, "enable_assign": empty,
                "crm_link": empty, "page": empty,
            }));
            assert_eq!(reply.integration, Integration::default(), "{empty}");
            assert!(reply.skipped.is_empty(), "{empty}: {:?}", reply.skipped);
        }
    }

    #[test]
    fn contact_info_needs_no_name_and_takes_numbers_as_text() {
        let reply = ok_reply(json!({ "contact_info": { "phone": 14084987855_u64 } }));
        assert_eq!(
            reply.integration.contact_info,
            Some(ReplyContact {
                name: None,
                phone: Some("14084987855".into()),
                email: None,
            })
        );
        assert!(reply.skipped.is_empty());
        let reply = ok_reply(json!({ "contact_info": { "name": "Jo", "email": "" } }));
        assert_eq!(
            reply.integration.contact_info,
            Some(ReplyContact {
                name: Some("Jo".into()),
                ..ReplyContact::default()
            })
        );
    }

    #[test]
    fn contact_info_without_a_usable_field_is_absent() {
        let reply = ok_reply(json!({ "contact_info": { "name": null, "phone": "" } }));
        assert_eq!(reply.integration.contact_info, None);
        assert!(reply.skipped.is_empty());
        let reply = ok_reply(json!({ "contact_info": { "name": { "first": "Jo" } } }));
        assert_eq!(reply.integration.contact_info, None);
        assert_eq!(
            notes(&reply),
            ["contact_info.name: expected text, got an object"]
        );
        assert_eq!(reply.skipped[0].field, "contact_info");
    }

    #[test]
    fn a_malformed_contact_field_is_left_out_and_the_others_kept() {
        let reply = ok_reply(json!({
            "contact_info": { "name": "Jo", "phone": true, "email": "jo@example.com" },
            "crm_link": "https://crm.example.com/c/2",
        }));
        assert_eq!(
            reply.integration.contact_info,
            Some(ReplyContact {
                name: Some("Jo".into()),
                phone: None,
                email: Some("jo@example.com".into()),
            })
        );
        assert_eq!(
            reply.integration.crm_link.as_deref(),
            Some("https://crm.example.com/c/2")
        );
        assert_eq!(
            notes(&reply),
            ["contact_info.phone: expected text, got true"]
        );
        let reply = ok_reply(json!({ "contact_info": ["Jo"] }));
        assert_eq!(reply.integration.contact_info, None);
        assert_eq!(
            notes(&reply),
            ["contact_info: expected an object, got a list"]
        );
    }

    #[test]
    fn custom_data_content_numbers_become_text_and_bad_entries_are_skipped_alone() {
        let reply = ok_reply(json!({ "custom_data": [
            { "title": "Visits", "content": 3 },
            { "title": "Score", "content": 2.5, "key": 7 },
            { "title": "Bad", "content": { "n": 1 } },
            { "title": "No content" },
            "plain",
            null,
            { "title": "Empty", "content": "" },
            { "title": ["x"], "content": "kept", "link": "javascript:alert(1)" },
        ]}));
        let shown: Vec<(Option<&str>, &str, Option<&str>)> = reply
            .integration
            .custom_data
            .iter()
            .map(|f| (f.title.as_deref(), f.content.as_str(), f.key.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                (Some("Visits"), "3", None),
                (Some("Score"), "2.5", Some("7")),
                (Some("Empty"), "", None),
                (None, "kept", None),
            ]
        );
        assert!(reply.integration.custom_data[3].link.is_none());
        assert_eq!(
            notes(&reply),
            [
                "custom_data[2].content: expected text, got an object",
                "custom_data[3].content: missing",
                "custom_data[4]: expected an object, got the text \"plain\"",
                "custom_data[7].title: expected text, got a list",
                "custom_data[7].link: not an http(s) URL",
            ]
        );
        assert!(reply.skipped.iter().all(|s| s.field == "custom_data"));
    }

    #[test]
    fn custom_data_that_is_not_a_list_is_skipped() {
        let reply = ok_reply(json!({
            "custom_data": { "title": "Lead", "content": "x" },
            "crm_link": "https://crm.example.com/c/1",
        }));
        assert!(reply.integration.custom_data.is_empty());
        assert!(reply.integration.crm_link.is_some());
        assert_eq!(
            notes(&reply),
            ["custom_data: expected a list, got an object"]
        );
    }

    #[test]
    fn only_usable_entries_count_toward_the_ten() {
        let mut entries = vec![json!({ "content": false })];
        entries.extend((0..10).map(|i| json!({ "content": i })));
        let reply = ok_reply(json!({ "custom_data": entries }));
        assert_eq!(reply.integration.custom_data.len(), 10);
        assert_eq!(reply.integration.custom_data[9].content, "9");
        assert_eq!(
            notes(&reply),
            ["custom_data[0].content: expected text, got false"]
        );
    }

    #[test]
    fn enable_assign_takes_booleans_ones_and_zeros() {
        for (value, expected) in [
            (json!(true), true),
            (json!(false), false),
            (json!(1), true),
            (json!(0), false),
            (json!("true"), true),
            (json!("TRUE"), true),
            (json!("false"), false),
            (json!("1"), true),
            (json!("0"), false),
        ] {
            let reply = ok_reply(json!({ "enable_assign": value }));
            assert_eq!(reply.integration.enable_assign, expected, "{value}");
            assert!(reply.skipped.is_empty(), "{value}");
        }
        for value in [json!(2), json!("yes"), json!({ "on": true }), json!([1])] {
            let reply = ok_reply(json!({
                "enable_assign": value, "crm_link": "https://crm.example.com/c/1",
            }));
            assert!(!reply.integration.enable_assign, "{value}");
            assert!(reply.integration.crm_link.is_some(), "{value}");
            assert_eq!(reply.skipped.len(), 1, "{value}");
            assert_eq!(reply.skipped[0].field, "enable_assign");
        }
        let reply = ok_reply(json!({ "enable_assign": 2 }));
        assert_eq!(
            notes(&reply),
            ["enable_assign: expected true or false, got the number 2"]
        );
    }

    #[test]
    fn crm_link_must_be_an_http_url_in_text() {
        let reply = ok_reply(json!({ "crm_link": false, "custom_data": [{ "content": "x" }] }));
        assert_eq!(reply.integration.crm_link, None);
        assert_eq!(reply.integration.custom_data.len(), 1);
        assert_eq!(notes(&reply), ["crm_link: expected text, got false"]);
        let reply = ok_reply(json!({ "crm_link": "crm.example.com/c/1" }));
        assert_eq!(reply.integration.crm_link, None);
        assert_eq!(notes(&reply), ["crm_link: not an http(s) URL"]);
        let reply = ok_reply(json!({ "crm_link": 42 }));
        assert_eq!(notes(&reply), ["crm_link: not an http(s) URL"]);
    }

    #[test]
    fn page_needs_an_http_url_and_takes_an_optional_title() {
        let reply =
            ok_reply(json!({ "page": { "url": "https://shop.example.com/", "title": 404 } }));
        assert_eq!(
            reply.integration.page,
            Some(Page {
                url: "https://shop.example.com/".into(),
                title: Some("404".into()),
            })
        );
        assert!(reply.skipped.is_empty());
        let reply =
            ok_reply(json!({ "page": { "url": "https://shop.example.com/", "title": {} } }));
        assert_eq!(
            reply.integration.page,
            Some(Page {
                url: "https://shop.example.com/".into(),
                title: None,
            })
        );
        let reply =
            ok_reply(json!({ "page": { "url": "https://shop.example.com/", "title": true } }));
        assert_eq!(
            reply.integration.page.as_ref().map(|p| p.title.as_deref()),
            Some(None)
        );
        assert_eq!(notes(&reply), ["page.title: expected text, got true"]);
        for (page, note) in [
            (json!({ "title": "Cart" }), "page.url: missing"),
            (json!({ "url": "/cart" }), "page.url: not an http(s) URL"),
            (
                json!({ "url": ["x"] }),
                "page.url: expected text, got a list",
            ),
            (
                json!("https://shop.example.com/"),
                "page: expected an object, got the text \"https://shop.example.com/\"",
            ),
        ] {
            let reply = ok_reply(json!({ "page": page }));
            assert_eq!(reply.integration.page, None, "{page}");
            assert_eq!(notes(&reply), [note], "{page}");
        }
    }

    #[test]
    fn several_malformed_fields_leave_the_good_ones() {
        let reply = ok_reply(json!({
            "custom_data": [{ "title": "Visits", "content": 3 }],
            "contact_info": {},
            "enable_assign": 1,
            "crm_link": false,
            "page": [],
        }));
        assert_eq!(reply.integration.custom_data[0].content, "3");
        assert_eq!(reply.integration.contact_info, None);
        assert!(reply.integration.enable_assign);
        assert_eq!(reply.integration.crm_link, None);
        assert_eq!(reply.integration.page, None);
        assert_eq!(notes(&reply), ["crm_link: expected text, got false"]);
    }

    #[test]
    fn long_texts_are_cut_in_notes() {
        let long = "x".repeat(500);
        let reply = ok_reply(json!({ "crm_link": { "a": 1 }, "enable_assign": long }));
        let note = reply.skipped[0].to_string();
        assert!(note.starts_with("enable_assign: "), "{note}");
        assert!(note.len() < 120, "{note}");
        assert!(note.ends_with("…"), "{note}");
    }

    #[test]
    fn merging_keeps_earlier_contact_details_a_later_reply_does_not_name() {
        let mut shown = ok_reply(json!({
            "contact_info": { "name": "Jo", "email": "jo@example.com" },
            "enable_assign": true,
        }))
        .integration;
        shown.merge(ok_reply(json!({ "contact_info": { "phone": "+1" } })).integration);
        assert_eq!(
            shown.contact_info,
            Some(ReplyContact {
                name: Some("Jo".into()),
                phone: Some("+1".into()),
                email: Some("jo@example.com".into()),
            })
        );
        assert!(shown.enable_assign);
    }

    #[test]
    fn stored_integration_data_of_earlier_versions_still_reads() {
        let stored: Integration = serde_json::from_str(
            r#"{"contact_info":{"name":"Jane Roe","phone":"+15550101"},"enable_assign":true}"#,
        )
        .expect("older integration data");
        assert_eq!(
            stored.contact_info.and_then(|c| c.name).as_deref(),
            Some("Jane Roe")
        );
    }
}
