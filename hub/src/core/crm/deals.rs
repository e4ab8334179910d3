//! `/crm/deals`: a client's deals moving through pipeline stages
//! (`crm_deal` webhooks). A deal is closed (`closed_ts`) while it stands in a
//! stage with a final status; a reject reason goes with unsuccessful stages.

use plugin_api::crm::{CrmEvent, Deal, DealEvent, FinalStatus};
use plugin_api::webhook::NumericId;
use serde::Deserialize;
use serde_json::Number;

use super::{
    Answer, Change, CoreError, Crm, Entity, Verb, created, invalid, long_text, no_such_change,
    nullable, ok, remove, title,
};
use crate::store::Agent;
use crate::store::crm::deals::{self as store, DealInput};
use crate::store::crm::{agent_exists, clients, pipelines};

const MISSING: &str = Entity::Deal.missing();

pub(super) async fn apply(cx: &Crm<'_>, verb: Verb) -> Answer {
    match verb {
        Verb::Create => create(cx, cx.agent, cx.fields()?).await,
        Verb::Update(id) => update(cx, cx.agent, id, cx.fields()?).await,
        Verb::Delete(id) => {
            remove(cx, id, MISSING, store::get, store::delete, |d| {
                CrmEvent::CrmDeal(DealEvent::DeletedDeal(d))
            })
            .await
        }
        _ => Err(no_such_change()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    client_id: NumericId,
    title: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    amount: Option<Number>,
    pipeline_id: NumericId,
    /// The stage; the pipeline's first stage when absent.
    #[serde(default)]
    pipeline_status_id: Option<NumericId>,
    #[serde(default)]
    pipeline_reject_reason_id: Option<NumericId>,
    /// The calling agent when absent; `null` for nobody.
    #[serde(default, deserialize_with = "nullable")]
    assigned_agent_id: Option<Option<NumericId>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    client_id: Option<NumericId>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    amount: Option<Option<Number>>,
    #[serde(default)]
    pipeline_id: Option<NumericId>,
    #[serde(default)]
    pipeline_status_id: Option<NumericId>,
    #[serde(default, deserialize_with = "nullable")]
    pipeline_reject_reason_id: Option<Option<NumericId>>,
    #[serde(default, deserialize_with = "nullable")]
    assigned_agent_id: Option<Option<NumericId>>,
}

fn amount(value: Option<Number>) -> Result<Option<Number>, CoreError> {
    match value {
        Some(n) if n.as_f64().is_some_and(|f| f.is_finite() && f >= 0.0) => Ok(Some(n)),
        Some(n) => Err(invalid(format!(
            "amount: expected a number of at least 0, got {n}"
        ))),
        None => Ok(None),
    }
}

async fn read(change: &mut Change<'_>, id: i64) -> Result<Deal, CoreError> {
    change.find(store::get, id, MISSING).await
}

/// Checks the deal's references and works out `closed_ts`: set when the deal
/// enters a final stage, kept while it stays there, cleared when it leaves.
async fn settle(
    change: &mut Change<'_>,
    agent: &Agent,
    deal: &mut DealInput,
    before: Option<&DealInput>,
) -> Result<(), CoreError> {
    if before.is_none_or(|b| b.client_id != deal.client_id)
        && clients::visible_channel(change.conn(), deal.client_id, &agent.email)
            .await?
            .is_none()
    {
        return Err(invalid(format!("client_id: no client {}", deal.client_id)));
    }
    if pipelines::get(change.conn(), deal.pipeline_id)
        .await?
        .is_none()
    {
        return Err(invalid(format!(
            "pipeline_id: no pipeline {}",
            deal.pipeline_id
        )));
    }
    let Some(stage) = pipelines::stage(change.conn(), deal.stage_id).await? else {
        return Err(invalid(format!(
            "pipeline_status_id: no stage {}",
            deal.stage_id
        )));
    };
    if stage.pipeline_id != deal.pipeline_id {
        return Err(invalid(format!(
            "pipeline_status_id: stage {} is not in pipeline {}",
            deal.stage_id, deal.pipeline_id
        )));
    }
    if let Some(reason) = deal.reject_reason_id {
        if stage.final_status != Some(FinalStatus::Unsuccessful) {
            return Err(invalid(
                "pipeline_reject_reason_id: only a deal in an unsuccessful stage has a reject reason",
            ));
        }
        if pipelines::reason_pipeline(change.conn(), reason).await? != Some(deal.pipeline_id) {
            return Err(invalid(format!(
                "pipeline_reject_reason_id: {reason} is not a reject reason of pipeline {}",
                deal.pipeline_id
            )));
        }
    }
    if let Some(a) = deal.assigned_agent_id
        && !agent_exists(change.conn(), a).await?
    {
        return Err(invalid(format!("assigned_agent_id: no agent {a}")));
    }
    deal.closed_ts = match stage.final_status {
        None => None,
        Some(_) => match before {
            Some(b) if b.stage_id == deal.stage_id && b.closed_ts.is_some() => b.closed_ts,
            _ => Some(change.now_s()),
        },
    };
    Ok(())
}

async fn create(cx: &Crm<'_>, agent: &Agent, body: CreateBody) -> Answer {
    let title = title("title", &body.title)?;
    let text = long_text("text", body.text.as_deref().unwrap_or_default())?;
    let amount = amount(body.amount)?;
    let mut change = Change::begin(cx).await?;
    let pipeline_id = body.pipeline_id.0;
    let stage_id = match body.pipeline_status_id {
        Some(s) => s.0,
        None => pipelines::first_stage(change.conn(), pipeline_id)
            .await?
            .ok_or_else(|| invalid(format!("pipeline_id: no pipeline {pipeline_id}")))?,
    };
    let mut input = DealInput {
        client_id: body.client_id.0,
        title,
        text,
        amount,
        pipeline_id,
        stage_id,
        reject_reason_id: body.pipeline_reject_reason_id.map(|n| n.0),
        assigned_agent_id: match body.assigned_agent_id {
            Some(a) => a.map(|n| n.0),
            None => Some(agent.id),
        },
        closed_ts: None,
    };
    settle(&mut change, agent, &mut input, None).await?;
    let now = change.now_s();
    let id = store::insert(change.conn(), &input, agent.id, now).await?;
    let deal = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmDeal(DealEvent::CreatedDeal(deal.clone())))
        .await?;
    created(&deal)
}

async fn update(cx: &Crm<'_>, agent: &Agent, id: i64, body: UpdateBody) -> Answer {
    let new_title = body
        .title
        .as_deref()
        .map(|t| title("title", t))
        .transpose()?;
    let new_text = body
        .text
        .as_deref()
        .map(|t| long_text("text", t))
        .transpose()?;
    let new_amount = body.amount.map(amount).transpose()?;
    let mut change = Change::begin(cx).await?;
    let before = DealInput::of(&read(&mut change, id).await?);
    let mut deal = before.clone();
    if let Some(c) = body.client_id {
        deal.client_id = c.0;
    }
    if let Some(t) = new_title {
        deal.title = t;
    }
    if let Some(t) = new_text {
        deal.text = t;
    }
    if let Some(a) = new_amount {
        deal.amount = a;
    }
    if let Some(p) = body.pipeline_id
        && p.0 != deal.pipeline_id
    {
        deal.pipeline_id = p.0;
        if body.pipeline_status_id.is_none() {
            deal.stage_id = pipelines::first_stage(change.conn(), p.0)
                .await?
                .ok_or_else(|| invalid(format!("pipeline_id: no pipeline {}", p.0)))?;
        }
    }
    if let Some(s) = body.pipeline_status_id {
        deal.stage_id = s.0;
    }
    match body.pipeline_reject_reason_id {
        Some(r) => deal.reject_reason_id = r.map(|n| n.0),
        // Leaving the unsuccessful stage (or the pipeline) drops the reason.
        None if deal.stage_id != before.stage_id => deal.reject_reason_id = None,
        None => {}
    }
    if let Some(a) = body.assigned_agent_id {
        deal.assigned_agent_id = a.map(|n| n.0);
    }
    settle(&mut change, agent, &mut deal, Some(&before)).await?;
    store::update(change.conn(), id, &deal).await?;
    let deal = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmDeal(DealEvent::UpdatedDeal(deal.clone())))
        .await?;
    ok(&deal)
}
