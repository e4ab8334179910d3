//! Identifiers that arrive as JSON numbers or strings: accepted either way on
//! input and written back in the type they came in.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An identifier chosen by the other side; the JSON type is preserved so that an
/// echo (`recipient.id` of an agent message) is byte-for-byte what was received.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum ExternalId {
    Int(i64),
    Str(String),
}

impl ExternalId {
    /// The identifier as text, the form used for lookups: `7` and `"7"` name the same client.
    pub fn as_key(&self) -> String {
        match self {
            ExternalId::Int(n) => n.to_string(),
            ExternalId::Str(s) => s.clone(),
        }
    }

    /// Empty strings count as absent: the spec drops such messages.
    pub fn is_empty(&self) -> bool {
        matches!(self, ExternalId::Str(s) if s.trim().is_empty())
    }
}

impl fmt::Display for ExternalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExternalId::Int(n) => write!(f, "{n}"),
            ExternalId::Str(s) => f.write_str(s),
        }
    }
}

/// A label that some senders write as a number; always read as text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Label(pub String);

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match ExternalId::deserialize(d)? {
            ExternalId::Int(n) => Ok(Label(n.to_string())),
            ExternalId::Str(s) => Ok(Label(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_keep_their_json_type() {
        let n: ExternalId = serde_json::from_str("42").unwrap();
        let s: ExternalId = serde_json::from_str("\"42\"").unwrap();
        assert_eq!(serde_json::to_string(&n).unwrap(), "42");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"42\"");
        assert_eq!(n.as_key(), s.as_key());
    }

    #[test]
    fn labels_read_numbers_as_text() {
        let l: Label = serde_json::from_str("17").unwrap();
        assert_eq!(l.0, "17");
    }
}
