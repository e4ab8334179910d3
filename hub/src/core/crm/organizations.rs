//! `/crm/organizations`: the companies clients belong to. The spec's only
//! `crm_organization` event is `created_organization`; renaming and deleting
//! send nothing of their own, but a deletion changes the company of its
//! clients, which is told per client (`changed_client_company` and
//! `client_updated`).

use plugin_api::crm::{
    ClientEvent, CrmEvent, Organization, OrganizationCreated, OrganizationEvent,
};
use serde::Deserialize;

use super::{Answer, Change, CoreError, Crm, Entity, Verb, created, no_such_change, ok, title};
use crate::store::crm::{clients, organizations as store};

const MISSING: &str = Entity::Organization.missing();

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
struct NameBody {
    name: String,
}

async fn read(change: &mut Change<'_>, id: i64) -> Result<Organization, CoreError> {
    change.find(store::get, id, MISSING).await
}

async fn create(cx: &Crm<'_>, body: NameBody) -> Answer {
    let name = title("name", &body.name)?;
    let mut change = Change::begin(cx).await?;
    let now = change.now_ms();
    let organization = store::insert(change.conn(), &name, now).await?;
    change
        .commit_with(CrmEvent::CrmOrganization(
            OrganizationEvent::CreatedOrganization(OrganizationCreated {
                organization_id: organization.organization_id,
            }),
        ))
        .await?;
    created(&organization)
}

/// Renames an organization; no webhook (the spec has no such event).
async fn update(cx: &Crm<'_>, id: i64, body: NameBody) -> Answer {
    let name = title("name", &body.name)?;
    let mut change = Change::begin(cx).await?;
    read(&mut change, id).await?;
    store::update(change.conn(), id, &name).await?;
    let organization = read(&mut change, id).await?;
    change.commit().await?;
    ok(&organization)
}

/// Deletes an organization; its former clients belong to none, and each is
/// told as a company change.
async fn delete(cx: &Crm<'_>, id: i64) -> Answer {
    let mut change = Change::begin(cx).await?;
    let organization = read(&mut change, id).await?;
    let members = store::delete(change.conn(), id).await?;
    let now = change.now_s();
    for client_id in members {
        if let Some(client) = clients::get(change.conn(), client_id, now).await? {
            change
                .crm(CrmEvent::CrmClient(Box::new(
                    ClientEvent::ChangedClientCompany(client),
                )))
                .await?;
        }
        change.client_updated(client_id).await?;
    }
    change.commit().await?;
    ok(&organization)
}
