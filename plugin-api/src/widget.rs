//! Widget scripting payloads: the objects a page passes to and gets back from
//! `widget_api` methods and callbacks, as the hub's widget script exchanges them.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `setCustomData` shows at most this many fields.
pub const MAX_CUSTOM_DATA_FIELDS: usize = 10;

/// One custom-data field shown to the agent, in array order. The page can forge
/// these, so `content` is rendered as text and `link` obeys the Safe URL setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CustomDataField {
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Shown in bold before a colon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Contact details as given to `setContactInfo`: only what is set is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContactInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What `getContactInfo()` returns: the name is `client_name` there, and pages
/// test the missing values against `null`, so all four are always written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContactInfoReading {
    #[serde(default)]
    pub client_name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub phone: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// The argument of `sendOfflineMessage` (the widget's offline form); a field
/// it does not know is refused, so nothing the visitor sent is silently lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OfflineMessageInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub message: String,
}

/// Longest offline message accepted, in characters.
pub const MAX_OFFLINE_MESSAGE_CHARS: usize = 4000;

impl OfflineMessageInput {
    /// The rules of the offline form: a message, and a way to answer it.
    pub fn validate(&self) -> Result<(), String> {
        if self.message.trim().is_empty() {
            return Err("message must not be empty".into());
        }
        if self.message.chars().count() > MAX_OFFLINE_MESSAGE_CHARS {
            return Err(format!(
                "message is longer than {MAX_OFFLINE_MESSAGE_CHARS} characters"
            ));
        }
        let blank = |v: &Option<String>| v.as_deref().is_none_or(|s| s.trim().is_empty());
        if blank(&self.email) && blank(&self.phone) {
            return Err("an e-mail address or a phone number is required".into());
        }
        if let Some(email) = self.email.as_deref().filter(|e| !e.trim().is_empty())
            && !email.contains('@')
        {
            return Err(format!("`{email}` is not an e-mail address"));
        }
        Ok(())
    }
}

/// The payload of the hub's `widget.offline_message` event: the visitor's
/// details and the message in the shape of a channel text message, so a
/// plugin that reads `message.text` treats it like any customer text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OfflineMessageEvent {
    pub visitor: ContactInfo,
    pub message: OfflineText,
}

/// `{"type": "text", "text": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OfflineText {
    /// Always `text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

impl From<&OfflineMessageInput> for OfflineMessageEvent {
    fn from(input: &OfflineMessageInput) -> Self {
        OfflineMessageEvent {
            visitor: ContactInfo {
                name: input.name.clone(),
                email: input.email.clone(),
                phone: input.phone.clone(),
                description: input.description.clone(),
            },
            message: OfflineText {
                kind: "text".to_owned(),
                text: input.message.clone(),
            },
        }
    }
}

impl OfflineMessageEvent {
    /// The form this payload describes, held to the form's rules.
    pub fn into_input(self) -> Result<OfflineMessageInput, String> {
        if self.message.kind != "text" {
            return Err("an offline message is text".to_owned());
        }
        let input = OfflineMessageInput {
            name: self.visitor.name,
            email: self.visitor.email,
            phone: self.visitor.phone,
            description: self.visitor.description,
            message: self.message.text,
        };
        input.validate()?;
        Ok(input)
    }

    /// Reads (and checks) a `widget.offline_message` payload.
    pub fn from_value(payload: serde_json::Value) -> Result<OfflineMessageInput, String> {
        let event: OfflineMessageEvent = serde_json::from_value(payload)
            .map_err(|e| format!("not a valid widget.offline_message: {e}"))?;
        event.into_input()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ResultStatus {
    Ok,
    Fail,
}

/// What every widget action returns (also the `widget_onCallEnd` argument).
/// Methods differ in where the failure text goes: `reason` for most,
/// `error` for `sendOfflineMessage`; `setUserToken` echoes `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ActionResult {
    pub result: ResultStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<TokenEcho>,
}

impl ActionResult {
    pub fn ok() -> Self {
        ActionResult {
            result: ResultStatus::Ok,
            reason: None,
            error: None,
            token: None,
        }
    }

    pub fn fail(reason: impl Into<String>) -> Self {
        ActionResult {
            reason: Some(reason.into()),
            ..ActionResult::with(ResultStatus::Fail)
        }
    }

    /// The `sendOfflineMessage` form of a failure.
    pub fn fail_error(error: impl Into<String>) -> Self {
        ActionResult {
            error: Some(error.into()),
            ..ActionResult::with(ResultStatus::Fail)
        }
    }

    /// The `setUserToken` answer.
    pub fn token(result: ResultStatus, token: TokenEcho) -> Self {
        ActionResult {
            token: Some(token),
            ..ActionResult::with(result)
        }
    }

    pub fn is_ok(&self) -> bool {
        self.result == ResultStatus::Ok
    }

    fn with(result: ResultStatus) -> Self {
        ActionResult {
            result,
            ..ActionResult::ok()
        }
    }
}

/// The `token` of a `setUserToken` result: the value given, or `false` when
/// there was none worth echoing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenEcho {
    Given(String),
    Refused,
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for TokenEcho {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TokenEcho".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "anyOf": [{ "type": "string" }, { "const": false }] })
    }
}

impl Serialize for TokenEcho {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TokenEcho::Given(t) => s.serialize_str(t),
            TokenEcho::Refused => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for TokenEcho {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Flag(bool),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => Ok(TokenEcho::Given(t)),
            Raw::Flag(false) => Ok(TokenEcho::Refused),
            Raw::Flag(true) => Err(D::Error::custom("token is a string or false")),
        }
    }
}

/// The `state` passed to `widget_onChangeState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum WidgetState {
    #[serde(rename = "chat")]
    Chat,
    #[serde(rename = "call")]
    Call,
    /// The callback form is open.
    #[serde(rename = "chat/call")]
    ChatCall,
    #[serde(rename = "label")]
    Label,
    /// The widget is minimised.
    #[serde(rename = "chat/min")]
    ChatMin,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    fn same<T: DeserializeOwned + Serialize>(v: Value) -> T {
        let parsed: T = serde_json::from_value(v.clone()).expect("parses");
        assert_eq!(serde_json::to_value(&parsed).unwrap(), v);
        parsed
    }

    #[test]
    fn custom_data_fields_round_trip() {
        let fields: Vec<CustomDataField> = same(json!([
            {"content":"#1234","title":"Order"},
            {"content":"Open card","title":"CRM","link":"https://crm.example.com/1"},
            {"content":"gold","key":"Plan"},
            {"content":"plain"}
        ]));
        assert_eq!(fields[2].key.as_deref(), Some("Plan"));
        assert!(serde_json::from_value::<CustomDataField>(json!({"title":"x"})).is_err());
    }

    #[test]
    fn contact_info_round_trips() {
        same::<ContactInfo>(json!({"name":"John","email":"j@example.com",
                                   "phone":"+1","description":"VIP"}));
        same::<ContactInfo>(json!({"email":"j@example.com"}));
    }

    #[test]
    fn contact_info_reading_keeps_nulls() {
        same::<ContactInfoReading>(json!({"client_name":"John","email":null,
                                          "phone":"+1","description":null}));
        assert_eq!(
            serde_json::to_value(ContactInfoReading::default()).unwrap(),
            json!({"client_name":null,"email":null,"phone":null,"description":null})
        );
    }

    #[test]
    fn offline_message_input_round_trips() {
        same::<OfflineMessageInput>(json!({"name":"John","email":"j@example.com","phone":"+1",
                                           "description":"d","message":"Call me"}));
        same::<OfflineMessageInput>(json!({"message":"Call me"}));
        assert!(serde_json::from_value::<OfflineMessageInput>(json!({"name":"x"})).is_err());
    }

    #[test]
    fn action_results_round_trip() {
        let ok: ActionResult = same(json!({"result":"ok"}));
        assert!(ok.is_ok());
        let fail: ActionResult = same(json!({"result":"fail","reason":"Callback disabled"}));
        assert!(!fail.is_ok());
        same::<ActionResult>(json!({"result":"fail","error":"email is invalid"}));
        same::<ActionResult>(json!({"result":"ok","token":"u-77"}));
        same::<ActionResult>(json!({"result":"fail","token":"u-77"}));
        same::<ActionResult>(json!({"result":"fail","token":false}));
        assert!(
            serde_json::from_value::<ActionResult>(json!({"result":"fail","token":true})).is_err()
        );
        assert!(serde_json::from_value::<ActionResult>(json!({"result":"maybe"})).is_err());
    }

    #[test]
    fn action_result_constructors_match_the_wire() {
        let cases = [
            (ActionResult::ok(), json!({"result":"ok"})),
            (
                ActionResult::fail("not an array"),
                json!({"result":"fail","reason":"not an array"}),
            ),
            (
                ActionResult::fail_error("email is invalid"),
                json!({"result":"fail","error":"email is invalid"}),
            ),
            (
                ActionResult::token(ResultStatus::Ok, TokenEcho::Given("t".into())),
                json!({"result":"ok","token":"t"}),
            ),
            (
                ActionResult::token(ResultStatus::Fail, TokenEcho::Refused),
                json!({"result":"fail","token":false}),
            ),
        ];
        for (value, wire) in cases {
            assert_eq!(serde_json::to_value(&value).unwrap(), wire);
        }
    }

    #[test]
    fn every_widget_state_round_trips() {
        for (wire, state) in [
            ("chat", WidgetState::Chat),
            ("call", WidgetState::Call),
            ("chat/call", WidgetState::ChatCall),
            ("label", WidgetState::Label),
            ("chat/min", WidgetState::ChatMin),
        ] {
            assert_eq!(same::<WidgetState>(json!(wire)), state);
        }
        assert!(serde_json::from_value::<WidgetState>(json!("open")).is_err());
    }
}
