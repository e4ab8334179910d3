//! `/crm/statuses`: client categories, their order and the "require update"
//! setting (`crm_status` webhooks). Assigning a category to a client is
//! `/crm/clients/{id}/status`.

use http::{Method, Request};
use hyper::body::Incoming;
use plugin_api::crm::{Category, CrmEvent, StatusEvent};
use plugin_api::webhook::NumericId;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    Answer, Change, CrmError, Crud, Query, body, body_or_default, color, created, crud, invalid,
    is_update, list_all, ok, show, title,
};
use crate::http::App;
use crate::store::crm::{STATUS_REQUIRE_UPDATE, set_setting_flag, setting_flag, statuses as store};
use crate::store::{Agent, StoreError};

const MISSING: &str = "no such client category";

pub(super) async fn route(
    app: &App,
    req: Request<Incoming>,
    _agent: &Agent,
    rest: &[&str],
) -> Answer {
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::POST, ["reorder"]) => reorder(app, body(app, req).await?).await,
        (&Method::GET, ["settings"]) => {
            let mut conn = app.store.crm_reader().await?;
            let on = setting_flag(&mut conn, STATUS_REQUIRE_UPDATE).await?;
            ok(&json!({ "require_update": on }))
        }
        (m, ["settings"]) if is_update(m) => settings(app, body(app, req).await?).await,
        (_, ["reorder" | "settings"]) => Err(CrmError::MethodNotAllowed),
        _ => match crud(&method, rest, MISSING)? {
            Crud::List => list_all(app, "statuses", store::list).await,
            Crud::Create => create(app, body(app, req).await?).await,
            Crud::Show(id) => show(app, id, MISSING, store::get).await,
            Crud::Update(id) => update(app, id, body(app, req).await?).await,
            Crud::Delete(id) => {
                // The clients' new category: the query wins over the body.
                let from_query = Query::of(&req).id("new_status_id")?;
                let body: DeleteBody = body_or_default(app, req).await?;
                delete(app, id, from_query.or(body.new_status_id.map(|n| n.0))).await
            }
        },
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

async fn read(change: &mut Change<'_>, id: i64) -> Result<Category, CrmError> {
    change.find(store::get, id, MISSING).await
}

async fn create(app: &App, body: CreateBody) -> Answer {
    let title = title("title", &body.title)?;
    let color = color("color", &body.color)?;
    let mut change = Change::begin(app).await?;
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

async fn update(app: &App, id: i64, body: UpdateBody) -> Answer {
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
    let mut change = Change::begin(app).await?;
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
async fn delete(app: &App, id: i64, to: Option<i64>) -> Answer {
    let mut change = Change::begin(app).await?;
    let mut category = read(&mut change, id).await?;
    let default = store::default_id(change.conn()).await?;
    if id == default {
        return Err(CrmError::Conflict(
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
async fn reorder(app: &App, body: ReorderBody) -> Answer {
    let ids: Vec<i64> = body.ids.iter().map(|n| n.0).collect();
    let mut change = Change::begin(app).await?;
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

async fn settings(app: &App, body: SettingsBody) -> Answer {
    let mut change = Change::begin(app).await?;
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
