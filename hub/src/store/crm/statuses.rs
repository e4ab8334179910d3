//! Client categories (the spec's CRM "statuses"). One category is the
//! default: clients without a category are in it, and it cannot be deleted.

use plugin_api::crm::Category;
use plugin_api::webhook::NumericId;
use sqlx::AnyConnection;

use crate::store::{Ctx, StoreError};

type Row = (i64, String, String, i64);

fn category((id, title, color, position): Row) -> Category {
    Category {
        status_id: NumericId(id),
        title,
        color,
        position,
        new_status_id: None,
    }
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<Category>, StoreError> {
    let rows: Vec<Row> =
        sqlx::query_as("SELECT id, title, color, position FROM crm_statuses ORDER BY position, id")
            .fetch_all(conn)
            .await
            .ctx("listing client categories")?;
    Ok(rows.into_iter().map(category).collect())
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<Category>, StoreError> {
    let row: Option<Row> =
        sqlx::query_as("SELECT id, title, color, position FROM crm_statuses WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await
            .ctx("reading a client category")?;
    Ok(row.map(category))
}

/// The default category's id.
pub async fn default_id(conn: &mut AnyConnection) -> Result<i64, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT id FROM crm_statuses WHERE is_default = 1 ORDER BY position, id LIMIT 1",
    )
    .fetch_optional(conn)
    .await
    .ctx("reading the default client category")?;
    row.map(|(id,)| id)
        .ok_or_else(|| StoreError::Corrupt("there is no default client category".to_owned()))
}

/// The category a client is in: its own, else the default.
pub async fn of_client(
    conn: &mut AnyConnection,
    status_id: Option<i64>,
) -> Result<Category, StoreError> {
    if let Some(id) = status_id
        && let Some(c) = get(conn, id).await?
    {
        return Ok(c);
    }
    let id = default_id(conn).await?;
    get(conn, id)
        .await?
        .ok_or_else(|| StoreError::Corrupt("the default client category vanished".to_owned()))
}

/// Appends a category after the others; returns its id.
pub async fn insert(
    conn: &mut AnyConnection,
    title: &str,
    color: &str,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO crm_statuses (title, color, position, is_default, created_at) \
         VALUES ($1, $2, (SELECT COALESCE(MAX(position), 0) + 1 FROM crm_statuses), 0, $3) \
         RETURNING id",
    )
    .bind(title)
    .bind(color)
    .bind(now_ms)
    .fetch_one(conn)
    .await
    .ctx("inserting a client category")?;
    Ok(id)
}

pub async fn update(
    conn: &mut AnyConnection,
    id: i64,
    title: &str,
    color: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE crm_statuses SET title = $1, color = $2 WHERE id = $3")
        .bind(title)
        .bind(color)
        .bind(id)
        .execute(conn)
        .await
        .ctx("updating a client category")?;
    Ok(())
}

/// Moves the category's clients to `to` and deletes it; returns the moved
/// clients. Clients of the default category that were never given one keep
/// their empty category, which still reads as the default.
pub async fn delete_moving(
    conn: &mut AnyConnection,
    id: i64,
    to: i64,
) -> Result<Vec<i64>, StoreError> {
    let moved: Vec<(i64,)> = sqlx::query_as("SELECT id FROM clients WHERE status_id = $1")
        .bind(id)
        .fetch_all(&mut *conn)
        .await
        .ctx("listing a category's clients")?;
    sqlx::query("UPDATE clients SET status_id = $1 WHERE status_id = $2")
        .bind(to)
        .bind(id)
        .execute(&mut *conn)
        .await
        .ctx("moving clients to another category")?;
    sqlx::query("DELETE FROM crm_statuses WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting a client category")?;
    Ok(moved.into_iter().map(|(id,)| id).collect())
}

/// Numbers the categories 1, 2, … in the order of `ids`.
pub async fn reorder(conn: &mut AnyConnection, ids: &[i64]) -> Result<(), StoreError> {
    for (position, id) in (1_i64..).zip(ids) {
        sqlx::query("UPDATE crm_statuses SET position = $1 WHERE id = $2")
            .bind(position)
            .bind(*id)
            .execute(&mut *conn)
            .await
            .ctx("reordering client categories")?;
    }
    Ok(())
}
