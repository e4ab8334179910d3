//! Creating channels, agents and bots, shared by the CLI, the admin API and the
//! channels declared in `hub.toml`. A URL the hub will send to is held to the
//! outbound policy when it is registered: refused with the reason when the
//! policy would refuse it (its host name resolved, briefly, to tell).

use std::time::Duration;

use serde::Serialize;

use crate::config::{BotConfig, ChannelConfig, is_http_url, is_provider_id, is_token};
use crate::core::accounts::{self, AccountError};
use crate::ids::{agent_token, random_token, token_hash};
use crate::outbound::Policy;
use crate::store::bots::{BotAuth, BotTarget};
use crate::store::{
    Agent, Bot, Channel, ChannelKind, NewAgent, NewBot, NewChannel, Store, StoreError,
};

/// Settings key of the installation's random path segment.
const PATH_SECRET_KEY: &str = "channel_path_secret";

/// Longest wait for a registered URL's host name to resolve; one that takes
/// longer is registered (and checked whenever the hub connects).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuses `url` (the value of `key`) when the outbound policy would.
async fn check_target(outbound: &Policy, key: &str, url: &str) -> Result<(), ProvisionError> {
    outbound
        .check_url_resolving(url, LOOKUP_TIMEOUT)
        .await
        .map_err(|refused| ProvisionError::Invalid(format!("{key}: {refused}")))
}

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
#[derive(Debug, Clone, Default)]
pub struct ChannelSpec {
    pub name: String,
    /// The integrator's endpoint (custom channels; empty for a widget).
    pub customer_endpoint: String,
    pub chunked: bool,
    pub agents: Vec<String>,
    /// Receiver of the channel's event webhooks, and its signing secret.
    pub webhook_url: Option<String>,
    pub webhook_secret: Option<String>,
    pub kind: ChannelKind,
    /// A widget's id (its `public_id`), kept by an operator moving from
    /// another service; random when not given.
    pub widget_id: Option<String>,
    pub color: Option<String>,
    pub allowed_origins: Vec<String>,
    /// A widget's callback calls; `None`: off.
    pub calls: Option<crate::config::CallsConfig>,
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
            kind: match c.kind {
                crate::config::ChannelType::Custom => ChannelKind::Custom,
                crate::config::ChannelType::Widget => ChannelKind::Widget,
            },
            widget_id: c.widget_id.clone(),
            color: c.color.clone(),
            allowed_origins: c.allowed_origins.clone(),
            calls: c.calls.clone(),
        }
    }
}

impl ChannelSpec {
    fn new_channel<'a>(&'a self, public_id: &'a str, declared: bool) -> NewChannel<'a> {
        NewChannel {
            public_id,
            name: &self.name,
            customer_endpoint: &self.customer_endpoint,
            chunked: self.chunked,
            declared,
            agents: &self.agents,
            kind: self.kind,
            color: self.color.as_deref(),
            allowed_origins: &self.allowed_origins,
            calls: self
                .calls
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok()),
        }
    }

    fn validate(&self) -> Result<(), ProvisionError> {
        if self.name.trim().is_empty() {
            return Err(ProvisionError::Invalid("name must not be empty".into()));
        }
        let widget = self.kind == ChannelKind::Widget;
        if let Err(problem) = crate::config::check_widget_settings(
            widget,
            self.widget_id.as_deref(),
            self.color.as_deref(),
            &self.allowed_origins,
        ) {
            return Err(ProvisionError::Invalid(problem.join("; ")));
        }
        if let Some(calls) = &self.calls {
            let mut problems = calls.problems();
            if !widget {
                problems.push("calls: only a channel of type `widget` has one".to_owned());
            }
            if !problems.is_empty() {
                return Err(ProvisionError::Invalid(problems.join("; ")));
            }
        }
        if !crate::config::customer_endpoint_ok(widget, &self.customer_endpoint) {
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
        check_webhook(self.webhook_url.as_deref(), self.webhook_secret.as_deref())
    }

    /// [`ChannelSpec::validate`], then the URLs against the outbound policy.
    async fn check(&self, outbound: &Policy) -> Result<(), ProvisionError> {
        self.validate()?;
        if !self.customer_endpoint.is_empty() {
            check_target(outbound, "customer_endpoint", &self.customer_endpoint).await?;
        }
        if let Some(url) = &self.webhook_url {
            check_target(outbound, "webhook_url", url).await?;
        }
        Ok(())
    }
}

/// A webhook receiver must be an http(s) URL the outbound policy allows; a
/// secret, a Standard Webhooks one.
pub async fn validate_webhook(
    url: Option<&str>,
    secret: Option<&str>,
    outbound: &Policy,
) -> Result<(), ProvisionError> {
    check_webhook(url, secret)?;
    if let Some(url) = url {
        check_target(outbound, "webhook_url", url).await?;
    }
    Ok(())
}

/// What [`validate_webhook`] checks without the policy.
fn check_webhook(url: Option<&str>, secret: Option<&str>) -> Result<(), ProvisionError> {
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
    #[serde(rename = "type")]
    pub kind: ChannelKind,
    /// Widget channels: the id pages embed, the script and demo URLs, the
    /// colour and the origins allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub widget: Option<WidgetView>,
}

#[derive(Debug, Serialize)]
pub struct WidgetView {
    pub widget_id: String,
    pub script_url: String,
    /// What a site pastes into its pages.
    pub embed: String,
    pub demo_url: String,
    pub color: String,
    pub allowed_origins: Vec<String>,
    /// Callback calls; absent: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls: Option<serde_json::Value>,
}

/// A widget's colour when none is set.
pub const DEFAULT_WIDGET_COLOR: &str = "#1e88e5";

/// The installation's random path segment, created on first use.
pub async fn path_secret(store: &Store) -> Result<String, StoreError> {
    store.setting_or_init(PATH_SECRET_KEY, random_token).await
}

pub fn view(channel: Channel, base: &str, secret: &str) -> ChannelView {
    let endpoint_url = format!("{base}/{secret}/{}", channel.public_id);
    let widget = channel.is_widget().then(|| {
        let script_url = format!("{base}/widget/{}", channel.public_id);
        let host_relative = script_url
            .split_once("://")
            .map_or(script_url.as_str(), |(_, rest)| rest);
        WidgetView {
            widget_id: channel.public_id.clone(),
            embed: format!("<script src=\"//{host_relative}\" async></script>"),
            demo_url: format!("{base}/demo/{}", channel.public_id),
            script_url,
            color: channel
                .color
                .clone()
                .unwrap_or_else(|| DEFAULT_WIDGET_COLOR.to_owned()),
            allowed_origins: channel.allowed_origins.clone(),
            calls: channel.calls.clone(),
        }
    });
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
        kind: channel.kind,
        widget,
    }
}

pub async fn create_channel(
    store: &Store,
    spec: &ChannelSpec,
    declared: bool,
    outbound: &Policy,
) -> Result<Channel, ProvisionError> {
    spec.check(outbound).await?;
    if store.channel_by_name(&spec.name).await?.is_some() {
        return Err(ProvisionError::Duplicate(format!(
            "a channel named `{}` exists already",
            spec.name
        )));
    }
    let public_id = spec.widget_id.clone().unwrap_or_else(random_token);
    if store.channel_by_public_id(&public_id).await?.is_some() {
        return Err(ProvisionError::Duplicate(format!(
            "widget id `{public_id}` is taken"
        )));
    }
    let mut channel = store
        .insert_channel(spec.new_channel(&public_id, declared))
        .await?
        .ok_or_else(|| {
            ProvisionError::Duplicate(format!(
                "a channel named `{}` or with widget id `{public_id}` exists already",
                spec.name
            ))
        })?;
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
    outbound: &Policy,
) -> Result<(), ProvisionError> {
    for c in declared {
        let spec = ChannelSpec::from(c);
        // Instances starting together on one database apply the same file
        // at once: a channel another one created between this one's look
        // and its insert is then updated like any existing one, never an error.
        let mut raced = false;
        loop {
            match store.channel_by_name(&c.name).await? {
                Some(existing) => {
                    spec.check(outbound).await?;
                    store
                        .update_declared_channel(
                            existing.id,
                            &spec.new_channel(&existing.public_id, true),
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
                None => match create_channel(store, &spec, true, outbound).await {
                    Ok(ch) => {
                        tracing::info!(channel = %ch.name, public_id = %ch.public_id, "created declared channel");
                    }
                    Err(ProvisionError::Duplicate(_)) if !raced => {
                        raced = true;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            }
            break;
        }
    }
    Ok(())
}

/// What an agent is created from (the admin API, the CLI).
#[derive(Debug, Clone, Default)]
pub struct AgentSpec {
    pub name: String,
    pub email: String,
    pub photo: Option<String>,
    /// For the console; without one the agent has only its bearer token.
    pub password: Option<String>,
    /// May use the admin API from the console.
    pub admin: bool,
}

/// Creates an agent; the token is returned once and only its hash is kept.
pub async fn create_agent(
    store: &Store,
    spec: &AgentSpec,
) -> Result<(Agent, String), ProvisionError> {
    let AgentSpec {
        name,
        email,
        photo,
        password,
        admin,
    } = spec;
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
    let password_hash = match password {
        Some(p) => Some(accounts::hash_password(p).await.map_err(|e| match e {
            AccountError::Store(e) => ProvisionError::Store(e),
            other => ProvisionError::Invalid(other.to_string()),
        })?),
        None => None,
    };
    let token = agent_token();
    let agent = store
        .insert_agent(NewAgent {
            name,
            email,
            photo: photo.as_deref(),
            token_hash: &token_hash(&token),
            password_hash: password_hash.as_deref(),
            admin: *admin,
        })
        .await?
        .ok_or_else(|| {
            ProvisionError::Duplicate(format!("an agent with e-mail `{email}` exists already"))
        })?;
    Ok((agent, token))
}

/// What a bot is created from (the admin API, the CLI, `hub.toml`).
#[derive(Debug, Clone)]
pub struct BotSpec {
    pub name: String,
    /// Random when not given.
    pub provider_id: Option<String>,
    pub target: BotTarget,
    pub channels: Vec<String>,
}

impl BotSpec {
    /// A bot of `hub.toml` (checked there already).
    pub fn from_config(c: &BotConfig) -> Result<BotSpec, ProvisionError> {
        let target = match (&c.endpoint, &c.token, &c.plugin) {
            (_, _, Some(plugin)) => BotTarget::Plugin(plugin.clone()),
            (Some(endpoint), Some(token), None) => BotTarget::Provider {
                endpoint: endpoint.clone(),
                token: token.clone(),
                auth: c.auth.as_ref().map(|a| BotAuth {
                    token_url: a.token_url.clone(),
                    client_id: a.client_id.clone(),
                    secret: a.secret.clone(),
                }),
            },
            _ => {
                return Err(ProvisionError::Invalid(format!(
                    "bot `{}`: give either endpoint and token or plugin",
                    c.name
                )));
            }
        };
        Ok(BotSpec {
            name: c.name.clone(),
            provider_id: c.provider_id.clone(),
            target,
            channels: c.channels.clone(),
        })
    }

    fn validate(&self) -> Result<(), ProvisionError> {
        let invalid = |m: String| Err(ProvisionError::Invalid(m));
        if self.name.trim().is_empty() {
            return invalid("name must not be empty".into());
        }
        if let Some(id) = &self.provider_id
            && !is_provider_id(id)
        {
            return invalid(format!(
                "provider_id `{id}` must be letters, digits, `-` or `_`"
            ));
        }
        if let Some(bad) = self.channels.iter().find(|c| c.trim().is_empty()) {
            return invalid(format!("channel name `{bad}` is empty"));
        }
        match &self.target {
            BotTarget::Provider {
                endpoint,
                token,
                auth,
            } => {
                if !is_http_url(endpoint) {
                    return invalid(format!("endpoint `{endpoint}` is not an http(s) URL"));
                }
                if !is_token(token) {
                    return invalid(
                        "token must be letters, digits, `-`, `_`, `.` or `~` (a path segment)"
                            .into(),
                    );
                }
                if let Some(a) = auth {
                    if !is_http_url(&a.token_url) {
                        return invalid(format!(
                            "auth.token_url `{}` is not an http(s) URL",
                            a.token_url
                        ));
                    }
                    if a.client_id.is_empty() || a.secret.is_empty() {
                        return invalid("auth needs client_id and secret".into());
                    }
                }
            }
            BotTarget::Plugin(name) if name.trim().is_empty() => {
                return invalid("plugin must not be empty".into());
            }
            BotTarget::Plugin(_) => {}
        }
        Ok(())
    }

    /// [`BotSpec::validate`], then the provider's URLs against the outbound policy.
    async fn check(&self, outbound: &Policy) -> Result<(), ProvisionError> {
        self.validate()?;
        if let BotTarget::Provider { endpoint, auth, .. } = &self.target {
            check_target(outbound, "endpoint", endpoint).await?;
            if let Some(a) = auth {
                check_target(outbound, "auth.token_url", &a.token_url).await?;
            }
        }
        Ok(())
    }
}

/// A bot as shown to the operator, with the two URLs to give the provider
/// (the token and the auth secret are not shown).
#[derive(Debug, Serialize)]
pub struct BotView {
    pub id: i64,
    pub name: String,
    pub provider_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    pub channels: Vec<String>,
    /// Whether requests carry the provider's bearer token (`auth`).
    pub authorized: bool,
    pub declared: bool,
    pub created_at: i64,
    /// Where the provider posts (plugin bots take no requests: absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhooks_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub providers_url: Option<String>,
}

pub fn bot_view(bot: &Bot, base: &str) -> BotView {
    let (endpoint, plugin, urls) = match &bot.target {
        BotTarget::Provider {
            endpoint, token, ..
        } => (
            Some(endpoint.clone()),
            None,
            Some((
                format!("{base}/webhooks/{}/{token}", bot.provider_id),
                format!("{base}/providers/{}/{token}", bot.provider_id),
            )),
        ),
        BotTarget::Plugin(name) => (None, Some(name.clone()), None),
    };
    let (webhooks_url, providers_url) = urls.unzip();
    BotView {
        id: bot.id,
        name: bot.name.clone(),
        provider_id: bot.provider_id.clone(),
        endpoint,
        plugin,
        channels: bot.channels.clone(),
        authorized: bot.auth().is_some(),
        declared: bot.declared,
        created_at: bot.created_at,
        webhooks_url,
        providers_url,
    }
}

pub async fn create_bot(
    store: &Store,
    spec: &BotSpec,
    declared: bool,
    outbound: &Policy,
) -> Result<Bot, ProvisionError> {
    spec.check(outbound).await?;
    let provider_id = spec.provider_id.clone().unwrap_or_else(random_token);
    store
        .insert_bot(NewBot {
            name: &spec.name,
            provider_id: &provider_id,
            target: &spec.target,
            channels: &spec.channels,
            declared,
        })
        .await?
        .ok_or_else(|| {
            ProvisionError::Duplicate(format!(
                "a bot named `{}` or with provider id `{provider_id}` exists already",
                spec.name
            ))
        })
}

/// The bot `key` names: its id, its name or its provider id.
pub async fn find_bot(store: &Store, key: &str) -> Result<Option<Bot>, StoreError> {
    let bots = store.list_bots().await?;
    let by_id = key.parse::<i64>().ok();
    Ok(bots
        .into_iter()
        .find(|b| Some(b.id) == by_id || b.name == key || b.provider_id == key))
}

/// Creates the bots of `hub.toml` that do not exist yet and updates the
/// others (by name); a declared provider id that changed is refused, since
/// providers hold the old URLs.
pub async fn sync_declared_bots(
    store: &Store,
    declared: &[BotConfig],
    outbound: &Policy,
) -> Result<(), ProvisionError> {
    let mut existing = store.list_bots().await?;
    for c in declared {
        let spec = BotSpec::from_config(c)?;
        spec.check(outbound).await?;
        let bot = match existing.iter().find(|b| b.name == c.name) {
            Some(bot) => bot,
            None => match create_bot(store, &spec, true, outbound).await {
                Ok(bot) => {
                    tracing::info!(bot = %bot.name, provider_id = %bot.provider_id, "created declared bot");
                    continue;
                }
                // Another instance starting at the same moment created it:
                // it is brought in line with the file like any existing one.
                Err(ProvisionError::Duplicate(why)) => {
                    existing = store.list_bots().await?;
                    match existing.iter().find(|b| b.name == c.name) {
                        Some(bot) => bot,
                        None => return Err(ProvisionError::Duplicate(why)),
                    }
                }
                Err(e) => return Err(e),
            },
        };
        if let Some(id) = &c.provider_id
            && *id != bot.provider_id
        {
            return Err(ProvisionError::Invalid(format!(
                "bot `{}`: provider_id cannot change (it is `{}`); delete the bot first",
                c.name, bot.provider_id
            )));
        }
        store
            .update_declared_bot(
                bot.id,
                NewBot {
                    name: &spec.name,
                    provider_id: &bot.provider_id,
                    target: &spec.target,
                    channels: &spec.channels,
                    declared: true,
                },
            )
            .await?;
    }
    Ok(())
}
