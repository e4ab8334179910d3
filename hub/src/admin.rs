//! The admin API: provisioning channels and agents with the admin bearer token.

use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use crate::app::App;
use crate::ids::constant_time_eq;
use crate::provisioning::{self, ChannelSpec, ProvisionError};
use crate::web::{Resp, bearer, error, json, method_not_allowed, read_body};

/// Routes `/admin/v1/...`; `rest` is the path after `v1`.
pub async fn handle(app: &App, req: Request<Incoming>, rest: &[&str]) -> Resp {
    let Some(expected) = app.admin_token.as_deref() else {
        return error(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "the admin API is off: set admin.token in hub.toml or HUB_ADMIN_TOKEN",
        );
    };
    match bearer(&req) {
        Some(t) if constant_time_eq(t.as_bytes(), expected.as_bytes()) => {}
        _ => {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "admin bearer token required",
            );
        }
    }
    let method = req.method().clone();
    match (method, rest) {
        (Method::GET, ["channels"]) => list_channels(app).await,
        (Method::POST, ["channels"]) => create_channel(app, req).await,
        (Method::GET, ["agents"]) => match app.store.list_agents().await {
            Ok(agents) => json(StatusCode::OK, &json!({ "agents": agents })),
            Err(e) => store_failure(e.into()),
        },
        (Method::POST, ["agents"]) => create_agent(app, req).await,
        (Method::GET, ["plugins"]) => list_plugins(app),
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
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "temporarily unavailable, retry",
    )
}

async fn body<T: for<'de> Deserialize<'de>>(app: &App, req: Request<Incoming>) -> Result<T, Resp> {
    let bytes = read_body(req, app.config.server.max_body_bytes)
        .await
        .map_err(|e| error(e.status(), "invalid_request", e.reason()))?;
    serde_json::from_slice(&bytes).map_err(|e| {
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
    customer_endpoint: String,
    #[serde(default)]
    chunked: bool,
    #[serde(default)]
    agents: Vec<String>,
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
    };
    match provisioning::create_channel(&app.store, &spec, false).await {
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
}

async fn create_agent(app: &App, req: Request<Incoming>) -> Resp {
    let b: NewAgentBody = match body(app, req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    match provisioning::create_agent(&app.store, &b.name, &b.email, b.photo.as_deref()).await {
        Ok((agent, token)) => json(
            StatusCode::CREATED,
            &json!({ "id": agent.id, "name": agent.name, "email": agent.email,
                     "photo": agent.photo, "token": token }),
        ),
        Err(e) => provision_error(e),
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
                "on_error": match r.on_error {
                    crate::config::OnError::Skip => "skip",
                    crate::config::OnError::Reject => "reject",
                },
            })
        })
        .collect();
    json(
        StatusCode::OK,
        &json!({ "plugins": plugins, "routes": routes }),
    )
}
