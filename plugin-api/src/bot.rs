//! Bot exchange payloads: the events the hub and a bot provider post to each
//! other (tagged by `event`) and the `{error: {code, message}}` body of a refusal.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Number;

use crate::lenient::Label;
use crate::webhook::NumericId;

/// A `BUTTONS` message carries at most this many buttons.
pub const MAX_BUTTONS: usize = 3;

/// A bot exchange event of either direction.
///
/// `client_id` and `chat_id` are written as strings because providers require
/// them so; they are read from numbers too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BotEvent {
    ClientMessage(ClientMessage),
    BotMessage(BotMessage),
    InviteAgent(InviteAgent),
    AgentJoined(ChatNotice),
    AgentUnavailable(ChatNotice),
    ChatClosed(ChatNotice),
    ClientInfo(ClientInfo),
}

impl BotEvent {
    /// The wire value of `event`.
    pub fn event_name(&self) -> &'static str {
        match self {
            BotEvent::ClientMessage(_) => "CLIENT_MESSAGE",
            BotEvent::BotMessage(_) => "BOT_MESSAGE",
            BotEvent::InviteAgent(_) => "INVITE_AGENT",
            BotEvent::AgentJoined(_) => "AGENT_JOINED",
            BotEvent::AgentUnavailable(_) => "AGENT_UNAVAILABLE",
            BotEvent::ChatClosed(_) => "CHAT_CLOSED",
            BotEvent::ClientInfo(_) => "CLIENT_INFO",
        }
    }

    /// The event id, the de-duplication key; sloppy providers leave it out,
    /// and such events are accepted without de-duplication.
    pub fn id(&self) -> Option<&str> {
        let id = match self {
            BotEvent::ClientMessage(e) => Some(&e.id),
            BotEvent::BotMessage(e) => e.id.as_ref(),
            BotEvent::InviteAgent(e) => e.id.as_ref(),
            BotEvent::AgentJoined(e) | BotEvent::AgentUnavailable(e) | BotEvent::ChatClosed(e) => {
                Some(&e.id)
            }
            BotEvent::ClientInfo(e) => e.id.as_ref(),
        };
        id.map(|l| l.0.as_str())
    }

    /// Every event names its chat, even when a provider omits everything else.
    pub fn chat_id(&self) -> &str {
        let chat = match self {
            BotEvent::ClientMessage(e) => &e.chat_id,
            BotEvent::BotMessage(e) => &e.chat_id,
            BotEvent::InviteAgent(e) => &e.chat_id,
            BotEvent::AgentJoined(e) | BotEvent::AgentUnavailable(e) | BotEvent::ChatClosed(e) => {
                &e.chat_id
            }
            BotEvent::ClientInfo(e) => &e.chat_id,
        };
        &chat.0
    }
}

/// A client's message, hub to provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClientMessage {
    /// A UUID: providers de-duplicate on it because the hub retries.
    pub id: Label,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_id: Option<Label>,
    pub client_id: Label,
    pub chat_id: Label,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents_online: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<Sender>,
    pub message: Message,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
}

/// The client who wrote; unlike the event's `client_id`, providers get the id as a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Sender {
    pub id: NumericId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_contacts: Option<bool>,
    /// Contact details the hub knows (from the customer or `CLIENT_INFO`);
    /// not in the field notes' sample, sent so a bot need not ask twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
}

/// The channel the client writes through (`widget`, a messenger, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Channel {
    pub id: Label,
    #[serde(rename = "type")]
    pub kind: String,
}

/// The provider's answer; `id` and `client_id` are optional because real
/// providers omit them and `chat_id` is enough to find the chat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BotMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<Label>,
    pub chat_id: Label,
    pub message: Message,
}

/// The provider hands the dialogue to an agent; as sloppy as `BOT_MESSAGE`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InviteAgent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<Label>,
    pub chat_id: Label,
}

/// `AGENT_JOINED`, `AGENT_UNAVAILABLE` and `CHAT_CLOSED`, all hub to provider.
/// The spec shows no fields for `CHAT_CLOSED`; the hub sends the same three.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChatNotice {
    pub id: Label,
    pub client_id: Label,
    pub chat_id: Label,
}

/// Contact details the bot collected, provider to hub. The spec shows no
/// fields; providers send them in a `client_info` object (some say
/// `contact_info`, some put them at the top level): all three are read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClientInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<Label>,
    pub chat_id: Label,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info: Option<Contacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact_info: Option<Contacts>,
    #[serde(flatten)]
    pub top_level: Contacts,
}

impl ClientInfo {
    /// What the provider sent, wherever it put it: `client_info` first,
    /// then `contact_info`, then the top level, field by field.
    pub fn contacts(&self) -> Contacts {
        let mut out = Contacts::default();
        for c in [&self.client_info, &self.contact_info]
            .into_iter()
            .flatten()
            .chain(std::iter::once(&self.top_level))
        {
            out.fill_from(c);
        }
        out
    }
}

/// A client's contact details, as the widget's contact info has them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Contacts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl Contacts {
    fn fill_from(&mut self, other: &Contacts) {
        let pick = |mine: &mut Option<String>, theirs: &Option<String>| {
            if mine.is_none() {
                *mine = theirs.clone().filter(|v| !v.trim().is_empty());
            }
        };
        pick(&mut self.name, &other.name);
        pick(&mut self.email, &other.email);
        pick(&mut self.phone, &other.phone);
        pick(&mut self.description, &other.description);
    }

    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.email.is_none()
            && self.phone.is_none()
            && self.description.is_none()
    }
}

/// One thing a plugin bot's reply asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum BotAnswer {
    /// A `BOT_MESSAGE`.
    Message(Message),
    /// `INVITE_AGENT`: hand the chat to agents.
    InviteAgent,
    /// `CLIENT_INFO`: contacts the bot collected.
    ClientInfo(Contacts),
}

/// A plugin bot's reply holds at most this many answers.
pub const MAX_ANSWERS: usize = 5;

/// Reads a plugin bot's reply: a message object (`{"type":"TEXT",…}`), a
/// provider event (`{"event":"BOT_MESSAGE","message":…}`, `INVITE_AGENT`,
/// `CLIENT_INFO`), or an array of up to [`MAX_ANSWERS`] of those, applied in
/// order. A message without `timestamp` gets `now` (Unix seconds).
pub fn parse_answers(reply: &serde_json::Value, now: i64) -> Result<Vec<BotAnswer>, String> {
    let items: Vec<&serde_json::Value> = match reply {
        serde_json::Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    if items.is_empty() || items.len() > MAX_ANSWERS {
        return Err(format!(
            "a bot reply holds 1 to {MAX_ANSWERS} answers, got {}",
            items.len()
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse_answer(item, now).map_err(|e| format!("answer {i}: {e}")))
        .collect()
}

fn parse_answer(item: &serde_json::Value, now: i64) -> Result<BotAnswer, String> {
    let message = |m: &serde_json::Value| -> Result<Message, String> {
        let mut m = m.clone();
        if let Some(fields) = m.as_object_mut() {
            fields
                .entry("timestamp")
                .or_insert_with(|| serde_json::Value::from(now));
        }
        serde_json::from_value(m).map_err(|e| format!("not a bot message: {e}"))
    };
    match item.get("event").and_then(|e| e.as_str()) {
        None if item.get("type").is_some() => message(item).map(BotAnswer::Message),
        None => Err("neither a message (`type`) nor an event (`event`)".to_owned()),
        Some("BOT_MESSAGE") => {
            let m = item.get("message").ok_or("BOT_MESSAGE without `message`")?;
            message(m).map(BotAnswer::Message)
        }
        Some("INVITE_AGENT") => Ok(BotAnswer::InviteAgent),
        Some("CLIENT_INFO") => {
            let mut info = item.clone();
            if let Some(fields) = info.as_object_mut() {
                fields
                    .entry("chat_id")
                    .or_insert_with(|| serde_json::Value::from(""));
            }
            let info: ClientInfo =
                serde_json::from_value(info).map_err(|e| format!("CLIENT_INFO: {e}"))?;
            Ok(BotAnswer::ClientInfo(info.contacts()))
        }
        Some(other) => Err(format!("`{other}` is not an event a bot sends")),
    }
}

/// A bot exchange message, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(rename = "BotMessageContent")
)]
#[serde(tag = "type", rename_all = "UPPERCASE")]
pub enum Message {
    Text(TextMessage),
    Markdown(MarkdownMessage),
    Buttons(ButtonsMessage),
}

impl Message {
    pub fn timestamp(&self) -> &Timestamp {
        match self {
            Message::Text(m) => &m.timestamp,
            Message::Markdown(m) => &m.timestamp,
            Message::Buttons(m) => &m.timestamp,
        }
    }

    /// What a channel without rich messages sends the customer: the plain
    /// `text`, for buttons followed by the button texts (so the customer can
    /// answer with one); `None` when there is no plain text, and then the
    /// message is for agents only.
    pub fn customer_text(&self) -> Option<String> {
        let text = self.plain_text().trim();
        if text.is_empty() {
            return None;
        }
        match self {
            Message::Buttons(b) if !b.buttons.is_empty() => {
                let mut out = text.to_owned();
                for button in &b.buttons {
                    out.push_str("\n- ");
                    out.push_str(&button.text);
                }
                Some(out)
            }
            _ => Some(text.to_owned()),
        }
    }

    /// What agents and transcripts show: the plain text, or the Markdown
    /// source and the button texts when there is none.
    pub fn display_text(&self) -> String {
        if let Some(text) = self.customer_text() {
            return text;
        }
        match self {
            Message::Text(m) => m.text.clone(),
            Message::Markdown(m) => m.content.clone(),
            Message::Buttons(b) => {
                let buttons: Vec<&str> = b.buttons.iter().map(|x| x.text.as_str()).collect();
                format!("{} [{}]", b.title, buttons.join("] ["))
            }
        }
    }

    /// The id of the button whose text `answer` is, if this offers one.
    pub fn button_for(&self, answer: &str) -> Option<&Button> {
        let Message::Buttons(b) = self else {
            return None;
        };
        let answer = answer.trim();
        b.buttons
            .iter()
            .find(|button| button.text.trim().eq_ignore_ascii_case(answer))
    }

    /// What a channel without rich messages shows: every type carries a plain `text`.
    pub fn plain_text(&self) -> &str {
        match self {
            Message::Text(m) => &m.text,
            Message::Markdown(m) => &m.text,
            Message::Buttons(m) => &m.text,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TextMessage {
    pub text: String,
    /// The button the client clicked, when the text is a prepared answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub button_id: Option<Label>,
    pub timestamp: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MarkdownMessage {
    pub content: String,
    /// Fallback for channels without Markdown; without it the message is not sent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub button_id: Option<Label>,
    pub timestamp: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ButtonsMessage {
    #[serde(default)]
    pub title: String,
    /// Fallback for channels without buttons; without it the message is not sent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(deserialize_with = "at_most_max_buttons")]
    pub buttons: Vec<Button>,
    pub timestamp: Timestamp,
}

/// A prepared answer; one variant of the interface gives it no `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Button {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Label>,
}

/// Unix time. The spec's table says string, its samples and every provider use
/// a number; both are read and the JSON type is kept, so echoes are exact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum Timestamp {
    Number(Number),
    Text(String),
}

impl Timestamp {
    /// The form the hub writes, as in the spec's samples.
    pub fn from_unix(seconds: i64) -> Self {
        Timestamp::Number(seconds.into())
    }

    /// Whole seconds, if the value is a time at all.
    pub fn unix_seconds(&self) -> Option<i64> {
        match self {
            Timestamp::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
            Timestamp::Text(s) => {
                let s = s.trim();
                s.parse::<i64>().ok().or_else(|| {
                    s.parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .map(|f| f as i64)
                })
            }
        }
    }
}

fn at_most_max_buttons<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Button>, D::Error> {
    let buttons = Vec::<Button>::deserialize(d)?;
    if buttons.len() > MAX_BUTTONS {
        return Err(D::Error::custom(format!(
            "at most {MAX_BUTTONS} buttons, got {}",
            buttons.len()
        )));
    }
    Ok(buttons)
}

/// The body of an error answer in either direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The token in the path names no bot channel.
    InvalidClient,
    /// The `Authorization` header was refused.
    UnauthorizedClient,
    InvalidRequest,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code,
                message: message.into(),
            },
        }
    }
}

impl ErrorCode {
    /// The HTTP status that goes with the code (both authentication failures are 401).
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidClient | ErrorCode::UnauthorizedClient => 401,
            ErrorCode::InvalidRequest => 400,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    fn check<T: DeserializeOwned + Serialize>(input: Value, expected: Value) -> T {
        let parsed: T = serde_json::from_value(input).expect("parses");
        assert_eq!(serde_json::to_value(&parsed).unwrap(), expected);
        parsed
    }

    fn same<T: DeserializeOwned + Serialize>(v: Value) -> T {
        check(v.clone(), v)
    }

    const UUID: &str = "9661ab9c-48b0-11ed-a3d6-859398ff9bd9";

    #[test]
    fn field_notes_client_message_round_trips() {
        let sample = r#"{"id":"9661ab9c-48b0-11ed-a3d6-859398ff9bd9","site_id":"123456","client_id":"1233","chat_id":"2037",
  "agents_online":true,"sender":{"id":1233,"name":"John Smith","url":"https://test.com","has_contacts":true},
  "message":{"type":"TEXT","text":"Can you help me?","timestamp":1665415879},
  "channel":{"id":"12345678","type":"widget"},"event":"CLIENT_MESSAGE"}"#;
        let e: BotEvent = serde_json::from_str(sample).unwrap();
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::from_str::<Value>(sample).unwrap()
        );
        assert_eq!(e.event_name(), "CLIENT_MESSAGE");
        assert_eq!(e.id(), Some(UUID));
        assert_eq!(e.chat_id(), "2037");
        let BotEvent::ClientMessage(m) = e else {
            panic!("wrong variant")
        };
        assert_eq!(m.message.timestamp().unix_seconds(), Some(1665415879));
        assert_eq!(m.message.plain_text(), "Can you help me?");
    }

    #[test]
    fn client_and_chat_ids_are_written_as_strings() {
        let input = json!({"event":"CLIENT_MESSAGE","id":UUID,"client_id":1233,"chat_id":2037,
                           "message":{"type":"TEXT","text":"hi","timestamp":1}});
        let expected = json!({"event":"CLIENT_MESSAGE","id":UUID,"client_id":"1233",
                              "chat_id":"2037","message":{"type":"TEXT","text":"hi","timestamp":1}});
        check::<BotEvent>(input, expected);
        check::<BotEvent>(
            json!({"event":"AGENT_JOINED","id":UUID,"client_id":5,"chat_id":6}),
            json!({"event":"AGENT_JOINED","id":UUID,"client_id":"5","chat_id":"6"}),
        );
    }

    #[test]
    fn bot_message_samples_round_trip() {
        let e: BotEvent = same(json!({"id":UUID,"client_id":"1233","chat_id":"2037",
            "event":"BOT_MESSAGE","message":{"type":"TEXT","text":"Sure","timestamp":1583910736}}));
        assert_eq!(e.event_name(), "BOT_MESSAGE");
        same::<BotEvent>(
            json!({"id":UUID,"client_id":"1233","chat_id":"2037","event":"BOT_MESSAGE",
            "message":{"type":"BUTTONS","title":"Agree?","text":"fallback","timestamp":1583910736,
                       "buttons":[{"text":"Yes","id":"1"},{"text":"No","id":"2"}]}}),
        );
    }

    #[test]
    fn sloppy_bot_messages_parse() {
        let no_client: BotEvent = same(json!({"id":UUID,"chat_id":"2037","event":"BOT_MESSAGE",
            "message":{"type":"TEXT","text":"a","timestamp":1}}));
        assert_eq!(no_client.id(), Some(UUID));
        let no_id: BotEvent = same(json!({"chat_id":"2037","event":"BOT_MESSAGE",
            "message":{"type":"TEXT","text":"a","timestamp":1}}));
        assert_eq!(no_id.id(), None);
        assert_eq!(no_id.chat_id(), "2037");
        let bare: BotEvent = same(json!({"chat_id":"2037","event":"BOT_MESSAGE",
            "message":{"type":"TEXT","text":"a","timestamp":1}}));
        assert!(matches!(
            bare,
            BotEvent::BotMessage(BotMessage {
                client_id: None,
                ..
            })
        ));
        assert!(
            serde_json::from_value::<BotEvent>(json!({"id":UUID,"event":"BOT_MESSAGE",
                "message":{"type":"TEXT","text":"a","timestamp":1}}))
            .is_err(),
            "chat_id is what identifies the chat"
        );
    }

    #[test]
    fn every_message_type_round_trips() {
        for message in [
            json!({"type":"TEXT","text":"Yes","button_id":"1","timestamp":1665415879}),
            json!({"type":"TEXT","text":"Yes","timestamp":"1665415879"}),
            json!({"type":"MARKDOWN","content":"**Hi** [site](https://example.com)",
                   "text":"Hi site","timestamp":1665415879}),
            json!({"type":"MARKDOWN","content":"_x_","text":"x","button_id":"2",
                   "timestamp":"1665415879"}),
            json!({"type":"BUTTONS","title":"Pick","text":"a, b or c","timestamp":1665415879,
                   "buttons":[{"text":"a","id":"1"},{"text":"b","id":"2"},{"text":"c","id":"3"}]}),
            json!({"type":"BUTTONS","title":"Pick","text":"a or b","timestamp":"1665415879",
                   "buttons":[{"text":"a"},{"text":"b"}]}),
        ] {
            let m: Message = same(message);
            assert_eq!(m.timestamp().unix_seconds(), Some(1665415879));
        }
    }

    #[test]
    fn the_customer_gets_the_plain_text_and_the_button_texts() {
        let buttons: Message = same(json!({"type":"BUTTONS","title":"Pick","text":"Choose one",
            "timestamp":1,"buttons":[{"text":"Yes","id":"1"},{"text":"No","id":"2"}]}));
        assert_eq!(
            buttons.customer_text().as_deref(),
            Some("Choose one\n- Yes\n- No")
        );
        assert_eq!(
            buttons
                .button_for(" yes ")
                .and_then(|b| b.id.as_ref())
                .map(|l| l.0.as_str()),
            Some("1")
        );
        assert!(buttons.button_for("maybe").is_none());
        let no_text: Message = same(json!({"type":"MARKDOWN","content":"**x**","timestamp":1}));
        assert_eq!(no_text.customer_text(), None, "agents only");
        assert_eq!(no_text.display_text(), "**x**");
    }

    #[test]
    fn plugin_answers_are_one_or_several_messages_or_events() {
        let one = parse_answers(&json!({"type":"TEXT","text":"hi"}), 77).unwrap();
        assert_eq!(
            one,
            vec![BotAnswer::Message(Message::Text(TextMessage {
                text: "hi".into(),
                button_id: None,
                timestamp: Timestamp::from_unix(77)
            }))]
        );
        let several = parse_answers(
            &json!([{"event":"BOT_MESSAGE","message":{"type":"TEXT","text":"a","timestamp":1}},
                    {"event":"CLIENT_INFO","client_info":{"name":"Ann"}},
                    {"event":"INVITE_AGENT"}]),
            0,
        )
        .unwrap();
        assert_eq!(several.len(), 3);
        assert_eq!(several[2], BotAnswer::InviteAgent);
        assert!(
            matches!(&several[1], BotAnswer::ClientInfo(c) if c.name.as_deref() == Some("Ann"))
        );
        for bad in [
            json!([]),
            json!({"text":"no type"}),
            json!({"event":"CHAT_CLOSED"}),
            json!({"event":"BOT_MESSAGE"}),
            json!([1, 2, 3, 4, 5, 6]),
        ] {
            assert!(parse_answers(&bad, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn buttons_are_limited_to_three() {
        let four = json!({"type":"BUTTONS","title":"t","text":"f","timestamp":1,
            "buttons":[{"text":"1"},{"text":"2"},{"text":"3"},{"text":"4"}]});
        let err = serde_json::from_value::<Message>(four).unwrap_err();
        assert!(err.to_string().contains("at most 3 buttons"), "{err}");
        assert!(serde_json::from_value::<Message>(json!({"type":"IMAGE","timestamp":1})).is_err());
    }

    #[test]
    fn timestamps_keep_their_json_type() {
        assert_eq!(
            same::<Timestamp>(json!(1665415879)).unix_seconds(),
            Some(1665415879)
        );
        assert_eq!(
            same::<Timestamp>(json!("1665415879")).unix_seconds(),
            Some(1665415879)
        );
        assert_eq!(
            same::<Timestamp>(json!(1665415879.5)).unix_seconds(),
            Some(1665415879)
        );
        assert_eq!(same::<Timestamp>(json!("soon")).unix_seconds(), None);
        assert_eq!(
            serde_json::to_value(Timestamp::from_unix(1583910736)).unwrap(),
            json!(1583910736)
        );
    }

    #[test]
    fn invite_agent_round_trips_strict_and_sloppy() {
        let e: BotEvent =
            same(json!({"event":"INVITE_AGENT","id":UUID,"client_id":"1233","chat_id":"2037"}));
        assert_eq!(e.event_name(), "INVITE_AGENT");
        let sloppy: BotEvent = same(json!({"event":"INVITE_AGENT","chat_id":"2037"}));
        assert_eq!(sloppy.id(), None);
    }

    #[test]
    fn service_notices_round_trip() {
        for name in ["AGENT_JOINED", "AGENT_UNAVAILABLE", "CHAT_CLOSED"] {
            let e: BotEvent =
                same(json!({"event":name,"id":UUID,"client_id":"1233","chat_id":"2037"}));
            assert_eq!(e.event_name(), name);
            assert_eq!(e.id(), Some(UUID));
            // The hub's own notices are complete: the id is required.
            assert!(
                serde_json::from_value::<BotEvent>(
                    json!({"event":name,"client_id":"1","chat_id":"2"})
                )
                .is_err()
            );
        }
    }

    #[test]
    fn client_info_round_trips() {
        let e: BotEvent = same(json!({"event":"CLIENT_INFO","id":UUID,"client_id":"1233",
            "chat_id":"2037","name":"John Smith","email":"john@example.com","phone":"+1555",
            "description":"wants a callback"}));
        assert_eq!(e.event_name(), "CLIENT_INFO");
        same::<BotEvent>(json!({"event":"CLIENT_INFO","chat_id":"2037","phone":"+1555"}));
        let nested: BotEvent = same(json!({"event":"CLIENT_INFO","chat_id":"1",
            "client_info":{"name":"Ann","email":"ann@example.com"},
            "contact_info":{"name":"Other","phone":"+1"}}));
        let BotEvent::ClientInfo(info) = nested else {
            panic!("wrong variant")
        };
        let c = info.contacts();
        assert_eq!(c.name.as_deref(), Some("Ann"), "client_info comes first");
        assert_eq!(c.email.as_deref(), Some("ann@example.com"));
        assert_eq!(
            c.phone.as_deref(),
            Some("+1"),
            "contact_info fills the gaps"
        );
    }

    #[test]
    fn unknown_events_are_refused() {
        assert!(
            serde_json::from_value::<BotEvent>(json!({"event":"TYPING","chat_id":"1"})).is_err()
        );
    }

    #[test]
    fn error_bodies_round_trip() {
        for (code, status) in [
            ("invalid_client", 401),
            ("unauthorized_client", 401),
            ("invalid_request", 400),
        ] {
            let body: ErrorBody = same(json!({"error":{"code":code,"message":"why"}}));
            assert_eq!(body.error.code.http_status(), status);
        }
        assert_eq!(
            serde_json::to_value(ErrorBody::new(ErrorCode::InvalidClient, "unknown token"))
                .unwrap(),
            json!({"error":{"code":"invalid_client","message":"unknown token"}})
        );
    }
}
