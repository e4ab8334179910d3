//! `/crm/tags`: client tags, merging them, and the "administrators only"
//! setting (`crm_client_tag` webhooks). Tagging a client is
//! `/crm/clients/{id}/tags`.

use plugin_api::crm::{CrmEvent, Flag, Tag, TagEvent, TagMerge, TagSetting};
use plugin_api::webhook::NumericId;
use serde::Deserialize;
use serde_json::json;

use super::{
    Answer, Change, CoreError, Crm, Entity, Verb, created, invalid, no_such_change, ok, remove,
    title,
};
use crate::store::crm::{TAGS_ADMINISTRATORS_ONLY, set_setting_flag, tags as store};

const MISSING: &str = Entity::Tag.missing();

pub(super) async fn apply(cx: &Crm<'_>, verb: Verb) -> Answer {
    match verb {
        Verb::Create => create(cx, cx.fields()?).await,
        Verb::Update(id) => update(cx, id, cx.fields()?).await,
        Verb::Merge => merge(cx, cx.fields()?).await,
        Verb::Settings => settings(cx, cx.fields()?).await,
        Verb::Delete(id) => {
            remove(cx, id, MISSING, store::get, store::delete, |t| {
                CrmEvent::CrmClientTag(TagEvent::DeletedClientTag(t))
            })
            .await
        }
        _ => Err(no_such_change()),
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

async fn read(change: &mut Change<'_>, id: i64) -> Result<Tag, CoreError> {
    change.find(store::get, id, MISSING).await
}

async fn create(cx: &Crm<'_>, body: TitleBody) -> Answer {
    let title = title("title", &body.title)?;
    let mut change = Change::begin(cx).await?;
    let now = change.now_ms();
    let tag = store::insert(change.conn(), &title, now).await?;
    change
        .commit_with(CrmEvent::CrmClientTag(TagEvent::CreatedClientTag(
            tag.clone(),
        )))
        .await?;
    created(&tag)
}

async fn update(cx: &Crm<'_>, id: i64, body: TitleBody) -> Answer {
    let title = title("title", &body.title)?;
    let mut change = Change::begin(cx).await?;
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
async fn merge(cx: &Crm<'_>, body: MergeBody) -> Answer {
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
    let mut change = Change::begin(cx).await?;
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

async fn settings(cx: &Crm<'_>, body: SettingsBody) -> Answer {
    let mut change = Change::begin(cx).await?;
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
