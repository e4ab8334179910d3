//! Client tags and which clients carry them.

use plugin_api::crm::Tag;
use plugin_api::webhook::NumericId;
use sqlx::AnyConnection;

use crate::store::{Ctx, StoreError};

fn tag((id, title): (i64, String)) -> Tag {
    Tag {
        tag_id: NumericId(id),
        title,
    }
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<Tag>, StoreError> {
    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, title FROM crm_tags ORDER BY id")
        .fetch_all(conn)
        .await
        .ctx("listing client tags")?;
    Ok(rows.into_iter().map(tag).collect())
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<Tag>, StoreError> {
    let row: Option<(i64, String)> = sqlx::query_as("SELECT id, title FROM crm_tags WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await
        .ctx("reading a client tag")?;
    Ok(row.map(tag))
}

pub async fn insert(conn: &mut AnyConnection, title: &str, now_ms: i64) -> Result<Tag, StoreError> {
    let (id,): (i64,) =
        sqlx::query_as("INSERT INTO crm_tags (title, created_at) VALUES ($1, $2) RETURNING id")
            .bind(title)
            .bind(now_ms)
            .fetch_one(conn)
            .await
            .ctx("inserting a client tag")?;
    Ok(Tag {
        tag_id: NumericId(id),
        title: title.to_owned(),
    })
}

pub async fn update(conn: &mut AnyConnection, id: i64, title: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE crm_tags SET title = $1 WHERE id = $2")
        .bind(title)
        .bind(id)
        .execute(conn)
        .await
        .ctx("updating a client tag")?;
    Ok(())
}

/// Deletes a tag; clients lose it.
pub async fn delete(conn: &mut AnyConnection, id: i64) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM crm_client_tags WHERE tag_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await
        .ctx("untagging clients")?;
    sqlx::query("DELETE FROM crm_tags WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting a client tag")?;
    Ok(())
}

/// Gives every client of the `merged` tags the `into` tag instead, then
/// deletes the merged tags.
pub async fn merge(conn: &mut AnyConnection, into: i64, merged: &[i64]) -> Result<(), StoreError> {
    for id in merged {
        sqlx::query(
            "INSERT INTO crm_client_tags (client_id, tag_id) \
             SELECT client_id, $1 FROM crm_client_tags WHERE tag_id = $2 \
             ON CONFLICT (client_id, tag_id) DO NOTHING",
        )
        .bind(into)
        .bind(*id)
        .execute(&mut *conn)
        .await
        .ctx("moving clients to the merged tag")?;
        delete(conn, *id).await?;
    }
    Ok(())
}

/// The tags of a client.
pub async fn of_client(conn: &mut AnyConnection, client_id: i64) -> Result<Vec<Tag>, StoreError> {
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT t.id, t.title FROM crm_client_tags ct JOIN crm_tags t ON t.id = ct.tag_id \
         WHERE ct.client_id = $1 ORDER BY t.id",
    )
    .bind(client_id)
    .fetch_all(conn)
    .await
    .ctx("reading a client's tags")?;
    Ok(rows.into_iter().map(tag).collect())
}

/// Replaces the tags of a client.
pub async fn set_of_client(
    conn: &mut AnyConnection,
    client_id: i64,
    tag_ids: &[i64],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM crm_client_tags WHERE client_id = $1")
        .bind(client_id)
        .execute(&mut *conn)
        .await
        .ctx("clearing a client's tags")?;
    for id in tag_ids {
        sqlx::query(
            "INSERT INTO crm_client_tags (client_id, tag_id) VALUES ($1, $2) \
             ON CONFLICT (client_id, tag_id) DO NOTHING",
        )
        .bind(client_id)
        .bind(*id)
        .execute(&mut *conn)
        .await
        .ctx("tagging a client")?;
    }
    Ok(())
}
