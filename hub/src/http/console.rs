//! The agent console: its page and scripts (embedded in the binary) and
//! sign-in, resume and sign-out at `/console/v1/session`.

use std::time::Duration;

use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER, SET_COOKIE};
use http::{HeaderValue, Method, Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use crate::core::accounts::{self, SignInError};
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{
    Resp, error, full, json, method_not_allowed, parse_json, read_body, with_type,
};
use crate::http::session::{self, COOKIE_NAME};
use crate::http::{App, client_ip};
use crate::store::Agent;

const INDEX: &str = include_str!("../../assets/console/index.html");
const SCRIPT: &str = include_str!("../../assets/console/console.js");
const ADMIN_SCRIPT: &str = include_str!("../../assets/console/console-admin.js");
const STYLE: &str = include_str!("../../assets/console/console.css");

/// The page runs only its own files: no inline script or style, no other
/// origin but images and media agents are sent (customers' photos).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' https: http: data:; media-src 'self' https: http:; connect-src 'self'; \
    form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Routes `/console/...`; `rest` is the path after `console`.
pub async fn handle(app: &App, req: Request<Incoming>, rest: &[&str]) -> Resp {
    let method = req.method().clone();
    match (method, rest) {
        (Method::GET | Method::HEAD, []) => asset(INDEX, "text/html; charset=utf-8"),
        (Method::GET | Method::HEAD, ["console.js"]) => {
            asset(SCRIPT, "text/javascript; charset=utf-8")
        }
        (Method::GET | Method::HEAD, ["console-admin.js"]) => {
            asset(ADMIN_SCRIPT, "text/javascript; charset=utf-8")
        }
        (Method::GET | Method::HEAD, ["console.css"]) => asset(STYLE, "text/css; charset=utf-8"),
        (Method::POST, ["v1", "session"]) => sign_in(app, req).await,
        (Method::GET, ["v1", "session"]) => resume(app, &req).await,
        (Method::DELETE, ["v1", "session"]) => sign_out(app, &req).await,
        (_, [] | ["console.js" | "console-admin.js" | "console.css"] | ["v1", "session"]) => {
            method_not_allowed()
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such page"),
    }
}

fn asset(body: &'static str, content_type: &'static str) -> Resp {
    let mut resp = with_type(StatusCode::OK, content_type, full(body));
    let h = resp.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    // The files change with the binary: always ask again.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignInBody {
    email: String,
    password: String,
}

/// The console's view of the signed-in agent.
fn session_json(agent: &Agent, csrf_token: &str) -> serde_json::Value {
    json!({ "agent": agent, "csrf_token": csrf_token })
}

fn no_store(mut resp: Resp) -> Resp {
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Whether the hub is reached over https (directly per its public URL, or
/// through a trusted proxy that says so): the cookie is then `Secure`.
fn over_https(app: &App, req: &Request<Incoming>) -> bool {
    if app.base.starts_with("https://") {
        return true;
    }
    let from_proxy = req
        .extensions()
        .get::<crate::http::Peer>()
        .is_some_and(|p| app.config.server.trusted_proxies.contains(&p.0.ip()));
    from_proxy
        && req
            .headers()
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

fn set_cookie(resp: &mut Resp, value: &str, max_age: Duration, secure: bool) {
    let cookie = format!(
        "{COOKIE_NAME}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        max_age.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    match HeaderValue::from_str(&cookie) {
        Ok(v) => {
            resp.headers_mut().append(SET_COOKIE, v);
        }
        Err(e) => tracing::error!(error = %e, "cannot set the session cookie"),
    }
}

async fn sign_in(app: &App, req: Request<Incoming>) -> Resp {
    // A JSON body cannot come from another site's form without a CORS
    // preflight the hub never grants, so nobody is signed in by a foreign page.
    let is_json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !is_json {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request",
            "send the e-mail and password as application/json",
        );
    }
    let ip = client_ip(&req, &app.config.server.trusted_proxies);
    let secure = over_https(app, &req);
    let body = match read_body(req, &app.config.server).await {
        Ok(b) => b,
        Err(e) => return Problem::body(&e).answer(Dialect::Api),
    };
    let b: SignInBody = match parse_json(&body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("invalid JSON body: {e}"),
            );
        }
    };
    match app
        .sign_ins
        .sign_in(&app.store, &b.email, &b.password, ip)
        .await
    {
        Ok(s) => {
            tracing::info!(agent = s.agent.id, "agent signed in to the console");
            let mut resp = json(StatusCode::OK, &session_json(&s.agent, &s.csrf_token));
            set_cookie(&mut resp, &s.cookie, s.ttl, secure);
            no_store(resp)
        }
        Err(SignInError::Wrong) => {
            tracing::info!(ip = ?ip, "failed console sign-in");
            error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "wrong e-mail or password",
            )
        }
        Err(SignInError::Locked(wait)) => {
            tracing::warn!(ip = ?ip, "console sign-in refused: too many failures");
            let mut resp = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many failed sign-ins, try again later",
            );
            let secs = wait.as_secs().max(1);
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
            resp
        }
        Err(SignInError::Account(e)) => {
            tracing::error!(error = %e, "console sign-in failed");
            Problem::unavailable().answer(Dialect::Api)
        }
    }
}

async fn resume(app: &App, req: &Request<Incoming>) -> Resp {
    let Some(value) = session::cookie(req) else {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "not signed in");
    };
    match app.sign_ins.session(&app.store, value).await {
        Ok(Some((agent, csrf))) => no_store(json(StatusCode::OK, &session_json(&agent, &csrf))),
        Ok(None) => error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the session has ended: sign in again",
        ),
        Err(e) => {
            tracing::error!(error = %e, "cannot check a console session");
            Problem::unavailable().answer(Dialect::Api)
        }
    }
}

async fn sign_out(app: &App, req: &Request<Incoming>) -> Resp {
    match session::agent(app, req).await {
        Ok(Some(_)) => {}
        Ok(None) => return error(StatusCode::UNAUTHORIZED, "unauthorized", "not signed in"),
        Err(resp) => return resp,
    }
    let Some(value) = session::cookie(req) else {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "not signed in");
    };
    if let Err(e) = accounts::sign_out(&app.store, value).await {
        tracing::error!(error = %e, "cannot end a console session");
        return Problem::unavailable().answer(Dialect::Api);
    }
    let mut resp = json(StatusCode::OK, &json!({ "result": "ok" }));
    set_cookie(&mut resp, "", Duration::ZERO, over_https(app, req));
    no_store(resp)
}
