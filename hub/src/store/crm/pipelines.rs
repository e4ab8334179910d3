//! Deal pipelines with their stages and reject reasons.

use plugin_api::crm::{FinalStatus, Pipeline, PipelineStage, RejectReason, StageType};
use plugin_api::webhook::NumericId;
use sqlx::{AnyConnection, Row};

use crate::store::{Ctx, StoreError};

/// A stage as written by the agent; `id` keeps an existing stage (and its deals).
#[derive(Debug, Clone)]
pub struct StageInput {
    pub id: Option<i64>,
    pub title: String,
    pub color: String,
    pub kind: StageType,
    pub final_status: Option<FinalStatus>,
}

/// A reject reason as written by the agent; `id` keeps an existing one.
#[derive(Debug, Clone)]
pub struct ReasonInput {
    pub id: Option<i64>,
    pub title: String,
}

/// A whole pipeline; positions come from the order of `stages` and `reject_reasons`.
#[derive(Debug, Clone)]
pub struct PipelineInput {
    pub title: String,
    pub currency: String,
    pub stages: Vec<StageInput>,
    pub reject_reasons: Vec<ReasonInput>,
}

pub fn stage_type_str(kind: StageType) -> &'static str {
    match kind {
        StageType::System => "system",
        StageType::User => "user",
    }
}

fn stage_type(s: &str) -> Result<StageType, StoreError> {
    match s {
        "system" => Ok(StageType::System),
        "user" => Ok(StageType::User),
        other => Err(StoreError::Corrupt(format!(
            "pipeline stage type `{other}`"
        ))),
    }
}

pub fn final_status_str(f: FinalStatus) -> &'static str {
    match f {
        FinalStatus::Successful => "successful",
        FinalStatus::Unsuccessful => "unsuccessful",
    }
}

fn final_status(s: Option<&str>) -> Result<Option<FinalStatus>, StoreError> {
    match s {
        None => Ok(None),
        Some("successful") => Ok(Some(FinalStatus::Successful)),
        Some("unsuccessful") => Ok(Some(FinalStatus::Unsuccessful)),
        Some(other) => Err(StoreError::Corrupt(format!("final status `{other}`"))),
    }
}

/// A stage's pipeline and final status: what moving a deal there means.
#[derive(Debug, Clone, Copy)]
pub struct StageInfo {
    pub pipeline_id: i64,
    pub final_status: Option<FinalStatus>,
}

async fn stages_of(conn: &mut AnyConnection, id: i64) -> Result<Vec<PipelineStage>, StoreError> {
    let rows = sqlx::query(
        "SELECT id, title, position, color, stage_type, final_status FROM crm_pipeline_stages \
         WHERE pipeline_id = $1 ORDER BY position, id",
    )
    .bind(id)
    .fetch_all(conn)
    .await
    .ctx("reading pipeline stages")?;
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get("stage_type").ctx("reading a pipeline stage")?;
            let fin: Option<String> = r.try_get("final_status").ctx("reading a pipeline stage")?;
            Ok(PipelineStage {
                pipeline_status_id: NumericId(r.try_get("id").ctx("reading a pipeline stage")?),
                title: r.try_get("title").ctx("reading a pipeline stage")?,
                position: r.try_get("position").ctx("reading a pipeline stage")?,
                color: r.try_get("color").ctx("reading a pipeline stage")?,
                kind: stage_type(&kind)?,
                final_status: final_status(fin.as_deref())?,
            })
        })
        .collect()
}

async fn reasons_of(conn: &mut AnyConnection, id: i64) -> Result<Vec<RejectReason>, StoreError> {
    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, title, position FROM crm_reject_reasons WHERE pipeline_id = $1 \
         ORDER BY position, id",
    )
    .bind(id)
    .fetch_all(conn)
    .await
    .ctx("reading reject reasons")?;
    Ok(rows
        .into_iter()
        .map(|(id, title, position)| RejectReason {
            pipeline_reject_reason_id: NumericId(id),
            title,
            position,
        })
        .collect())
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<Pipeline>, StoreError> {
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT title, currency FROM crm_pipelines WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await
            .ctx("reading a pipeline")?;
    let Some((title, currency)) = row else {
        return Ok(None);
    };
    Ok(Some(Pipeline {
        pipeline_id: NumericId(id),
        title,
        currency,
        pipeline_statuses: stages_of(conn, id).await?,
        pipeline_reject_reasons: reasons_of(conn, id).await?,
    }))
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<Pipeline>, StoreError> {
    let ids: Vec<(i64,)> = sqlx::query_as("SELECT id FROM crm_pipelines ORDER BY id")
        .fetch_all(&mut *conn)
        .await
        .ctx("listing pipelines")?;
    let mut out = Vec::with_capacity(ids.len());
    for (id,) in ids {
        if let Some(p) = get(conn, id).await? {
            out.push(p);
        }
    }
    Ok(out)
}

async fn insert_stage(
    conn: &mut AnyConnection,
    pipeline_id: i64,
    position: i64,
    s: &StageInput,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO crm_pipeline_stages \
         (pipeline_id, title, position, color, stage_type, final_status) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(pipeline_id)
    .bind(s.title.as_str())
    .bind(position)
    .bind(s.color.as_str())
    .bind(stage_type_str(s.kind))
    .bind(s.final_status.map(final_status_str))
    .execute(conn)
    .await
    .ctx("inserting a pipeline stage")?;
    Ok(())
}

async fn insert_reason(
    conn: &mut AnyConnection,
    pipeline_id: i64,
    position: i64,
    r: &ReasonInput,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO crm_reject_reasons (pipeline_id, title, position) VALUES ($1, $2, $3)",
    )
    .bind(pipeline_id)
    .bind(r.title.as_str())
    .bind(position)
    .execute(conn)
    .await
    .ctx("inserting a reject reason")?;
    Ok(())
}

/// Inserts a pipeline with its stages and reasons; returns its id.
pub async fn insert(
    conn: &mut AnyConnection,
    input: &PipelineInput,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO crm_pipelines (title, currency, created_at) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(input.title.as_str())
    .bind(input.currency.as_str())
    .bind(now_ms)
    .fetch_one(&mut *conn)
    .await
    .ctx("inserting a pipeline")?;
    for (position, stage) in (1..).zip(&input.stages) {
        insert_stage(conn, id, position, stage).await?;
    }
    for (position, reason) in (1..).zip(&input.reject_reasons) {
        insert_reason(conn, id, position, reason).await?;
    }
    Ok(id)
}

/// Replaces title, currency, stages and reasons. Stages and reasons named by
/// id are updated in place, the others of the pipeline deleted, new ones
/// inserted. The caller has checked that ids belong to the pipeline and that
/// no deal uses what is deleted.
pub async fn replace(
    conn: &mut AnyConnection,
    id: i64,
    input: &PipelineInput,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE crm_pipelines SET title = $1, currency = $2 WHERE id = $3")
        .bind(input.title.as_str())
        .bind(input.currency.as_str())
        .bind(id)
        .execute(&mut *conn)
        .await
        .ctx("updating a pipeline")?;
    let kept: Vec<i64> = input.stages.iter().filter_map(|s| s.id).collect();
    for old in stage_ids(conn, id).await? {
        if !kept.contains(&old) {
            sqlx::query("DELETE FROM crm_pipeline_stages WHERE id = $1")
                .bind(old)
                .execute(&mut *conn)
                .await
                .ctx("deleting a pipeline stage")?;
        }
    }
    for (position, stage) in (1..).zip(&input.stages) {
        match stage.id {
            Some(stage_id) => {
                sqlx::query(
                    "UPDATE crm_pipeline_stages SET title = $1, position = $2, color = $3, \
                     stage_type = $4, final_status = $5 WHERE id = $6 AND pipeline_id = $7",
                )
                .bind(stage.title.as_str())
                .bind(position)
                .bind(stage.color.as_str())
                .bind(stage_type_str(stage.kind))
                .bind(stage.final_status.map(final_status_str))
                .bind(stage_id)
                .bind(id)
                .execute(&mut *conn)
                .await
                .ctx("updating a pipeline stage")?;
            }
            None => insert_stage(conn, id, position, stage).await?,
        }
    }
    let kept: Vec<i64> = input.reject_reasons.iter().filter_map(|r| r.id).collect();
    for old in reason_ids(conn, id).await? {
        if !kept.contains(&old) {
            sqlx::query("DELETE FROM crm_reject_reasons WHERE id = $1")
                .bind(old)
                .execute(&mut *conn)
                .await
                .ctx("deleting a reject reason")?;
        }
    }
    for (position, reason) in (1..).zip(&input.reject_reasons) {
        match reason.id {
            Some(reason_id) => {
                sqlx::query(
                    "UPDATE crm_reject_reasons SET title = $1, position = $2 \
                     WHERE id = $3 AND pipeline_id = $4",
                )
                .bind(reason.title.as_str())
                .bind(position)
                .bind(reason_id)
                .bind(id)
                .execute(&mut *conn)
                .await
                .ctx("updating a reject reason")?;
            }
            None => insert_reason(conn, id, position, reason).await?,
        }
    }
    Ok(())
}

/// Deletes a pipeline; its stages and reasons go with it. The caller has
/// checked that it holds no deals.
pub async fn delete(conn: &mut AnyConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM crm_pipelines WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting a pipeline")?;
    Ok(())
}

pub async fn stage_ids(conn: &mut AnyConnection, pipeline_id: i64) -> Result<Vec<i64>, StoreError> {
    let rows: Vec<(i64,)> =
        sqlx::query_as("SELECT id FROM crm_pipeline_stages WHERE pipeline_id = $1")
            .bind(pipeline_id)
            .fetch_all(conn)
            .await
            .ctx("listing pipeline stages")?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

pub async fn reason_ids(
    conn: &mut AnyConnection,
    pipeline_id: i64,
) -> Result<Vec<i64>, StoreError> {
    let rows: Vec<(i64,)> =
        sqlx::query_as("SELECT id FROM crm_reject_reasons WHERE pipeline_id = $1")
            .bind(pipeline_id)
            .fetch_all(conn)
            .await
            .ctx("listing reject reasons")?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// How many deals the pipeline holds.
pub async fn deal_count(conn: &mut AnyConnection, pipeline_id: i64) -> Result<i64, StoreError> {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM crm_deals WHERE pipeline_id = $1")
        .bind(pipeline_id)
        .fetch_one(conn)
        .await
        .ctx("counting a pipeline's deals")?;
    Ok(n)
}

/// Whether any deal stands in the stage.
pub async fn stage_in_use(conn: &mut AnyConnection, stage_id: i64) -> Result<bool, StoreError> {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM crm_deals WHERE stage_id = $1")
        .bind(stage_id)
        .fetch_one(conn)
        .await
        .ctx("counting a stage's deals")?;
    Ok(n > 0)
}

/// Whether any deal was lost for the reason.
pub async fn reason_in_use(conn: &mut AnyConnection, reason_id: i64) -> Result<bool, StoreError> {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM crm_deals WHERE reject_reason_id = $1")
        .bind(reason_id)
        .fetch_one(conn)
        .await
        .ctx("counting a reject reason's deals")?;
    Ok(n > 0)
}

pub async fn stage(
    conn: &mut AnyConnection,
    stage_id: i64,
) -> Result<Option<StageInfo>, StoreError> {
    let row: Option<(i64, Option<String>)> =
        sqlx::query_as("SELECT pipeline_id, final_status FROM crm_pipeline_stages WHERE id = $1")
            .bind(stage_id)
            .fetch_optional(conn)
            .await
            .ctx("reading a pipeline stage")?;
    row.map(|(pipeline_id, fin)| {
        Ok(StageInfo {
            pipeline_id,
            final_status: final_status(fin.as_deref())?,
        })
    })
    .transpose()
}

/// The first stage of a pipeline: where new deals start.
pub async fn first_stage(
    conn: &mut AnyConnection,
    pipeline_id: i64,
) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT id FROM crm_pipeline_stages WHERE pipeline_id = $1 ORDER BY position, id LIMIT 1",
    )
    .bind(pipeline_id)
    .fetch_optional(conn)
    .await
    .ctx("reading a pipeline's first stage")?;
    Ok(row.map(|(id,)| id))
}

/// The pipeline of a reject reason.
pub async fn reason_pipeline(
    conn: &mut AnyConnection,
    reason_id: i64,
) -> Result<Option<i64>, StoreError> {
    let row: Option<(i64,)> =
        sqlx::query_as("SELECT pipeline_id FROM crm_reject_reasons WHERE id = $1")
            .bind(reason_id)
            .fetch_optional(conn)
            .await
            .ctx("reading a reject reason")?;
    Ok(row.map(|(id,)| id))
}
