//! `[[bots]]`: the bots whose channels' new chats start with them, each a
//! provider (`endpoint` + `token`, optional `auth`) or a plugin (`plugin`).

use std::collections::HashSet;

use serde::Deserialize;

use super::{Env, expand_env, is_http_url};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotConfig {
    /// Shown to customers and agents as the sender of the bot's messages.
    pub name: String,
    /// The provider's URL; the hub posts to `{endpoint}/{token}`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The provider's token (`${VAR}` allowed); the last segment of every
    /// URL in both directions.
    #[serde(default)]
    pub token: Option<String>,
    /// The id in the provider's URLs to the hub; random when not given.
    #[serde(default)]
    pub provider_id: Option<String>,
    /// A plugin that is the bot, instead of a provider.
    #[serde(default)]
    pub plugin: Option<String>,
    /// Names of the channels whose new chats start with this bot.
    #[serde(default)]
    pub channels: Vec<String>,
    /// The optional client-credentials exchange (spec § Authentication).
    #[serde(default)]
    pub auth: Option<BotAuthConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotAuthConfig {
    pub token_url: String,
    pub client_id: String,
    /// `${VAR}` allowed.
    pub secret: String,
}

/// Whether `id` may be a provider id: URL-safe characters only.
pub fn is_provider_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Whether `token` may be a path segment.
pub fn is_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 512
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c))
}

/// Checks the bots and fills in `${VAR}` in tokens and secrets.
pub(super) fn check(
    bots: &mut [BotConfig],
    plugins: &HashSet<&str>,
    env: &Env,
    problems: &mut Vec<String>,
) {
    let mut names = HashSet::new();
    let mut provider_ids = HashSet::new();
    let mut channels = HashSet::new();
    for (i, bot) in bots.iter_mut().enumerate() {
        let key = format!("bots[{i}]");
        if bot.name.trim().is_empty() {
            problems.push(format!("{key}.name: must not be empty"));
        } else if !names.insert(bot.name.clone()) {
            problems.push(format!("{key}.name: `{}` is declared twice", bot.name));
        }
        if let Some(id) = &bot.provider_id {
            if !is_provider_id(id) {
                problems.push(format!(
                    "{key}.provider_id: `{id}` must be letters, digits, `-` or `_`"
                ));
            } else if !provider_ids.insert(id.clone()) {
                problems.push(format!("{key}.provider_id: `{id}` is declared twice"));
            }
        }
        for (j, channel) in bot.channels.iter().enumerate() {
            if !channels.insert(channel.clone()) {
                problems.push(format!(
                    "{key}.channels[{j}]: `{channel}` has a bot already (one bot per channel)"
                ));
            }
        }
        match (&bot.endpoint, &bot.token, &bot.plugin) {
            (None, None, Some(plugin)) => {
                if !plugins.contains(plugin.as_str()) {
                    problems.push(format!(
                        "{key}.plugin: `{plugin}` is not a plugin declared in [[plugins]]"
                    ));
                }
                if bot.auth.is_some() {
                    problems.push(format!("{key}.auth: only a provider bot has `auth`"));
                }
            }
            (Some(endpoint), Some(token), None) => {
                if !is_http_url(endpoint) {
                    problems.push(format!(
                        "{key}.endpoint: `{endpoint}` is not an http(s) URL"
                    ));
                }
                let expanded = expand(token, &format!("{key}.token"), env, problems);
                if let Some(t) = &expanded
                    && !is_token(t)
                {
                    problems.push(format!(
                        "{key}.token: must be letters, digits, `-`, `_`, `.` or `~` \
                         (it is a path segment)"
                    ));
                }
                bot.token = expanded.or(bot.token.take());
                if let Some(auth) = &mut bot.auth {
                    if !is_http_url(&auth.token_url) {
                        problems.push(format!(
                            "{key}.auth.token_url: `{}` is not an http(s) URL",
                            auth.token_url
                        ));
                    }
                    if auth.client_id.is_empty() {
                        problems.push(format!("{key}.auth.client_id: must not be empty"));
                    }
                    if let Some(s) =
                        expand(&auth.secret, &format!("{key}.auth.secret"), env, problems)
                    {
                        auth.secret = s;
                    }
                }
            }
            _ => problems.push(format!(
                "{key}: give either `endpoint` and `token` (a provider) or `plugin`"
            )),
        }
    }
}

fn expand(value: &str, key: &str, env: &Env, problems: &mut Vec<String>) -> Option<String> {
    match expand_env(value, |var| env.get(var)) {
        Ok(v) => Some(v),
        Err(e) => {
            problems.push(format!("{key}: {e}"));
            None
        }
    }
}
