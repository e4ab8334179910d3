//! The website widget's visitors in the core: who a visitor is (a key inside
//! a token the hub signs), their session, and what the page's `widget_api`
//! calls do to their client and chat. A visitor's messages are customer
//! messages of the widget channel (the door's `CustomerMessage`); what is
//! here crosses the pipeline as `widget.*` events.

use hmac::{Hmac, Mac};
use plugin_api::widget::{ContactInfo, CustomDataField, MAX_CUSTOM_DATA_FIELDS};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use crate::core::conversations::Conversations;
use crate::core::error::CoreError;
use crate::core::error::Passage;
use crate::core::live::client_view;
use crate::core::webhooks;
use crate::event::{Direction, Event, EventKind};
use crate::ids::{constant_time_eq, random_token};
use crate::pipeline::record_in;
use crate::store::calls::{self, NewCall};
use crate::store::chats::{ContactUpdate, set_client_contact, set_client_description};
use crate::store::widget::{
    PageReport, set_custom_data, set_history_from, set_page, set_user_token, take_attribute_call,
};
use crate::store::{Channel, Client, Conn, MessageRow, Store, StoreError};
use plugin_api::webhook::{Call, CallStatus, CallType};

/// Settings key of the secret visitor tokens are signed with.
const SECRET_KEY: &str = "widget_token_secret";
/// `setClientAttributes` calls a visitor may make per hour.
pub const ATTRIBUTE_CALLS_PER_HOUR: i64 = 10;

/// Signs and checks visitor tokens: `v1.<visitor key>.<HMAC of widget id
/// and key>`. A visitor holds only their own key, so they can read only
/// their own chats; the signature keeps anyone from making up a key.
#[derive(Clone)]
pub struct VisitorKeys(Vec<u8>);

/// The secret stays out of logs.
impl std::fmt::Debug for VisitorKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VisitorKeys(..)")
    }
}

impl VisitorKeys {
    /// The installation's secret, created on first use.
    pub async fn load(store: &Store) -> Result<VisitorKeys, StoreError> {
        let secret = store.setting_or_init(SECRET_KEY, random_token).await?;
        Ok(VisitorKeys(secret.into_bytes()))
    }

    fn mac(&self, widget_id: &str, key: &str) -> String {
        // Any key length is valid for HMAC; the error cannot happen.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(widget_id.as_bytes());
        mac.update(b".");
        mac.update(key.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A new visitor's key and token.
    pub fn issue(&self, widget_id: &str) -> (String, String) {
        let key = format!("v_{}", random_token());
        let token = self.token(widget_id, &key);
        (key, token)
    }

    pub fn token(&self, widget_id: &str, key: &str) -> String {
        format!("v1.{key}.{}", self.mac(widget_id, key))
    }

    /// The visitor key of a genuine token of this widget.
    pub fn verify(&self, widget_id: &str, token: &str) -> Option<String> {
        let rest = token.strip_prefix("v1.")?;
        let (key, mac) = rest.rsplit_once('.')?;
        let expected = self.mac(widget_id, key);
        (!key.is_empty() && constant_time_eq(mac.as_bytes(), expected.as_bytes()))
            .then(|| key.to_owned())
    }
}

/// What a page's `widget_api` call asks of the visitor's client.
#[derive(Debug, Clone)]
pub enum WidgetAction {
    /// `setContactInfo`, the contacts form.
    Contacts(ContactInfo),
    /// `setCustomData`.
    CustomData(Vec<CustomDataField>),
    /// `setUserToken`.
    UserToken(String),
    /// `sendPageTitle`, navigation within the site.
    Page {
        url: Option<String>,
        title: Option<String>,
        referrer: Option<String>,
    },
    /// `setClientAttributes`.
    Attributes(Map<String, Value>),
    /// `clearHistory`.
    ClearHistory,
    /// `startCall`: the visitor asks to be called back at this number.
    StartCall(String),
}

impl WidgetAction {
    fn kind(&self) -> &'static str {
        match self {
            WidgetAction::Contacts(_) => "widget.contact_info",
            WidgetAction::CustomData(_) => "widget.custom_data",
            WidgetAction::UserToken(_) => "widget.user_token",
            WidgetAction::Page { .. } => "widget.page",
            WidgetAction::Attributes(_) => "widget.client_attributes",
            WidgetAction::ClearHistory => "widget.clear_history",
            WidgetAction::StartCall(_) => "widget.call_request",
        }
    }

    fn payload(&self) -> Value {
        match self {
            WidgetAction::Contacts(c) => json!({ "contact_info": c }),
            WidgetAction::CustomData(fields) => json!({ "fields": fields }),
            WidgetAction::UserToken(t) => json!({ "user_token": t }),
            WidgetAction::Page {
                url,
                title,
                referrer,
            } => json!({ "page": { "url": url, "title": title, "referrer": referrer } }),
            WidgetAction::Attributes(a) => json!({ "attributes": a }),
            WidgetAction::ClearHistory => json!({}),
            WidgetAction::StartCall(phone) => json!({ "phone": phone }),
        }
    }

    /// Checks what the page sent; the reason is the fail result's.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            WidgetAction::CustomData(fields) if fields.len() > MAX_CUSTOM_DATA_FIELDS => Err(
                format!("at most {MAX_CUSTOM_DATA_FIELDS} custom data fields"),
            ),
            WidgetAction::UserToken(t) if t.trim().is_empty() || t.len() > 1024 => {
                Err("the user token must be a non-empty string".to_owned())
            }
            WidgetAction::Attributes(a) if a.is_empty() => {
                Err("attributes must be a non-empty object".to_owned())
            }
            WidgetAction::StartCall(phone) if !is_phone(phone) => {
                Err("invalid phone number".to_owned())
            }
            WidgetAction::Contacts(c) => {
                if let Some(email) = &c.email
                    && !email.is_empty()
                    && !email.contains('@')
                {
                    return Err(format!("`{email}` is not an e-mail address"));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// A phone number as a visitor types it: digits, an optional leading `+`,
/// spaces, dashes and parentheses; 6 to 20 digits.
pub fn is_phone(phone: &str) -> bool {
    let digits = phone.chars().filter(char::is_ascii_digit).count();
    (6..=20).contains(&digits)
        && phone.len() <= 32
        && phone
            .char_indices()
            .all(|(i, c)| c.is_ascii_digit() || " -()".contains(c) || (c == '+' && i == 0))
}

/// A visitor's session as `POST …/session` answers it.
#[derive(Debug)]
pub struct Session {
    pub token: String,
    pub client: Client,
    pub online: bool,
    pub messages: Vec<MessageRow>,
    /// The latest chat: id, state, agent.
    pub chat: Option<(i64, String, Option<i64>)>,
}

/// How much history a session shows.
const HISTORY: i64 = 200;

impl Conversations {
    /// Whether the visitor may ask for a call now: `Err` is the reason the
    /// page is given (the spec's "Callback disabled", outside the hours, a
    /// call already under way).
    pub async fn callback_state(
        &self,
        channel: &Channel,
        visitor: Option<&Client>,
    ) -> Result<Result<(), String>, StoreError> {
        let now = self.clock.now_ms();
        let config: Option<crate::config::CallsConfig> = channel
            .calls
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        if let Err(reason) = config
            .as_ref()
            .map_or(Err(crate::config::CALLBACK_DISABLED), |c| {
                c.available_at(now)
            })
        {
            return Ok(Err(reason.to_owned()));
        }
        if let Some(v) = visitor
            && self
                .store
                .client_has_live_call(v.id, now - 3_600_000)
                .await?
        {
            return Ok(Err("A call is already in progress".to_owned()));
        }
        Ok(Ok(()))
    }

    /// Starts (or resumes, with a genuine token) a visitor's session on a
    /// widget channel: the client exists from here on (with its visitor
    /// number), the page is recorded, and the history comes back.
    pub(super) async fn widget_session(
        &self,
        channel: &Channel,
        keys: &VisitorKeys,
        token: Option<&str>,
        page: PageReport<'_>,
    ) -> Result<Session, CoreError> {
        let known = token.and_then(|t| keys.verify(&channel.public_id, t));
        let (key, token) = match known {
            Some(key) => {
                let token = keys.token(&channel.public_id, &key);
                (key, token)
            }
            None => keys.issue(&channel.public_id),
        };
        let payload = json!({
            "visitor": key,
            "page": { "url": page.url, "title": page.title, "referrer": page.referrer },
            "user_agent": page.user_agent,
        });
        let event = Event::new(
            EventKind::from("widget.session".to_owned()),
            Direction::In,
            payload,
        )
        .on_channel(channel.id);
        let routed = match self.pass(event, "widget session").await? {
            Passage::Through(routed) => *routed,
            Passage::Dropped(reason) => {
                return Err(CoreError::Conflict(format!("refused: {reason}")));
            }
        };
        let now = self.clock.now_ms();
        let sender = plugin_api::channel::CustomerSender {
            id: plugin_api::lenient::ExternalId::Str(key),
            name: None,
            phone: None,
            email: None,
            photo: None,
            url: None,
            invite: None,
        };
        let mut w = self.store.begin_write().await?;
        let client =
            crate::store::chats::upsert_client(&mut w.tx, channel.id, &sender, now).await?;
        set_page(&mut w.tx, client.id, &page, true, now).await?;
        record_in(&mut w.tx, &routed, now).await?;
        w.commit().await?;
        if !routed.forwards.is_empty() {
            self.kick.kick();
        }
        let extras = self.store.visitor_extras(client.id).await?;
        let messages = self
            .store
            .visitor_messages(client.id, extras.history_from.unwrap_or(0), HISTORY)
            .await?;
        let chat = self.store.visitor_chats(client.id).await?.pop();
        let online = self.store.channel_has_online_agent(channel.id).await?;
        let client = self.store.client_by_id(client.id).await?.unwrap_or(client);
        Ok(Session {
            token,
            client,
            online,
            messages,
            chat,
        })
    }

    /// A `widget_api` call of visitor `client`, through the pipeline
    /// (`widget.*`), then applied to the client (and its live chat).
    pub(super) async fn widget_action(
        &self,
        channel: &Channel,
        client: &Client,
        action: WidgetAction,
    ) -> Result<(), CoreError> {
        action.validate().map_err(CoreError::Invalid)?;
        let chat = self
            .store
            .visitor_chats(client.id)
            .await?
            .into_iter()
            .rev()
            .find(|(_, state, _)| state != "closed")
            .map(|(id, _, _)| id);
        let mut event = Event::new(
            EventKind::from(action.kind().to_owned()),
            Direction::In,
            action.payload(),
        )
        .on_channel(channel.id);
        event.chat_id = chat;
        let routed = match self.pass(event, "widget call").await? {
            Passage::Through(routed) => *routed,
            Passage::Dropped(_) => return Ok(()),
        };
        let now = self.clock.now_ms();
        let mut w = self.store.begin_write().await?;
        let applied = self
            .apply_widget_action(&mut w.tx, channel, client, chat, &action, now)
            .await?;
        record_in(&mut w.tx, &routed, now).await?;
        w.commit().await?;
        self.kick.kick();
        match applied {
            Applied::Call(started) => self.announce_call(client, started).await?,
            Applied::Publish(kind) => {
                if let Some(chat_id) = chat {
                    self.publish_client(channel, client, chat_id, kind).await?;
                }
            }
            Applied::Quietly => {}
        }
        Ok(())
    }

    /// Tells agents of a callback a visitor asked for (and of the chat it
    /// opened): they take it through the calls API.
    async fn announce_call(&self, client: &Client, started: StartedCall) -> Result<(), CoreError> {
        let StartedCall {
            chat_id,
            opened,
            call_id,
            call,
        } = started;
        let Some(chat) = self.store.chat_by_id(chat_id).await? else {
            return Ok(());
        };
        if opened {
            self.publish(
                &chat,
                "chat.opened",
                || json!({ "chat": chat, "client": client_view(client) }),
            );
        }
        self.publish(
            &chat,
            "chat.call",
            || json!({ "id": call_id, "call": call, "agent_id": null }),
        );
        Ok(())
    }

    /// Tells the chat's agents what the visitor changed of their client.
    async fn publish_client(
        &self,
        channel: &Channel,
        client: &Client,
        chat_id: i64,
        kind: &'static str,
    ) -> Result<(), CoreError> {
        // The reads below are for the update alone.
        if !self.live().is_heard(kind) {
            return Ok(());
        }
        let client = self.store.client_by_id(client.id).await?;
        let extras = self
            .store
            .visitor_extras(client.as_ref().map_or(0, |c| c.id))
            .await?;
        self.publish_to(channel.id, chat_id, kind, || {
            json!({
                "client": client.as_ref().map(client_view),
                "custom_data": extras
                    .custom_data
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok()),
                "page": { "url": client.as_ref().and_then(|c| c.url.clone()),
                          "title": extras.page_title },
            })
        });
        Ok(())
    }

    /// What a `widget_api` call changes, in the call's transaction.
    async fn apply_widget_action(
        &self,
        conn: &mut Conn,
        channel: &Channel,
        client: &Client,
        chat: Option<i64>,
        action: &WidgetAction,
        now: i64,
    ) -> Result<Applied, CoreError> {
        Ok(match action {
            WidgetAction::Contacts(c) => {
                let update = ContactUpdate {
                    name: c.name.as_deref().filter(|v| !v.is_empty()),
                    phone: c.phone.as_deref().filter(|v| !v.is_empty()),
                    email: c.email.as_deref().filter(|v| !v.is_empty()),
                };
                set_client_contact(conn, client.id, update, now).await?;
                if let Some(d) = c.description.as_deref().filter(|v| !v.is_empty()) {
                    set_client_description(conn, client.id, d).await?;
                }
                match chat {
                    Some(chat) => webhooks::queue_chat_event(conn, chat, false, now).await?,
                    None => webhooks::queue_client_updated(conn, client.id, now).await?,
                }
                Applied::Publish("chat.client")
            }
            WidgetAction::CustomData(fields) => {
                let text = serde_json::to_string(fields)
                    .map_err(|e| CoreError::Invalid(format!("custom data: {e}")))?;
                set_custom_data(conn, client.id, &text).await?;
                Applied::Publish("chat.custom_data")
            }
            WidgetAction::UserToken(t) => {
                set_user_token(conn, client.id, t).await?;
                Applied::Quietly
            }
            WidgetAction::Page {
                url,
                title,
                referrer,
            } => {
                let page = PageReport {
                    url: url.as_deref(),
                    title: title.as_deref(),
                    referrer: referrer.as_deref(),
                    ..PageReport::default()
                };
                set_page(conn, client.id, &page, false, now).await?;
                Applied::Publish("chat.page")
            }
            WidgetAction::Attributes(changes) => {
                let since = now - 3_600_000;
                if !take_attribute_call(conn, client.id, since, ATTRIBUTE_CALLS_PER_HOUR, now)
                    .await?
                {
                    return Err(CoreError::Conflict(format!(
                        "at most {ATTRIBUTE_CALLS_PER_HOUR} calls per hour"
                    )));
                }
                crate::core::integration::merge_attributes(conn, client.id, changes.clone(), now)
                    .await?;
                Applied::Quietly
            }
            WidgetAction::ClearHistory => {
                set_history_from(conn, client.id, now).await?;
                Applied::Quietly
            }
            WidgetAction::StartCall(phone) => {
                let (chat_id, opened) = match chat {
                    Some(id) => (id, false),
                    None => {
                        let chat =
                            crate::store::chats::insert_chat(conn, channel.id, client.id, now)
                                .await?;
                        (chat.id, true)
                    }
                };
                let new = NewCall {
                    chat_id,
                    channel_id: channel.id,
                    client_id: client.id,
                    agent_id: calls::NO_AGENT,
                    call_type: "callback",
                    phone,
                    now,
                };
                let call_id = calls::insert(conn, &new).await?;
                let call = Call {
                    kind: CallType::Callback,
                    phone: phone.clone(),
                    status: CallStatus::Start,
                    reason: None,
                    record_url: None,
                };
                self.queue_call(conn, chat_id, None, call.clone(), now)
                    .await?;
                Applied::Call(StartedCall {
                    chat_id,
                    opened,
                    call_id,
                    call,
                })
            }
        })
    }
}

/// What a `widget_api` call changed that agents hear of.
enum Applied {
    /// The client's details (the kind of live update).
    Publish(&'static str),
    /// A callback request, maybe in a chat it opened.
    Call(StartedCall),
    Quietly,
}

struct StartedCall {
    chat_id: i64,
    opened: bool,
    call_id: i64,
    call: Call,
}
