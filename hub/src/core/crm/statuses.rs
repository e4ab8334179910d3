//! `/crm/statuses`: client categories, their order and the "require update"
//! setting (`crm_status` webhooks). Assigning a category to a client is
//! `/crm/clients/{id}/status`.

use plugin_api::crm::{Category, CrmEvent, StatusEvent};
use plugin_api::webhook::NumericId;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    Answer, Change, CoreError, Crm, Entity, Verb, color, created, invalid, no_such_change, ok,
    title,
};
use crate::store::StoreError;
use crate::store::crm::{STATUS_REQUIRE_UPDATE, set_setting_flag, statuses as store};

const MISSING: &str = Entity::Status.missing();

pub(super) async fn apply(cx: &Crm<'_>, verb: Verb) -> Answer {
    match verb {
        Verb::Create => create(cx, cx.fields()?).await,
        Verb::Update(id) => update(cx, id, cx.fields()?).await,
        Verb::Reorder => reorder(cx, cx.fields()?).await,
        Verb::Settings => settings(cx, cx.fields()?).await,
        Verb::Delete(id) => {
            let body: DeleteBody = cx.fields()?;
            delete(cx, id, body.new_status_id.map(|n| n.0)).await
        }
        _ => Err(no_such_change()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    title: String,
    color: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    color: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DeleteBody {
    #[serde(default)]
    new_status_id: Option<NumericId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReorderBody {
    ids: Vec<NumericId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsBody {
    require_update: bool,
}

async fn read(change: &mut Change<'_>, id: i64) -> Result<Category, CoreError> {
    change.find(store::get, id, MISSING).await
}

async fn create(cx: &Crm<'_>, body: CreateBody) -> Answer {
    let title = title("title", &body.title)?;
    let color = color("color", &body.color)?;
    let mut change = Change::begin(cx).await?;
    let now = change.now_ms();
    let id = store::insert(change.conn(), &title, &color, now).await?;
    let category = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmStatus(StatusEvent::CreatedStatus(
            category.clone(),
        )))
        .await?;
    created(&category)
}

async fn update(cx: &Crm<'_>, id: i64, body: UpdateBody) -> Answer {
    let new_title = body
        .title
        .as_deref()
        .map(|t| title("title", t))
        .transpose()?;
    let new_color = body
        .color
        .as_deref()
        .map(|c| color("color", c))
        .transpose()?;
    let mut change = Change::begin(cx).await?;
    let current = read(&mut change, id).await?;
    store::update(
        change.conn(),
        id,
        new_title.as_deref().unwrap_or(&current.title),
        new_color.as_deref().unwrap_or(&current.color),
    )
    .await?;
    let category = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmStatus(StatusEvent::UpdatedStatus(
            category.clone(),
        )))
        .await?;
    ok(&category)
}

/// Deletes a category, moving its clients to `to` (default: the default
/// category). Each moved client's category changed: `client_updated`.
async fn delete(cx: &Crm<'_>, id: i64, to: Option<i64>) -> Answer {
    let mut change = Change::begin(cx).await?;
    let mut category = read(&mut change, id).await?;
    let default = store::default_id(change.conn()).await?;
    if id == default {
        return Err(CoreError::Conflict(
            "the default client category cannot be deleted".to_owned(),
        ));
    }
    let to = to.unwrap_or(default);
    if to == id {
        return Err(invalid("new_status_id: must be another category"));
    }
    if store::get(change.conn(), to).await?.is_none() {
        return Err(invalid(format!("new_status_id: no client category {to}")));
    }
    let moved = store::delete_moving(change.conn(), id, to).await?;
    category.new_status_id = Some(NumericId(to));
    change
        .crm(CrmEvent::CrmStatus(StatusEvent::DeletedStatus(
            category.clone(),
        )))
        .await?;
    for client in moved {
        change.client_updated(client).await?;
    }
    change.commit().await?;
    ok(&category)
}

/// Puts the categories in the order of `ids`, which must name each once.
async fn reorder(cx: &Crm<'_>, body: ReorderBody) -> Answer {
    let ids: Vec<i64> = body.ids.iter().map(|n| n.0).collect();
    let mut change = Change::begin(cx).await?;
    let mut all: Vec<i64> = store::list(change.conn())
        .await?
        .iter()
        .map(|c| c.status_id.0)
        .collect();
    let mut given = ids.clone();
    all.sort_unstable();
    given.sort_unstable();
    if all != given {
        return Err(invalid(format!(
            "ids: name every client category exactly once (they are {all:?})"
        )));
    }
    store::reorder(change.conn(), &ids).await?;
    let statuses = store::list(change.conn()).await?;
    let mut event = Map::new();
    event.insert(
        "statuses".to_owned(),
        serde_json::to_value(&statuses)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode categories: {e}")))?,
    );
    change
        .commit_with(CrmEvent::CrmStatus(StatusEvent::ReorderedStatus(event)))
        .await?;
    ok(&json!({ "statuses": statuses }))
}

async fn settings(cx: &Crm<'_>, body: SettingsBody) -> Answer {
    let mut change = Change::begin(cx).await?;
    set_setting_flag(change.conn(), STATUS_REQUIRE_UPDATE, body.require_update).await?;
    let mut event = Map::new();
    event.insert(
        "enabled".to_owned(),
        Value::from(u8::from(body.require_update)),
    );
    change
        .commit_with(CrmEvent::CrmStatus(
            StatusEvent::ChangedRequireUpdateOfStatus(event),
        ))
        .await?;
    ok(&json!({ "require_update": body.require_update }))
}
