//! `/crm/tasks`: reminders for an agent about a client, maybe tied to one of
//! the client's deals (`crm_task` webhooks). The reminder itself
//! (`fired_task`) is sent by [`super::reminders`].

use plugin_api::crm::{CrmEvent, Flag, Task, TaskEvent};
use plugin_api::webhook::NumericId;
use serde::Deserialize;

use super::{
    Answer, Change, CoreError, Crm, Entity, Verb, created, invalid, long_text, no_such_change,
    nullable, ok, remove,
};
use crate::store::Agent;
use crate::store::crm::tasks::{self as store, COMPLETED, TaskInput};
use crate::store::crm::{agent_exists, clients, deals};

const MISSING: &str = Entity::Task.missing();
/// `notify_ts` above this is surely milliseconds, not the spec's seconds.
const MAX_NOTIFY_TS: i64 = 100_000_000_000;

pub(super) async fn apply(cx: &Crm<'_>, verb: Verb) -> Answer {
    match verb {
        Verb::Create => create(cx, cx.agent, cx.fields()?).await,
        Verb::Update(id) => update(cx, cx.agent, id, cx.fields()?).await,
        Verb::Complete(id) => complete(cx, id).await,
        Verb::Delete(id) => {
            remove(cx, id, MISSING, store::get, store::delete, |d| {
                CrmEvent::CrmTask(TaskEvent::DeletedTask(d))
            })
            .await
        }
        _ => Err(no_such_change()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    text: String,
    client_id: NumericId,
    /// Unix seconds of the reminder.
    notify_ts: NumericId,
    /// The calling agent when absent.
    #[serde(default)]
    agent_id: Option<NumericId>,
    #[serde(default)]
    deal_id: Option<NumericId>,
    /// `true`/`false` or `1`/`0`; on when absent.
    #[serde(default)]
    show_notification: Option<Flag>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    client_id: Option<NumericId>,
    #[serde(default)]
    notify_ts: Option<NumericId>,
    #[serde(default)]
    agent_id: Option<NumericId>,
    #[serde(default, deserialize_with = "nullable")]
    deal_id: Option<Option<NumericId>>,
    #[serde(default)]
    show_notification: Option<Flag>,
}

fn task_text(value: &str) -> Result<String, CoreError> {
    let text = long_text("text", value.trim())?;
    if text.is_empty() {
        return Err(invalid("text: must not be empty"));
    }
    Ok(text)
}

fn notify_ts(value: NumericId) -> Result<i64, CoreError> {
    let value = value.0;
    if value <= 0 || value >= MAX_NOTIFY_TS {
        return Err(invalid(format!(
            "notify_ts: expected Unix seconds, got {value}"
        )));
    }
    Ok(value)
}

async fn read(change: &mut Change<'_>, id: i64) -> Result<Task, CoreError> {
    change.find(store::get, id, MISSING).await
}

/// Checks the task's client (on the agent's channels, when it changes), its
/// agent, and that its deal is one of the client's.
async fn check(
    change: &mut Change<'_>,
    agent: &Agent,
    task: &TaskInput,
    before: Option<&TaskInput>,
) -> Result<(), CoreError> {
    if before.is_none_or(|b| b.client_id != task.client_id)
        && clients::visible_channel(change.conn(), task.client_id, &agent.email)
            .await?
            .is_none()
    {
        return Err(invalid(format!("client_id: no client {}", task.client_id)));
    }
    if !agent_exists(change.conn(), task.agent_id).await? {
        return Err(invalid(format!("agent_id: no agent {}", task.agent_id)));
    }
    if let Some(deal_id) = task.deal_id {
        match deals::get(change.conn(), deal_id).await? {
            Some(d) if d.client.client_id.0 == task.client_id => {}
            Some(_) => {
                return Err(invalid(format!(
                    "deal_id: deal {deal_id} belongs to another client"
                )));
            }
            None => return Err(invalid(format!("deal_id: no deal {deal_id}"))),
        }
    }
    Ok(())
}

async fn create(cx: &Crm<'_>, agent: &Agent, body: CreateBody) -> Answer {
    let input = TaskInput {
        text: task_text(&body.text)?,
        agent_id: body.agent_id.map_or(agent.id, |n| n.0),
        client_id: body.client_id.0,
        deal_id: body.deal_id.map(|n| n.0),
        notify_ts: notify_ts(body.notify_ts)?,
        show_notification: body.show_notification.is_none_or(|f| f.0),
    };
    let mut change = Change::begin(cx).await?;
    check(&mut change, agent, &input, None).await?;
    let now = change.now_s();
    let id = store::insert(change.conn(), &input, agent.id, now).await?;
    let task = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmTask(TaskEvent::CreatedTask(task.clone())))
        .await?;
    created(&task)
}

async fn update(cx: &Crm<'_>, agent: &Agent, id: i64, body: UpdateBody) -> Answer {
    let new_text = body.text.as_deref().map(task_text).transpose()?;
    let new_notify = body.notify_ts.map(notify_ts).transpose()?;
    let mut change = Change::begin(cx).await?;
    let before = TaskInput::of(&read(&mut change, id).await?);
    let mut task = before.clone();
    if let Some(t) = new_text {
        task.text = t;
    }
    if let Some(c) = body.client_id {
        task.client_id = c.0;
        // A deal belongs to one client; moving the task leaves it behind.
        if c.0 != before.client_id && body.deal_id.is_none() {
            task.deal_id = None;
        }
    }
    if let Some(n) = new_notify {
        task.notify_ts = n;
    }
    if let Some(a) = body.agent_id {
        task.agent_id = a.0;
    }
    if let Some(d) = body.deal_id {
        task.deal_id = d.map(|n| n.0);
    }
    if let Some(f) = body.show_notification {
        task.show_notification = f.0;
    }
    check(&mut change, agent, &task, Some(&before)).await?;
    let now = change.now_s();
    store::update(change.conn(), id, &task, now).await?;
    let task = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmTask(TaskEvent::UpdatedTask(task.clone())))
        .await?;
    ok(&task)
}

async fn complete(cx: &Crm<'_>, id: i64) -> Answer {
    let mut change = Change::begin(cx).await?;
    let task = read(&mut change, id).await?;
    if task.status == COMPLETED {
        return Err(CoreError::Conflict(
            "the task is already completed".to_owned(),
        ));
    }
    let now = change.now_s();
    store::complete(change.conn(), id, now).await?;
    let task = read(&mut change, id).await?;
    change
        .commit_with(CrmEvent::CrmTask(TaskEvent::CompletedTask(task.clone())))
        .await?;
    ok(&task)
}
