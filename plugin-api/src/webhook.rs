//! Event-webhook payloads: what the hub posts to an integrator's `{webhook_url}`
//! (tagged by `event_name`) and the reply that may carry data for the agent.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::lenient::{ExternalId, Label};
use crate::widget::CustomDataField;

/// An identifier the spec types as a number that some senders quote (`"3599"`):
/// read either way, always written as a number. The CRM and bot payloads use it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct NumericId(pub i64);

impl<'de> Deserialize<'de> for NumericId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match ExternalId::deserialize(d)? {
            ExternalId::Int(n) => Ok(NumericId(n)),
            ExternalId::Str(s) => s
                .trim()
                .parse()
                .map(NumericId)
                .map_err(|_| D::Error::custom(format!("expected an integer id, got {s:?}"))),
        }
    }
}

impl From<i64> for NumericId {
    fn from(n: i64) -> Self {
        NumericId(n)
    }
}

impl fmt::Display for NumericId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The visitor as known when the event fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Visitor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    /// Required by the spec, but senders write `null` for "nothing known".
    #[serde(default, deserialize_with = "text_or_empty")]
    pub description: String,
    /// A string per the spec's table; some payloads carry it as a number.
    pub number: Label,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub social: Option<Map<String, Value>>,
    pub chats_count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Organization {
    pub id: NumericId,
    pub name: String,
}

/// The client's category.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Status {
    pub id: NumericId,
    pub title: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AssignedAgent {
    pub id: NumericId,
    pub email: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Tag {
    pub id: NumericId,
    pub title: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Department {
    pub id: NumericId,
    pub name: String,
}

/// The visitor's browsing session; any part may be unknown (no geo data for a
/// private address, no UTM for a direct visit), so every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Session {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub geoip: Option<GeoIp>,
    /// Deprecated by the spec in favour of `utm_json`; kept because old receivers parse it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utm_json: Option<UtmJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
}

/// All strings on the wire, coordinates and region codes included; numbers are
/// accepted because geo databases hand them out as numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GeoIp {
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub region_code: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub country_code: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub country: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub region: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub city: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub latitude: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub longitude: Option<String>,
    #[serde(
        default,
        deserialize_with = "opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub organization: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UtmJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<String>,
}

/// A page the visitor is on; also the `page` of a webhook reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Page {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// An agent; `id` is an integer per the spec although its samples quote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Agent {
    pub id: NumericId,
    pub name: String,
    pub email: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Call {
    #[serde(rename = "type")]
    pub kind: CallType,
    pub phone: String,
    pub status: CallStatus,
    /// Only with `status: error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Only once the call has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_url: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CallType {
    Callback,
    Incoming,
    Outgoing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    Start,
    End,
    AgentConnected,
    ClientConnected,
    Error,
}

/// The finished chat as sent with `chat_finished`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Chat {
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub blacklisted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invitation: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Rate {
    Positive,
    Negative,
}

/// One line of the chat log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChatMessage {
    pub message: String,
    pub timestamp: i64,
    #[serde(rename = "type")]
    pub kind: ChatMessageKind,
    /// Present only when `kind` is `Agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<NumericId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blacklisted: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ChatMessageKind {
    Visitor,
    Agent,
}

/// The conversation topic an agent picked; `parent_id` is absent for a root topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Topic {
    pub topic_id: NumericId,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<NumericId>,
}

/// An event posted to `{webhook_url}`, tagged by `event_name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum WebhookEvent {
    CallEvent(CallEvent),
    ChatAccepted(ChatEvent),
    ChatAssigned(ChatAssigned),
    ChatUpdated(ChatEvent),
    ClientUpdated(ClientUpdated),
    ClientAttributeUpdated(ClientAttributeUpdated),
    ChatFinished(ChatFinished),
    /// The spec's type table spells the name `offline_messages`; its samples do not.
    #[serde(alias = "offline_messages")]
    OfflineMessage(OfflineMessage),
}

impl WebhookEvent {
    /// The wire value of `event_name`.
    pub fn event_name(&self) -> &'static str {
        match self {
            WebhookEvent::CallEvent(_) => "call_event",
            WebhookEvent::ChatAccepted(_) => "chat_accepted",
            WebhookEvent::ChatAssigned(_) => "chat_assigned",
            WebhookEvent::ChatUpdated(_) => "chat_updated",
            WebhookEvent::ClientUpdated(_) => "client_updated",
            WebhookEvent::ClientAttributeUpdated(_) => "client_attribute_updated",
            WebhookEvent::ChatFinished(_) => "chat_finished",
            WebhookEvent::OfflineMessage(_) => "offline_message",
        }
    }

    /// Only these replies may carry data for the agent; for the others the hub
    /// reads nothing but the outcome.
    pub fn reply_carries_data(&self) -> bool {
        matches!(
            self,
            WebhookEvent::ChatAccepted(_) | WebhookEvent::ChatUpdated(_)
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CallEvent {
    pub chat_id: NumericId,
    pub widget_id: Label,
    pub visitor: Visitor,
    /// Absent while a widget visitor's callback request waits for an agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub department: Option<Department>,
    pub session: Session,
    pub page: Page,
    pub call: Call,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytics: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<Topic>,
}

/// The body of `chat_accepted` and `chat_updated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChatEvent {
    pub widget_id: Label,
    /// Present even when the page set no token: receivers test it against null.
    #[serde(default)]
    pub user_token: Option<String>,
    pub visitor: Visitor,
    #[serde(default)]
    pub organization: Option<Organization>,
    #[serde(default)]
    pub status: Option<Status>,
    #[serde(default)]
    pub assigned_agent: Option<AssignedAgent>,
    #[serde(default)]
    pub tags: Vec<Tag>,
    pub chat_id: NumericId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub department: Option<Department>,
    pub session: Session,
    pub page: Page,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytics: Option<Map<String, Value>>,
    /// Always set for `chat_accepted`; `chat_updated` can fire before any agent
    /// accepted (a contact form filled while the chat waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<Topic>,
}

/// `chat_accepted` plus the CRM link the agent followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChatAssigned {
    #[serde(flatten)]
    pub chat: ChatEvent,
    pub assign_to: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClientUpdated {
    pub widget_id: Label,
    #[serde(default)]
    pub user_token: Option<String>,
    pub visitor: Visitor,
    #[serde(default)]
    pub organization: Option<Organization>,
    #[serde(default)]
    pub status: Option<Status>,
    #[serde(default)]
    pub assigned_agent: Option<AssignedAgent>,
    #[serde(default)]
    pub tags: Vec<Tag>,
    pub client_id: NumericId,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClientAttributeUpdated {
    pub widget_id: Label,
    #[serde(default)]
    pub user_token: Option<String>,
    pub client_id: NumericId,
    /// Attribute values are whatever the account defined: any JSON type.
    #[serde(default)]
    pub attributes: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ChatFinished {
    /// Not in the spec's list for this event, but the service sends both and
    /// receivers use them to tell channels and visitors apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub widget_id: Option<Label>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_token: Option<String>,
    pub visitor: Visitor,
    #[serde(default)]
    pub agents: Vec<Agent>,
    pub chat: Chat,
    pub chat_id: NumericId,
    pub session: Session,
    pub page: Page,
    pub plain_messages: String,
    pub html_messages: String,
    #[serde(default)]
    pub organization: Option<Organization>,
    #[serde(default)]
    pub status: Option<Status>,
    #[serde(default)]
    pub assigned_agent: Option<AssignedAgent>,
    #[serde(default)]
    pub tags: Vec<Tag>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytics: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<Topic>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OfflineMessage {
    pub widget_id: Label,
    #[serde(default)]
    pub user_token: Option<String>,
    pub visitor: Visitor,
    pub session: Session,
    pub page: Page,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytics: Option<Map<String, Value>>,
    pub chat_id: NumericId,
    pub message: String,
    /// String or number per the spec: kept in the type it came in.
    pub offline_message_id: ExternalId,
}

/// The integrator's JSON answer to an event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WebhookReply {
    /// A reply without `result` applies nothing, exactly like a failure text.
    #[serde(default)]
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_data: Option<Vec<CustomDataField>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact_info: Option<ReplyContactInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_assign: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crm_link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<Page>,
}

impl WebhookReply {
    /// A bare success, the only answer most events expect.
    pub fn ok() -> Self {
        WebhookReply {
            result: "ok".to_owned(),
            ..WebhookReply::default()
        }
    }

    /// Integrators write both `ok` and `OK`; nothing else lets the data through.
    pub fn is_ok(&self) -> bool {
        self.result.eq_ignore_ascii_case("ok")
    }
}

/// Contact details from a reply, shown as if the visitor had introduced themselves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReplyContactInfo {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

fn opt_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(D::Error::custom(format!("expected a string, got {other}"))),
    }
}

fn text_or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(opt_text(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    /// Parses `input`, serializes the result and checks it against `expected`.
    fn check<T: DeserializeOwned + Serialize>(input: Value, expected: Value) -> T {
        let parsed: T = serde_json::from_value(input).expect("parses");
        assert_eq!(serde_json::to_value(&parsed).unwrap(), expected);
        parsed
    }

    fn same<T: DeserializeOwned + Serialize>(v: Value) -> T {
        check(v.clone(), v)
    }

    fn visitor() -> Value {
        json!({"name":"John Smith","email":"email@example.com","phone":"+14084987855",
               "description":"Description text","number":"2746","social":{},"chats_count":8})
    }

    fn agent() -> Value {
        json!({"id":3599,"name":"Thomas Anderson","email":"agent@example.com","phone":"+14083682346"})
    }

    fn session() -> Value {
        json!({
            "geoip":{"region_code":"CA","country_code":"US","country":"United States",
                     "region":"California","city":"San Francisco","latitude":"37.7898",
                     "longitude":"-122.3942","organization":"Example ISP"},
            "utm":"source=google|medium=cpc|content=banner|campaign=campaign_name",
            "utm_json":{"source":"google","campaign":"campaign_name","content":"banner",
                        "medium":"cpc","term":"chat"},
            "ip_addr":"208.80.152.201",
            "user_agent":"Mozilla/5.0"
        })
    }

    fn page() -> Value {
        json!({"url":"http://example.com/","title":"Page title"})
    }

    fn chat_event_body(name: &str) -> Value {
        json!({
            "event_name": name,
            "widget_id": "2853",
            "user_token": "u-77",
            "visitor": visitor(),
            "organization": {"id": 12, "name": "Acme"},
            "status": {"id": 3, "title": "Lead"},
            "assigned_agent": {"id": 3599, "email": "agent@example.com", "name": "Thomas Anderson"},
            "tags": [{"id": 1, "title": "vip"}, {"id": 2, "title": "new"}],
            "chat_id": 4398,
            "department": {"id": 181, "name": "Sales"},
            "session": session(),
            "page": page(),
            "analytics": {"ga_client_id": "1.2"},
            "agent": agent(),
            "topic": {"topic_id": 5, "title": "Billing", "parent_id": 1}
        })
    }

    #[test]
    fn call_event_round_trips() {
        let body = json!({
            "event_name":"call_event","chat_id":4398,"widget_id":"2853","visitor":visitor(),
            "agent":agent(),"department":{"id":181,"name":"Sales"},"session":session(),
            "page":page(),
            "call":{"type":"callback","phone":"+14084987855","status":"end",
                    "record_url":"http://example.com/record.mp3"},
            "analytics":{}
        });
        let e: WebhookEvent = same(body);
        assert_eq!(e.event_name(), "call_event");
        let WebhookEvent::CallEvent(c) = e else {
            panic!("wrong variant")
        };
        assert_eq!(c.call.kind, CallType::Callback);
        assert_eq!(c.call.status, CallStatus::End);
    }

    #[test]
    fn every_call_type_and_status_round_trips() {
        for kind in ["callback", "incoming", "outgoing"] {
            for status in [
                "start",
                "end",
                "agent_connected",
                "client_connected",
                "error",
            ] {
                let mut call = json!({"type": kind, "phone": "+1", "status": status});
                if status == "error" {
                    call["reason"] = json!("busy");
                }
                same::<Call>(call);
            }
        }
    }

    #[test]
    fn chat_accepted_and_updated_round_trip() {
        for name in ["chat_accepted", "chat_updated"] {
            let e: WebhookEvent = same(chat_event_body(name));
            assert_eq!(e.event_name(), name);
            assert!(e.reply_carries_data());
        }
    }

    #[test]
    fn chat_assigned_round_trips_with_assign_to() {
        let mut body = chat_event_body("chat_assigned");
        body["assign_to"] = json!("https://crm.example.com/clients/17");
        let e: WebhookEvent = same(body);
        let WebhookEvent::ChatAssigned(a) = e else {
            panic!("wrong variant")
        };
        assert_eq!(a.assign_to, "https://crm.example.com/clients/17");
        assert_eq!(a.chat.chat_id, NumericId(4398));
    }

    #[test]
    fn unknown_visitor_links_stay_null() {
        let input = json!({
            "event_name":"chat_updated","widget_id":"2853","user_token":null,
            "visitor":{"description":"","number":"1","chats_count":1},
            "organization":null,"status":null,"assigned_agent":null,"tags":[],
            "chat_id":7,"session":{},"page":{"url":"https://example.com/"}
        });
        let WebhookEvent::ChatUpdated(chat) = same(input) else {
            panic!("wrong variant")
        };
        assert_eq!(chat.agent, None);
        assert_eq!(chat.organization, None);
    }

    #[test]
    fn absent_nullable_links_are_written_as_null() {
        let input = json!({
            "event_name":"client_updated","widget_id":"2853",
            "visitor":{"description":"d","number":"1","chats_count":1},"client_id":9
        });
        let expected = json!({
            "event_name":"client_updated","widget_id":"2853","user_token":null,
            "visitor":{"description":"d","number":"1","chats_count":1},
            "organization":null,"status":null,"assigned_agent":null,"tags":[],"client_id":9
        });
        check::<WebhookEvent>(input, expected);
    }

    #[test]
    fn ids_are_lenient_in_and_typed_out() {
        let input = json!({
            "event_name":"call_event","chat_id":"4398","widget_id":2853,
            "visitor":{"description":null,"number":2746,"chats_count":8},
            "agent":{"id":"3599","name":"T","email":"t@example.com"},
            "session":{"geoip":{"latitude":37.7898,"region_code":77}},"page":{"url":"u"},
            "call":{"type":"incoming","phone":"+1","status":"start"}
        });
        let expected = json!({
            "event_name":"call_event","chat_id":4398,"widget_id":"2853",
            "visitor":{"description":"","number":"2746","chats_count":8},
            "agent":{"id":3599,"name":"T","email":"t@example.com"},
            "session":{"geoip":{"latitude":"37.7898","region_code":"77"}},"page":{"url":"u"},
            "call":{"type":"incoming","phone":"+1","status":"start"}
        });
        check::<WebhookEvent>(input, expected);
        assert!(serde_json::from_value::<NumericId>(json!("abc")).is_err());
    }

    #[test]
    fn client_updated_round_trips() {
        let e: WebhookEvent = same(json!({
            "event_name":"client_updated","widget_id":"2853","user_token":"u-1",
            "visitor":visitor(),"organization":{"id":12,"name":"Acme"},
            "status":{"id":3,"title":"Lead"},
            "assigned_agent":{"id":3599,"email":"agent@example.com","name":"Thomas Anderson"},
            "tags":[{"id":1,"title":"vip"}],"client_id":12345
        }));
        assert_eq!(e.event_name(), "client_updated");
        assert!(!e.reply_carries_data());
    }

    #[test]
    fn client_attribute_updated_round_trips() {
        let e: WebhookEvent = same(json!({
            "event_name":"client_attribute_updated","widget_id":"2853","user_token":null,
            "client_id":12345,
            "attributes":{"plan":"gold","seats":12,"trial":false,"tags":["a","b"],"note":null}
        }));
        assert_eq!(e.event_name(), "client_attribute_updated");
    }

    #[test]
    fn chat_finished_round_trips() {
        let e: WebhookEvent = same(json!({
            "event_name":"chat_finished","widget_id":"2853","user_token":"u-1",
            "visitor":visitor(),"agents":[agent(),{"id":12,"name":"B","email":"b@example.com"}],
            "chat":{
                "messages":[
                    {"message":"Hello","timestamp":1665415879,"type":"visitor"},
                    {"message":"Hi!","timestamp":1665415885,"type":"agent","agent_id":3599},
                    {"message":"spam","timestamp":1665415890,"type":"visitor","blacklisted":true}
                ],
                "blacklisted":false,"rate":"positive","invitation":"Need help?"
            },
            "chat_id":4398,"session":session(),"page":page(),
            "plain_messages":"Hello\nHi!","html_messages":"<p>Hello</p><p>Hi!</p>",
            "organization":null,"status":{"id":3,"title":"Lead"},"assigned_agent":null,
            "tags":[],"analytics":{},"topic":{"topic_id":5,"title":"Billing"}
        }));
        let WebhookEvent::ChatFinished(f) = e else {
            panic!("wrong variant")
        };
        assert_eq!(f.chat.messages[1].kind, ChatMessageKind::Agent);
        assert_eq!(f.chat.rate, Some(Rate::Positive));
        same::<Chat>(json!({"messages":[],"blacklisted":true,"rate":"negative"}));
    }

    #[test]
    fn offline_message_round_trips_and_accepts_the_plural_name() {
        for id in [json!("om-1"), json!(77)] {
            let body = json!({
                "event_name":"offline_message","widget_id":"2853","user_token":null,
                "visitor":visitor(),"session":session(),"page":page(),"analytics":{},
                "chat_id":4398,"message":"Call me back","offline_message_id":id
            });
            let e: WebhookEvent = same(body.clone());
            assert_eq!(e.event_name(), "offline_message");
            let mut plural = body.clone();
            plural["event_name"] = json!("offline_messages");
            check::<WebhookEvent>(plural, body);
        }
    }

    #[test]
    fn unknown_event_names_are_refused() {
        let mut body = chat_event_body("chat_accepted");
        body["event_name"] = json!("chat_started");
        assert!(serde_json::from_value::<WebhookEvent>(body).is_err());
    }

    #[test]
    fn full_reply_round_trips() {
        let r: WebhookReply = same(json!({
            "result":"ok",
            "custom_data":[{"title":"Order","content":"#1234"},
                           {"title":"Profile","content":"Open","link":"https://crm.example.com/1"}],
            "contact_info":{"name":"John Smith","phone":"+14084987855","email":"john@example.com"},
            "enable_assign":true,
            "crm_link":"https://crm.example.com/clients/1",
            "page":{"url":"https://example.com/cart","title":"Cart"}
        }));
        assert!(r.is_ok());
        assert_eq!(r.custom_data.unwrap().len(), 2);
    }

    #[test]
    fn reply_result_is_case_insensitive() {
        for (result, ok) in [
            ("ok", true),
            ("OK", true),
            ("Ok", true),
            ("FAILURE", false),
            ("error: no such client", false),
        ] {
            let r: WebhookReply = same(json!({"result": result}));
            assert_eq!(r.is_ok(), ok, "{result}");
        }
        let empty: WebhookReply = serde_json::from_value(json!({})).unwrap();
        assert!(!empty.is_ok());
        assert_eq!(
            serde_json::to_value(WebhookReply::ok()).unwrap(),
            json!({"result":"ok"})
        );
    }
}
