//! Property tests of every parser the hub applies to outside input: the
//! channel's customer messages (and the agent API's message bodies), bot
//! providers' events, webhook receivers' replies, the widget's calls and
//! `hub.toml`. Each property calls the function a request body really goes
//! through, with arbitrary bytes, arbitrary JSON, mutations of valid payloads
//! and generated valid payloads.
//!
//! Bounded for CI: [`DEFAULT_CASES`] per property unless `PROPTEST_CASES`
//! says otherwise (`PROPTEST_CASES=100000 cargo test -p hub --lib proptests`
//! for a long run). Failures are not persisted: a failing case prints its
//! minimal input, which belongs in a unit test of the parser.

mod bots;
mod channel;
mod config;
mod webhook_reply;
mod widget;

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{Map, Number, Value};

/// Cases per property when `PROPTEST_CASES` is unset: the whole module stays
/// within about half a minute in a debug build on a two-core machine.
const DEFAULT_CASES: u32 = 1024;

/// The configuration of every property here; `proptest!` applies the
/// `PROPTEST_*` variables on top of it.
pub(super) fn config() -> ProptestConfig {
    ProptestConfig {
        cases: DEFAULT_CASES,
        // Regressions are kept as unit tests of the parser, not as files
        // next to the source that nobody reviews.
        failure_persistence: None,
        // A shrink that runs away must not hold CI for minutes.
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    }
}

/// Texts that have broken parsers before: empty and blank, control
/// characters, quotes and backslashes, direction marks, a BOM, surrogate-free
/// astral characters, and look-alikes of the wire's own words.
const SPECIAL: &[&str] = &[
    "",
    " ",
    "\t\n\r",
    "\0",
    "\u{7f}",
    "\u{1b}[31m",
    "\"",
    "\\",
    "\\u0000",
    "\u{202e}",
    "\u{feff}",
    "\u{2028}",
    "ж",
    "😀",
    "e\u{301}",
    "<script>",
    "&amp;",
    "null",
    "0",
    "-1",
    "1e400",
    "ok",
    "OK",
    "http://",
    "https://x",
    "${HOME}",
];

/// Any text a sender may put in a JSON string.
pub(super) fn any_text() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::collection::vec(any::<char>(), 0..24).prop_map(String::from_iter),
        3 => prop::sample::select(SPECIAL).prop_map(str::to_owned),
        1 => (prop::sample::select(SPECIAL), 200..1500usize).prop_map(|(s, n)| s.repeat(n)),
    ]
    .boxed()
}

/// Text that is not blank, so parsers that treat blank as absent keep it.
pub(super) fn non_blank() -> BoxedStrategy<String> {
    any_text()
        .prop_map(|s| {
            if s.trim().is_empty() {
                format!("x{s}")
            } else {
                s
            }
        })
        .boxed()
}

/// Integers and floats of every size a JSON number can hold here, edges first.
pub(super) fn any_number() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(vec![
            Value::from(0),
            Value::from(-1),
            Value::from(1),
            Value::from(i64::MIN),
            Value::from(i64::MAX),
            Value::from(u64::MAX),
            Value::from(1e308),
            Value::from(-1e308),
            Value::from(5e-324),
            Value::from(0.5),
            Value::from(-0.0),
        ]),
    ]
    .boxed()
}

/// Numbers that survive printing and reading back exactly: serde_json reads
/// long decimals on a fast path that may miss the nearest `f64` by one unit
/// in the last place (its `float_roundtrip` feature is off), so round trips
/// use decimals of at most 15 significant digits.
pub(super) fn exact_number() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-999_999_999_999i64..=999_999_999_999, 0..7u32)
            .prop_map(|(n, k)| Value::from(n as f64 / 10f64.powi(k as i32))),
    ]
    .boxed()
}

/// As [`any_json`], with numbers that read back exactly.
pub(super) fn exact_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        exact_number(),
        any_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((any_key(), inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
    .boxed()
}

/// Object keys: mostly the wire's own field names, so that arbitrary values
/// land where parsers look, and sometimes any text.
pub(super) fn any_key() -> BoxedStrategy<String> {
    const KEYS: &[&str] = &[
        "sender",
        "message",
        "id",
        "type",
        "text",
        "name",
        "phone",
        "email",
        "photo",
        "file",
        "file_url",
        "file_name",
        "file_size",
        "latitude",
        "longitude",
        "event",
        "chat_id",
        "client_id",
        "timestamp",
        "buttons",
        "content",
        "title",
        "result",
        "custom_data",
        "contact_info",
        "enable_assign",
        "crm_link",
        "page",
        "url",
        "link",
        "key",
        "fields",
        "token",
        "attributes",
        "error",
    ];
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => any_text(),
    ]
    .boxed()
}

/// Any JSON value: nested objects and arrays of strings, numbers, booleans and nulls.
pub(super) fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any_number(),
        any_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((any_key(), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
    .boxed()
}

/// A JSON text as a sender may write it, which a `Value` cannot hold: keys
/// repeated within an object, keys spelled with `\u` escapes, numbers beyond
/// what `f64` and `u64` hold.
#[derive(Debug, Clone)]
pub(super) enum Raw {
    Token(String),
    Array(Vec<Raw>),
    Object(Vec<(RawKey, Raw)>),
}

#[derive(Debug, Clone)]
pub(super) struct RawKey {
    key: String,
    escaped: bool,
}

impl Raw {
    pub(super) fn render(&self, out: &mut String) {
        match self {
            Raw::Token(t) => out.push_str(t),
            Raw::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.render(out);
                }
                out.push(']');
            }
            Raw::Object(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    k.render(out);
                    out.push(':');
                    v.render(out);
                }
                out.push('}');
            }
        }
    }

    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        self.render(&mut out);
        out
    }
}

impl RawKey {
    fn render(&self, out: &mut String) {
        if !self.escaped {
            out.push_str(&Value::from(self.key.as_str()).to_string());
            return;
        }
        // The same key spelled differently: a duplicate check must decode it.
        out.push('"');
        for c in self.key.chars() {
            match u16::try_from(u32::from(c)) {
                Ok(unit) => out.push_str(&format!("\\u{unit:04x}")),
                Err(_) => out.push(c),
            }
        }
        out.push('"');
    }
}

/// JSON texts with duplicate keys (drawn from a small set, so they repeat),
/// escaped keys and out-of-range numbers.
pub(super) fn raw_json() -> BoxedStrategy<Raw> {
    let token = prop_oneof![
        4 => any_json().prop_map(|v| v.to_string()),
        1 => prop::sample::select(vec![
            "1e400",
            "-1e400",
            "123456789012345678901234567890",
            "-0",
            "0.0000000000000000000000000001e-400",
            "18446744073709551616",
            "-9223372036854775809",
        ])
        .prop_map(str::to_owned),
    ];
    let key = (
        prop::sample::select(vec![
            "id", "type", "text", "sender", "message", "event", "chat_id", "result", "a",
        ]),
        any::<bool>(),
    )
        .prop_map(|(k, escaped)| RawKey {
            key: k.to_owned(),
            escaped,
        });
    token
        .prop_map(Raw::Token)
        .prop_recursive(4, 32, 5, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Raw::Array),
                prop::collection::vec((key.clone(), inner), 0..5).prop_map(Raw::Object),
            ]
        })
        .boxed()
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
pub(super) enum Edit {
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Delete(prop::sample::Index),
    Repeat(prop::sample::Index, prop::sample::Index),
}

/// One edit at a random place.
pub(super) fn edit_strategy() -> impl Strategy<Value = Edit> {
    use prop::sample::Index;
    prop_oneof![
        any::<Index>().prop_map(Edit::Truncate),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<Index>().prop_map(Edit::Delete),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Repeat(a, b)),
    ]
}

/// `bytes` after `edits`: what a broken client or a flaky network makes of a valid body.
pub(super) fn apply_edits(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = bytes.len();
        match e {
            Edit::Truncate(i) => bytes.truncate(i.index(len + 1)),
            Edit::Flip(i, b) if len > 0 => bytes[i.index(len)] ^= b | 1,
            Edit::Insert(i, b) => bytes.insert(i.index(len + 1), *b),
            Edit::Delete(i) if len > 0 => {
                bytes.remove(i.index(len));
            }
            Edit::Repeat(a, b) if len > 0 => {
                let (a, b) = (a.index(len), b.index(len));
                let (from, to) = (a.min(b), a.max(b) + 1);
                let copy = bytes[from..to].to_vec();
                bytes.splice(to..to, copy);
            }
            _ => {}
        }
    }
    bytes
}

/// `valid` bodies broken by one to four edits.
pub(super) fn mutated(valid: BoxedStrategy<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    (valid, prop::collection::vec(edit_strategy(), 1..5))
        .prop_map(|(bytes, edits)| apply_edits(bytes, &edits))
        .boxed()
}

/// Bodies nested far deeper than any parser's recursion limit.
fn deep_nesting() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec!["[", "{\"a\":", "{\"sender\":", "[{\"id\":"]),
        100..5000usize,
    )
        .prop_map(|(open, n)| open.repeat(n).into_bytes())
}

/// Any request body: random bytes, JSON with duplicate keys and huge
/// numbers, JSON broken by edits, deep nesting.
pub(super) fn any_body() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..256),
        3 => raw_json().prop_map(|r| r.text().into_bytes()),
        2 => any_json().prop_map(|v| v.to_string().into_bytes()),
        2 => mutated(raw_json().prop_map(|r| r.text().into_bytes()).boxed()),
        1 => deep_nesting(),
    ]
    .boxed()
}

/// An `http(s)://` URL as senders write them (the scheme's case varies in
/// `case_scheme`), with any path after the host.
pub(super) fn http_url(case_scheme: bool) -> BoxedStrategy<String> {
    let scheme = if case_scheme {
        prop::sample::select(vec!["http://", "https://", "HTTPS://", "Http://"]).boxed()
    } else {
        prop::sample::select(vec!["http://", "https://"]).boxed()
    };
    (scheme, "[a-z0-9][a-z0-9.-]{0,20}", any_text())
        .prop_map(|(s, host, path)| format!("{s}{host}/{path}"))
        .boxed()
}

/// A JSON value of another type than the ones `accepted` names (`null`,
/// `bool`, `number`, `string`, `array`, `object`), never an empty string,
/// array or object (which some parsers read as absent).
pub(super) fn wrong_type(accepted: &'static [&'static str]) -> BoxedStrategy<Value> {
    let all: Vec<(&str, Value)> = vec![
        ("null", Value::Null),
        ("bool", Value::Bool(true)),
        ("bool", Value::Bool(false)),
        ("number", Value::from(7)),
        ("number", Value::from(-2.5)),
        ("string", Value::from("wrong")),
        ("array", serde_json::json!([1, "a"])),
        ("object", serde_json::json!({"a": 1})),
    ];
    let wrong: Vec<Value> = all
        .into_iter()
        .filter(|(kind, _)| !accepted.contains(kind))
        .map(|(_, v)| v)
        .collect();
    prop::sample::select(wrong).boxed()
}

/// The error text of a refusal: something a sender can read.
pub(super) fn assert_readable(reason: &str) {
    assert!(!reason.trim().is_empty(), "an empty reason");
}

/// The value at `path` (object keys and array indexes) of `root`.
pub(super) fn at_mut<'v>(root: &'v mut Value, path: &[PathStep]) -> Option<&'v mut Value> {
    let mut here = root;
    for step in path {
        here = match step {
            PathStep::Key(k) => here.get_mut(*k)?,
            PathStep::Index(i) => here.get_mut(*i)?,
        };
    }
    Some(here)
}

/// One step into a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathStep {
    Key(&'static str),
    Index(usize),
}

/// Removes the field at `path` (the last step a key); whether it was there.
pub(super) fn remove_at(root: &mut Value, path: &[PathStep]) -> bool {
    let Some((PathStep::Key(last), parent)) = path.split_last() else {
        return false;
    };
    at_mut(root, parent)
        .and_then(Value::as_object_mut)
        .and_then(|o| o.shift_remove(*last))
        .is_some()
}

/// Sets the field at `path`, adding it if absent.
pub(super) fn set_at(root: &mut Value, path: &[PathStep], value: Value) {
    match path.split_last() {
        None => *root = value,
        Some((PathStep::Key(last), parent)) => {
            if let Some(o) = at_mut(root, parent).and_then(Value::as_object_mut) {
                o.insert((*last).to_owned(), value);
            }
        }
        Some((PathStep::Index(_), _)) => {
            if let Some(slot) = at_mut(root, path) {
                *slot = value;
            }
        }
    }
}

/// An unknown field name: none of the wire's fields starts with `zz_`.
pub(super) fn unknown_key() -> BoxedStrategy<String> {
    "zz_[a-z0-9_]{1,10}".boxed()
}
