//! Organizations (companies) clients belong to.

use plugin_api::crm::Organization;
use plugin_api::webhook::NumericId;
use sqlx::AnyConnection;

use crate::store::{Ctx, StoreError};

fn organization((id, name): (i64, String)) -> Organization {
    Organization {
        organization_id: NumericId(id),
        name,
    }
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<Organization>, StoreError> {
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, name FROM crm_organizations ORDER BY id")
            .fetch_all(conn)
            .await
            .ctx("listing organizations")?;
    Ok(rows.into_iter().map(organization).collect())
}

pub async fn get(conn: &mut AnyConnection, id: i64) -> Result<Option<Organization>, StoreError> {
    let row: Option<(i64, String)> =
        sqlx::query_as("SELECT id, name FROM crm_organizations WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await
            .ctx("reading an organization")?;
    Ok(row.map(organization))
}

pub async fn insert(
    conn: &mut AnyConnection,
    name: &str,
    now_ms: i64,
) -> Result<Organization, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO crm_organizations (name, created_at) VALUES ($1, $2) RETURNING id",
    )
    .bind(name)
    .bind(now_ms)
    .fetch_one(conn)
    .await
    .ctx("inserting an organization")?;
    Ok(Organization {
        organization_id: NumericId(id),
        name: name.to_owned(),
    })
}

pub async fn update(conn: &mut AnyConnection, id: i64, name: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE crm_organizations SET name = $1 WHERE id = $2")
        .bind(name)
        .bind(id)
        .execute(conn)
        .await
        .ctx("updating an organization")?;
    Ok(())
}

/// Deletes an organization; its clients belong to none afterwards. Returns them.
pub async fn delete(conn: &mut AnyConnection, id: i64) -> Result<Vec<i64>, StoreError> {
    let members: Vec<(i64,)> =
        sqlx::query_as("SELECT id FROM clients WHERE organization_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&mut *conn)
            .await
            .ctx("listing an organization's clients")?;
    sqlx::query("UPDATE clients SET organization_id = NULL WHERE organization_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await
        .ctx("detaching clients from an organization")?;
    sqlx::query("DELETE FROM crm_organizations WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await
        .ctx("deleting an organization")?;
    Ok(members.into_iter().map(|(id,)| id).collect())
}
