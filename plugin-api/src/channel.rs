//! Custom chat channel payloads: the customer message the integrator posts to the
//! hub, and the agent message the hub posts to the integrator's endpoint.
//!
//! Parsing is lenient where real integrators differ (ids as numbers or strings,
//! `file_url` for `file`) and strict on every rule of the spec's tables.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::lenient::{ExternalId, Label};

/// Longest customer text kept; longer text is cut (in characters, not bytes).
pub const MAX_TEXT_CHARS: usize = 1000;

/// A customer message as posted to `{base_url}/<random_string>/<public_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CustomerMessage {
    pub sender: CustomerSender,
    pub message: Message,
}

/// The customer as the integrator describes them; every field but `id` updates
/// the client's profile when present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CustomerSender {
    pub id: ExternalId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub photo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invite: Option<String>,
}

/// An agent message as posted to `{customer_endpoint}/<public_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentMessage {
    pub sender: AgentSender,
    pub recipient: Recipient,
    pub message: Message,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentSender {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub photo: Option<String>,
}

/// The customer an agent message is for: `id` is the customer's `sender.id`,
/// returned unchanged (same JSON type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Recipient {
    pub id: ExternalId,
}

/// A message body of either direction, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Message {
    Text(Text),
    Video(Media),
    Audio(Media),
    Voice(Media),
    Photo(Media),
    Sticker(Media),
    Document(Media),
    Location(Location),
    Typein,
    Typeout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Text {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
    pub text: String,
}

/// Fields of the file-carrying types (video, audio, voice, photo, sticker, document).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Media {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
    pub file: String,
    pub file_name: String,
    pub file_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumb: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emoji: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Location {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
    pub latitude: f64,
    pub longitude: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

impl Message {
    /// The wire value of `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Message::Text(_) => "text",
            Message::Video(_) => "video",
            Message::Audio(_) => "audio",
            Message::Voice(_) => "voice",
            Message::Photo(_) => "photo",
            Message::Sticker(_) => "sticker",
            Message::Document(_) => "document",
            Message::Location(_) => "location",
            Message::Typein => "typein",
            Message::Typeout => "typeout",
        }
    }

    /// Typing notifications travel like messages but are never stored as one.
    pub fn is_typing(&self) -> bool {
        matches!(self, Message::Typein | Message::Typeout)
    }

    /// The sender's own label for the message, if it gave one.
    pub fn label(&self) -> Option<&str> {
        let id = match self {
            Message::Text(t) => &t.id,
            Message::Video(m)
            | Message::Audio(m)
            | Message::Voice(m)
            | Message::Photo(m)
            | Message::Sticker(m)
            | Message::Document(m) => &m.id,
            Message::Location(l) => &l.id,
            Message::Typein | Message::Typeout => return None,
        };
        id.as_ref().map(|l| l.0.as_str())
    }

    /// Replaces the sender's label: the hub labels the messages it sends with its own ids.
    pub fn set_label(&mut self, label: String) {
        let slot = match self {
            Message::Text(t) => &mut t.id,
            Message::Video(m)
            | Message::Audio(m)
            | Message::Voice(m)
            | Message::Photo(m)
            | Message::Sticker(m)
            | Message::Document(m) => &mut m.id,
            Message::Location(l) => &mut l.id,
            Message::Typein | Message::Typeout => return,
        };
        *slot = Some(Label(label));
    }

    /// A one-line rendering for logs, previews and plain-text transcripts.
    pub fn preview(&self) -> String {
        match self {
            Message::Text(t) => t.text.clone(),
            Message::Video(m)
            | Message::Audio(m)
            | Message::Voice(m)
            | Message::Photo(m)
            | Message::Sticker(m)
            | Message::Document(m) => match &m.text {
                Some(t) if !t.is_empty() => format!("[{}] {} {}", self.type_name(), m.file_name, t),
                _ => format!("[{}] {}", self.type_name(), m.file_name),
            },
            Message::Location(l) => format!("[location] {}, {}", l.latitude, l.longitude),
            Message::Typein => "[typing]".to_owned(),
            Message::Typeout => "[stopped typing]".to_owned(),
        }
    }
}

/// Why a message was refused; the text is what the sender reads in a `text/plain` 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidMessage(pub String);

impl std::fmt::Display for InvalidMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidMessage {}

fn invalid(msg: impl Into<String>) -> InvalidMessage {
    InvalidMessage(msg.into())
}

/// Parses and validates a customer message body against every rule of the spec,
/// cutting `text` to [`MAX_TEXT_CHARS`].
pub fn parse_customer_message(body: &[u8]) -> Result<CustomerMessage, InvalidMessage> {
    // Before the parse, which would keep the last of two values silently.
    if let Some(dup) = crate::json::duplicate_key(body) {
        return Err(invalid(dup.to_string()));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("body is not valid JSON: {e}")))?;
    customer_message_from_value(value)
}

/// As [`parse_customer_message`], for a payload already parsed (a plugin's output).
pub fn customer_message_from_value(value: Value) -> Result<CustomerMessage, InvalidMessage> {
    let Value::Object(mut root) = value else {
        return Err(invalid("body must be a JSON object"));
    };
    let sender = match root.remove("sender") {
        Some(Value::Object(s)) => parse_sender(s)?,
        Some(_) => return Err(invalid("sender must be an object")),
        None => return Err(invalid("sender is required")),
    };
    let message = match root.remove("message") {
        Some(Value::Object(m)) => parse_message(m, Direction::FromCustomer)?,
        Some(_) => return Err(invalid("message must be an object")),
        None => return Err(invalid("message is required")),
    };
    Ok(CustomerMessage { sender, message })
}

/// Validates a message body an agent wants to send (same rules, no text cut).
pub fn agent_message_body_from_value(value: Value) -> Result<Message, InvalidMessage> {
    match value {
        Value::Object(m) => parse_message(m, Direction::FromAgent),
        _ => Err(invalid("message must be a JSON object")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    FromCustomer,
    FromAgent,
}

fn parse_sender(mut s: Map<String, Value>) -> Result<CustomerSender, InvalidMessage> {
    let id = match s.remove("id") {
        None | Some(Value::Null) => return Err(invalid("sender.id is required")),
        Some(Value::String(v)) if v.trim().is_empty() => {
            return Err(invalid("sender.id must not be empty"));
        }
        Some(Value::String(v)) => ExternalId::Str(v),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => ExternalId::Int(i),
            None => return Err(invalid("sender.id must be a string or an integer")),
        },
        Some(_) => return Err(invalid("sender.id must be a string or an integer")),
    };
    let mut sender = CustomerSender {
        id,
        name: opt_string(&mut s, "sender.name", "name")?,
        phone: opt_string(&mut s, "sender.phone", "phone")?,
        email: opt_string(&mut s, "sender.email", "email")?,
        photo: opt_string(&mut s, "sender.photo", "photo")?,
        url: opt_string(&mut s, "sender.url", "url")?,
        invite: opt_string(&mut s, "sender.invite", "invite")?,
    };
    // Blank profile fields carry no information; treat them as absent.
    for field in [
        &mut sender.photo,
        &mut sender.name,
        &mut sender.phone,
        &mut sender.email,
        &mut sender.url,
        &mut sender.invite,
    ] {
        if field.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *field = None;
        }
    }
    if let Some(photo) = &sender.photo {
        require_http_url("sender.photo", photo)?;
    }
    Ok(sender)
}

fn parse_message(
    mut m: Map<String, Value>,
    direction: Direction,
) -> Result<Message, InvalidMessage> {
    let kind = match m.remove("type") {
        Some(Value::String(t)) => t,
        Some(_) => return Err(invalid("message.type must be a string")),
        None => return Err(invalid("message.type is required")),
    };
    let id = opt_label(&mut m)?;
    let message = match kind.as_str() {
        "typein" => Message::Typein,
        "typeout" => Message::Typeout,
        "text" => {
            let text = match m.remove("text") {
                Some(Value::String(t)) => t,
                Some(_) => return Err(invalid("message.text must be a string")),
                None => return Err(invalid("message.text is required for type text")),
            };
            if text.trim().is_empty() {
                return Err(invalid("message.text must not be empty"));
            }
            let text = match direction {
                Direction::FromCustomer => cut_chars(text, MAX_TEXT_CHARS),
                Direction::FromAgent => text,
            };
            Message::Text(Text { id, text })
        }
        "location" => Message::Location(Location {
            id,
            latitude: required_coordinate(&mut m, "latitude", 90.0)?,
            longitude: required_coordinate(&mut m, "longitude", 180.0)?,
            text: opt_string(&mut m, "message.text", "text")?,
            title: opt_string(&mut m, "message.title", "title")?,
        }),
        "video" | "audio" | "voice" | "photo" | "sticker" | "document" => {
            let media = parse_media(&mut m, id)?;
            match kind.as_str() {
                "video" => Message::Video(media),
                "audio" => Message::Audio(media),
                "voice" => Message::Voice(media),
                "photo" => Message::Photo(media),
                "sticker" => Message::Sticker(media),
                _ => Message::Document(media),
            }
        }
        other => {
            return Err(invalid(format!(
                "message.type `{other}` is not one of text, video, audio, voice, photo, \
                 sticker, document, location, typein, typeout"
            )));
        }
    };
    Ok(message)
}

fn parse_media(m: &mut Map<String, Value>, id: Option<Label>) -> Result<Media, InvalidMessage> {
    // Some integrators name the file link `file_url`.
    let file = match opt_string(m, "message.file", "file")? {
        Some(f) => Some(f),
        None => opt_string(m, "message.file_url", "file_url")?,
    };
    let Some(file) = file else {
        return Err(invalid("message.file is required for media messages"));
    };
    require_http_url("message.file", &file)?;
    let Some(file_name) = opt_string(m, "message.file_name", "file_name")? else {
        return Err(invalid("message.file_name is required for media messages"));
    };
    let Some(file_size) = opt_positive(m, "file_size")? else {
        return Err(invalid("message.file_size is required for media messages"));
    };
    let thumb = opt_string(m, "message.thumb", "thumb")?;
    if let Some(t) = &thumb {
        require_http_url("message.thumb", t)?;
    }
    Ok(Media {
        id,
        file,
        file_name,
        file_size,
        thumb,
        emoji: opt_string(m, "message.emoji", "emoji")?,
        duration: opt_positive(m, "duration")?,
        width: opt_positive(m, "width")?,
        height: opt_positive(m, "height")?,
        text: opt_string(m, "message.text", "text")?,
        performer: opt_string(m, "message.performer", "performer")?,
        title: opt_string(m, "message.title", "title")?,
    })
}

fn opt_label(m: &mut Map<String, Value>) -> Result<Option<Label>, InvalidMessage> {
    match m.remove("id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(Label(s))),
        Some(Value::Number(n)) => Ok(Some(Label(n.to_string()))),
        Some(_) => Err(invalid("message.id must be a string or a number")),
    }
}

fn opt_string(
    m: &mut Map<String, Value>,
    path: &str,
    key: &str,
) -> Result<Option<String>, InvalidMessage> {
    match m.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(format!("{path} must be a string"))),
    }
}

fn opt_positive(m: &mut Map<String, Value>, key: &str) -> Result<Option<u64>, InvalidMessage> {
    match m.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v > 0 => Ok(Some(v)),
            _ => Err(invalid(format!("message.{key} must be a positive integer"))),
        },
        Some(_) => Err(invalid(format!("message.{key} must be a positive integer"))),
    }
}

fn required_coordinate(
    m: &mut Map<String, Value>,
    key: &str,
    bound: f64,
) -> Result<f64, InvalidMessage> {
    let value = match m.remove(key) {
        Some(Value::Number(n)) => n.as_f64(),
        // Coordinates copied from a form often arrive as strings.
        Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
        None | Some(Value::Null) => {
            return Err(invalid(format!(
                "message.{key} is required for type location"
            )));
        }
        Some(_) => None,
    };
    match value {
        Some(v) if v.is_finite() && v.abs() <= bound => Ok(v),
        _ => Err(invalid(format!(
            "message.{key} must be a number between -{bound} and {bound}"
        ))),
    }
}

fn require_http_url(path: &str, url: &str) -> Result<(), InvalidMessage> {
    let lower = url.trim_start().to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(()),
        _ => Err(invalid(format!(
            "{path} must be an http:// or https:// URL"
        ))),
    }
}

fn cut_chars(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((byte, _)) => text[..byte].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<CustomerMessage, InvalidMessage> {
        customer_message_from_value(v)
    }

    #[test]
    fn text_is_cut_by_characters() {
        let long: String = "ж".repeat(1500);
        let m = parse(json!({"sender":{"id":1},"message":{"type":"text","text":long}})).unwrap();
        let Message::Text(t) = m.message else {
            panic!("not text")
        };
        assert_eq!(t.text.chars().count(), 1000);
    }

    #[test]
    fn sender_id_rules() {
        let msg = json!({"type":"text","text":"hi"});
        assert!(parse(json!({"sender":{},"message":msg})).is_err());
        assert!(parse(json!({"sender":{"id":""},"message":msg})).is_err());
        assert!(parse(json!({"sender":{"id":[1]},"message":msg})).is_err());
        let m = parse(json!({"sender":{"id":"abc"},"message":msg})).unwrap();
        assert_eq!(m.sender.id, ExternalId::Str("abc".into()));
    }

    #[test]
    fn media_rules() {
        let ok = json!({"sender":{"id":1},"message":{"type":"photo","file":"https://x/y.png",
            "file_name":"y.png","file_size":10,"thumb":"http://x/t.png","width":320}});
        assert!(matches!(parse(ok).unwrap().message, Message::Photo(_)));
        for bad in [
            json!({"type":"photo","file_name":"y","file_size":1}),
            json!({"type":"photo","file":"ftp://x","file_name":"y","file_size":1}),
            json!({"type":"photo","file":"https://x","file_name":"y","file_size":0}),
            json!({"type":"photo","file":"https://x","file_name":"y","file_size":1.5}),
            json!({"type":"video","file":"https://x","file_name":"y","file_size":1,"duration":-1}),
            json!({"type":"location","latitude":1}),
            json!({"type":"gif"}),
        ] {
            assert!(
                parse(json!({"sender":{"id":1},"message":bad})).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn blank_profile_fields_are_absent() {
        let m = parse(json!({"sender":{"id":1,"photo":"","name":" "},
            "message":{"type":"text","text":"hi"}}))
        .unwrap();
        assert_eq!((m.sender.photo, m.sender.name), (None, None));
        assert!(
            parse(json!({"sender":{"id":1,"photo":"ftp://x"},
            "message":{"type":"text","text":"hi"}}))
            .is_err()
        );
    }

    #[test]
    fn typing_ignores_other_fields() {
        let m = parse(json!({"sender":{"id":1},"message":{"type":"typein","text":5}})).unwrap();
        assert_eq!(m.message, Message::Typein);
    }

    #[test]
    fn agent_message_wire_form() {
        let mut message = Message::Text(Text {
            id: None,
            text: "hello".into(),
        });
        message.set_label("m-1".into());
        let out = AgentMessage {
            sender: AgentSender {
                name: "Ann".into(),
                photo: None,
            },
            recipient: Recipient {
                id: ExternalId::Int(5),
            },
            message,
        };
        assert_eq!(
            serde_json::to_value(&out).unwrap(),
            json!({"sender":{"name":"Ann"},"recipient":{"id":5},
                   "message":{"type":"text","id":"m-1","text":"hello"}})
        );
        let back: AgentMessage =
            serde_json::from_value(serde_json::to_value(&out).unwrap()).unwrap();
        assert_eq!(back, out);
    }
}
