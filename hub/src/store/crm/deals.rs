//! Deals: a client's opportunity moving through a pipeline's stages.

use plugin_api::crm::{
    AssignedAgentRef, ClientRef, CreatorAgentRef, Deal, DealPipeline, PipelineStatusRef,
    RejectReasonRef,
};
use plugin_api::webhook::NumericId;
use serde_json::Number;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use crate::store::{Ctx, StoreError};

/// A deal's state as written; the caller decides `closed_ts`.
#[derive(Debug, Clone)]
pub struct DealInput {
    pub client_id: i64,
    pub title: String,
    pub text: String,
    pub amount: Option<Number>,
    pub pipeline_id: i64,
    pub stage_id: i64,
    pub reject_reason_id: Option<i64>,
    pub assigned_agent_id: Option<i64>,
    pub closed_ts: Option<i64>,
}

impl DealInput {
    /// The deal's current state, to be changed by an update.
    pub fn of(deal: &Deal) -> DealInput {
        DealInput {
            client_id: deal.client.client_id.0,
            title: deal.title.clone(),
            text: deal.text.clone(),
            amount: deal.amount.clone(),
            pipeline_id: deal.pipeline.pipeline_id.0,
            stage_id: deal.pipeline.pipeline_status.pipeline_status_id.0,
            reject_reason_id: deal
                .pipeline
                .pipeline_reject_reason
                .pipeline_reject_reason_id
                .map(|n| n.0),
            assigned_agent_id: deal.assigned_agent.assigned_agent_id.map(|n| n.0),
            closed_ts: deal.closed_ts,
        }
    }
}

/// Which deals to list.
#[derive(Debug, Clone, Default)]
pub struct DealFilter {
    pub client_id: Option<i64>,
    pub pipeline_id: Option<i64>,
    pub stage_id: Option<i64>,
    pub assigned_agent_id: Option<i64>,
}

const COLUMNS: &str = "id, client_id, title, text, amount, pipeline_id, stage_id, \
     reject_reason_id, assigned_agent_id, creator_agent_id, created_ts, closed_ts";

fn from_row(row: &AnyRow) -> Result<Deal, StoreError> {
    let get_i = |c: &str| row.try_get::<i64, _>(c).ctx("reading a deal");
    let get_oi = |c: &str| row.try_get::<Option<i64>, _>(c).ctx("reading a deal");
    let amount: Option<String> = row.try_get("amount").ctx("reading a deal")?;
    let amount = amount
        .map(|a| {
            serde_json::from_str::<Number>(&a)
                .map_err(|e| StoreError::Corrupt(format!("deal amount `{a}`: {e}")))
        })
        .transpose()?;
    Ok(Deal {
        deal_id: NumericId(get_i("id")?),
        client: ClientRef {
            client_id: NumericId(get_i("client_id")?),
        },
        title: row.try_get("title").ctx("reading a deal")?,
        text: row.try_get("text").ctx("reading a deal")?,
        amount,
        pipeline: DealPipeline {
            pipeline_id: NumericId(get_i("pipeline_id")?),
            pipeline_status: PipelineStatusRef {
                pipeline_status_id: NumericId(get_i("stage_id")?),
            },
            pipeline_reject_reason: RejectReasonRef {
                pipeline_reject_reason_id: get_oi("reject_reason_id")?.map(NumericId),
            },
        },
        assigned_agent: AssignedAgentRef {
            assigned_agent_id: get_oi("assigned_agent_id")?.map(NumericId),
        },
        created_ts: get_i("created_ts")?,
        closed_ts: get_oi("closed_ts")?,
        creator_agent: CreatorAgentRef {
            creator_agent_id: NumericId(get_i("creator_agent_id")?),
        },
    })
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<Deal>, StoreError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM crm_deals WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await
        .ctx("reading a deal")?;
    row.as_ref().map(from_row).transpose()
}

/// Deals matching `filter`, oldest first.
pub async fn list(conn: &mut AnyConnection, filter: &DealFilter) -> Result<Vec<Deal>, StoreError> {
    // NULL parameters switch their condition off.
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM crm_deals WHERE \
         ($1 IS NULL OR client_id = $1) AND ($2 IS NULL OR pipeline_id = $2) AND \
         ($3 IS NULL OR stage_id = $3) AND ($4 IS NULL OR assigned_agent_id = $4) \
         ORDER BY id"
    ))
    .bind(filter.client_id)
    .bind(filter.pipeline_id)
    .bind(filter.stage_id)
    .bind(filter.assigned_agent_id)
    .fetch_all(conn)
    .await
    .ctx("listing deals")?;
    rows.iter().map(from_row).collect()
}

pub async fn insert(
    conn: &mut AnyConnection,
    d: &DealInput,
    creator_agent_id: i64,
    created_ts: i64,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO crm_deals (client_id, title, text, amount, pipeline_id, stage_id, \
         reject_reason_id, assigned_agent_id, creator_agent_id, created_ts, closed_ts) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
    )
    .bind(d.client_id)
    .bind(d.title.as_str())
    .bind(d.text.as_str())
    .bind(d.amount.as_ref().map(Number::to_string))
    .bind(d.pipeline_id)
    .bind(d.stage_id)
    .bind(d.reject_reason_id)
    .bind(d.assigned_agent_id)
    .bind(creator_agent_id)
    .bind(created_ts)
    .bind(d.closed_ts)
    .fetch_one(conn)
    .await
    .ctx("inserting a deal")?;
    Ok(id)
}

pub async fn update(conn: &mut AnyConnection, id: i64, d: &DealInput) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE crm_deals SET client_id = $1, title = $2, text = $3, amount = $4, \
         pipeline_id = $5, stage_id = $6, reject_reason_id = $7, assigned_agent_id = $8, \
         closed_ts = $9 WHERE id = $10",
    )
    .bind(d.client_id)
    .bind(d.title.as_str())
    .bind(d.text.as_str())
    .bind(d.amount.as_ref().map(Number::to_string))
    .bind(d.pipeline_id)
    .bind(d.stage_id)
    .bind(d.reject_reason_id)
    .bind(d.assigned_agent_id)
    .bind(d.closed_ts)
    .bind(id)
    .execute(conn)
    .await
    .ctx("updating a deal")?;
    Ok(())
}

/// Deletes a deal; its tasks stay, without a deal.
pub async fn delete(conn: &mut AnyConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE crm_tasks SET deal_id = NULL WHERE deal_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await
        .ctx("detaching tasks from a deal")?;
    sqlx::query("DELETE FROM crm_deals WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting a deal")?;
    Ok(())
}
