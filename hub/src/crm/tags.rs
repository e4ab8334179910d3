//! `/crm/tags`: client tags, merging them, and the "administrators only"
//! setting (`crm_client_tag` webhooks). Tagging a client is
//! `/crm/clients/{id}/tags`.

use http::{Method, Request};
use hyper::body::Incoming;
use plugin_api::crm::{CrmEvent, Flag, Tag, TagEvent, TagMerge, TagSetting};
use plugin_api::webhook::NumericId;
use serde::Deserialize;
use serde_json::json;

use super::{Answer, Change, CrmError, body, created, invalid, is_update, ok, path_id, title};
use crate::app::App;
use crate::store::Agent;
use crate::store::crm::{TAGS_ADMINISTRATORS_ONLY, set_setting_flag, setting_flag, tags as store};

const MISSING: &str = "no such client tag";

pub(super) async fn route(
    app: &App,
    req: Request<Incoming>,
    _agent: &Agent,
    rest: &[&str],
) -> Answer {
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::GET, []) => {
            let mut conn = app.store.crm_reader().await?;
            ok(&json!({ "tags": store::list(&mut conn).await? }))
        }
        (&Method::POST, []) => create(app, body(app, req).await?).await,
        (&Method::POST, ["merge"]) => merge(app, body(app, req).await?).await,
        (&Method::GET, ["settings"]) => {
            let mut conn = app.store.crm_reader().await?;
            let on = setting_flag(&mut conn, TAGS_ADMINISTRATORS_ONLY).await?;
            ok(&json!({ "administrators_only": on }))
        }
        (m, ["settings"]) if is_update(m) => settings(app, body(app, req).await?).await,
        (_, ["merge" | "settings"]) => Err(CrmError::MethodNotAllowed),
        (&Method::GET, [id]) => {
            let id = path_id(id, MISSING)?;
            let mut conn = app.store.crm_reader().await?;
            ok(&store::get(&mut conn, id)
                .await?
                .ok_or(CrmError::NotFound(MISSING))?)
        }
        (m, [id]) if is_update(m) => {
            let id = path_id(id, MISSING)?;
            update(app, id, body(app, req).await?).await
        }
        (&Method::DELETE, [id]) => delete(app, path_id(id, MISSING)?).await,
        (_, [] | [_]) => Err(CrmError::MethodNotAllowed),
        _ => Err(CrmError::NoEndpoint),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TitleBody {
    title: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MergeBody {
    into: NumericId,
    merge: Vec<NumericId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsBody {
    administrators_only: bool,
}

async fn read(change: &mut Change<'_>, id: i64) -> Result<Tag, CrmError> {
    store::get(change.conn(), id)
        .await?
        .ok_or(CrmError::NotFound(MISSING))
}

async fn create(app: &App, body: TitleBody) -> Answer {
    let title = title("title", &body.title)?;
    let mut change = Change::begin(app).await?;
    let now = change.now_ms();
    let tag = store::insert(change.conn(), &title, now).await?;
    change
        .crm(CrmEvent::CrmClientTag(TagEvent::CreatedClientTag(
            tag.clone(),
        )))
        .await?;
    change.commit().await?;
    created(&tag)
}

async fn update(app: &App, id: i64, body: TitleBody) -> Answer {
    let title = title("title", &body.title)?;
    let mut change = Change::begin(app).await?;
    read(&mut change, id).await?;
    store::update(change.conn(), id, &title).await?;
    let tag = read(&mut change, id).await?;
    change
        .crm(CrmEvent::CrmClientTag(TagEvent::UpdatedClientTag(
            tag.clone(),
        )))
        .await?;
    change.commit().await?;
    ok(&tag)
}

async fn delete(app: &App, id: i64) -> Answer {
    let mut change = Change::begin(app).await?;
    let tag = read(&mut change, id).await?;
    store::delete(change.conn(), id).await?;
    change
        .crm(CrmEvent::CrmClientTag(TagEvent::DeletedClientTag(
            tag.clone(),
        )))
        .await?;
    change.commit().await?;
    ok(&tag)
}

/// Folds the `merge` tags into `into`: their clients carry `into` instead.
async fn merge(app: &App, body: MergeBody) -> Answer {
    let into = body.into.0;
    let mut ids: Vec<i64> = Vec::with_capacity(body.merge.len());
    for id in body.merge.iter().map(|n| n.0) {
        if id == into {
            return Err(invalid("merge: a tag cannot be merged into itself"));
        }
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err(invalid("merge: name at least one tag to merge"));
    }
    let mut change = Change::begin(app).await?;
    let Some(tag) = store::get(change.conn(), into).await? else {
        return Err(invalid(format!("into: no client tag {into}")));
    };
    let mut merged_tags = Vec::with_capacity(ids.len());
    for id in &ids {
        match store::get(change.conn(), *id).await? {
            Some(t) => merged_tags.push(t),
            None => return Err(invalid(format!("merge: no client tag {id}"))),
        }
    }
    store::merge(change.conn(), into, &ids).await?;
    let merge = TagMerge { tag, merged_tags };
    change
        .crm(CrmEvent::CrmClientTag(TagEvent::MergedClientTag(
            merge.clone(),
        )))
        .await?;
    change.commit().await?;
    ok(&merge)
}

async fn settings(app: &App, body: SettingsBody) -> Answer {
    let mut change = Change::begin(app).await?;
    set_setting_flag(
        change.conn(),
        TAGS_ADMINISTRATORS_ONLY,
        body.administrators_only,
    )
    .await?;
    change
        .crm(CrmEvent::CrmClientTag(
            TagEvent::ChangedAdministratorOnlyClientTag(TagSetting {
                enabled: Flag(body.administrators_only),
            }),
        ))
        .await?;
    change.commit().await?;
    ok(&json!({ "administrators_only": body.administrators_only }))
}
