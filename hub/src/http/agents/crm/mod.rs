//! The CRM part of the agent API (`/agent/v1/crm/...`): pipelines, client
//! categories, tags, deals, tasks, organizations and clients. Reads are
//! answered from the store here; a change is parsed into a [`CrmChange`]
//! and handed to the door, which runs it through the plugins and the CRM's
//! rules (`core/crm/`). Clients are reachable only on the agent's channels.

use http::{Method, Request, StatusCode};
use hyper::body::{Bytes, Incoming};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::clock::now_ms;
use crate::core::crm::clients::answer as client_answer;
use crate::core::crm::{ClientPart, CrmChange, Entity, Verb};
use crate::core::error::CoreError;
use crate::core::{Handled, Inbound};
use crate::http::App;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, error, json, method_not_allowed, query_pairs, read_body};
use crate::store::{Agent, Conn, StoreError};

/// Routes `/agent/v1/crm/...`; `rest` is the path after `crm`.
pub async fn handle(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Resp {
    let result = match rest {
        ["pipelines", tail @ ..] => pipelines(app, req, agent, tail).await,
        ["statuses", tail @ ..] => statuses(app, req, agent, tail).await,
        ["tags", tail @ ..] => tags(app, req, agent, tail).await,
        ["deals", tail @ ..] => deals(app, req, agent, tail).await,
        ["tasks", tail @ ..] => tasks(app, req, agent, tail).await,
        ["organizations", tail @ ..] => organizations(app, req, agent, tail).await,
        ["clients", tail @ ..] => clients(app, req, agent, tail).await,
        _ => Err(CrmError::NoEndpoint),
    };
    result.unwrap_or_else(CrmError::into_response)
}

/// Why a CRM request failed; each maps to a status and an error code.
#[derive(Debug)]
pub(crate) enum CrmError {
    /// 404 naming what is missing ("no such deal").
    NotFound(&'static str),
    NoEndpoint,
    MethodNotAllowed,
    Invalid(String),
    /// The body could not be read (400 or 413).
    Body(StatusCode, String),
    Store(StoreError),
    /// The change was refused by a plugin or the CRM's rules.
    Core(CoreError),
}

impl From<CoreError> for CrmError {
    fn from(e: CoreError) -> Self {
        CrmError::Core(e)
    }
}

impl From<StoreError> for CrmError {
    fn from(e: StoreError) -> Self {
        CrmError::Store(e)
    }
}

impl CrmError {
    fn into_response(self) -> Resp {
        match self {
            CrmError::NotFound(what) => error(StatusCode::NOT_FOUND, "not_found", what),
            CrmError::NoEndpoint => error(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
            CrmError::MethodNotAllowed => method_not_allowed(),
            CrmError::Invalid(m) => error(StatusCode::BAD_REQUEST, "invalid_request", m),
            CrmError::Body(status, m) => error(status, "invalid_request", m),
            CrmError::Store(e) => {
                tracing::error!(error = %e, "CRM request failed");
                Problem::unavailable().answer(Dialect::Api)
            }
            CrmError::Core(e) => Problem::core(e, "not found", "CRM change").answer(Dialect::Api),
        }
    }
}

pub(crate) type Answer = Result<Resp, CrmError>;

pub(crate) fn invalid(message: impl Into<String>) -> CrmError {
    CrmError::Invalid(message.into())
}

pub(crate) fn ok(value: &impl serde::Serialize) -> Answer {
    Ok(json(StatusCode::OK, value))
}

/// An id in the path; anything else names nothing.
pub(crate) fn path_id(segment: &str, missing: &'static str) -> Result<i64, CrmError> {
    segment
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or(CrmError::NotFound(missing))
}

/// What a request to an entity's collection (`/` or `/{id}`) asks for. Each
/// entity matches its own extra paths first and leaves these to [`crud`].
pub(crate) enum Crud {
    List,
    Create,
    Show(i64),
    Update(i64),
    Delete(i64),
}

impl Crud {
    /// The change a create, update or delete asks for; reads are routed
    /// before they get here.
    fn verb(self) -> Result<Verb, CrmError> {
        match self {
            Crud::Create => Ok(Verb::Create),
            Crud::Update(id) => Ok(Verb::Update(id)),
            Crud::Delete(id) => Ok(Verb::Delete(id)),
            Crud::List | Crud::Show(_) => Err(CrmError::NoEndpoint),
        }
    }
}

/// Routes the collection paths every entity shares: `GET`/`POST` on `/`,
/// `GET`, `PUT`/`PATCH` and `DELETE` on `/{id}` (an id that is not one is the
/// 404 `missing`); another method there is 405, any other path 404.
pub(crate) fn crud(
    method: &Method,
    rest: &[&str],
    missing: &'static str,
) -> Result<Crud, CrmError> {
    match (method, rest) {
        (&Method::GET, []) => Ok(Crud::List),
        (&Method::POST, []) => Ok(Crud::Create),
        (&Method::GET, [id]) => path_id(id, missing).map(Crud::Show),
        (m, [id]) if is_update(m) => path_id(id, missing).map(Crud::Update),
        (&Method::DELETE, [id]) => path_id(id, missing).map(Crud::Delete),
        (_, [] | [_]) => Err(CrmError::MethodNotAllowed),
        _ => Err(CrmError::NoEndpoint),
    }
}

/// Turns a store read's "none" into the entity's 404.
pub(crate) fn found<T>(value: Option<T>, missing: &'static str) -> Result<T, CrmError> {
    value.ok_or(CrmError::NotFound(missing))
}

/// `GET` of a whole collection, answered as `{ key: [...] }`. The store's
/// `list` is passed in so each entity names only its key and its reader.
pub(crate) async fn list_all<T: serde::Serialize>(
    app: &App,
    key: &str,
    list: impl AsyncFnOnce(&mut Conn) -> Result<Vec<T>, StoreError>,
) -> Answer {
    let mut conn = app.store.crm_reader().await?;
    let items = list(&mut conn).await?;
    ok(&json!({ key: items }))
}

/// `GET /{id}`: the entity, or the 404 `missing`.
pub(crate) async fn show<T: serde::Serialize>(
    app: &App,
    id: i64,
    missing: &'static str,
    get: impl AsyncFnOnce(&mut Conn, i64) -> Result<Option<T>, StoreError>,
) -> Answer {
    let mut conn = app.store.crm_reader().await?;
    ok(&found(get(&mut conn, id).await?, missing)?)
}

/// PUT and PATCH both change the fields they carry.
pub(crate) fn is_update(method: &Method) -> bool {
    *method == Method::PUT || *method == Method::PATCH
}

/// Parses a JSON body into `T`, answering 400/413 with the reason.
pub(crate) async fn body<T: DeserializeOwned>(
    app: &App,
    req: Request<Incoming>,
) -> Result<T, CrmError> {
    parse_json(&raw_body(app, req).await?)
}

/// Like [`body`], but an empty body reads as `T::default()`.
pub(crate) async fn body_or_default<T: DeserializeOwned + Default>(
    app: &App,
    req: Request<Incoming>,
) -> Result<T, CrmError> {
    let bytes = raw_body(app, req).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_json(&bytes)
}

/// The request body within the configured limit (400/413 otherwise).
async fn raw_body(app: &App, req: Request<Incoming>) -> Result<Bytes, CrmError> {
    read_body(req, &app.config.server)
        .await
        .map_err(|e| CrmError::Body(e.status(), e.reason()))
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CrmError> {
    crate::http::respond::parse_json(bytes).map_err(|e| invalid(format!("invalid JSON body: {e}")))
}

/// The decoded `key=value` pairs of a request's query string.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn of<B>(req: &Request<B>) -> Query {
        Query(query_pairs(req.uri().query().unwrap_or_default()).collect())
    }

    /// The last non-empty value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// An id parameter; a value that is not a positive integer is refused.
    pub(crate) fn id(&self, key: &str) -> Result<Option<i64>, CrmError> {
        self.get(key)
            .map(|v| {
                v.trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| invalid(format!("{key}: expected a positive integer")))
            })
            .transpose()
    }
}

/// Pipelines with their stages and reject reasons.
async fn pipelines(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::pipelines as store;
    let entity = Entity::Pipeline;
    match crud(req.method(), rest, entity.missing())? {
        Crud::List => list_all(app, "pipelines", store::list).await,
        Crud::Show(id) => show(app, id, entity.missing(), store::get).await,
        other => change(app, req, agent, entity, other.verb()?).await,
    }
}

/// Client categories, their order and the "require update" setting.
async fn statuses(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::{STATUS_REQUIRE_UPDATE, setting_flag, statuses as store};
    let entity = Entity::Status;
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::POST, ["reorder"]) => change(app, req, agent, entity, Verb::Reorder).await,
        (&Method::GET, ["settings"]) => {
            let mut conn = app.store.crm_reader().await?;
            let on = setting_flag(&mut conn, STATUS_REQUIRE_UPDATE).await?;
            ok(&json!({ "require_update": on }))
        }
        (m, ["settings"]) if is_update(m) => change(app, req, agent, entity, Verb::Settings).await,
        (_, ["reorder" | "settings"]) => Err(CrmError::MethodNotAllowed),
        _ => match crud(&method, rest, entity.missing())? {
            Crud::List => list_all(app, "statuses", store::list).await,
            Crud::Show(id) => show(app, id, entity.missing(), store::get).await,
            other => change(app, req, agent, entity, other.verb()?).await,
        },
    }
}

/// Client tags, merging them and the "administrators only" setting.
async fn tags(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::{TAGS_ADMINISTRATORS_ONLY, setting_flag, tags as store};
    let entity = Entity::Tag;
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::POST, ["merge"]) => change(app, req, agent, entity, Verb::Merge).await,
        (&Method::GET, ["settings"]) => {
            let mut conn = app.store.crm_reader().await?;
            let on = setting_flag(&mut conn, TAGS_ADMINISTRATORS_ONLY).await?;
            ok(&json!({ "administrators_only": on }))
        }
        (m, ["settings"]) if is_update(m) => change(app, req, agent, entity, Verb::Settings).await,
        (_, ["merge" | "settings"]) => Err(CrmError::MethodNotAllowed),
        _ => match crud(&method, rest, entity.missing())? {
            Crud::List => list_all(app, "tags", store::list).await,
            Crud::Show(id) => show(app, id, entity.missing(), store::get).await,
            other => change(app, req, agent, entity, other.verb()?).await,
        },
    }
}

/// A client's deals, filtered by client, pipeline, stage or agent.
async fn deals(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::deals::{self as store, DealFilter};
    let entity = Entity::Deal;
    match crud(req.method(), rest, entity.missing())? {
        Crud::List => {
            let q = Query::of(&req);
            let filter = DealFilter {
                client_id: q.id("client_id")?,
                pipeline_id: q.id("pipeline_id")?,
                stage_id: q.id("pipeline_status_id")?,
                assigned_agent_id: q.id("assigned_agent_id")?,
            };
            list_all(app, "deals", async |conn| store::list(conn, &filter).await).await
        }
        Crud::Show(id) => show(app, id, entity.missing(), store::get).await,
        other => change(app, req, agent, entity, other.verb()?).await,
    }
}

/// Reminders for agents, filtered by client, deal, agent or status.
async fn tasks(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::tasks::{self as store, TaskFilter};
    let entity = Entity::Task;
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::POST, [id, "complete"]) => {
            let id = path_id(id, entity.missing())?;
            change(app, req, agent, entity, Verb::Complete(id)).await
        }
        (_, [_, "complete"]) => Err(CrmError::MethodNotAllowed),
        _ => match crud(&method, rest, entity.missing())? {
            Crud::List => {
                let q = Query::of(&req);
                let filter = TaskFilter {
                    client_id: q.id("client_id")?,
                    deal_id: q.id("deal_id")?,
                    agent_id: q.id("agent_id")?,
                    status: q.get("status").map(str::to_owned),
                };
                list_all(app, "tasks", async |conn| store::list(conn, &filter).await).await
            }
            Crud::Show(id) => show(app, id, entity.missing(), store::get).await,
            other => change(app, req, agent, entity, other.verb()?).await,
        },
    }
}

/// The companies clients belong to.
async fn organizations(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::organizations as store;
    let entity = Entity::Organization;
    match crud(req.method(), rest, entity.missing())? {
        Crud::List => list_all(app, "organizations", store::list).await,
        Crud::Show(id) => show(app, id, entity.missing(), store::get).await,
        other => change(app, req, agent, entity, other.verb()?).await,
    }
}

/// The clients of the agent's channels, and the parts of one set alone.
async fn clients(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Answer {
    use crate::store::crm::clients as store;
    let entity = Entity::Client;
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::GET, []) => list_clients(app, &req, agent).await,
        (&Method::GET, [id]) => {
            let id = path_id(id, entity.missing())?;
            let mut conn = app.store.crm_reader().await?;
            if store::visible_channel(&mut conn, id, &agent.email)
                .await?
                .is_none()
            {
                return Err(CrmError::NotFound(entity.missing()));
            }
            ok(&client_answer(&mut conn, id, now_ms() / 1000).await?)
        }
        (m, [id, part]) if is_update(m) => {
            let id = path_id(id, entity.missing())?;
            let part = ClientPart::parse(part).ok_or(CrmError::NoEndpoint)?;
            change(app, req, agent, entity, Verb::Set(id, part)).await
        }
        (_, [_, part]) if ClientPart::parse(part).is_some() => Err(CrmError::MethodNotAllowed),
        _ => {
            let verb = crud(&method, rest, entity.missing())?.verb()?;
            change(app, req, agent, entity, verb).await
        }
    }
}

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 500;

async fn list_clients(app: &App, req: &Request<Incoming>, agent: &Agent) -> Answer {
    use crate::store::crm::clients::{self as store, ClientFilter};
    let q = Query::of(req);
    let limit = q.id("limit")?.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    let mut conn = app.store.crm_reader().await?;
    let channel_id = match q.get("channel") {
        Some(c) => Some(
            store::agent_channel(&mut conn, c, &agent.email)
                .await?
                .ok_or_else(|| invalid(format!("channel: no channel {c:?} of yours")))?,
        ),
        None => None,
    };
    let filter = ClientFilter {
        channel_id,
        status_id: q.id("status_id")?,
        organization_id: q.id("organization_id")?,
        assigned_agent_id: q.id("assigned_agent_id")?,
        tag_id: q.id("tag_id")?,
        search: q.get("q").map(str::to_owned),
        after_id: q.id("after")?,
        limit,
    };
    let ids = store::list(&mut conn, &agent.email, &filter).await?;
    let now_s = now_ms() / 1000;
    let mut clients = Vec::with_capacity(ids.len());
    for id in &ids {
        clients.push(client_answer(&mut conn, *id, now_s).await?);
    }
    let next_after = if i64::try_from(ids.len()).is_ok_and(|n| n == limit) {
        ids.last().copied()
    } else {
        None
    };
    ok(&json!({ "clients": clients, "next_after": next_after }))
}

/// Hands a change to the door with its fields: the JSON body, `{}` for a
/// delete or a completion (which carry none). Deleting a client category
/// takes `new_status_id` from the body or, first, from the query.
async fn change(
    app: &App,
    req: Request<Incoming>,
    agent: &Agent,
    entity: Entity,
    verb: Verb,
) -> Answer {
    let fields = match verb {
        Verb::Delete(_) if entity == Entity::Status => {
            let from_query = Query::of(&req).id("new_status_id")?;
            let mut fields: Map<String, Value> = body_or_default(app, req).await?;
            if let Some(id) = from_query {
                fields.insert("new_status_id".to_owned(), Value::from(id));
            }
            Value::Object(fields)
        }
        Verb::Delete(_) | Verb::Complete(_) => json!({}),
        _ => body(app, req).await?,
    };
    let change = CrmChange {
        entity,
        verb,
        fields,
    };
    match app
        .conversations
        .handle(Inbound::Crm { agent, change })
        .await?
    {
        Handled::Crm(done) if done.created => Ok(json(StatusCode::CREATED, &done.body)),
        Handled::Crm(done) => Ok(json(StatusCode::OK, &done.body)),
        other => Err(CrmError::Core(CoreError::Unavailable(format!(
            "a CRM change came to {other:?}"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        let req = Request::get("/x?a=%C3%A9&b=a%20b+c&c=100%&d=%zz&e=1&e=&f")
            .body(())
            .expect("request");
        let q = Query::of(&req);
        assert_eq!(q.get("a"), Some("é"));
        assert_eq!(q.get("b"), Some("a b c"));
        assert_eq!(q.get("c"), Some("100%"));
        assert_eq!(q.get("d"), Some("%zz"));
        assert_eq!(q.get("e"), Some("1"), "an empty value is absent");
        assert_eq!(q.get("f"), None);
    }
}
