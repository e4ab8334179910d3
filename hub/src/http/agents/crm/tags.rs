//! `/crm/tags`: client tags, merging them, and the "administrators only"
//! setting (`crm_client_tag` webhooks). Tagging a client is
//! `/crm/clients/{id}/tags`.

use http::{Method, Request};
use hyper::body::Incoming;
use plugin_api::crm::{CrmEvent, Flag, Tag, TagEvent, TagMerge, TagSetting};
use plugin_api::webhook::NumericId;
use serde::Deserialize;
use serde_json::json;

use super::{
    Answer, Change, CrmError, Crud, body, created, crud, invalid, is_update, list_all, ok, remove,
    show, title,
};
use crate::http::App;
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
        (&Method::POST, ["merge"]) => merge(app, body(app, req).await?).await,
        (&Method::GET, ["settings"]) => {
            let mut conn = app.store.crm_reader().await?;
            let on = setting_flag(&mut conn, TAGS_ADMINISTRATORS_ONLY).await?;
            ok(&json!({ "administrators_only": on }))
        }
        (m, ["settings"]) if is_update(m) => settings(app, body(app, req).await?).await,
        (_, ["merge" | "settings"]) => Err(CrmError::MethodNotAllowed),
        _ => match crud(&method, rest, MISSING)? {
            Crud::List => list_all(app, "tags", store::list).await,
            Crud::Create => create(app, body(app, req).await?).await,
            Crud::Show(id) => show(app, id, MISSING, store::get).await,
            Crud::Update(id) => update(app, id, body(app, req).await?).await,
            Crud::Delete(id) => {
                remove(app, id, MISSING, store::get, store::delete, |t| {
                    CrmEvent::CrmClientTag(TagEvent::DeletedClientTag(t))
                })
                .await
            }
        },
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
    change.find(store::get, id, MISSING).await
}

async fn create(app: &App, body: TitleBody) -> Answer {
    let title = title("title", &body.title)?;
    let mut change = Change::begin(app).await?;
    let now = change.now_ms();
    let tag = store::insert(change.conn(), &title, now).await?;
    change
        .commit_with(CrmEvent::CrmClientTag(TagEvent::CreatedClientTag(
            tag.clone(),
        )))
        .await?;
    created(&tag)
}

async fn update(app: &App, id: i64, body: TitleBody) -> Answer {
    let title = title("title", &body.title)?;
    let mut change = Change::begin(app).await?;
    read(&mut change, id).await?;
    store::update(change.conn(), id, &title).await?;
    let tag = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmClientTag(TagEvent::UpdatedClientTag(
            tag.clone(),
        )))
        .await?;
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
        .commit_with(CrmEvent::CrmClientTag(TagEvent::MergedClientTag(
            merge.clone(),
        )))
        .await?;
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
        .commit_with(CrmEvent::CrmClientTag(
            TagEvent::ChangedAdministratorOnlyClientTag(TagSetting {
                enabled: Flag(body.administrators_only),
            }),
        ))
        .await?;
    ok(&json!({ "administrators_only": body.administrators_only }))
}
