//! Tasks: reminders for an agent about a client (and maybe a deal). A task
//! fires once when its `notify_ts` has passed.

use plugin_api::crm::{AgentRef, ClientRef, CreatorAgentRef, DealRef, Flag, Task};
use plugin_api::webhook::NumericId;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use crate::store::{Ctx, StoreError, flag};

/// `status` of a task that is not done.
pub const ACTIVE: &str = "active";
/// `status` of a completed task.
pub const COMPLETED: &str = "completed";

/// A task's fields as written.
#[derive(Debug, Clone)]
pub struct TaskInput {
    pub text: String,
    pub agent_id: i64,
    pub client_id: i64,
    pub deal_id: Option<i64>,
    pub notify_ts: i64,
    pub show_notification: bool,
}

impl TaskInput {
    /// The task's current fields, to be changed by an update.
    pub fn of(task: &Task) -> TaskInput {
        TaskInput {
            text: task.text.clone(),
            agent_id: task.agent.agent_id.0,
            client_id: task.client.client_id.0,
            deal_id: task.deal.as_ref().map(|d| d.deal_id.0),
            notify_ts: task.notify_ts,
            show_notification: task.show_notification.0,
        }
    }
}

/// Which tasks to list.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub client_id: Option<i64>,
    pub deal_id: Option<i64>,
    pub agent_id: Option<i64>,
    pub status: Option<String>,
}

const COLUMNS: &str = "id, text, status, agent_id, client_id, deal_id, notify_ts, \
     show_notification, creator_agent_id, created_ts, updated_ts";

fn from_row(row: &AnyRow) -> Result<Task, StoreError> {
    let get_i = |c: &str| row.try_get::<i64, _>(c).ctx("reading a task");
    let deal_id: Option<i64> = row.try_get("deal_id").ctx("reading a task")?;
    Ok(Task {
        task_id: NumericId(get_i("id")?),
        text: row.try_get("text").ctx("reading a task")?,
        status: row.try_get("status").ctx("reading a task")?,
        agent: AgentRef {
            agent_id: NumericId(get_i("agent_id")?),
        },
        client: ClientRef {
            client_id: NumericId(get_i("client_id")?),
        },
        notify_ts: get_i("notify_ts")?,
        created_ts: get_i("created_ts")?,
        updated_ts: get_i("updated_ts")?,
        show_notification: Flag(flag(get_i("show_notification")?)),
        creator_agent: CreatorAgentRef {
            creator_agent_id: NumericId(get_i("creator_agent_id")?),
        },
        deal: deal_id.map(|id| DealRef {
            deal_id: NumericId(id),
        }),
    })
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<Task>, StoreError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM crm_tasks WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await
        .ctx("reading a task")?;
    row.as_ref().map(from_row).transpose()
}

/// Tasks matching `filter`, by reminder time.
pub async fn list(conn: &mut AnyConnection, filter: &TaskFilter) -> Result<Vec<Task>, StoreError> {
    // NULL parameters switch their condition off.
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM crm_tasks WHERE \
         ($1 IS NULL OR client_id = $1) AND ($2 IS NULL OR deal_id = $2) AND \
         ($3 IS NULL OR agent_id = $3) AND ($4 IS NULL OR status = $4) \
         ORDER BY notify_ts, id"
    ))
    .bind(filter.client_id)
    .bind(filter.deal_id)
    .bind(filter.agent_id)
    .bind(filter.status.as_deref())
    .fetch_all(conn)
    .await
    .ctx("listing tasks")?;
    rows.iter().map(from_row).collect()
}

/// Inserts an active task; returns its id.
pub async fn insert(
    conn: &mut AnyConnection,
    t: &TaskInput,
    creator_agent_id: i64,
    now_s: i64,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO crm_tasks (text, status, agent_id, client_id, deal_id, notify_ts, \
         show_notification, creator_agent_id, created_ts, updated_ts, fired) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, 0) RETURNING id",
    )
    .bind(t.text.as_str())
    .bind(ACTIVE)
    .bind(t.agent_id)
    .bind(t.client_id)
    .bind(t.deal_id)
    .bind(t.notify_ts)
    .bind(i64::from(t.show_notification))
    .bind(creator_agent_id)
    .bind(now_s)
    .fetch_one(conn)
    .await
    .ctx("inserting a task")?;
    Ok(id)
}

/// Writes a task's fields. A changed `notify_ts` arms the reminder again.
pub async fn update(
    conn: &mut AnyConnection,
    id: i64,
    t: &TaskInput,
    now_s: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE crm_tasks SET text = $1, agent_id = $2, client_id = $3, deal_id = $4, \
         fired = CASE WHEN notify_ts = $5 THEN fired ELSE 0 END, notify_ts = $5, \
         show_notification = $6, updated_ts = $7 WHERE id = $8",
    )
    .bind(t.text.as_str())
    .bind(t.agent_id)
    .bind(t.client_id)
    .bind(t.deal_id)
    .bind(t.notify_ts)
    .bind(i64::from(t.show_notification))
    .bind(now_s)
    .bind(id)
    .execute(conn)
    .await
    .ctx("updating a task")?;
    Ok(())
}

pub async fn complete(conn: &mut AnyConnection, id: i64, now_s: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE crm_tasks SET status = $1, updated_ts = $2 WHERE id = $3")
        .bind(COMPLETED)
        .bind(now_s)
        .bind(id)
        .execute(conn)
        .await
        .ctx("completing a task")?;
    Ok(())
}

pub async fn delete(conn: &mut AnyConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM crm_tasks WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting a task")?;
    Ok(())
}

/// Active tasks whose reminder is due at `now_s` and has not fired, oldest first.
pub async fn due(conn: &mut AnyConnection, now_s: i64, limit: i64) -> Result<Vec<i64>, StoreError> {
    let rows: Vec<(i64,)> = sqlx::query_as(
        "SELECT id FROM crm_tasks WHERE fired = 0 AND notify_ts <= $1 AND status <> $2 \
         ORDER BY notify_ts, id LIMIT $3",
    )
    .bind(now_s)
    .bind(COMPLETED)
    .bind(limit)
    .fetch_all(conn)
    .await
    .ctx("finding due task reminders")?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Marks a reminder fired; false if it already was.
pub async fn mark_fired(conn: &mut AnyConnection, id: i64) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE crm_tasks SET fired = 1 WHERE id = $1 AND fired = 0")
        .bind(id)
        .execute(conn)
        .await
        .ctx("marking a task reminder fired")?;
    Ok(done.rows_affected() == 1)
}

/// The earliest `notify_ts` of a reminder still to fire.
pub async fn next_due(conn: &mut AnyConnection) -> Result<Option<i64>, StoreError> {
    let (next,): (Option<i64>,) =
        sqlx::query_as("SELECT MIN(notify_ts) FROM crm_tasks WHERE fired = 0 AND status <> $1")
            .bind(COMPLETED)
            .fetch_one(conn)
            .await
            .ctx("finding the next task reminder")?;
    Ok(next)
}
