//! The console's session as a credential: its cookie, and the agent it
//! names, whose state-changing requests must carry the session's CSRF token
//! (`X-CSRF-Token`). The layer (`layer.rs`) takes it where an agent or admin
//! bearer token is absent; the console's own endpoints read it too.

use http::header::COOKIE;
use http::{Method, Request, StatusCode};

use crate::http::App;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, error};
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
    let (agent, csrf) = match app.sign_ins.session(&app.store, value).await {
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
