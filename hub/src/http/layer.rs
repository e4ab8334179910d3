//! The layer every request passes before its edge's handler, as middleware
//! does: the credential the edge declares (the channel path's secret, an
//! agent's token or console session, the admin token, a bot's provider
//! token, a widget visitor's token and the page's origin) and the rate
//! limits that apply, in an order that tells a guesser nothing. `route`
//! runs it and hands the handler what it established (a [`Channel`], an
//! [`Agent`], [`Admin`], a bot, a [`Visitor`]), so a handler holds only its
//! interface's steps. Nothing else of `http/` uses [`crate::http::limits`]
//! but the connection cap (`tests/layout.rs` checks this).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{AUTHORIZATION, ORIGIN};
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;

use crate::http::limits::{self, Door};
use crate::http::problem::{Dialect, Problem, retry_after, widget_fail};
use crate::http::respond::{Resp, bearer, error, query_pairs, text};
use crate::http::{App, client_ip, session};
use crate::ids::{constant_time_eq, token_hash};
use crate::store::{Agent, Bot, Channel, Client};

/// The source address a request counts against, as the limits see it.
fn source<B>(app: &App, req: &Request<B>) -> IpAddr {
    limits::source(client_ip(req, &app.config.server.trusted_proxies))
}

/// What the channel edge answers when the path names no channel.
pub const NO_CHANNEL: &str = "no channel at this address";

/// `/<random_string>/<public_id>[/status]`: the installation's path secret,
/// then the channel, then the channel's rate. Failed secrets are counted per
/// source and checked before the comparison, so that guessing gets no
/// answer at all.
pub async fn channel<B>(
    app: &App,
    req: &Request<B>,
    secret: &str,
    public_id: &str,
) -> Result<Channel, Resp> {
    let source = source(app, req);
    if let Some(wait) = app.limits.auth_blocked(Door::Channel, source) {
        return Err(
            Problem::too_many("too many requests to wrong addresses from this source")
                .answer_after(Dialect::Channel, wait),
        );
    }
    if !constant_time_eq(secret.as_bytes(), app.path_secret.as_bytes()) {
        app.limits.auth_failed(Door::Channel, source);
        return Err(text(StatusCode::NOT_FOUND, NO_CHANNEL));
    }
    let channel = match app.store.channel_by_public_id(public_id).await {
        Ok(Some(ch)) => ch,
        Ok(None) => return Err(text(StatusCode::NOT_FOUND, NO_CHANNEL)),
        Err(e) => {
            tracing::error!(error = %e, "channel lookup failed");
            return Err(Problem::unavailable().answer(Dialect::Channel));
        }
    };
    if let Err(wait) = app.limits.channel(channel.id, source) {
        return Err(
            Problem::too_many("too many requests to this channel; slow down")
                .answer_after(Dialect::Channel, wait),
        );
    }
    Ok(channel)
}

/// 429 while `source` is waiting out its failed bearer tokens: checked
/// before the token. Session cookies are not counted: they are too long to
/// guess, and an expired one is no attack.
fn bearer_blocked(app: &App, source: IpAddr) -> Option<Resp> {
    app.limits.auth_blocked(Door::Api, source).map(|wait| {
        Problem::too_many("too many requests with a wrong token from this address; retry later")
            .answer_after(Dialect::Api, wait)
    })
}

/// `/agent/v1/…`: an agent's bearer token, or else the console's session
/// cookie (with its CSRF token on state-changing requests).
pub async fn agent<B>(app: &App, req: &Request<B>) -> Result<Agent, Resp> {
    let Some(token) = bearer(req) else {
        return match session::agent(app, req).await? {
            Some(agent) => Ok(agent),
            None => Err(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a bearer token is required",
            )),
        };
    };
    let source = source(app, req);
    if let Some(blocked) = bearer_blocked(app, source) {
        return Err(blocked);
    }
    match app.store.agent_by_token_hash(&token_hash(token)).await {
        Ok(Some(agent)) => Ok(agent),
        Ok(None) => {
            app.limits.auth_failed(Door::Api, source);
            Err(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "unknown token",
            ))
        }
        Err(e) => {
            tracing::error!(error = %e, "agent authentication failed");
            Err(Problem::unavailable().answer(Dialect::Api))
        }
    }
}

/// Proof that the request carries the admin token, or the console session
/// of an admin agent: only [`admin`] makes one, and the admin API's handler
/// takes it.
#[derive(Debug)]
pub struct Admin(());

/// `/admin/v1/…` (and `/metrics` with `access = "admin"`): the admin
/// token, or the console session of an admin agent (whose state-changing
/// requests carry the CSRF token).
pub async fn admin<B>(app: &App, req: &Request<B>) -> Result<Admin, Resp> {
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
        let source = source(app, req);
        if let Some(blocked) = bearer_blocked(app, source) {
            return Err(blocked);
        }
        return match app.admin_token.as_deref() {
            Some(expected) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
                Ok(Admin(()))
            }
            Some(_) => {
                app.limits.auth_failed(Door::Api, source);
                Err(unauthorized())
            }
            None => Err(disabled()),
        };
    }
    match session::agent(app, req).await? {
        Some(agent) if agent.admin => Ok(Admin(())),
        Some(_) => Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this agent is not an administrator",
        )),
        None if app.admin_token.is_none() => Err(disabled()),
        None => Err(unauthorized()),
    }
}

/// `/metrics`: open, or the admin's per `[metrics] access`.
pub async fn metrics<B>(app: &App, req: &Request<B>) -> Result<(), Resp> {
    if app.config.metrics.access == crate::config::MetricsAccess::Admin {
        admin(app, req).await?;
    }
    Ok(())
}

/// Which of the two URLs a bot's provider used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BotDoor {
    /// `/webhooks/…`: the token in the path is the credential.
    Webhooks,
    /// `/providers/…`: a bot with `auth` also requires its bearer token back.
    Providers,
}

/// Why the layer turned a provider's request away; the bot exchange edge
/// answers it in the spec's words.
#[derive(Debug)]
pub enum BotDenied {
    /// The path is not `/<provider_id>/<token>`.
    Malformed,
    /// No bot takes requests at this provider id.
    Unknown,
    /// Too many wrong tokens from this source: wait this long.
    Blocked(Duration),
    /// The token in the path is not the bot's.
    WrongToken,
    /// The bot's requests from this source are over its rate.
    OverRate(Duration),
    /// Not a POST.
    NotPost,
    /// `/providers/…` without the bot's access token in `Authorization`.
    WrongAuthorization,
}

/// A refusal and the bot it concerns (its name, or the provider id the
/// path gave), for the edge's log line.
#[derive(Debug)]
pub struct BotDenial {
    pub bot: String,
    pub why: BotDenied,
}

/// `/webhooks/<provider_id>/<token>` and `/providers/…`: the bot, its token
/// (failures counted per source and provider id, checked before the
/// comparison), the bot's rate (only its own requests count, so nobody
/// else can use it up), POST only, and on `/providers/…` the access token.
pub async fn bot<B>(
    app: &App,
    req: &Request<B>,
    door: BotDoor,
    rest: &[&str],
) -> Result<Arc<Bot>, BotDenial> {
    let deny = |bot: &str, why| BotDenial {
        bot: bot.to_owned(),
        why,
    };
    let [provider_id, token] = rest else {
        return Err(deny(
            rest.first().copied().unwrap_or("-"),
            BotDenied::Malformed,
        ));
    };
    let directory = app.conversations.bots();
    let Some(bot) = directory.by_provider_id(provider_id).cloned() else {
        return Err(deny(provider_id, BotDenied::Unknown));
    };
    let deny = |why| deny(&bot.name, why);
    // Plugin bots take no requests: their URLs do not exist.
    let Some(expected) = bot.token() else {
        return Err(deny(BotDenied::Unknown));
    };
    let source = source(app, req);
    let guarded = Door::Bot(provider_id);
    if let Some(wait) = app.limits.auth_blocked(guarded, source) {
        return Err(deny(BotDenied::Blocked(wait)));
    }
    if !constant_time_eq(token.as_bytes(), expected.as_bytes()) {
        app.limits.auth_failed(guarded, source);
        return Err(deny(BotDenied::WrongToken));
    }
    if let Err(wait) = app.limits.bot(provider_id, source) {
        return Err(deny(BotDenied::OverRate(wait)));
    }
    if req.method() != Method::POST {
        return Err(deny(BotDenied::NotPost));
    }
    if door == BotDoor::Providers {
        let header = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !app.conversations.provider_authorized(&bot, header).await {
            app.limits.auth_failed(guarded, source);
            return Err(deny(BotDenied::WrongAuthorization));
        }
    }
    Ok(bot)
}

/// Whether a widget endpoint needs the visitor's token, as the widget edge
/// declares it per channel, method and endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisitorNeed {
    /// Not asked for.
    None,
    /// Looked up when sent; a missing or unknown one is no refusal.
    Optional,
    /// Required: 401 without a valid one.
    Required,
    /// Required, and the request is a visitor's message, counted per visitor.
    Messaging,
}

/// What the layer established for a widget request.
pub struct Visitor<'p> {
    pub channel: Channel,
    /// The visitor, when the endpoint asked for one and the token named one.
    pub client: Option<Client>,
    /// The path after the widget id.
    pub endpoint: &'p [&'p str],
    /// The page's origin, which the answer is made readable to.
    origin: Option<String>,
}

impl Visitor<'_> {
    /// The handler's answer, readable by the page.
    pub fn answer(&self, resp: Resp) -> Resp {
        with_cors(resp, self.origin.as_deref())
    }
}

/// `/widget/v1/<widget_id>/…`: the channel, the page's origin against the
/// channel's `allowed_origins`, the source address's rates (requests, and
/// sessions on `session`), the CORS preflight, then the visitor's token
/// where `need` asks for it and the visitor's message rate. Every answer
/// from here on carries CORS headers ([`Visitor::answer`] for the handler's).
pub async fn widget<'p>(
    app: &App,
    req: &Request<Incoming>,
    rest: &'p [&'p str],
    need: fn(&Channel, &Method, &[&str]) -> VisitorNeed,
) -> Result<Visitor<'p>, Resp> {
    let [widget_id, endpoint @ ..] = rest else {
        return Err(widget_fail(StatusCode::NOT_FOUND, "no such endpoint"));
    };
    let channel = match app.store.channel_by_public_id(widget_id).await {
        Ok(Some(c)) => c,
        Ok(None) => return Err(widget_fail(StatusCode::NOT_FOUND, "no such widget")),
        Err(e) => {
            tracing::error!(error = %e, "widget lookup failed");
            return Err(Problem::unavailable().answer(Dialect::Widget));
        }
    };
    let origin = req
        .headers()
        .get(ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The preflight passes for every site, so that the refusal itself is
    // what a foreign page's widget reads.
    if let Some(o) = &origin
        && *req.method() != Method::OPTIONS
        && !channel.allowed_origins.is_empty()
        && !channel.allowed_origins.iter().any(|a| a == o)
    {
        // Readable by the page, so its widget stops asking instead of
        // taking the refusal for a network failure.
        let refused = widget_fail(StatusCode::FORBIDDEN, "this site may not use the widget");
        return Err(with_cors(refused, Some(o)));
    }
    let ip = client_ip(req, &app.config.server.trusted_proxies)
        .map(|a| a.to_string())
        .unwrap_or_default();
    let limits = &app.widget_limits;
    let over = limits.requests_per_ip.take(&ip).and_then(|()| {
        if endpoint == ["session"] {
            limits.sessions_per_ip.take(&ip)
        } else {
            Ok(())
        }
    });
    if let Err(wait) = over {
        let resp = slow_down("too many requests; slow down", wait);
        return Err(with_cors(resp, origin.as_deref()));
    }
    if *req.method() == Method::OPTIONS {
        return Err(with_cors(preflight(), origin.as_deref()));
    }
    let mut admitted = Visitor {
        channel,
        client: None,
        endpoint,
        origin,
    };
    let need = need(&admitted.channel, req.method(), endpoint);
    match need {
        VisitorNeed::None => {}
        VisitorNeed::Optional => {
            admitted.client = visitor(app, req, &admitted.channel).await.ok();
        }
        VisitorNeed::Required | VisitorNeed::Messaging => {
            match visitor(app, req, &admitted.channel).await {
                Ok(client) => admitted.client = Some(client),
                Err(resp) => return Err(admitted.answer(resp)),
            }
        }
    }
    if need == VisitorNeed::Messaging
        && let Some(client) = &admitted.client
        && let Err(wait) = limits
            .messages_per_visitor
            .take(&format!("{}:{}", admitted.channel.id, client.id))
    {
        return Err(admitted.answer(slow_down("too many messages; slow down", wait)));
    }
    Ok(admitted)
}

/// The answer a widget request without a valid visitor token gets.
pub fn no_visitor() -> Resp {
    widget_fail(StatusCode::UNAUTHORIZED, "no valid visitor token")
}

/// The visitor a request's token names: `Authorization: Bearer`, or
/// `?token=` where a browser cannot set headers (`EventSource`).
async fn visitor(app: &App, req: &Request<Incoming>, channel: &Channel) -> Result<Client, Resp> {
    let token = bearer(req)
        .map(str::to_owned)
        .or_else(|| query_pairs(req.uri().query()?).find_map(|(k, v)| (k == "token").then_some(v)));
    let Some(key) = token.and_then(|t| app.visitor_keys.verify(&channel.public_id, &t)) else {
        return Err(no_visitor());
    };
    match app.store.visitor(channel.id, &key).await {
        Ok(Some(client)) => Ok(client),
        Ok(None) => Err(no_visitor()),
        Err(e) => {
            tracing::error!(error = %e, "visitor lookup failed");
            Err(Problem::unavailable().answer(Dialect::Widget))
        }
    }
}

/// 429 with `Retry-After`: the page's script (or a well-behaved client)
/// waits as told instead of guessing.
fn slow_down(reason: &str, wait: Duration) -> Resp {
    retry_after(widget_fail(StatusCode::TOO_MANY_REQUESTS, reason), wait)
}

fn preflight() -> Resp {
    use http::HeaderValue;
    use http::header::{
        ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_MAX_AGE,
    };
    let mut resp = crate::http::respond::with_type(
        StatusCode::NO_CONTENT,
        "text/plain",
        crate::http::respond::full(bytes::Bytes::new()),
    );
    let h = resp.headers_mut();
    h.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type"),
    );
    h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    resp
}

/// Lets the page's origin read the answer (the origin was checked already).
fn with_cors(mut resp: Resp, origin: Option<&str>) -> Resp {
    use http::HeaderValue;
    use http::header::{ACCESS_CONTROL_ALLOW_ORIGIN, VARY};
    let value = origin
        .and_then(|o| HeaderValue::from_str(o).ok())
        .unwrap_or_else(|| HeaderValue::from_static("*"));
    let h = resp.headers_mut();
    h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, value);
    h.insert(VARY, HeaderValue::from_static("Origin"));
    resp
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

    /// The layer compares the secrets a client sends with the constant-time
    /// helper, never with `==`, which stops at the first difference and so
    /// tells a guesser how much of its guess was right.
    #[test]
    fn the_layer_compares_secrets_in_constant_time() {
        let code = include_str!("layer.rs")
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default();
        assert!(code.contains("constant_time_eq("));
        for secret in ["path_secret", "expected"] {
            for line in code.lines().filter(|l| l.contains(secret)) {
                assert!(
                    !line.contains("==") && !line.contains("!="),
                    "a secret compared with ==: {line}"
                );
            }
        }
    }
}
