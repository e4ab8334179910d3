//! Who is calling the agent and admin APIs: a bearer token, or a console
//! session cookie, whose state-changing requests must carry the session's
//! CSRF token (`X-CSRF-Token`).

use std::net::IpAddr;

use http::header::COOKIE;
use http::{Method, Request, StatusCode};

use crate::http::limits::{self, Door};
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, bearer, error};
use crate::http::{App, client_ip};
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

/// The source address a request's bearer token came from, as the
/// failed-token limit counts it.
pub fn bearer_source<B>(app: &App, req: &Request<B>) -> IpAddr {
    limits::source(client_ip(req, &app.config.server.trusted_proxies))
}

/// 429 while `source` is waiting out its failed tokens: checked before the
/// token, so that guessing gets no answer at all. Session cookies are not
/// counted: they are too long to guess, and an expired one is no attack.
pub fn bearer_blocked(app: &App, source: IpAddr) -> Option<Resp> {
    app.limits.auth_blocked(Door::Api, source).map(|wait| {
        Problem::too_many("too many requests with a wrong token from this address; retry later")
            .answer_after(Dialect::Api, wait)
    })
}

/// Counts a wrong admin or agent token from `source`.
pub fn bearer_failed(app: &App, source: IpAddr) {
    app.limits.auth_failed(Door::Api, source);
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
        let source = bearer_source(app, req);
        if let Some(blocked) = bearer_blocked(app, source) {
            return Err(blocked);
        }
        return match app.admin_token.as_deref() {
            Some(expected) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => {
                bearer_failed(app, source);
                Err(unauthorized())
            }
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

#[cfg(test)]
mod tests {
    use crate::ids::constant_time_eq;

    #[test]
    fn secrets_are_compared_whole_whichever_byte_differs() {
        let secret = *b"0123456789abcdef0123456789abcdef";
        assert!(constant_time_eq(&secret, &secret));
        for i in 0..secret.len() {
            let mut other = secret;
            other[i] ^= 1;
            assert!(!constant_time_eq(&secret, &other), "byte {i}");
        }
        assert!(!constant_time_eq(&secret, &secret[..31]), "a prefix");
        assert!(!constant_time_eq(b"", &secret));
    }

    /// The edges that check a secret the client sends compare it with the
    /// constant-time helper, never with `==`, which stops at the first
    /// difference and so tells a guesser how much of its guess was right.
    #[test]
    fn the_edges_compare_secrets_in_constant_time() {
        let edges = [
            ("channel.rs", include_str!("channel.rs"), "path_secret"),
            ("bots.rs", include_str!("bots.rs"), "expected"),
            ("session.rs", include_str!("session.rs"), "admin_token"),
        ];
        for (file, source, secret) in edges {
            let code = source.split("#[cfg(test)]").next().unwrap_or_default();
            assert!(code.contains("constant_time_eq("), "{file}");
            for line in code.lines().filter(|l| l.contains(secret)) {
                assert!(
                    !line.contains("==") && !line.contains("!="),
                    "{file} compares a secret with ==: {line}"
                );
            }
        }
    }
}
