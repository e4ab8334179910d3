//! CRM webhook payloads: the envelope `{site_id, event_type, event: {event_name, ...}}`
//! the hub posts when CRM entities change, and the entities it carries.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use crate::lenient::Label;
use crate::webhook::NumericId;

/// A `1`/`0` switch. Written as the spec's integer; `true`/`false` and quoted
/// digits are read too because they mean the same thing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Flag(pub bool);

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Flag {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Flag".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "integer", "enum": [0, 1] })
    }
}

impl Serialize for Flag {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(u8::from(self.0))
    }
}

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(b) => Ok(Flag(b)),
            Value::Number(n) if n.as_u64() == Some(0) => Ok(Flag(false)),
            Value::Number(n) if n.as_u64() == Some(1) => Ok(Flag(true)),
            Value::String(s) if s.trim() == "0" => Ok(Flag(false)),
            Value::String(s) if s.trim() == "1" => Ok(Flag(true)),
            other => Err(D::Error::custom(format!("expected 1 or 0, got {other}"))),
        }
    }
}

/// A CRM webhook request body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CrmWebhook {
    pub site_id: NumericId,
    /// Written as `event_type` plus `event`, so a type can only carry its own names.
    #[serde(flatten)]
    pub event: CrmEvent,
}

/// The entity category (`event_type`) with its action and data (`event`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_type", content = "event", rename_all = "snake_case")]
pub enum CrmEvent {
    CrmPipeline(PipelineEvent),
    CrmStatus(StatusEvent),
    CrmClientTag(TagEvent),
    CrmDeal(DealEvent),
    CrmTask(TaskEvent),
    CrmOrganization(OrganizationEvent),
    /// Boxed: a client is several times the size of any other entity.
    CrmClient(Box<ClientEvent>),
}

impl CrmEvent {
    /// The wire value of `event_type`.
    pub fn event_type(&self) -> &'static str {
        match self {
            CrmEvent::CrmPipeline(_) => "crm_pipeline",
            CrmEvent::CrmStatus(_) => "crm_status",
            CrmEvent::CrmClientTag(_) => "crm_client_tag",
            CrmEvent::CrmDeal(_) => "crm_deal",
            CrmEvent::CrmTask(_) => "crm_task",
            CrmEvent::CrmOrganization(_) => "crm_organization",
            CrmEvent::CrmClient(_) => "crm_client",
        }
    }

    /// The wire value of `event.event_name`, always the spec's canonical spelling.
    pub fn event_name(&self) -> &'static str {
        match self {
            CrmEvent::CrmPipeline(e) => match e {
                PipelineEvent::CreatedPipeline(_) => "created_pipeline",
                PipelineEvent::UpdatedPipeline(_) => "updated_pipeline",
                PipelineEvent::DeletedPipeline(_) => "deleted_pipeline",
            },
            CrmEvent::CrmStatus(e) => match e {
                StatusEvent::CreatedStatus(_) => "created_status",
                StatusEvent::UpdatedStatus(_) => "updated_status",
                StatusEvent::DeletedStatus(_) => "deleted_status",
                StatusEvent::ReorderedStatus(_) => "reordered_status",
                StatusEvent::AssignedStatus(_) => "assigned_status",
                StatusEvent::ChangedRequireUpdateOfStatus(_) => "changed_require_update_of_status",
            },
            CrmEvent::CrmClientTag(e) => match e {
                TagEvent::CreatedClientTag(_) => "created_client_tag",
                TagEvent::UpdatedClientTag(_) => "updated_client_tag",
                TagEvent::DeletedClientTag(_) => "deleted_client_tag",
                TagEvent::MergedClientTag(_) => "merged_client_tag",
                TagEvent::ChangedAdministratorOnlyClientTag(_) => {
                    "changed_administrator_only_client_tag"
                }
            },
            CrmEvent::CrmDeal(e) => match e {
                DealEvent::CreatedDeal(_) => "created_deal",
                DealEvent::UpdatedDeal(_) => "updated_deal",
                DealEvent::DeletedDeal(_) => "deleted_deal",
            },
            CrmEvent::CrmTask(e) => match e {
                TaskEvent::CreatedTask(_) => "created_task",
                TaskEvent::DeletedTask(_) => "deleted_task",
                TaskEvent::UpdatedTask(_) => "updated_task",
                TaskEvent::CompletedTask(_) => "completed_task",
                TaskEvent::FiredTask(_) => "fired_task",
            },
            CrmEvent::CrmOrganization(e) => match e {
                OrganizationEvent::CreatedOrganization(_) => "created_organization",
            },
            CrmEvent::CrmClient(e) => match e.as_ref() {
                ClientEvent::AssignedAgentToClient(_) => "assigned_agent_to_client",
                ClientEvent::CreatedClient(_) => "created_client",
                ClientEvent::DeletedClient(_) => "deleted_client",
                ClientEvent::UpdatedClient(_) => "updated_client",
                ClientEvent::ChangedClientCompany(_) => "changed_client_company",
                ClientEvent::ChangedClientBlacklist(_) => "changed_client_blacklist",
                ClientEvent::UpdatedClientContacts(_) => "updated_client_contacts",
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum PipelineEvent {
    CreatedPipeline(Pipeline),
    /// Stages, rejection reasons or currency edited.
    UpdatedPipeline(Pipeline),
    DeletedPipeline(Pipeline),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum StatusEvent {
    CreatedStatus(Category),
    UpdatedStatus(Category),
    DeletedStatus(Category),
    /// The spec shows no payload: whatever fields come are kept as they are.
    ReorderedStatus(Map<String, Value>),
    AssignedStatus(StatusAssignment),
    /// The spec shows no payload: whatever fields come are kept as they are.
    ChangedRequireUpdateOfStatus(Map<String, Value>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum TagEvent {
    CreatedClientTag(Tag),
    UpdatedClientTag(Tag),
    DeletedClientTag(Tag),
    /// The public merge sample spells it `merged_tag`; read both, write the canonical name.
    #[serde(alias = "merged_tag")]
    MergedClientTag(TagMerge),
    ChangedAdministratorOnlyClientTag(TagSetting),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum DealEvent {
    CreatedDeal(Deal),
    UpdatedDeal(Deal),
    DeletedDeal(Deal),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum TaskEvent {
    CreatedTask(Task),
    DeletedTask(Task),
    UpdatedTask(Task),
    /// A public sample writes `completed task`; read both, write the canonical name.
    #[serde(alias = "completed task")]
    CompletedTask(Task),
    /// The task's reminder went off.
    FiredTask(Task),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum OrganizationEvent {
    CreatedOrganization(OrganizationCreated),
}

/// Every client event carries the whole client, whatever changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "event_name", rename_all = "snake_case")]
pub enum ClientEvent {
    AssignedAgentToClient(Client),
    CreatedClient(Client),
    DeletedClient(Client),
    UpdatedClient(Client),
    ChangedClientCompany(Client),
    ChangedClientBlacklist(Client),
    UpdatedClientContacts(Client),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Pipeline {
    pub pipeline_id: NumericId,
    pub title: String,
    /// International currency code.
    pub currency: String,
    #[serde(default)]
    pub pipeline_statuses: Vec<PipelineStage>,
    #[serde(default)]
    pub pipeline_reject_reasons: Vec<RejectReason>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PipelineStage {
    pub pipeline_status_id: NumericId,
    pub title: String,
    pub position: i64,
    /// HEX colour.
    pub color: String,
    #[serde(rename = "type")]
    pub kind: StageType,
    /// `null` for stages that do not close the deal.
    #[serde(default)]
    pub final_status: Option<FinalStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StageType {
    System,
    User,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FinalStatus {
    Successful,
    Unsuccessful,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RejectReason {
    pub pipeline_reject_reason_id: NumericId,
    pub title: String,
    pub position: i64,
}

/// A client category (the spec's "status").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Category {
    pub status_id: NumericId,
    pub title: String,
    /// HEX colour.
    pub color: String,
    pub position: i64,
    /// Where the category's clients moved when it was deleted; `null` otherwise.
    #[serde(default)]
    pub new_status_id: Option<NumericId>,
}

/// `assigned_status`: a client got a category.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StatusAssignment {
    pub status: Category,
    pub client: Box<Client>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(rename = "CrmTag")
)]
pub struct Tag {
    pub tag_id: NumericId,
    pub title: String,
}

/// `merged_client_tag`: `merged_tags` were folded into `tag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TagMerge {
    pub tag: Tag,
    pub merged_tags: Vec<Tag>,
}

/// `changed_administrator_only_client_tag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TagSetting {
    /// Set: only administrators may create tags; clear: all employees may.
    pub enabled: Flag,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Deal {
    pub deal_id: NumericId,
    pub client: ClientRef,
    pub title: String,
    pub text: String,
    /// Kept as the JSON number it is, so `1500` does not come back as `1500.0`.
    #[serde(default)]
    pub amount: Option<Number>,
    pub pipeline: DealPipeline,
    pub assigned_agent: AssignedAgentRef,
    pub created_ts: i64,
    #[serde(default)]
    pub closed_ts: Option<i64>,
    pub creator_agent: CreatorAgentRef,
}

/// Where a deal stands in its pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DealPipeline {
    pub pipeline_id: NumericId,
    pub pipeline_status: PipelineStatusRef,
    pub pipeline_reject_reason: RejectReasonRef,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PipelineStatusRef {
    pub pipeline_status_id: NumericId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RejectReasonRef {
    /// `null` unless the deal was lost.
    #[serde(default)]
    pub pipeline_reject_reason_id: Option<NumericId>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Task {
    pub task_id: NumericId,
    pub text: String,
    pub status: String,
    pub agent: AgentRef,
    pub client: ClientRef,
    pub notify_ts: i64,
    pub created_ts: i64,
    pub updated_ts: i64,
    pub show_notification: Flag,
    pub creator_agent: CreatorAgentRef,
    /// Tasks need not belong to a deal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deal: Option<DealRef>,
}

/// `created_organization` carries nothing but the id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OrganizationCreated {
    pub organization_id: NumericId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(rename = "CrmOrganization")
)]
pub struct Organization {
    pub organization_id: NumericId,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Client {
    pub client_id: NumericId,
    pub widget: WidgetRef,
    pub name: String,
    #[serde(default)]
    pub avatar_url: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub social: Option<Map<String, Value>>,
    pub assigned_agent: AssignedAgentRef,
    #[serde(default)]
    pub crm_link: Option<String>,
    pub chats_count: u64,
    pub visits_count: u64,
    #[serde(default)]
    pub custom_data: Option<Map<String, Value>>,
    pub status: Category,
    #[serde(default)]
    pub organization: Option<Organization>,
    #[serde(default)]
    pub tags: Vec<Tag>,
    pub has_deal: Flag,
    #[serde(default)]
    pub contacts: Vec<Contact>,
    /// `null` unless the client is blocked.
    #[serde(default)]
    pub blacklist: Option<Blacklist>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Contact {
    pub contact_type: ContactType,
    pub contact: String,
    /// Who recorded the contact.
    pub channel_type: ContactSource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ContactType {
    Phone,
    Email,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ContactSource {
    /// Entered by an agent in the agent application.
    AgentApp,
    /// Given by the client through the widget.
    Widget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Blacklist {
    /// The agent who blocked the client.
    pub agent: AgentRef,
    pub block_datetime_ts: i64,
    pub unblock_datetime_ts: i64,
    pub ip_address: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClientRef {
    pub client_id: NumericId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WidgetRef {
    /// A string like the event webhooks' `widget_id`.
    pub widget_id: Label,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentRef {
    pub agent_id: NumericId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AssignedAgentRef {
    /// `null` when nobody is assigned.
    #[serde(default)]
    pub assigned_agent_id: Option<NumericId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CreatorAgentRef {
    pub creator_agent_id: NumericId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DealRef {
    pub deal_id: NumericId,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    fn check<T: DeserializeOwned + Serialize>(input: Value, expected: Value) -> T {
        let parsed: T = serde_json::from_value(input).expect("parses");
        assert_eq!(serde_json::to_value(&parsed).unwrap(), expected);
        parsed
    }

    fn same<T: DeserializeOwned + Serialize>(v: Value) -> T {
        check(v.clone(), v)
    }

    fn envelope(event_type: &str, event_name: &str, entity: Value) -> Value {
        let mut event = Map::new();
        event.insert("event_name".into(), json!(event_name));
        if let Value::Object(fields) = entity {
            event.extend(fields);
        }
        json!({"site_id": 123456, "event_type": event_type, "event": event})
    }

    /// Round-trips every name of one `event_type` and checks the reported names.
    fn check_names(event_type: &str, names: &[&str], entity: Value) {
        for name in names {
            let hook: CrmWebhook = same(envelope(event_type, name, entity.clone()));
            assert_eq!(hook.event.event_type(), event_type);
            assert_eq!(hook.event.event_name(), *name);
            assert_eq!(hook.site_id, NumericId(123456));
        }
    }

    fn pipeline() -> Value {
        json!({
            "pipeline_id": 1, "title": "Sales", "currency": "USD",
            "pipeline_statuses": [
                {"pipeline_status_id": 10, "title": "New", "position": 1, "color": "#00AAFF",
                 "type": "system", "final_status": null},
                {"pipeline_status_id": 11, "title": "Won", "position": 2, "color": "#00FF00",
                 "type": "system", "final_status": "successful"},
                {"pipeline_status_id": 12, "title": "Lost", "position": 3, "color": "#FF0000",
                 "type": "user", "final_status": "unsuccessful"}
            ],
            "pipeline_reject_reasons": [
                {"pipeline_reject_reason_id": 20, "title": "Too expensive", "position": 1}
            ]
        })
    }

    fn category() -> Value {
        json!({"status_id": 3, "title": "Lead", "color": "#FFCC00", "position": 2,
               "new_status_id": null})
    }

    fn client() -> Value {
        json!({
            "client_id": 777, "widget": {"widget_id": "2853"}, "name": "John Smith",
            "avatar_url": "https://example.com/a.png", "description": "VIP",
            "social": {"telegram": "@john"}, "assigned_agent": {"assigned_agent_id": 3599},
            "crm_link": "https://crm.example.com/777", "chats_count": 4, "visits_count": 9,
            "custom_data": {"plan": "gold"}, "status": category(),
            "organization": {"organization_id": 5, "name": "Acme"},
            "tags": [{"tag_id": 1, "title": "vip"}], "has_deal": 1,
            "contacts": [
                {"contact_type": "phone", "contact": "+1555", "channel_type": "agent_app"},
                {"contact_type": "email", "contact": "j@example.com", "channel_type": "widget"}
            ],
            "blacklist": {"agent": {"agent_id": 3599}, "block_datetime_ts": 1665415879,
                          "unblock_datetime_ts": 1665502279, "ip_address": "203.0.113.5"}
        })
    }

    fn deal() -> Value {
        json!({
            "deal_id": 50, "client": {"client_id": 777}, "title": "Website", "text": "Redesign",
            "amount": 1500,
            "pipeline": {"pipeline_id": 1, "pipeline_status": {"pipeline_status_id": 10},
                         "pipeline_reject_reason": {"pipeline_reject_reason_id": null}},
            "assigned_agent": {"assigned_agent_id": 3599}, "created_ts": 1665415879,
            "closed_ts": null, "creator_agent": {"creator_agent_id": 3599}
        })
    }

    fn task() -> Value {
        json!({
            "task_id": 90, "text": "Call back", "status": "active", "agent": {"agent_id": 3599},
            "client": {"client_id": 777}, "notify_ts": 1665500000, "created_ts": 1665415879,
            "updated_ts": 1665415880, "show_notification": 1,
            "creator_agent": {"creator_agent_id": 3599}, "deal": {"deal_id": 50}
        })
    }

    #[test]
    fn pipeline_events_round_trip() {
        check_names(
            "crm_pipeline",
            &["created_pipeline", "updated_pipeline", "deleted_pipeline"],
            pipeline(),
        );
    }

    #[test]
    fn status_events_round_trip() {
        check_names(
            "crm_status",
            &["created_status", "updated_status", "deleted_status"],
            category(),
        );
        let mut moved = category();
        moved["new_status_id"] = json!(1);
        check_names("crm_status", &["deleted_status"], moved);
        check_names(
            "crm_status",
            &["reordered_status", "changed_require_update_of_status"],
            json!({"statuses": [3, 1, 2], "enabled": 1}),
        );
        check_names("crm_status", &["reordered_status"], json!({}));
    }

    #[test]
    fn assigned_status_carries_status_and_client() {
        check_names(
            "crm_status",
            &["assigned_status"],
            json!({"status": category(), "client": client()}),
        );
        assert!(
            serde_json::from_value::<CrmWebhook>(envelope(
                "crm_status",
                "assigned_status",
                category()
            ))
            .is_err()
        );
    }

    #[test]
    fn tag_events_round_trip() {
        check_names(
            "crm_client_tag",
            &[
                "created_client_tag",
                "updated_client_tag",
                "deleted_client_tag",
            ],
            json!({"tag_id": 1, "title": "vip"}),
        );
        check_names(
            "crm_client_tag",
            &["merged_client_tag"],
            json!({"tag": {"tag_id": 1, "title": "vip"},
                   "merged_tags": [{"tag_id": 2, "title": "VIP"}, {"tag_id": 3, "title": "v.i.p."}]}),
        );
        for enabled in [0, 1] {
            check_names(
                "crm_client_tag",
                &["changed_administrator_only_client_tag"],
                json!({ "enabled": enabled }),
            );
        }
    }

    #[test]
    fn sample_misspellings_are_read_and_written_canonically() {
        let merge = json!({"tag": {"tag_id": 1, "title": "vip"}, "merged_tags": []});
        check::<CrmWebhook>(
            envelope("crm_client_tag", "merged_tag", merge.clone()),
            envelope("crm_client_tag", "merged_client_tag", merge),
        );
        check::<CrmWebhook>(
            envelope("crm_task", "completed task", task()),
            envelope("crm_task", "completed_task", task()),
        );
    }

    #[test]
    fn deal_events_round_trip() {
        check_names(
            "crm_deal",
            &["created_deal", "updated_deal", "deleted_deal"],
            deal(),
        );
        let mut closed = deal();
        closed["amount"] = json!(1499.99);
        closed["closed_ts"] = json!(1665500000);
        closed["pipeline"]["pipeline_reject_reason"]["pipeline_reject_reason_id"] = json!(20);
        closed["assigned_agent"]["assigned_agent_id"] = json!(null);
        check_names("crm_deal", &["updated_deal"], closed);
        let mut free = deal();
        free["amount"] = json!(null);
        check_names("crm_deal", &["created_deal"], free);
    }

    #[test]
    fn task_events_round_trip() {
        check_names(
            "crm_task",
            &[
                "created_task",
                "deleted_task",
                "updated_task",
                "completed_task",
                "fired_task",
            ],
            task(),
        );
        let mut without_deal = task();
        without_deal.as_object_mut().unwrap().remove("deal");
        without_deal["show_notification"] = json!(0);
        check_names("crm_task", &["created_task"], without_deal);
    }

    #[test]
    fn created_organization_carries_only_the_id() {
        check_names(
            "crm_organization",
            &["created_organization"],
            json!({"organization_id": 5}),
        );
        check::<CrmWebhook>(
            envelope(
                "crm_organization",
                "created_organization",
                json!({"organization_id": "5", "name": "Acme"}),
            ),
            envelope(
                "crm_organization",
                "created_organization",
                json!({"organization_id": 5}),
            ),
        );
    }

    #[test]
    fn client_events_round_trip() {
        let names = [
            "assigned_agent_to_client",
            "created_client",
            "deleted_client",
            "updated_client",
            "changed_client_company",
            "changed_client_blacklist",
            "updated_client_contacts",
        ];
        check_names("crm_client", &names, client());
        let sparse = json!({
            "client_id": 778, "widget": {"widget_id": "2853"}, "name": "Anonymous",
            "avatar_url": null, "description": null, "social": null,
            "assigned_agent": {"assigned_agent_id": null}, "crm_link": null,
            "chats_count": 1, "visits_count": 1, "custom_data": null, "status": category(),
            "organization": null, "tags": [], "has_deal": 0, "contacts": [], "blacklist": null
        });
        check_names("crm_client", &names, sparse);
    }

    #[test]
    fn nullable_client_fields_are_written_as_null_when_absent() {
        let input = json!({
            "client_id": "778", "widget": {"widget_id": 2853}, "name": "Anonymous",
            "assigned_agent": {}, "chats_count": 1, "visits_count": 1,
            "status": {"status_id": "3", "title": "Lead", "color": "#FFCC00", "position": 2},
            "has_deal": false
        });
        let expected = json!({
            "client_id": 778, "widget": {"widget_id": "2853"}, "name": "Anonymous",
            "avatar_url": null, "description": null, "social": null,
            "assigned_agent": {"assigned_agent_id": null}, "crm_link": null,
            "chats_count": 1, "visits_count": 1, "custom_data": null, "status": category(),
            "organization": null, "tags": [], "has_deal": 0, "contacts": [], "blacklist": null
        });
        check::<Client>(input, expected);
    }

    #[test]
    fn names_only_pair_with_their_own_event_type() {
        for (event_type, name, entity) in [
            ("crm_deal", "created_task", task()),
            ("crm_task", "created_deal", deal()),
            (
                "crm_client",
                "created_client_tag",
                json!({"tag_id": 1, "title": "x"}),
            ),
            (
                "crm_organization",
                "updated_organization",
                json!({"organization_id": 5}),
            ),
            ("crm_client", "merged_client", client()),
            ("crm_contact", "created_client", client()),
        ] {
            assert!(
                serde_json::from_value::<CrmWebhook>(envelope(event_type, name, entity)).is_err(),
                "{event_type}/{name}"
            );
        }
    }

    #[test]
    fn flags_read_leniently_and_write_integers() {
        for (input, out) in [
            (json!(1), 1),
            (json!(0), 0),
            (json!(true), 1),
            (json!(false), 0),
            (json!("1"), 1),
            (json!("0"), 0),
        ] {
            check::<Flag>(input, json!(out));
        }
        for bad in [json!(2), json!("yes"), json!(null)] {
            assert!(serde_json::from_value::<Flag>(bad).is_err());
        }
    }
}
