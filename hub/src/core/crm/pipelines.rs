//! `/crm/pipelines`: deal pipelines, their stages and reject reasons
//! (`crm_pipeline` webhooks).

use plugin_api::crm::{CrmEvent, FinalStatus, Pipeline, PipelineEvent, StageType};
use plugin_api::webhook::NumericId;
use serde::Deserialize;

use super::{
    Answer, Change, CoreError, Crm, Entity, Verb, color, created, invalid, no_such_change, ok,
    title,
};
use crate::store::crm::pipelines::{self as store, PipelineInput, ReasonInput, StageInput};

const MISSING: &str = Entity::Pipeline.missing();
/// Most stages or reject reasons one pipeline may have.
const MAX_ITEMS: usize = 100;

pub(super) async fn apply(cx: &Crm<'_>, verb: Verb) -> Answer {
    match verb {
        Verb::Create => create(cx, cx.fields()?).await,
        Verb::Update(id) => update(cx, id, cx.fields()?).await,
        Verb::Delete(id) => delete(cx, id).await,
        _ => Err(no_such_change()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StageBody {
    /// Keeps an existing stage (and the deals in it) when a pipeline is replaced.
    #[serde(default)]
    pipeline_status_id: Option<NumericId>,
    title: String,
    color: String,
    #[serde(default, rename = "type")]
    kind: Option<StageType>,
    #[serde(default)]
    final_status: Option<FinalStatus>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    /// Keeps an existing reason when a pipeline is replaced.
    #[serde(default)]
    pipeline_reject_reason_id: Option<NumericId>,
    title: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    title: String,
    currency: String,
    stages: Vec<StageBody>,
    #[serde(default)]
    reject_reasons: Vec<ReasonBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    stages: Option<Vec<StageBody>>,
    #[serde(default)]
    reject_reasons: Option<Vec<ReasonBody>>,
}

/// An international currency code: three letters, kept in capitals.
fn currency(value: &str) -> Result<String, CoreError> {
    let v = value.trim();
    if v.len() == 3 && v.chars().all(|c| c.is_ascii_alphabetic()) {
        Ok(v.to_ascii_uppercase())
    } else {
        Err(invalid(format!(
            "currency: expected a three-letter currency code like USD, got {value:?}"
        )))
    }
}

fn stages(body: Vec<StageBody>) -> Result<Vec<StageInput>, CoreError> {
    if body.is_empty() {
        return Err(invalid("stages: a pipeline needs at least one stage"));
    }
    if body.len() > MAX_ITEMS {
        return Err(invalid(format!("stages: at most {MAX_ITEMS}")));
    }
    let mut out: Vec<StageInput> = Vec::with_capacity(body.len());
    for (i, s) in body.into_iter().enumerate() {
        let id = s.pipeline_status_id.map(|n| n.0);
        if id.is_some() && out.iter().any(|o| o.id == id) {
            return Err(invalid(format!("stages[{i}]: stage named twice")));
        }
        out.push(StageInput {
            id,
            title: title(&format!("stages[{i}].title"), &s.title)?,
            color: color(&format!("stages[{i}].color"), &s.color)?,
            kind: s.kind.unwrap_or(StageType::User),
            final_status: s.final_status,
        });
    }
    Ok(out)
}

fn reasons(body: Vec<ReasonBody>) -> Result<Vec<ReasonInput>, CoreError> {
    if body.len() > MAX_ITEMS {
        return Err(invalid(format!("reject_reasons: at most {MAX_ITEMS}")));
    }
    let mut out: Vec<ReasonInput> = Vec::with_capacity(body.len());
    for (i, r) in body.into_iter().enumerate() {
        let id = r.pipeline_reject_reason_id.map(|n| n.0);
        if id.is_some() && out.iter().any(|o| o.id == id) {
            return Err(invalid(format!("reject_reasons[{i}]: reason named twice")));
        }
        out.push(ReasonInput {
            id,
            title: title(&format!("reject_reasons[{i}].title"), &r.title)?,
        });
    }
    Ok(out)
}

async fn create(cx: &Crm<'_>, body: CreateBody) -> Answer {
    let input = PipelineInput {
        title: title("title", &body.title)?,
        currency: currency(&body.currency)?,
        stages: stages(body.stages)?,
        reject_reasons: reasons(body.reject_reasons)?,
    };
    if input.stages.iter().any(|s| s.id.is_some())
        || input.reject_reasons.iter().any(|r| r.id.is_some())
    {
        return Err(invalid(
            "a new pipeline's stages and reject reasons have no ids yet",
        ));
    }
    let mut change = Change::begin(cx).await?;
    let now = change.now_ms();
    let id = store::insert(change.conn(), &input, now).await?;
    let pipeline = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmPipeline(PipelineEvent::CreatedPipeline(
            pipeline.clone(),
        )))
        .await?;
    created(&pipeline)
}

async fn read(change: &mut Change<'_>, id: i64) -> Result<Pipeline, CoreError> {
    change.find(store::get, id, MISSING).await
}

async fn update(cx: &Crm<'_>, id: i64, body: UpdateBody) -> Answer {
    let new_title = body
        .title
        .as_deref()
        .map(|t| title("title", t))
        .transpose()?;
    let new_currency = body.currency.as_deref().map(currency).transpose()?;
    let new_stages = body.stages.map(stages).transpose()?;
    let new_reasons = body.reject_reasons.map(reasons).transpose()?;
    let mut change = Change::begin(cx).await?;
    let current = read(&mut change, id).await?;
    let stage_ids = store::stage_ids(change.conn(), id).await?;
    let reason_ids = store::reason_ids(change.conn(), id).await?;
    let stages = match new_stages {
        Some(s) => s,
        None => current
            .pipeline_statuses
            .iter()
            .map(|s| StageInput {
                id: Some(s.pipeline_status_id.0),
                title: s.title.clone(),
                color: s.color.clone(),
                kind: s.kind,
                final_status: s.final_status,
            })
            .collect(),
    };
    let reject_reasons = match new_reasons {
        Some(r) => r,
        None => current
            .pipeline_reject_reasons
            .iter()
            .map(|r| ReasonInput {
                id: Some(r.pipeline_reject_reason_id.0),
                title: r.title.clone(),
            })
            .collect(),
    };
    for s in &stages {
        if let Some(sid) = s.id
            && !stage_ids.contains(&sid)
        {
            return Err(invalid(format!(
                "stages: pipeline_status_id {sid} is not a stage of this pipeline"
            )));
        }
    }
    for r in &reject_reasons {
        if let Some(rid) = r.id
            && !reason_ids.contains(&rid)
        {
            return Err(invalid(format!(
                "reject_reasons: pipeline_reject_reason_id {rid} is not a reason of this pipeline"
            )));
        }
    }
    for old in stage_ids {
        if !stages.iter().any(|s| s.id == Some(old))
            && store::stage_in_use(change.conn(), old).await?
        {
            return Err(CoreError::Conflict(format!(
                "stage {old} holds deals: keep it (send its pipeline_status_id) or move the deals first"
            )));
        }
    }
    for old in reason_ids {
        if !reject_reasons.iter().any(|r| r.id == Some(old))
            && store::reason_in_use(change.conn(), old).await?
        {
            return Err(CoreError::Conflict(format!(
                "reject reason {old} is given for deals: keep it (send its \
                 pipeline_reject_reason_id) or change the deals first"
            )));
        }
    }
    let input = PipelineInput {
        title: new_title.unwrap_or(current.title),
        currency: new_currency.unwrap_or(current.currency),
        stages,
        reject_reasons,
    };
    store::replace(change.conn(), id, &input).await?;
    let pipeline = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmPipeline(PipelineEvent::UpdatedPipeline(
            pipeline.clone(),
        )))
        .await?;
    ok(&pipeline)
}

async fn delete(cx: &Crm<'_>, id: i64) -> Answer {
    let mut change = Change::begin(cx).await?;
    let pipeline = read(&mut change, id).await?;
    let deals = store::deal_count(change.conn(), id).await?;
    if deals > 0 {
        return Err(CoreError::Conflict(format!(
            "the pipeline holds {deals} deal(s): delete or move them first"
        )));
    }
    store::delete(change.conn(), id).await?;
    change
        .commit_with(CrmEvent::CrmPipeline(PipelineEvent::DeletedPipeline(
            pipeline.clone(),
        )))
        .await?;
    ok(&pipeline)
}
