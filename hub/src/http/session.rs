//! Who is calling the agent and admin APIs: a bearer token, or a console
//! session cookie, whose state-changing requests must carry the session's
//! CSRF token (`X-CSRF-Token`).

use http::header::COOKIE;
use http::{Method, Request, StatusCode};

use crate::core::accounts;
use crate::http::App;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, bearer, error};
use crate::ids::constant_time_eq;
use crate::store::Agent;

/// The console session's cookie.
pub const COOKIE_NAME: &str = "hub_session";
/// The header the console sends the session's CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The value of the session cookie, if the request has one.
pub fn cookie<B>(req: &Request<B>) -> Option<&str> {
    req.headers()
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim())
        .filter(|v| !v.is_empty())
}

/// Whether a request may change something (and so needs the CSRF token).
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The agent of the request's console session. `Ok(None)`: there is no
/// session cookie. A cookie that is unknown or expired is 401; a
/// state-changing request without the session's CSRF token is 403.
pub async fn agent<B>(app: &App, req: &Request<B>) -> Result<Option<Agent>, Resp> {
    let Some(value) = cookie(req) else {
        return Ok(None);
    };
    let (agent, csrf) = match accounts::session(&app.store, value).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the session has ended: sign in again",
            ));
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot check a console session");
            return Err(Problem::unavailable().answer(Dialect::Api));
        }
    };
    if changes_state(req.method()) {
        let sent = req
            .headers()
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !constant_time_eq(sent.as_bytes(), csrf.as_bytes()) {
            return Err(error(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a CSRF token is required (X-CSRF-Token)",
            ));
        }
    }
    Ok(Some(agent))
}

/// The admin token, or the console session of an admin agent (whose
/// state-changing requests carry the CSRF token).
pub async fn admin<B>(app: &App, req: &Request<B>) -> Result<(), Resp> {
    let disabled = || {
        error(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "the admin API is off: set admin.token in hub.toml or HUB_ADMIN_TOKEN",
        )
    };
    let unauthorized = || {
        error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "admin bearer token required",
        )
    };
    if let Some(token) = bearer(req) {
        return match app.admin_token.as_deref() {
            Some(expected) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => Err(unauthorized()),
            None => Err(disabled()),
        };
    }
    match agent(app, req).await? {
        Some(agent) if agent.admin => Ok(()),
        Some(_) => Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this agent is not an administrator",
        )),
        None if app.admin_token.is_none() => Err(disabled()),
        None => Err(unauthorized()),
    }
}
