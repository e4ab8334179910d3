//! The CRM agent API and its webhooks: every event of the spec's CRM table
//! reaches the CRM receiver with the configured `site_id` and the entity's
//! shape; client changes also send `client_updated`; agents reach only the
//! clients of their channels; task reminders fire once, also after a restart.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{
    EARLY_WINDOW, HubOptions, Integrator, TestAgent, TestHub, eventually, move_clock_to,
    plugin_toml, route_toml,
};
use hub::clock::ManualClock;
use reqwest::Method;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);
const SITE_ID: i64 = 4242;

/// Every `event_type` with its `event_name`s, as the spec's table lists them.
const SPEC_TABLE: &[(&str, &[&str])] = &[
    (
        "crm_pipeline",
        &["created_pipeline", "updated_pipeline", "deleted_pipeline"],
    ),
    (
        "crm_status",
        &[
            "created_status",
            "updated_status",
            "deleted_status",
            "reordered_status",
            "assigned_status",
            "changed_require_update_of_status",
        ],
    ),
    (
        "crm_client_tag",
        &[
            "created_client_tag",
            "updated_client_tag",
            "deleted_client_tag",
            "merged_client_tag",
            "changed_administrator_only_client_tag",
        ],
    ),
    (
        "crm_deal",
        &["created_deal", "updated_deal", "deleted_deal"],
    ),
    (
        "crm_task",
        &[
            "created_task",
            "deleted_task",
            "updated_task",
            "completed_task",
            "fired_task",
        ],
    ),
    ("crm_organization", &["created_organization"]),
    (
        "crm_client",
        &[
            "assigned_agent_to_client",
            "created_client",
            "deleted_client",
            "updated_client",
            "changed_client_company",
            "changed_client_blacklist",
            "updated_client_contacts",
        ],
    ),
];

/// The keys of the spec's Client object, all always written.
const CLIENT_KEYS: &[&str] = &[
    "client_id",
    "widget",
    "name",
    "avatar_url",
    "description",
    "social",
    "assigned_agent",
    "crm_link",
    "chats_count",
    "visits_count",
    "custom_data",
    "status",
    "organization",
    "tags",
    "has_deal",
    "contacts",
    "blacklist",
];

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A hub whose CRM webhooks go to `crm`; Ann works on channel `web`, whose
/// event webhooks go to `events`; Carl works on channel `shop`.
struct Office {
    hub: TestHub,
    crm: Integrator,
    events: Integrator,
    ann: TestAgent,
    carl: TestAgent,
    web_public_id: String,
}

fn crm_options(crm: &Integrator) -> HubOptions {
    HubOptions {
        extra_toml: format!(
            "[crm]\nsite_id = {SITE_ID}\nwebhook_url = \"{}\"\n",
            crm.url
        ),
        ..HubOptions::default()
    }
}

impl Office {
    async fn open() -> Office {
        let crm = Integrator::start().await;
        let events = Integrator::start().await;
        let replies = Integrator::start().await;
        let hub = TestHub::start_with(crm_options(&crm)).await;
        Office::staff(hub, crm, events, &replies).await
    }

    /// An office whose hub runs on `clock`, which also stamps the CRM's webhooks.
    async fn open_on(clock: &ManualClock) -> Office {
        let crm = Integrator::start().await;
        crm.on_clock(clock);
        let events = Integrator::start().await;
        let replies = Integrator::start().await;
        let hub = TestHub::start_with(HubOptions {
            clock: Some(clock.clone()),
            ..crm_options(&crm)
        })
        .await;
        Office::staff(hub, crm, events, &replies).await
    }

    async fn staff(
        hub: TestHub,
        crm: Integrator,
        events: Integrator,
        replies: &Integrator,
    ) -> Office {
        let ann = hub.create_agent("Ann", "ann@example.com").await;
        let carl = hub.create_agent("Carl", "carl@example.com").await;
        let resp = hub
            .admin_post(
                "/admin/v1/channels",
                json!({ "name": "web", "customer_endpoint": replies.url, "chunked": false,
                        "agents": ["ann@example.com"], "webhook_url": events.url }),
            )
            .await;
        assert_eq!(resp.status(), 201, "channel creation");
        let web: Value = resp.json().await.expect("channel json");
        hub.create_channel("shop", &replies.url, false, &["carl@example.com"])
            .await;
        Office {
            hub,
            crm,
            events,
            ann,
            carl,
            web_public_id: web["public_id"].as_str().expect("public_id").to_owned(),
        }
    }

    /// Creates a client on `web` through the CRM API.
    async fn client(&self, name: &str) -> Value {
        let (status, v) = crm(
            &self.ann,
            Method::POST,
            "clients",
            json!({ "channel": "web", "name": name }),
        )
        .await;
        assert_eq!(status, 201, "client creation: {v}");
        v
    }
}

/// A CRM API call as `agent`: `path` is below `/agent/v1/crm/`.
async fn crm(agent: &TestAgent, method: Method, path: &str, body: Value) -> (u16, Value) {
    let body = (method != Method::GET && !body.is_null()).then_some(body);
    agent
        .send(method, &format!("/agent/v1/crm/{path}"), body)
        .await
}

async fn get(agent: &TestAgent, path: &str) -> Value {
    let (status, v) = crm(agent, Method::GET, path, Value::Null).await;
    assert_eq!(status, 200, "GET {path}: {v}");
    v
}

/// The CRM webhook bodies received so far.
fn crm_bodies(rx: &Integrator) -> Vec<Value> {
    rx.requests().iter().map(|r| r.json()).collect()
}

/// Waits for CRM webhooks named `name` until there are `n`; returns them.
async fn crm_events(rx: &Integrator, name: &str, n: usize) -> Vec<Value> {
    eventually(WAIT, &format!("{n} CRM webhook(s) {name}"), || async {
        let found: Vec<Value> = crm_bodies(rx)
            .into_iter()
            .filter(|b| b["event"]["event_name"] == name)
            .collect();
        (found.len() >= n).then_some(found)
    })
    .await
}

/// The first CRM webhook named `name` whose event satisfies `pick`.
async fn crm_event(rx: &Integrator, name: &str, pick: impl Fn(&Value) -> bool) -> Value {
    eventually(WAIT, &format!("CRM webhook {name}"), || async {
        crm_bodies(rx)
            .into_iter()
            .find(|b| b["event"]["event_name"] == name && pick(&b["event"]))
    })
    .await
}

/// Waits for event webhooks `client_updated` until there are `n`.
async fn client_updates(rx: &Integrator, n: usize) -> Vec<Value> {
    eventually(WAIT, &format!("{n} client_updated webhook(s)"), || async {
        let found: Vec<Value> = rx
            .requests()
            .iter()
            .map(|r| r.json())
            .filter(|b| b["event_name"] == "client_updated")
            .collect();
        (found.len() >= n).then_some(found)
    })
    .await
}

fn assert_client_shape(client: &Value) {
    let keys: BTreeSet<&str> = client
        .as_object()
        .expect("client object")
        .keys()
        .map(String::as_str)
        .collect();
    for key in CLIENT_KEYS {
        assert!(keys.contains(key), "client lacks {key}: {client}");
    }
    assert!(client["client_id"].is_i64());
    assert!(client["widget"]["widget_id"].is_string());
    assert!(client["status"]["status_id"].is_i64());
    assert!(client["has_deal"] == 0 || client["has_deal"] == 1);
}

#[tokio::test]
async fn every_event_of_the_spec_table_reaches_the_crm() {
    let o = Office::open().await;
    let ann = &o.ann;

    // Pipelines.
    let (status, pipeline) = crm(
        ann,
        Method::POST,
        "pipelines",
        json!({
            "title": "Sales", "currency": "usd",
            "stages": [
                {"title": "New", "color": "#00AAFF", "type": "system"},
                {"title": "Won", "color": "#00FF00", "final_status": "successful"},
                {"title": "Lost", "color": "#FF0000", "final_status": "unsuccessful"}
            ],
            "reject_reasons": [{"title": "Too expensive"}]
        }),
    )
    .await;
    assert_eq!(status, 201, "{pipeline}");
    assert_eq!(pipeline["currency"], "USD");
    let pipeline_id = pipeline["pipeline_id"].as_i64().expect("pipeline id");
    let stages = pipeline["pipeline_statuses"]
        .as_array()
        .expect("stages")
        .clone();
    assert_eq!(stages.len(), 3);
    assert_eq!(stages[0]["position"], 1);
    assert_eq!(stages[0]["type"], "system");
    assert_eq!(stages[1]["type"], "user");
    assert_eq!(stages[1]["final_status"], "successful");
    assert_eq!(stages[0]["final_status"], Value::Null);
    let new_stage = stages[0]["pipeline_status_id"].as_i64().expect("stage id");
    let won_stage = stages[1]["pipeline_status_id"].as_i64().expect("stage id");

    let (status, updated) = crm(
        ann,
        Method::PUT,
        &format!("pipelines/{pipeline_id}"),
        json!({"currency": "EUR"}),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["currency"], "EUR");
    assert_eq!(updated["pipeline_statuses"], pipeline["pipeline_statuses"]);

    let (_, scratch) = crm(
        ann,
        Method::POST,
        "pipelines",
        json!({"title": "Scratch", "currency": "GBP",
               "stages": [{"title": "Only", "color": "#123"}]}),
    )
    .await;
    let scratch_id = scratch["pipeline_id"].as_i64().expect("pipeline id");
    let (status, _) = crm(
        ann,
        Method::DELETE,
        &format!("pipelines/{scratch_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);

    // Categories.
    let (status, lead) = crm(
        ann,
        Method::POST,
        "statuses",
        json!({"title": "Lead", "color": "#FFCC00"}),
    )
    .await;
    assert_eq!(status, 201, "{lead}");
    let lead_id = lead["status_id"].as_i64().expect("status id");
    let (_, vip) = crm(
        ann,
        Method::POST,
        "statuses",
        json!({"title": "VIP", "color": "#AA00AA"}),
    )
    .await;
    let vip_id = vip["status_id"].as_i64().expect("status id");
    let (status, _) = crm(
        ann,
        Method::PUT,
        &format!("statuses/{lead_id}"),
        json!({"title": "Hot lead"}),
    )
    .await;
    assert_eq!(status, 200);
    let all = get(ann, "statuses").await["statuses"].clone();
    let mut order: Vec<i64> = all
        .as_array()
        .expect("statuses")
        .iter()
        .filter_map(|s| s["status_id"].as_i64())
        .collect();
    order.reverse();
    let (status, reordered) =
        crm(ann, Method::POST, "statuses/reorder", json!({"ids": order})).await;
    assert_eq!(status, 200, "{reordered}");
    assert_eq!(reordered["statuses"][0]["status_id"], order[0]);
    assert_eq!(reordered["statuses"][0]["position"], 1);
    let (status, _) = crm(
        ann,
        Method::PUT,
        "statuses/settings",
        json!({"require_update": true}),
    )
    .await;
    assert_eq!(status, 200);

    // Tags.
    let (status, tag) = crm(ann, Method::POST, "tags", json!({"title": "vip"})).await;
    assert_eq!(status, 201, "{tag}");
    let tag_id = tag["tag_id"].as_i64().expect("tag id");
    let (_, dup) = crm(ann, Method::POST, "tags", json!({"title": "VIP"})).await;
    let dup_id = dup["tag_id"].as_i64().expect("tag id");
    let (_, gone) = crm(ann, Method::POST, "tags", json!({"title": "old"})).await;
    let gone_id = gone["tag_id"].as_i64().expect("tag id");
    let (status, _) = crm(
        ann,
        Method::PUT,
        &format!("tags/{tag_id}"),
        json!({"title": "V.I.P."}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = crm(ann, Method::DELETE, &format!("tags/{gone_id}"), Value::Null).await;
    assert_eq!(status, 200);
    let (status, _) = crm(
        ann,
        Method::PUT,
        "tags/settings",
        json!({"administrators_only": true}),
    )
    .await;
    assert_eq!(status, 200);

    // Organizations.
    let (status, org) = crm(ann, Method::POST, "organizations", json!({"name": "Acme"})).await;
    assert_eq!(status, 201, "{org}");
    let org_id = org["organization_id"].as_i64().expect("organization id");

    // Clients: one made by the CRM, one by a customer message.
    let created = o.client("John Smith").await;
    assert_client_shape(&created);
    let john = created["client_id"].as_i64().expect("client id");

    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}"),
        json!({"description": "Prefers mornings", "custom_data": {"plan": "gold"},
               "crm_link": "https://crm.example.com/john"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}/assigned_agent"),
        json!({"agent_id": ann.id}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}/status"),
        json!({"status_id": lead_id}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}/organization"),
        json!({"organization_id": org_id}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}/contacts"),
        json!({"contacts": [{"contact_type": "phone", "contact": "+1 555 0100"},
                            {"contact_type": "email", "contact": "john@example.com"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}/tags"),
        json!({"tag_ids": [dup_id]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("clients/{john}/blacklist"),
        json!({"blocked": true, "unblock_ts": now_s() + 86_400, "ip_address": "203.0.113.5"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["blacklist"]["agent"]["agent_id"], ann.id);
    assert_eq!(v["blacklist"]["ip_address"], "203.0.113.5");

    // Merging moves John's tag.
    let (status, merged) = crm(
        ann,
        Method::POST,
        "tags/merge",
        json!({"into": tag_id, "merge": [dup_id]}),
    )
    .await;
    assert_eq!(status, 200, "{merged}");
    let john_now = get(ann, &format!("clients/{john}")).await;
    assert_eq!(
        john_now["tags"],
        json!([{"tag_id": tag_id, "title": "V.I.P."}])
    );

    // Deals.
    let (status, deal) = crm(
        ann,
        Method::POST,
        "deals",
        json!({"client_id": john, "title": "Website", "text": "Redesign", "amount": 1500,
               "pipeline_id": pipeline_id}),
    )
    .await;
    assert_eq!(status, 201, "{deal}");
    let deal_id = deal["deal_id"].as_i64().expect("deal id");
    assert_eq!(
        deal["pipeline"]["pipeline_status"]["pipeline_status_id"],
        new_stage
    );
    assert_eq!(deal["closed_ts"], Value::Null);
    let (status, won) = crm(
        ann,
        Method::PATCH,
        &format!("deals/{deal_id}"),
        json!({"pipeline_status_id": won_stage}),
    )
    .await;
    assert_eq!(status, 200, "{won}");
    assert!(won["closed_ts"].as_i64().is_some_and(|t| t >= now_s() - 60));

    // Tasks.
    let (status, task) = crm(
        ann,
        Method::POST,
        "tasks",
        json!({"text": "Call back", "client_id": john, "deal_id": deal_id,
               "notify_ts": now_s() + 3600}),
    )
    .await;
    assert_eq!(status, 201, "{task}");
    let task_id = task["task_id"].as_i64().expect("task id");
    assert_eq!(task["status"], "active");
    let (status, _) = crm(
        ann,
        Method::PUT,
        &format!("tasks/{task_id}"),
        json!({"text": "Call back after lunch", "show_notification": false}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, done) = crm(
        ann,
        Method::POST,
        &format!("tasks/{task_id}/complete"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed");
    let (status, due) = crm(
        ann,
        Method::POST,
        "tasks",
        json!({"text": "Overdue", "client_id": john, "notify_ts": now_s() - 5}),
    )
    .await;
    assert_eq!(status, 201, "{due}");
    // Its reminder is overdue: it fires within a second or so.
    let fired = crm_events(&o.crm, "fired_task", 1).await;
    assert_eq!(fired[0]["event"]["text"], "Overdue");
    assert_eq!(fired[0]["event"]["task_id"], due["task_id"]);
    let (_, doomed) = crm(
        ann,
        Method::POST,
        "tasks",
        json!({"text": "Never mind", "client_id": john, "notify_ts": now_s() + 3600}),
    )
    .await;
    let doomed_id = doomed["task_id"].as_i64().expect("task id");
    let (status, _) = crm(
        ann,
        Method::DELETE,
        &format!("tasks/{doomed_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);

    // Deleting a deal, the category (John moves to VIP), then John.
    let (status, _) = crm(
        ann,
        Method::DELETE,
        &format!("deals/{deal_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    let (status, deleted) = crm(
        ann,
        Method::DELETE,
        &format!("statuses/{lead_id}?new_status_id={vip_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["new_status_id"], vip_id);
    assert_eq!(
        get(ann, &format!("clients/{john}")).await["status"]["status_id"],
        vip_id
    );
    let (status, v) = crm(ann, Method::DELETE, &format!("clients/{john}"), Value::Null).await;
    assert_eq!(status, 200, "{v}");

    // The receiver got every name of the table, each with its own type.
    crm_events(&o.crm, "deleted_client", 1).await;
    let bodies = crm_bodies(&o.crm);
    // CRM webhooks go out in the order of the changes, numbered so.
    let sequence: Vec<i64> = bodies
        .iter()
        .map(|b| b["sequence"].as_i64().expect("sequence"))
        .collect();
    assert!(
        sequence.windows(2).all(|w| w[0] < w[1]),
        "sequence numbers grow in arrival order: {sequence:?}"
    );
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for b in &bodies {
        assert_eq!(b["site_id"], SITE_ID, "{b}");
        let keys: BTreeSet<&str> = b
            .as_object()
            .expect("body")
            .keys()
            .map(String::as_str)
            .collect();
        // The spec's envelope plus the hub's order fields (docs/webhooks.md).
        assert_eq!(
            keys,
            BTreeSet::from(["site_id", "event_type", "event", "sequence", "event_ts"])
        );
        seen.insert((
            b["event_type"].as_str().unwrap_or_default().to_owned(),
            b["event"]["event_name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ));
    }
    for (event_type, names) in SPEC_TABLE {
        for name in *names {
            assert!(
                seen.contains(&((*event_type).to_owned(), (*name).to_owned())),
                "{event_type}/{name} was not received; got {seen:?}"
            );
        }
    }
    for (event_type, name) in &seen {
        assert!(
            SPEC_TABLE
                .iter()
                .any(|(t, names)| t == event_type && names.contains(&name.as_str())),
            "{event_type}/{name} is not in the spec's table"
        );
    }

    // Shapes.
    let ev = crm_event(&o.crm, "created_pipeline", |e| {
        e["pipeline_id"] == pipeline_id
    })
    .await;
    assert_eq!(ev["event"]["title"], "Sales");
    assert_eq!(
        ev["event"]["pipeline_statuses"].as_array().map(Vec::len),
        Some(3)
    );
    assert_eq!(
        ev["event"]["pipeline_reject_reasons"][0]["title"],
        "Too expensive"
    );
    let ev = crm_event(&o.crm, "updated_pipeline", |e| {
        e["pipeline_id"] == pipeline_id
    })
    .await;
    assert_eq!(ev["event"]["currency"], "EUR");
    let ev = crm_event(&o.crm, "deleted_pipeline", |_| true).await;
    assert_eq!(ev["event"]["pipeline_id"], scratch_id);

    let ev = crm_event(&o.crm, "created_status", |e| e["status_id"] == lead_id).await;
    assert_eq!(ev["event_type"], "crm_status");
    assert_eq!(ev["event"]["color"], "#FFCC00");
    assert_eq!(ev["event"]["new_status_id"], Value::Null);
    let ev = crm_event(&o.crm, "updated_status", |_| true).await;
    assert_eq!(ev["event"]["title"], "Hot lead");
    let ev = crm_event(&o.crm, "deleted_status", |_| true).await;
    assert_eq!(ev["event"]["status_id"], lead_id);
    assert_eq!(ev["event"]["new_status_id"], vip_id);
    let ev = crm_event(&o.crm, "reordered_status", |_| true).await;
    assert_eq!(ev["event"]["statuses"][0]["status_id"], order[0]);
    let ev = crm_event(&o.crm, "changed_require_update_of_status", |_| true).await;
    assert_eq!(ev["event"]["enabled"], 1);
    let ev = crm_event(&o.crm, "assigned_status", |_| true).await;
    assert_eq!(ev["event"]["status"]["status_id"], lead_id);
    assert_eq!(ev["event"]["status"]["title"], "Hot lead");
    assert_eq!(ev["event"]["client"]["client_id"], john);
    assert_eq!(ev["event"]["client"]["status"]["status_id"], lead_id);
    assert_client_shape(&ev["event"]["client"]);

    let ev = crm_event(&o.crm, "created_client_tag", |e| e["tag_id"] == tag_id).await;
    assert_eq!(ev["event_type"], "crm_client_tag");
    assert_eq!(ev["event"]["title"], "vip");
    let ev = crm_event(&o.crm, "updated_client_tag", |_| true).await;
    assert_eq!(
        ev["event"],
        json!({"event_name": "updated_client_tag", "tag_id": tag_id, "title": "V.I.P."})
    );
    let ev = crm_event(&o.crm, "deleted_client_tag", |_| true).await;
    assert_eq!(ev["event"]["tag_id"], gone_id);
    let ev = crm_event(&o.crm, "merged_client_tag", |_| true).await;
    assert_eq!(
        ev["event"],
        json!({"event_name": "merged_client_tag",
               "tag": {"tag_id": tag_id, "title": "V.I.P."},
               "merged_tags": [{"tag_id": dup_id, "title": "VIP"}]})
    );
    let ev = crm_event(&o.crm, "changed_administrator_only_client_tag", |_| true).await;
    assert_eq!(
        ev["event"],
        json!({"event_name": "changed_administrator_only_client_tag", "enabled": 1})
    );

    let ev = crm_event(&o.crm, "created_organization", |_| true).await;
    assert_eq!(ev["event_type"], "crm_organization");
    assert_eq!(
        ev["event"],
        json!({"event_name": "created_organization", "organization_id": org_id})
    );

    let ev = crm_event(&o.crm, "created_deal", |_| true).await;
    let d = &ev["event"];
    assert_eq!(ev["event_type"], "crm_deal");
    assert_eq!(d["deal_id"], deal_id);
    assert_eq!(d["client"], json!({"client_id": john}));
    assert_eq!(d["title"], "Website");
    assert_eq!(d["text"], "Redesign");
    assert_eq!(d["amount"], 1500);
    assert_eq!(d["pipeline"]["pipeline_id"], pipeline_id);
    assert_eq!(
        d["pipeline"]["pipeline_status"]["pipeline_status_id"],
        new_stage
    );
    assert_eq!(
        d["pipeline"]["pipeline_reject_reason"],
        json!({"pipeline_reject_reason_id": null})
    );
    assert_eq!(d["assigned_agent"], json!({"assigned_agent_id": ann.id}));
    assert_eq!(d["creator_agent"], json!({"creator_agent_id": ann.id}));
    assert!(
        d["created_ts"]
            .as_i64()
            .is_some_and(|t| (t - now_s()).abs() < 60)
    );
    assert_eq!(d["closed_ts"], Value::Null);
    let ev = crm_event(&o.crm, "updated_deal", |_| true).await;
    assert_eq!(
        ev["event"]["pipeline"]["pipeline_status"]["pipeline_status_id"],
        won_stage
    );
    assert!(ev["event"]["closed_ts"].is_i64());
    let ev = crm_event(&o.crm, "deleted_deal", |e| e["deal_id"] == deal_id).await;
    assert_eq!(ev["event"]["title"], "Website");

    let ev = crm_event(&o.crm, "created_task", |e| e["task_id"] == task_id).await;
    let t = &ev["event"];
    assert_eq!(ev["event_type"], "crm_task");
    assert_eq!(t["text"], "Call back");
    assert_eq!(t["status"], "active");
    assert_eq!(t["agent"], json!({"agent_id": ann.id}));
    assert_eq!(t["client"], json!({"client_id": john}));
    assert_eq!(t["deal"], json!({"deal_id": deal_id}));
    assert_eq!(t["creator_agent"], json!({"creator_agent_id": ann.id}));
    assert_eq!(t["show_notification"], 1);
    for key in ["notify_ts", "created_ts", "updated_ts"] {
        assert!(t[key].is_i64(), "{key}: {t}");
    }
    let ev = crm_event(&o.crm, "updated_task", |e| e["task_id"] == task_id).await;
    assert_eq!(ev["event"]["show_notification"], 0);
    let ev = crm_event(&o.crm, "completed_task", |_| true).await;
    assert_eq!(ev["event"]["status"], "completed");
    let ev = crm_event(&o.crm, "deleted_task", |e| e["task_id"] == doomed_id).await;
    assert_eq!(ev["event"]["text"], "Never mind");

    // Every crm_client event carries the same client shape.
    for name in SPEC_TABLE[6].1 {
        let ev = crm_event(&o.crm, name, |_| true).await;
        assert_eq!(ev["event_type"], "crm_client");
        assert_eq!(ev["event"]["client_id"], john, "{name}");
        assert_client_shape(&ev["event"]);
    }
    let ev = crm_event(&o.crm, "updated_client", |e| !e["custom_data"].is_null()).await;
    assert_eq!(ev["event"]["custom_data"], json!({"plan": "gold"}));
    assert_eq!(ev["event"]["description"], "Prefers mornings");
    assert_eq!(ev["event"]["crm_link"], "https://crm.example.com/john");
    assert_eq!(ev["event"]["widget"]["widget_id"], o.web_public_id.as_str());
    let ev = crm_event(&o.crm, "assigned_agent_to_client", |_| true).await;
    assert_eq!(
        ev["event"]["assigned_agent"],
        json!({"assigned_agent_id": ann.id})
    );
    let ev = crm_event(&o.crm, "changed_client_company", |_| true).await;
    assert_eq!(
        ev["event"]["organization"],
        json!({"organization_id": org_id, "name": "Acme"})
    );
    let ev = crm_event(&o.crm, "updated_client_contacts", |_| true).await;
    assert_eq!(
        ev["event"]["contacts"],
        json!([
            {"contact_type": "phone", "contact": "+1 555 0100", "channel_type": "agent_app"},
            {"contact_type": "email", "contact": "john@example.com", "channel_type": "agent_app"}
        ])
    );
    let ev = crm_event(&o.crm, "changed_client_blacklist", |_| true).await;
    assert_eq!(ev["event"]["blacklist"]["ip_address"], "203.0.113.5");
    assert!(ev["event"]["blacklist"]["block_datetime_ts"].is_i64());
    let ev = crm_event(&o.crm, "deleted_client", |_| true).await;
    assert_eq!(ev["event"]["status"]["status_id"], vip_id);

    o.hub.shutdown().await;
}

#[tokio::test]
async fn client_changes_also_send_client_updated() {
    let o = Office::open().await;
    let ann = &o.ann;
    let john = o.client("John").await["client_id"]
        .as_i64()
        .expect("client id");
    let (_, org) = crm(ann, Method::POST, "organizations", json!({"name": "Acme"})).await;
    let org_id = org["organization_id"].as_i64().expect("organization id");
    let (_, lead) = crm(
        ann,
        Method::POST,
        "statuses",
        json!({"title": "Lead", "color": "#FFCC00"}),
    )
    .await;
    let lead_id = lead["status_id"].as_i64().expect("status id");

    for (path, body) in [
        ("assigned_agent", json!({"agent_id": ann.id})),
        ("status", json!({"status_id": lead_id})),
        ("organization", json!({"organization_id": org_id})),
        (
            "contacts",
            json!({"contacts": [{"contact_type": "email", "contact": "j@example.com"}]}),
        ),
    ] {
        let (status, v) = crm(ann, Method::PUT, &format!("clients/{john}/{path}"), body).await;
        assert_eq!(status, 200, "{path}: {v}");
    }
    let updates = client_updates(&o.events, 4).await;
    assert_eq!(updates.len(), 4, "one client_updated per change");
    let last = &updates[3];
    assert_eq!(last["client_id"], john);
    assert_eq!(last["widget_id"], o.web_public_id.as_str());
    assert_eq!(last["assigned_agent"]["id"], ann.id);
    assert_eq!(last["assigned_agent"]["email"], "ann@example.com");
    assert_eq!(last["status"], json!({"id": lead_id, "title": "Lead"}));
    assert_eq!(last["organization"], json!({"id": org_id, "name": "Acme"}));
    // The first update already names the agent; the category came second.
    assert_eq!(updates[0]["assigned_agent"]["id"], ann.id);
    assert_eq!(updates[1]["status"]["id"], lead_id);

    // The CRM heard the same four changes.
    for name in [
        "assigned_agent_to_client",
        "assigned_status",
        "changed_client_company",
        "updated_client_contacts",
    ] {
        crm_events(&o.crm, name, 1).await;
    }

    // Profile and blacklist changes are the CRM's alone; tags are part of
    // client_updated, so a change of tags is told to both receivers.
    let (_, tag) = crm(ann, Method::POST, "tags", json!({"title": "vip"})).await;
    for (path, body) in [
        ("", json!({"description": "x"})),
        ("/tags", json!({"tag_ids": [tag["tag_id"]]})),
        ("/blacklist", json!({"blocked": true})),
    ] {
        let (status, v) = crm(ann, Method::PUT, &format!("clients/{john}{path}"), body).await;
        assert_eq!(status, 200, "{path}: {v}");
    }
    crm_events(&o.crm, "changed_client_blacklist", 1).await;
    let updates = client_updates(&o.events, 5).await;
    assert_eq!(
        updates.len(),
        5,
        "profile and blacklist changes sent client_updated"
    );
    assert_eq!(updates[4]["tags"][0]["title"], "vip");
    // Deleting the organization takes John out of it: told to both receivers.
    let (status, _) = crm(
        ann,
        Method::DELETE,
        &format!("organizations/{org_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    let updates = client_updates(&o.events, 6).await;
    assert_eq!(updates.len(), 6);
    assert_eq!(updates[5]["organization"], Value::Null);
    crm_events(&o.crm, "changed_client_company", 2).await;

    o.hub.shutdown().await;
}

#[tokio::test]
async fn agents_reach_only_clients_of_their_channels() {
    let o = Office::open().await;
    let (ann, carl) = (&o.ann, &o.carl);
    let john = o.client("John").await["client_id"]
        .as_i64()
        .expect("client id");

    let (status, v) = crm(carl, Method::GET, &format!("clients/{john}"), Value::Null).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "not_found");
    let (status, _) = crm(
        carl,
        Method::PUT,
        &format!("clients/{john}/status"),
        json!({"status_id": 1}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = crm(
        carl,
        Method::DELETE,
        &format!("clients/{john}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(get(carl, "clients").await["clients"], json!([]));
    let (status, v) = crm(
        carl,
        Method::POST,
        "clients",
        json!({"channel": "web", "name": "Intruder"}),
    )
    .await;
    assert_eq!(status, 400, "{v}");

    let listed = get(ann, "clients").await;
    assert_eq!(listed["clients"].as_array().map(Vec::len), Some(1));
    assert_client_shape(&listed["clients"][0]);
    assert!(listed["clients"][0]["external_id"].is_string());
    let found = get(ann, "clients?q=joh").await;
    assert_eq!(found["clients"][0]["client_id"], john);
    let none = get(ann, "clients?q=zed").await;
    assert_eq!(none["clients"], json!([]));

    // Deals and tasks of a client the agent cannot reach cannot be made.
    let (_, p) = crm(
        carl,
        Method::POST,
        "pipelines",
        json!({"title": "P", "currency": "USD", "stages": [{"title": "S", "color": "#000"}]}),
    )
    .await;
    let (status, v) = crm(
        carl,
        Method::POST,
        "deals",
        json!({"client_id": john, "title": "Steal", "pipeline_id": p["pipeline_id"]}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = crm(
        carl,
        Method::POST,
        "tasks",
        json!({"client_id": john, "text": "x", "notify_ts": now_s() + 60}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    // Shared entities: Carl sees Ann's pipeline list and tags.
    assert_eq!(
        get(ann, "pipelines").await["pipelines"][0]["pipeline_id"],
        p["pipeline_id"]
    );

    o.hub.shutdown().await;
}

#[tokio::test]
async fn customers_of_the_channel_are_crm_clients() {
    let crm_rx = Integrator::start().await;
    let events = Integrator::start().await;
    let replies = Integrator::start().await;
    let hub = TestHub::start_with(crm_options(&crm_rx)).await;
    let o = Office::staff(hub, crm_rx, events, &replies).await;
    let channels = o
        .hub
        .http
        .get(o.hub.url("/admin/v1/channels"))
        .bearer_auth(crate::support::ADMIN_TOKEN)
        .send()
        .await
        .expect("channels");
    let channels: Value = channels.json().await.expect("channels json");
    let web = channels["channels"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "web"))
        .cloned()
        .expect("web channel");
    let ch = crate::support::TestChannel {
        public_id: web["public_id"].as_str().expect("public_id").to_owned(),
        endpoint_url: web["endpoint_url"]
            .as_str()
            .expect("endpoint_url")
            .to_owned(),
        status_url: web["status_url"].as_str().unwrap_or_default().to_owned(),
        raw: web.clone(),
    };
    let (status, body) = o
        .hub
        .customer(
            &ch,
            json!({"sender": {"id": 77, "name": "Mary", "email": "mary@example.com"},
                   "message": {"type": "text", "text": "hi"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let listed = get(&o.ann, "clients").await;
    let mary = &listed["clients"][0];
    assert_eq!(mary["name"], "Mary");
    assert_eq!(mary["external_id"], 77);
    assert_eq!(mary["chats_count"], 1);
    assert_eq!(
        mary["contacts"],
        json!([{"contact_type": "email", "contact": "mary@example.com", "channel_type": "widget"}])
    );
    // The default category, no deal, no block.
    assert_eq!(mary["status"]["status_id"], 1);
    assert_eq!(mary["has_deal"], 0);
    assert_eq!(mary["blacklist"], Value::Null);
    // A client with an open chat cannot be deleted.
    let id = mary["client_id"].as_i64().expect("client id");
    let (status, v) = crm(
        &o.ann,
        Method::DELETE,
        &format!("clients/{id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 409, "{v}");
    // The same external id on the same channel is taken.
    let (status, v) = crm(
        &o.ann,
        Method::POST,
        "clients",
        json!({"channel": ch.public_id, "name": "Mary again", "external_id": "77"}),
    )
    .await;
    assert_eq!(status, 409, "{v}");
    o.hub.shutdown().await;
}

#[tokio::test]
async fn invalid_requests_and_conflicts_answer_json_errors() {
    let o = Office::open().await;
    let ann = &o.ann;
    for (method, path, body, want) in [
        (
            Method::POST,
            "pipelines",
            json!({"title": "P", "currency": "dollars", "stages": [{"title": "S", "color": "#000"}]}),
            400,
        ),
        (
            Method::POST,
            "pipelines",
            json!({"title": "P", "currency": "USD", "stages": []}),
            400,
        ),
        (
            Method::POST,
            "statuses",
            json!({"title": "Lead", "color": "yellow"}),
            400,
        ),
        (Method::POST, "tags", json!({"title": "  "}), 400),
        (Method::POST, "tags", json!({"title": "x", "extra": 1}), 400),
        (Method::GET, "tags/999", Value::Null, 404),
        (Method::GET, "deals/abc", Value::Null, 404),
        (Method::GET, "nothing", Value::Null, 404),
        (Method::DELETE, "statuses/1", Value::Null, 409),
        (
            Method::POST,
            "tags/merge",
            json!({"into": 1, "merge": [1]}),
            400,
        ),
        (
            Method::POST,
            "statuses/reorder",
            json!({"ids": [1, 1]}),
            400,
        ),
    ] {
        let (status, v) = crm(ann, method.clone(), path, body).await;
        assert_eq!(status, want, "{method} {path}: {v}");
        assert!(v["error"]["code"].is_string(), "{method} {path}: {v}");
    }
    let (status, v) = crm(ann, Method::DELETE, "statuses/1", Value::Null).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("conflict"))
    );

    // A pipeline with deals keeps its stages and cannot go.
    let (_, p) = crm(
        ann,
        Method::POST,
        "pipelines",
        json!({"title": "Sales", "currency": "USD",
               "stages": [{"title": "New", "color": "#000"},
                          {"title": "Lost", "color": "#F00", "final_status": "unsuccessful"}],
               "reject_reasons": [{"title": "Price"}]}),
    )
    .await;
    let pid = p["pipeline_id"].as_i64().expect("pipeline id");
    let new_stage = p["pipeline_statuses"][0]["pipeline_status_id"].clone();
    let lost_stage = p["pipeline_statuses"][1]["pipeline_status_id"].clone();
    let reason = p["pipeline_reject_reasons"][0]["pipeline_reject_reason_id"].clone();
    let john = o.client("John").await["client_id"].clone();
    let (status, deal) = crm(
        ann,
        Method::POST,
        "deals",
        json!({"client_id": john, "title": "D", "pipeline_id": pid, "amount": 99.5,
               "assigned_agent_id": null}),
    )
    .await;
    assert_eq!(status, 201, "{deal}");
    assert_eq!(deal["amount"], 99.5);
    assert_eq!(deal["assigned_agent"]["assigned_agent_id"], Value::Null);
    let deal_id = deal["deal_id"].as_i64().expect("deal id");
    let (status, v) = crm(
        ann,
        Method::DELETE,
        &format!("pipelines/{pid}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 409, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("pipelines/{pid}"),
        json!({"stages": [{"title": "Fresh", "color": "#111"}]}),
    )
    .await;
    assert_eq!(status, 409, "{v}");
    let (status, v) = crm(
        ann,
        Method::PUT,
        &format!("pipelines/{pid}"),
        json!({"stages": [{"pipeline_status_id": new_stage, "title": "Renamed", "color": "#111"},
                          {"title": "Won", "color": "#0F0", "final_status": "successful"},
                          {"pipeline_status_id": lost_stage, "title": "Lost", "color": "#F00",
                           "final_status": "unsuccessful"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["pipeline_statuses"][0]["title"], "Renamed");
    assert_eq!(v["pipeline_statuses"][0]["pipeline_status_id"], new_stage);
    assert_eq!(v["pipeline_statuses"][2]["position"], 3);

    // A reject reason only in an unsuccessful stage; losing closes the deal.
    let (status, v) = crm(
        ann,
        Method::PATCH,
        &format!("deals/{deal_id}"),
        json!({"pipeline_reject_reason_id": reason}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let (status, lost) = crm(
        ann,
        Method::PATCH,
        &format!("deals/{deal_id}"),
        json!({"pipeline_status_id": lost_stage, "pipeline_reject_reason_id": reason}),
    )
    .await;
    assert_eq!(status, 200, "{lost}");
    assert!(lost["closed_ts"].is_i64());
    assert_eq!(
        lost["pipeline"]["pipeline_reject_reason"]["pipeline_reject_reason_id"],
        reason
    );
    let (status, reopened) = crm(
        ann,
        Method::PATCH,
        &format!("deals/{deal_id}"),
        json!({"pipeline_status_id": new_stage}),
    )
    .await;
    assert_eq!(status, 200, "{reopened}");
    assert_eq!(reopened["closed_ts"], Value::Null);
    assert_eq!(
        reopened["pipeline"]["pipeline_reject_reason"]["pipeline_reject_reason_id"],
        Value::Null
    );
    // A completed task cannot be completed again.
    let (_, task) = crm(
        ann,
        Method::POST,
        "tasks",
        json!({"client_id": john, "text": "t", "notify_ts": now_s() + 3600}),
    )
    .await;
    let path = format!("tasks/{}/complete", task["task_id"]);
    assert_eq!(crm(ann, Method::POST, &path, Value::Null).await.0, 200);
    assert_eq!(crm(ann, Method::POST, &path, Value::Null).await.0, 409);
    // notify_ts in milliseconds is refused.
    let (status, _) = crm(
        ann,
        Method::POST,
        "tasks",
        json!({"client_id": john, "text": "t", "notify_ts": now_s() * 1000}),
    )
    .await;
    assert_eq!(status, 400);
    o.hub.shutdown().await;
}

/// When each `fired_task` reached the CRM, by the hub's clock.
fn fired_at(rx: &Integrator) -> Vec<Option<i64>> {
    rx.requests()
        .iter()
        .filter(|r| r.json()["event"]["event_name"] == "fired_task")
        .map(|r| r.hub_ms)
        .collect()
}

/// Waits until every webhook the CRM got has its result recorded: moving
/// the clock on before that would time out one still under way (and send
/// it again).
async fn crm_settled(hub: &TestHub, rx: &Integrator) {
    for r in rx.requests() {
        hub.delivery_done(r.header("x-hub-delivery").expect("a delivery id"))
            .await;
    }
}

/// Gives a hub whose clock moved on the time to fire what it (wrongly) would.
async fn let_nothing_fire() {
    tokio::time::sleep(EARLY_WINDOW).await;
}

#[tokio::test]
async fn a_reminder_fires_once_when_due() {
    let clock = ManualClock::new();
    let o = Office::open_on(&clock).await;
    let john = o.client("John").await["client_id"].clone();
    let clock_s = || clock.now_ms() / 1000;
    let notify_ts = clock_s() + 60;
    let (status, task) = crm(
        &o.ann,
        Method::POST,
        "tasks",
        json!({"text": "Ring John", "client_id": john, "notify_ts": notify_ts}),
    )
    .await;
    assert_eq!(status, 201, "{task}");
    crm_settled(&o.hub, &o.crm).await;
    move_clock_to(&clock, notify_ts * 1000).await;
    let fired = crm_events(&o.crm, "fired_task", 1).await;
    assert_eq!(fired_at(&o.crm), [Some(notify_ts * 1000)], "fired when due");
    assert_eq!(fired[0]["site_id"], SITE_ID);
    assert_eq!(fired[0]["event_type"], "crm_task");
    assert_eq!(fired[0]["event"]["task_id"], task["task_id"]);
    assert_eq!(fired[0]["event"]["client"]["client_id"], john);
    assert_eq!(fired[0]["event"]["notify_ts"], notify_ts);
    // Once only.
    crm_settled(&o.hub, &o.crm).await;
    clock.advance(Duration::from_secs(60));
    let_nothing_fire().await;
    assert_eq!(crm_events(&o.crm, "fired_task", 1).await.len(), 1);
    // Moving the reminder arms it again; completing a task disarms it.
    let id = task["task_id"].as_i64().expect("task id");
    let moved_to = clock_s() + 30;
    let (status, _) = crm(
        &o.ann,
        Method::PATCH,
        &format!("tasks/{id}"),
        json!({"notify_ts": moved_to}),
    )
    .await;
    assert_eq!(status, 200);
    crm_settled(&o.hub, &o.crm).await;
    move_clock_to(&clock, moved_to * 1000).await;
    crm_events(&o.crm, "fired_task", 2).await;
    assert_eq!(fired_at(&o.crm)[1], Some(moved_to * 1000), "fired when due");
    let (_, quiet) = crm(
        &o.ann,
        Method::POST,
        "tasks",
        json!({"text": "Done early", "client_id": john, "notify_ts": clock_s() + 30}),
    )
    .await;
    let path = format!("tasks/{}/complete", quiet["task_id"]);
    assert_eq!(crm(&o.ann, Method::POST, &path, Value::Null).await.0, 200);
    crm_settled(&o.hub, &o.crm).await;
    clock.advance(Duration::from_secs(60));
    let_nothing_fire().await;
    assert_eq!(crm_events(&o.crm, "fired_task", 2).await.len(), 2);
    o.hub.shutdown().await;
}

#[tokio::test]
async fn a_reminder_due_while_the_hub_was_down_fires_after_restart() {
    let clock = ManualClock::new();
    let o = Office::open_on(&clock).await;
    let john = o.client("John").await["client_id"].clone();
    let notify_ts = clock.now_ms() / 1000 + 60;
    let (status, task) = crm(
        &o.ann,
        Method::POST,
        "tasks",
        json!({"text": "While away", "client_id": john, "notify_ts": notify_ts}),
    )
    .await;
    assert_eq!(status, 201, "{task}");
    let Office {
        mut hub,
        crm: crm_rx,
        ..
    } = o;
    // Stop before it is due, stay down past it, come back.
    if let Some(running) = hub.running.take() {
        running.shutdown().await;
    }
    assert!(
        crm_bodies(&crm_rx)
            .iter()
            .all(|b| b["event"]["event_name"] != "fired_task"),
        "fired before the restart"
    );
    clock.advance(Duration::from_secs(120));
    let hub = hub.restart().await;
    let fired = crm_events(&crm_rx, "fired_task", 1).await;
    assert_eq!(fired[0]["event"]["task_id"], task["task_id"]);
    assert_eq!(fired[0]["event"]["text"], "While away");
    // Once, also across a second restart.
    crm_settled(&hub, &crm_rx).await;
    let hub = hub.restart().await;
    clock.advance(Duration::from_secs(60));
    let_nothing_fire().await;
    assert_eq!(crm_events(&crm_rx, "fired_task", 1).await.len(), 1);
    hub.shutdown().await;
}

/// An office whose CRM changes of kind `events` cross the fault plugin
/// configured by `fault` (on a route with `on_error`).
async fn office_with_plugin(events: &str, fault: &str, on_error: &str) -> Office {
    let crm = Integrator::start().await;
    let replies = Integrator::start().await;
    let mut options = crm_options(&crm);
    options
        .extra_toml
        .push_str(&plugin_toml("guard", "fault", "", fault));
    options
        .extra_toml
        .push_str(&route_toml(events, "\"guard\"", on_error));
    let hub = TestHub::start_with(options).await;
    Office::staff(hub, crm, Integrator::start().await, &replies).await
}

/// The event log's rows of `kind`.
async fn event_log(o: &Office, kind: &str) -> Vec<hub::event::Event> {
    o.hub
        .store()
        .events_of_kind(kind, 10)
        .await
        .expect("event log")
}

/// Ann's deal `title` on a new pipeline and client, the first of a fresh
/// hub (ids 1, which the plugin's replacement fields name).
async fn first_deal(o: &Office, title: &str) -> (u16, Value) {
    let (pipeline_id, client_id) = deal_ground(o).await;
    assert_eq!((pipeline_id, client_id), (1, 1));
    crm(
        &o.ann,
        Method::POST,
        "deals",
        json!({"client_id": client_id, "title": title, "pipeline_id": pipeline_id}),
    )
    .await
}

/// A pipeline with one stage, and a client on `web`: what a deal needs.
async fn deal_ground(o: &Office) -> (i64, i64) {
    let (status, pipeline) = crm(
        &o.ann,
        Method::POST,
        "pipelines",
        json!({"title": "Sales", "currency": "USD",
               "stages": [{"title": "New", "color": "#000"}]}),
    )
    .await;
    assert_eq!(status, 201, "pipeline: {pipeline}");
    let client = o.client("Bob").await;
    let pipeline_id = pipeline["pipeline_id"].as_i64().expect("pipeline id");
    let client_id = client["client_id"].as_i64().expect("client id");
    (pipeline_id, client_id)
}

#[tokio::test]
async fn a_plugin_on_crm_events_may_drop_or_refuse_a_deal_before_it_is_written() {
    // Dropped: the agent hears why (409), nothing is written or sent.
    let o = office_with_plugin(
        "\"agent.crm.deal.*\"",
        "fault = \"drop\"\nreason = \"deals are frozen\"",
        "reject",
    )
    .await;
    let (status, v) = first_deal(&o, "Big one").await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "conflict");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("deals are frozen"), "{v}");
    assert_eq!(get(&o.ann, "deals").await["deals"], json!([]));
    // The other CRM kinds were not routed to the plugin and went through.
    assert_eq!(
        get(&o.ann, "pipelines").await["pipelines"][0]["title"],
        "Sales"
    );

    // Refused (a plugin failing on a rejecting route): 503, nothing written.
    let o = office_with_plugin("\"agent.crm.deal.create\"", "fault = \"error\"", "reject").await;
    let (status, v) = first_deal(&o, "Big one").await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "unavailable");
    assert_eq!(get(&o.ann, "deals").await["deals"], json!([]));
    let logged = event_log(&o, "agent.crm.deal.create").await;
    assert!(
        logged.is_empty(),
        "a refused change is no event: {logged:?}"
    );
}

#[tokio::test]
async fn a_plugin_may_change_a_deal_and_the_changed_deal_is_stored_and_logged() {
    // The plugin replaces the fields with its own: ids 1 are the first
    // pipeline and client of a fresh hub, checked below.
    let o = office_with_plugin(
        "\"agent.crm.deal.create\"",
        "fault = \"replace\"\n[plugins.config.payload.fields]\nclient_id = 1\n\
         title = \"Renamed by a plugin\"\npipeline_id = 1\ntext = \"checked\"",
        "reject",
    )
    .await;
    let (status, deal) = first_deal(&o, "As typed").await;
    assert_eq!(status, 201, "{deal}");
    assert_eq!(deal["title"], "Renamed by a plugin");
    let id = deal["deal_id"].as_i64().expect("deal id");
    let stored = get(&o.ann, &format!("deals/{id}")).await;
    assert_eq!(stored["title"], "Renamed by a plugin");
    assert_eq!(stored["text"], "checked");
    let webhook = crm_event(&o.crm, "created_deal", |e| e["deal_id"] == id).await;
    assert_eq!(webhook["event"]["title"], "Renamed by a plugin");

    // The change is a row of the event log, as the plugins left it.
    let logged = event_log(&o, "agent.crm.deal.create").await;
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].payload["fields"]["title"], "Renamed by a plugin");
    // Changes no plugin watches are logged too, with the agent and the id.
    let created = event_log(&o, "agent.crm.pipeline.create").await;
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0].payload["agent"]["email"], "ann@example.com");
    assert_eq!(created[0].payload["fields"]["title"], "Sales");
}
