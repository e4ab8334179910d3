//! Creating channels and agents, shared by the CLI, the admin API and the
//! channels declared in `hub.toml`.

use serde::Serialize;

use crate::config::{ChannelConfig, is_http_url};
use crate::ids::{agent_token, random_token, token_hash};
use crate::store::{Agent, Channel, NewAgent, NewChannel, Store, StoreError};

/// Settings key of the installation's random path segment.
const PATH_SECRET_KEY: &str = "channel_path_secret";

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Duplicate(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a channel is created from.
#[derive(Debug, Clone)]
pub struct ChannelSpec {
    pub name: String,
    pub customer_endpoint: String,
    pub chunked: bool,
    pub agents: Vec<String>,
    /// Receiver of the channel's event webhooks, and its signing secret.
    pub webhook_url: Option<String>,
    pub webhook_secret: Option<String>,
}

impl From<&ChannelConfig> for ChannelSpec {
    fn from(c: &ChannelConfig) -> Self {
        ChannelSpec {
            name: c.name.clone(),
            customer_endpoint: c.customer_endpoint.clone(),
            chunked: c.chunked,
            agents: c.agents.clone(),
            webhook_url: c.webhook_url.clone(),
            webhook_secret: c.webhook_secret.clone(),
        }
    }
}

impl ChannelSpec {
    fn validate(&self) -> Result<(), ProvisionError> {
        if self.name.trim().is_empty() {
            return Err(ProvisionError::Invalid("name must not be empty".into()));
        }
        if !is_http_url(&self.customer_endpoint) {
            return Err(ProvisionError::Invalid(format!(
                "customer_endpoint `{}` is not an http(s) URL",
                self.customer_endpoint
            )));
        }
        if let Some(bad) = self.agents.iter().find(|a| !a.contains('@')) {
            return Err(ProvisionError::Invalid(format!(
                "agent `{bad}` is not an e-mail address"
            )));
        }
        validate_webhook(self.webhook_url.as_deref(), self.webhook_secret.as_deref())
    }
}

/// A webhook receiver must be an http(s) URL; a secret, a Standard Webhooks one.
pub fn validate_webhook(url: Option<&str>, secret: Option<&str>) -> Result<(), ProvisionError> {
    if let Some(url) = url
        && !is_http_url(url)
    {
        return Err(ProvisionError::Invalid(format!(
            "webhook_url `{url}` is not an http(s) URL"
        )));
    }
    if let Some(secret) = secret {
        crate::outbound::signing::Secret::parse(secret)
            .map_err(|e| ProvisionError::Invalid(format!("webhook_secret: {e}")))?;
    }
    Ok(())
}

/// A channel as shown to the operator, with the URLs to give the integrator.
#[derive(Debug, Serialize)]
pub struct ChannelView {
    pub id: i64,
    pub public_id: String,
    pub name: String,
    pub customer_endpoint: String,
    pub chunked: bool,
    pub declared: bool,
    pub agents: Vec<String>,
    pub endpoint_url: String,
    pub status_url: String,
    pub created_at: i64,
    pub webhook_url: Option<String>,
    pub webhook_signed: bool,
}

/// The installation's random path segment, created on first use.
pub async fn path_secret(store: &Store) -> Result<String, StoreError> {
    store.setting_or_init(PATH_SECRET_KEY, random_token).await
}

pub fn view(channel: Channel, base: &str, secret: &str) -> ChannelView {
    let endpoint_url = format!("{base}/{secret}/{}", channel.public_id);
    ChannelView {
        status_url: format!("{endpoint_url}/status"),
        endpoint_url,
        id: channel.id,
        public_id: channel.public_id,
        name: channel.name,
        customer_endpoint: channel.customer_endpoint,
        chunked: channel.chunked,
        declared: channel.declared,
        agents: channel.agents,
        created_at: channel.created_at,
        webhook_url: channel.webhook_url,
        webhook_signed: channel.webhook_signed,
    }
}

pub async fn create_channel(
    store: &Store,
    spec: &ChannelSpec,
    declared: bool,
) -> Result<Channel, ProvisionError> {
    spec.validate()?;
    if store.channel_by_name(&spec.name).await?.is_some() {
        return Err(ProvisionError::Duplicate(format!(
            "a channel named `{}` exists already",
            spec.name
        )));
    }
    let public_id = random_token();
    let mut channel = store
        .insert_channel(NewChannel {
            public_id: &public_id,
            name: &spec.name,
            customer_endpoint: &spec.customer_endpoint,
            chunked: spec.chunked,
            declared,
            agents: &spec.agents,
        })
        .await?;
    if spec.webhook_url.is_some() || spec.webhook_secret.is_some() {
        store
            .set_channel_webhook(
                channel.id,
                spec.webhook_url.as_deref(),
                spec.webhook_secret.as_deref(),
            )
            .await?;
        channel.webhook_url = spec.webhook_url.clone();
        channel.webhook_signed = spec.webhook_secret.is_some();
    }
    Ok(channel)
}

/// Creates the channels of `hub.toml` that do not exist yet and updates the others;
/// identifiers of existing channels never change.
pub async fn sync_declared(
    store: &Store,
    declared: &[ChannelConfig],
) -> Result<(), ProvisionError> {
    for c in declared {
        let spec = ChannelSpec::from(c);
        match store.channel_by_name(&c.name).await? {
            Some(existing) => {
                spec.validate()?;
                store
                    .update_declared_channel(
                        existing.id,
                        &c.customer_endpoint,
                        c.chunked,
                        &c.agents,
                    )
                    .await?;
                store
                    .set_channel_webhook(
                        existing.id,
                        c.webhook_url.as_deref(),
                        c.webhook_secret.as_deref(),
                    )
                    .await?;
            }
            None => {
                let ch = create_channel(store, &spec, true).await?;
                tracing::info!(channel = %ch.name, public_id = %ch.public_id, "created declared channel");
            }
        }
    }
    Ok(())
}

/// Creates an agent; the token is returned once and only its hash is kept.
pub async fn create_agent(
    store: &Store,
    name: &str,
    email: &str,
    photo: Option<&str>,
) -> Result<(Agent, String), ProvisionError> {
    if name.trim().is_empty() {
        return Err(ProvisionError::Invalid("name must not be empty".into()));
    }
    if !email.contains('@') {
        return Err(ProvisionError::Invalid(format!(
            "`{email}` is not an e-mail address"
        )));
    }
    if let Some(p) = photo
        && !is_http_url(p)
    {
        return Err(ProvisionError::Invalid(format!(
            "photo `{p}` is not an http(s) URL"
        )));
    }
    let token = agent_token();
    let agent = store
        .insert_agent(NewAgent {
            name,
            email,
            photo,
            token_hash: &token_hash(&token),
        })
        .await?
        .ok_or_else(|| {
            ProvisionError::Duplicate(format!("an agent with e-mail `{email}` exists already"))
        })?;
    Ok((agent, token))
}
