//! Duplicate-key detection for inbound JSON.
//!
//! JSON parsers disagree about `{"a":1,"a":2}`: serde keeps the last value,
//! others the first or refuse it. The hub refuses such bodies, so that a plugin
//! or a receiver parsing the stored payload sees the message the hub stored.
//! The check walks the text once with a visitor and builds nothing but the set
//! of keys of the object it is in.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A key that appears twice in one JSON object, and where that object is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateKey {
    /// The key, with escapes decoded (`"a"` and `"\u0061"` are the same key).
    pub key: String,
    /// The object holding the key, as `sender`, `items[2].meta`; empty for the root.
    pub path: String,
}

impl fmt::Display for DuplicateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "duplicate key {:?}", self.key)?;
        if !self.path.is_empty() {
            write!(f, " in {}", self.path)?;
        }
        Ok(())
    }
}

impl std::error::Error for DuplicateKey {}

/// The first key that appears twice within one object of `text`, in document order.
///
/// Only the text before a syntax error is checked: on malformed JSON this
/// answers `None` unless a duplicate came first, and the caller's own parse
/// reports the syntax error.
pub fn duplicate_key(text: &[u8]) -> Option<DuplicateKey> {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(text);
    // The error itself carries nothing the caller needs: either `found` says
    // which key, or the text is malformed and the caller's parse says so.
    let _ = Node { found: &mut found }.deserialize(&mut de);
    found.map(|f| {
        let mut path = String::new();
        // Segments were pushed while the error unwound, innermost first.
        for segment in f.path.iter().rev() {
            match segment {
                Segment::Key(k) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.extend(k.escape_debug());
                }
                Segment::Index(i) => {
                    path.push('[');
                    path.push_str(&i.to_string());
                    path.push(']');
                }
            }
        }
        DuplicateKey { key: f.key, path }
    })
}

struct Found {
    key: String,
    path: Vec<Segment>,
}

enum Segment {
    Key(String),
    Index(usize),
}

/// One JSON value. The path to a duplicate is only built on the way out of
/// an error, so a body without duplicates costs no allocation for it.
struct Node<'f> {
    found: &'f mut Option<Found>,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0;
        loop {
            match seq.next_element_seed(Node {
                found: &mut *self.found,
            }) {
                Ok(Some(())) => index += 1,
                Ok(None) => return Ok(()),
                Err(e) => {
                    if let Some(f) = self.found.as_mut() {
                        f.path.push(Segment::Index(index));
                    }
                    return Err(e);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Keys without escapes borrow from the text; only escaped ones allocate.
        let mut seen: HashSet<Cow<'de, str>> = HashSet::new();
        while let Some(key) = map.next_key_seed(Key)? {
            if seen.contains(&key) {
                *self.found = Some(Found {
                    key: key.into_owned(),
                    path: Vec::new(),
                });
                return Err(de::Error::custom("duplicate key"));
            }
            if let Err(e) = map.next_value_seed(Node {
                found: &mut *self.found,
            }) {
                if let Some(f) = self.found.as_mut() {
                    f.path.push(Segment::Key(key.into_owned()));
                }
                return Err(e);
            }
            seen.insert(key);
        }
        Ok(())
    }
}

/// An object key, decoded.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(text: &str) -> Option<String> {
        duplicate_key(text.as_bytes()).map(|d| d.to_string())
    }

    #[test]
    fn unique_keys_pass() {
        assert_eq!(
            dup(r#"{"sender":{"id":"a"},"message":{"type":"text"}}"#),
            None
        );
        assert_eq!(dup(r#"[1, "x", null, true, 2.5, -3, {}, []]"#), None);
        assert_eq!(dup(r#""just a string""#), None);
    }

    #[test]
    fn root_duplicate_is_named() {
        assert_eq!(
            dup(r#"{"sender":{"id":"a"},"sender":{"id":"b"}}"#).as_deref(),
            Some(r#"duplicate key "sender""#)
        );
    }

    #[test]
    fn nested_duplicate_names_the_path() {
        assert_eq!(
            dup(r#"{"sender":{"id":"a","id":"b"}}"#).as_deref(),
            Some(r#"duplicate key "id" in sender"#)
        );
        assert_eq!(
            dup(r#"{"a":{"b":{"c":1,"c":2}}}"#).as_deref(),
            Some(r#"duplicate key "c" in a.b"#)
        );
    }

    #[test]
    fn arrays_of_objects_name_the_index() {
        assert_eq!(
            dup(r#"{"items":[{"t":1},{"t":2,"t":3}]}"#).as_deref(),
            Some(r#"duplicate key "t" in items[1]"#)
        );
        assert_eq!(
            dup(r#"[{"x":[{},{"y":1,"y":1}]}]"#).as_deref(),
            Some(r#"duplicate key "y" in [0].x[1]"#)
        );
    }

    #[test]
    fn same_key_in_sibling_objects_is_fine() {
        assert_eq!(
            dup(r#"{"a":{"id":1},"b":{"id":2},"c":[{"id":3},{"id":4}]}"#),
            None
        );
        // A key of an inner object does not clash with the outer one.
        assert_eq!(dup(r#"{"id":1,"inner":{"id":2}}"#), None);
    }

    #[test]
    fn escaped_keys_are_compared_decoded() {
        assert_eq!(
            dup(r#"{"a":1,"\u0061":2}"#).as_deref(),
            Some(r#"duplicate key "a""#)
        );
        assert_eq!(
            dup(r#"{"\u00e9":1,"é":2}"#).as_deref(),
            Some(r#"duplicate key "é""#)
        );
        // Different keys that only look alike stay different.
        assert_eq!(dup(r#"{"a":1,"A":2,"a ":3}"#), None);
    }

    #[test]
    fn the_first_duplicate_wins() {
        assert_eq!(
            dup(r#"{"x":{"k":1,"k":2},"x":0}"#).as_deref(),
            Some(r#"duplicate key "k" in x"#)
        );
    }

    #[test]
    fn malformed_text_is_left_to_the_parser() {
        assert_eq!(dup(r#"{"a":1,"b":"#), None);
        assert_eq!(dup("not json"), None);
        assert_eq!(dup(""), None);
        // A duplicate before the syntax error is still reported.
        assert_eq!(
            dup(r#"{"a":1,"a":2,"#).as_deref(),
            Some(r#"duplicate key "a""#)
        );
    }

    #[test]
    fn odd_keys_are_escaped_in_the_reason() {
        assert_eq!(
            dup("{\"o\\\"k\":{\"z\":1,\"z\":1}}").as_deref(),
            Some(r#"duplicate key "z" in o\"k"#)
        );
        assert_eq!(
            dup(r#"{"q\"":1,"q\"":2}"#).as_deref(),
            Some(r#"duplicate key "q\"""#)
        );
    }

    #[test]
    fn customer_messages_with_duplicates_are_refused() {
        let err = crate::channel::parse_customer_message(
            br#"{"sender":{"id":"a"},"sender":{"id":"b"},"message":{"type":"text","text":"hi"}}"#,
        )
        .unwrap_err();
        assert_eq!(err.0, r#"duplicate key "sender""#);
        let err = crate::channel::parse_customer_message(
            br#"{"sender":{"id":"a","id":"b"},"message":{"type":"text","text":"hi"}}"#,
        )
        .unwrap_err();
        assert_eq!(err.0, r#"duplicate key "id" in sender"#);
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        // serde_json's recursion limit stops the walk; the parser then reports it.
        let deep = "[".repeat(100_000);
        assert_eq!(duplicate_key(deep.as_bytes()), None);
    }
}
