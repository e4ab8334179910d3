//! The CRM part of the agent API (`/agent/v1/crm/...`): pipelines, client
//! categories, tags, deals, tasks, organizations and clients. Each change is
//! one write transaction that also queues its CRM webhook (and, for the
//! client changes the event webhooks name, `client_updated`); the deliverer is
//! woken once it commits. Clients are reachable only on the agent's channels;
//! the other CRM entities are shared by all agents.

mod clients;
mod deals;
mod organizations;
mod pipelines;
mod statuses;
mod tags;
mod tasks;

use http::{Method, Request, StatusCode};
use hyper::body::{Bytes, Incoming};
use plugin_api::crm::CrmEvent;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::json;

use crate::clock::now_ms;
use crate::http::App;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, error, json, method_not_allowed, read_body};
use crate::store::{Agent, Conn, StoreError, WriteTx};

/// Longest title, name or text line the CRM keeps, in characters.
const MAX_TITLE: usize = 255;
/// Longest free text (deal and task texts, descriptions), in characters.
const MAX_TEXT: usize = 10_000;

/// Routes `/agent/v1/crm/...`; `rest` is the path after `crm`.
pub async fn handle(app: &App, req: Request<Incoming>, agent: &Agent, rest: &[&str]) -> Resp {
    let result = match rest {
        ["pipelines", tail @ ..] => pipelines::route(app, req, agent, tail).await,
        ["statuses", tail @ ..] => statuses::route(app, req, agent, tail).await,
        ["tags", tail @ ..] => tags::route(app, req, agent, tail).await,
        ["deals", tail @ ..] => deals::route(app, req, agent, tail).await,
        ["tasks", tail @ ..] => tasks::route(app, req, agent, tail).await,
        ["organizations", tail @ ..] => organizations::route(app, req, agent, tail).await,
        ["clients", tail @ ..] => clients::route(app, req, agent, tail).await,
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
    Conflict(String),
    /// The body could not be read (400 or 413).
    Body(StatusCode, String),
    Store(StoreError),
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
            CrmError::Conflict(m) => error(StatusCode::CONFLICT, "conflict", m),
            CrmError::Body(status, m) => error(status, "invalid_request", m),
            CrmError::Store(e) => {
                tracing::error!(error = %e, "CRM request failed");
                Problem::unavailable().answer(Dialect::Api)
            }
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

pub(crate) fn created(value: &impl serde::Serialize) -> Answer {
    Ok(json(StatusCode::CREATED, value))
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

/// Deletes an entity that needs nothing but its one webhook, which carries
/// the entity as it was; answers with that same entity.
pub(crate) async fn remove<T: serde::Serialize + Clone>(
    app: &App,
    id: i64,
    missing: &'static str,
    get: impl AsyncFnOnce(&mut Conn, i64) -> Result<Option<T>, StoreError>,
    delete: impl AsyncFnOnce(&mut Conn, i64) -> Result<(), StoreError>,
    event: fn(T) -> CrmEvent,
) -> Answer {
    let mut change = Change::begin(app).await?;
    let gone = change.find(get, id, missing).await?;
    delete(change.conn(), id).await?;
    change.commit_with(event(gone.clone())).await?;
    ok(&gone)
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

/// For `Option<Option<T>>` fields: absent is `None`, `null` is `Some(None)`.
pub(crate) fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The decoded `key=value` pairs of a request's query string.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn of<B>(req: &Request<B>) -> Query {
        let pairs = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect();
        Query(pairs)
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

/// `%XX` escapes and `+` as space; malformed escapes stay as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A required title or name: trimmed, not empty, at most `MAX_TITLE` characters.
pub(crate) fn title(field: &str, value: &str) -> Result<String, CrmError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(invalid(format!("{field}: must not be empty")));
    }
    if v.chars().count() > MAX_TITLE {
        return Err(invalid(format!("{field}: at most {MAX_TITLE} characters")));
    }
    Ok(v.to_owned())
}

/// Free text of at most `MAX_TEXT` characters (may be empty).
pub(crate) fn long_text(field: &str, value: &str) -> Result<String, CrmError> {
    if value.chars().count() > MAX_TEXT {
        return Err(invalid(format!("{field}: at most {MAX_TEXT} characters")));
    }
    Ok(value.to_owned())
}

/// Optional free text; empty reads as absent.
pub(crate) fn optional_text(field: &str, value: Option<&str>) -> Result<Option<String>, CrmError> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => long_text(field, v).map(Some),
        None => Ok(None),
    }
}

/// A HEX colour: `#RGB` or `#RRGGBB`.
pub(crate) fn color(field: &str, value: &str) -> Result<String, CrmError> {
    let v = value.trim();
    let ok = v.strip_prefix('#').is_some_and(|h| {
        (h.len() == 3 || h.len() == 6) && h.chars().all(|c| c.is_ascii_hexdigit())
    });
    if !ok {
        return Err(invalid(format!(
            "{field}: expected a HEX colour like #4caf50, got {value:?}"
        )));
    }
    Ok(v.to_owned())
}

/// An optional http(s) URL; empty reads as absent.
pub(crate) fn optional_url(field: &str, value: Option<&str>) -> Result<Option<String>, CrmError> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) if crate::config::is_http_url(v) && v.len() <= 2048 => Ok(Some(v.to_owned())),
        Some(v) => Err(invalid(format!(
            "{field}: expected an http(s) URL, got {v:?}"
        ))),
        None => Ok(None),
    }
}

/// One change: its write transaction, the webhooks queued in it, then a kick
/// of the deliverer once it is committed. Dropped without `commit`, nothing
/// of it happened.
pub(crate) struct Change<'a> {
    app: &'a App,
    w: WriteTx<'a>,
    now_ms: i64,
}

impl<'a> Change<'a> {
    pub(crate) async fn begin(app: &'a App) -> Result<Change<'a>, CrmError> {
        let w = app.store.begin_write().await?;
        Ok(Change {
            app,
            w,
            now_ms: now_ms(),
        })
    }

    pub(crate) fn conn(&mut self) -> &mut Conn {
        &mut self.w.tx
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// The CRM's clock: Unix seconds.
    pub(crate) fn now_s(&self) -> i64 {
        self.now_ms / 1000
    }

    /// Queues a CRM webhook in this transaction.
    pub(crate) async fn crm(&mut self, event: CrmEvent) -> Result<(), CrmError> {
        crate::core::webhooks::queue_crm(&mut self.w.tx, &self.app.config.crm, event, self.now_ms)
            .await?;
        Ok(())
    }

    /// Queues the event webhook `client_updated` in this transaction.
    pub(crate) async fn client_updated(&mut self, client_id: i64) -> Result<(), CrmError> {
        crate::core::webhooks::queue_client_updated(&mut self.w.tx, client_id, self.now_ms).await?;
        Ok(())
    }

    /// Reads the entity `id` inside this change, or fails with its 404.
    pub(crate) async fn find<T>(
        &mut self,
        get: impl AsyncFnOnce(&mut Conn, i64) -> Result<Option<T>, StoreError>,
        id: i64,
        missing: &'static str,
    ) -> Result<T, CrmError> {
        found(get(self.conn(), id).await?, missing)
    }

    /// Queues the change's one CRM webhook and commits: the usual end of a
    /// create, update or delete.
    pub(crate) async fn commit_with(mut self, event: CrmEvent) -> Result<(), CrmError> {
        self.crm(event).await?;
        self.commit().await
    }

    pub(crate) async fn commit(self) -> Result<(), CrmError> {
        self.w.commit().await?;
        self.app.kick.kick();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        assert_eq!(percent_decode("a%20b+c"), "a b c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%C3%A9"), "é");
    }

    #[test]
    fn colours_and_titles() {
        assert!(color("color", "#4caf50").is_ok());
        assert!(color("color", "#FFF").is_ok());
        assert!(color("color", "red").is_err());
        assert!(color("color", "#12345").is_err());
        assert!(title("title", "  ").is_err());
        assert_eq!(title("title", " Sales ").ok().as_deref(), Some("Sales"));
    }
}
