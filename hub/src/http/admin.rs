//! The admin API: provisioning channels, agents and bots with the admin bearer token.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use crate::core::accounts::{self, AccountError};
use crate::core::provisioning::{self, BotSpec, ChannelSpec, ProvisionError};
use crate::http::App;
use crate::http::layer::Admin;
use crate::http::problem::{Dialect, Problem};
use crate::http::respond::{Resp, error, json, method_not_allowed, read_body};
use crate::store::ChannelKind;
use crate::store::OutboxState;
use crate::store::bots::{BotAuth, BotTarget};

/// Routes `/admin/v1/...` once the layer found the admin's credential;
/// `rest` is the path after `v1`.
pub async fn handle(app: &App, req: Request<Incoming>, _admin: &Admin, rest: &[&str]) -> Resp {
    let method = req.method().clone();
    match (method, rest) {
        (Method::GET, ["channels"]) => list_channels(app).await,
        (Method::POST, ["channels"]) => create_channel(app, req).await,
        (Method::GET, ["agents"]) => match app.store.list_agents().await {
            Ok(agents) => json(StatusCode::OK, &json!({ "agents": agents })),
            Err(e) => store_failure(e.into()),
        },
        (Method::POST, ["agents"]) => create_agent(app, req).await,
        (Method::PUT, ["agents", id, "password"]) => set_password(app, req, id).await,
        (Method::PUT, ["channels", id, "agents"]) => set_channel_agents(app, req, id).await,
        (_, ["agents", _, "password"] | ["channels", _, "agents"]) => method_not_allowed(),
        (Method::GET, ["bots"]) => list_bots(app).await,
        (Method::POST, ["bots"]) => create_bot(app, req).await,
        (Method::GET, ["bots", key]) => get_bot(app, key).await,
        (Method::DELETE, ["bots", key]) => delete_bot(app, key).await,
        (_, ["bots"] | ["bots", _]) => method_not_allowed(),
        (Method::GET, ["plugins"]) => list_plugins(app),
        (Method::GET, ["plugins", name, "shadow"]) => shadow_report(app, name),
        (_, ["plugins", _, "shadow"]) => method_not_allowed(),
        (Method::PUT, ["channels", id, "webhook"]) => set_webhook(app, req, id).await,
        (Method::GET, ["deliveries"]) => list_deliveries(app, &req).await,
        // `replay` is a path of its own (POST only), never a delivery id.
        (Method::GET, ["deliveries", id]) if *id != "replay" => get_delivery(app, id).await,
        (Method::POST, ["deliveries", "replay"]) => replay(app, Vec::new()).await,
        (Method::POST, ["deliveries", id, "replay"]) => replay(app, vec![(*id).to_owned()]).await,
        (_, ["deliveries", ..] | ["plugins"] | ["channels", _, "webhook"]) => method_not_allowed(),
        (_, ["channels"] | ["agents"]) => method_not_allowed(),
        _ => error(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
    }
}

fn provision_error(e: ProvisionError) -> Resp {
    match e {
        ProvisionError::Invalid(m) => error(StatusCode::BAD_REQUEST, "invalid_request", m),
        ProvisionError::Duplicate(m) => error(StatusCode::CONFLICT, "conflict", m),
        ProvisionError::Store(_) => store_failure(e),
    }
}

fn store_failure(e: ProvisionError) -> Resp {
    tracing::error!(error = %e, "admin action failed");
    Problem::unavailable().answer(Dialect::Api)
}

async fn body<T: for<'de> Deserialize<'de>>(app: &App, req: Request<Incoming>) -> Result<T, Resp> {
    let bytes = read_body(req, &app.config.server)
        .await
        .map_err(|e| Problem::body(&e).answer(Dialect::Api))?;
    crate::http::respond::parse_json(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("invalid JSON body: {e}"),
        )
    })
}

async fn list_channels(app: &App) -> Resp {
    match app.store.list_channels().await {
        Ok(channels) => {
            let views: Vec<_> = channels
                .into_iter()
                .map(|c| provisioning::view(c, &app.base, &app.path_secret))
                .collect();
            json(StatusCode::OK, &json!({ "channels": views }))
        }
        Err(e) => store_failure(e.into()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewChannelBody {
    name: String,
    #[serde(default)]
    customer_endpoint: String,
    #[serde(default, rename = "type")]
    kind: ChannelKind,
    #[serde(default)]
    widget_id: Option<String>,
    #[serde(default)]
    color: Option<String>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    #[serde(default)]
    calls: Option<crate::config::CallsConfig>,
    #[serde(default)]
    chunked: bool,
    #[serde(default)]
    agents: Vec<String>,
    #[serde(default)]
    webhook_url: Option<String>,
    #[serde(default)]
    webhook_secret: Option<String>,
}

async fn create_channel(app: &App, req: Request<Incoming>) -> Resp {
    let b: NewChannelBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let spec = ChannelSpec {
        name: b.name,
        customer_endpoint: b.customer_endpoint,
        chunked: b.chunked,
        agents: b.agents,
        webhook_url: b.webhook_url,
        webhook_secret: b.webhook_secret,
        kind: b.kind,
        widget_id: b.widget_id,
        color: b.color,
        allowed_origins: b.allowed_origins,
        calls: b.calls,
    };
    let outbound = app.sender.policy();
    match provisioning::create_channel(&app.store, &spec, false, &outbound).await {
        Ok(ch) => json(
            StatusCode::CREATED,
            &provisioning::view(ch, &app.base, &app.path_secret),
        ),
        Err(e) => provision_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewAgentBody {
    name: String,
    email: String,
    #[serde(default)]
    photo: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    admin: bool,
}

async fn create_agent(app: &App, req: Request<Incoming>) -> Resp {
    let b: NewAgentBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let spec = provisioning::AgentSpec {
        name: b.name,
        email: b.email,
        photo: b.photo,
        password: b.password,
        admin: b.admin,
    };
    match provisioning::create_agent(&app.store, &spec).await {
        Ok((agent, token)) => json(
            StatusCode::CREATED,
            &json!({ "id": agent.id, "name": agent.name, "email": agent.email,
                     "photo": agent.photo, "admin": agent.admin, "token": token }),
        ),
        Err(e) => provision_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PasswordBody {
    password: String,
}

/// `PUT /admin/v1/agents/{id}/password`: sets the console password and
/// signs the agent out everywhere.
async fn set_password(app: &App, req: Request<Incoming>, id: &str) -> Resp {
    let Ok(id) = id.parse::<i64>() else {
        return error(StatusCode::NOT_FOUND, "not_found", "no such agent");
    };
    let b: PasswordBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    match accounts::set_password(&app.store, id, &b.password).await {
        Ok(agent) => json(StatusCode::OK, &agent),
        Err(AccountError::NoAgent) => error(StatusCode::NOT_FOUND, "not_found", "no such agent"),
        Err(AccountError::Invalid(m)) => error(StatusCode::BAD_REQUEST, "invalid_request", m),
        Err(e) => {
            tracing::error!(error = %e, "cannot set a password");
            Problem::unavailable().answer(Dialect::Api)
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelAgentsBody {
    agents: Vec<String>,
}

/// `PUT /admin/v1/channels/{id}/agents`: replaces who receives the
/// channel's chats (a channel declared in `hub.toml` gets the file's list
/// back at the next reload).
async fn set_channel_agents(app: &App, req: Request<Incoming>, id: &str) -> Resp {
    let Ok(id) = id.parse::<i64>() else {
        return error(StatusCode::NOT_FOUND, "not_found", "no such channel");
    };
    let b: ChannelAgentsBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    if let Some(bad) = b.agents.iter().find(|e| !e.contains('@')) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("`{bad}` is not an e-mail address"),
        );
    }
    match app.store.set_channel_agents(id, &b.agents).await {
        Ok(true) => match app.store.channel_by_id(id).await {
            Ok(Some(ch)) => json(
                StatusCode::OK,
                &provisioning::view(ch, &app.base, &app.path_secret),
            ),
            Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "no such channel"),
            Err(e) => store_failure(e.into()),
        },
        Ok(false) => error(StatusCode::NOT_FOUND, "not_found", "no such channel"),
        Err(e) => store_failure(e.into()),
    }
}

async fn list_bots(app: &App) -> Resp {
    match app.store.list_bots().await {
        Ok(bots) => {
            let views: Vec<_> = bots
                .iter()
                .map(|b| provisioning::bot_view(b, &app.base))
                .collect();
            json(StatusCode::OK, &json!({ "bots": views }))
        }
        Err(e) => store_failure(e.into()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewBotBody {
    name: String,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    plugin: Option<String>,
    #[serde(default)]
    provider_id: Option<String>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    auth: Option<BotAuthBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BotAuthBody {
    token_url: String,
    client_id: String,
    secret: String,
}

async fn create_bot(app: &App, req: Request<Incoming>) -> Resp {
    let b: NewBotBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let target = match (b.endpoint, b.token, b.plugin) {
        (None, None, Some(plugin)) if b.auth.is_none() => {
            if !app.wiring.current().plugins.contains_key(&plugin) {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("plugin `{plugin}` is not loaded"),
                );
            }
            BotTarget::Plugin(plugin)
        }
        (Some(endpoint), Some(token), None) => BotTarget::Provider {
            endpoint,
            token,
            auth: b.auth.map(|a| BotAuth {
                token_url: a.token_url,
                client_id: a.client_id,
                secret: a.secret,
            }),
        },
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "give either endpoint and token (a provider) or plugin",
            );
        }
    };
    let spec = BotSpec {
        name: b.name,
        provider_id: b.provider_id,
        target,
        channels: b.channels,
    };
    let outbound = app.sender.policy();
    match provisioning::create_bot(&app.store, &spec, false, &outbound).await {
        Ok(bot) => {
            if let Err(e) = app.conversations.bots_changed().await {
                return store_failure(e.into());
            }
            json(
                StatusCode::CREATED,
                &provisioning::bot_view(&bot, &app.base),
            )
        }
        Err(e) => provision_error(e),
    }
}

async fn get_bot(app: &App, key: &str) -> Resp {
    match provisioning::find_bot(&app.store, key).await {
        Ok(Some(bot)) => json(StatusCode::OK, &provisioning::bot_view(&bot, &app.base)),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "no such bot"),
        Err(e) => store_failure(e.into()),
    }
}

async fn delete_bot(app: &App, key: &str) -> Resp {
    let bot = match provisioning::find_bot(&app.store, key).await {
        Ok(Some(bot)) => bot,
        Ok(None) => return error(StatusCode::NOT_FOUND, "not_found", "no such bot"),
        Err(e) => return store_failure(e.into()),
    };
    let deleted = app.store.delete_bot(bot.id).await;
    let reloaded = app.conversations.bots_changed().await;
    match deleted.and(reloaded) {
        Ok(()) => json(
            StatusCode::OK,
            &json!({ "deleted": provisioning::bot_view(&bot, &app.base) }),
        ),
        Err(e) => store_failure(e.into()),
    }
}

/// Loaded plugins with their limits, grants and counters.
fn list_plugins(app: &App) -> Resp {
    let wiring = app.wiring.current();
    let counters = app.runtime.counters().snapshot();
    let mut plugins: Vec<_> = wiring
        .plugins
        .values()
        .map(|p| {
            let limits = p.limits();
            json!({
                "name": p.name(),
                "sha256": p.digest(),
                "timeout_ms": limits.timeout.as_millis() as u64,
                "memory_mb": limits.memory_bytes >> 20,
                "max_output_bytes": limits.max_output_bytes,
                "max_host_calls": limits.max_host_calls,
                "max_forwards": limits.max_forwards,
                "max_concurrency": limits.max_concurrency,
                "time_share": limits.time_share,
                "kv": p.kv_enabled(),
                "counters": counters.get(p.name()),
            })
        })
        .collect();
    plugins.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let routes: Vec<_> = wiring
        .routes
        .iter()
        .map(|r| {
            json!({
                "events": r.events,
                "channels": r.channels,
                "plugins": r.plugins.iter().map(|p| p.name()).collect::<Vec<_>>(),
                "missing": r.missing,
                "shadow": r.shadows.iter().map(|s| s.plugin.name()).collect::<Vec<_>>(),
                "on_error": match r.on_error {
                    crate::config::OnError::Skip => "skip",
                    crate::config::OnError::Reject => "reject",
                },
            })
        })
        .collect();
    let unavailable: Vec<_> = wiring
        .unavailable
        .iter()
        .map(|(name, error)| json!({ "name": name, "error": error }))
        .collect();
    json(
        StatusCode::OK,
        &json!({ "plugins": plugins, "routes": routes, "unavailable": unavailable }),
    )
}

/// A shadow plugin's counts and latest differing events; 404 for a name
/// that is no shadow of the wiring in force and has nothing recorded.
fn shadow_report(app: &App, name: &str) -> Resp {
    let report = app.wiring.shadows().report(name);
    let is_shadow = app
        .wiring
        .current()
        .routes
        .iter()
        .any(|r| r.shadows.iter().any(|s| s.plugin.name() == name));
    let seen = report["counts"]
        .as_object()
        .is_some_and(|c| c.values().any(|n| n.as_u64().unwrap_or(0) > 0));
    if !is_shadow && !seen {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no route shadows a plugin of this name",
        );
    }
    json(StatusCode::OK, &report)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookBody {
    /// `null` removes the receiver.
    url: Option<String>,
    #[serde(default)]
    secret: Option<String>,
    /// Makes a new signing secret and answers it (once).
    #[serde(default)]
    generate_secret: bool,
}

/// `PUT /admin/v1/channels/{id or public_id}/webhook`: where the channel's event webhooks go.
async fn set_webhook(app: &App, req: Request<Incoming>, id: &str) -> Resp {
    let b: WebhookBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let channel = match id.parse::<i64>() {
        Ok(n) => app.store.channel_by_id(n).await,
        Err(_) => app.store.channel_by_public_id(id).await,
    };
    let channel = match channel {
        Ok(Some(c)) => c,
        Ok(None) => return error(StatusCode::NOT_FOUND, "not_found", "no such channel"),
        Err(e) => return store_failure(e.into()),
    };
    let secret = if b.generate_secret {
        Some(crate::outbound::signing::Secret::generate())
    } else {
        b.secret
    };
    let outbound = app.sender.policy();
    if let Err(e) =
        provisioning::validate_webhook(b.url.as_deref(), secret.as_deref(), &outbound).await
    {
        return provision_error(e);
    }
    match app
        .store
        .set_channel_webhook(channel.id, b.url.as_deref(), secret.as_deref())
        .await
    {
        Ok(()) => json(
            StatusCode::OK,
            &json!({ "channel": channel.public_id, "url": b.url,
                     "signed": secret.is_some(),
                     "secret": if b.generate_secret { secret } else { None } }),
        ),
        Err(e) => store_failure(e.into()),
    }
}

/// `GET /admin/v1/deliveries?state=dead|failed|pending|delivered|dropped&limit=N`.
async fn list_deliveries(app: &App, req: &Request<Incoming>) -> Resp {
    let mut state = OutboxState::Failed;
    let mut limit = 100;
    for pair in req.uri().query().unwrap_or_default().split('&') {
        match pair.split_once('=') {
            Some(("state", "dead")) => state = OutboxState::Failed,
            Some(("state", s)) => match OutboxState::parse(s) {
                Some(s) => state = s,
                None => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_request",
                        format!("state `{s}` is none of dead, failed, pending, delivered, dropped"),
                    );
                }
            },
            Some(("limit", n)) => match n.parse::<i64>() {
                Ok(n) if (1..=1000).contains(&n) => limit = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "invalid_request",
                        "limit is a number from 1 to 1000",
                    );
                }
            },
            _ => {}
        }
    }
    match app.store.list_deliveries(state, limit).await {
        Ok(list) => json(StatusCode::OK, &json!({ "deliveries": list })),
        Err(e) => store_failure(e.into()),
    }
}

/// `GET /admin/v1/deliveries/{id}`: one delivery in any state, with its notes.
async fn get_delivery(app: &App, id: &str) -> Resp {
    match app.store.delivery(id).await {
        Ok(Some(delivery)) => json(StatusCode::OK, &delivery),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no delivery has this id",
        ),
        Err(e) => store_failure(e.into()),
    }
}

/// Puts dead letters (one, or all failed webhooks) back in the queue.
async fn replay(app: &App, ids: Vec<String>) -> Resp {
    let one = !ids.is_empty();
    match app.store.replay_dead(&ids, crate::clock::now_ms()).await {
        Ok(replayed) if one && replayed.is_empty() => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no failed delivery has this id",
        ),
        Ok(replayed) => {
            app.kick.kick();
            json(StatusCode::OK, &json!({ "replayed": replayed }))
        }
        Err(e) => store_failure(e.into()),
    }
}
