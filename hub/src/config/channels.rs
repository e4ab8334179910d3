//! `[[channels]]`: the channels declared in the file, and the checks of a
//! channel's settings the admin API shares.

use serde::Deserialize;

use super::{CallsConfig, is_http_url, is_provider_id};

/// A channel declared in `hub.toml`, created on first start and matched by name after.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    pub name: String,
    /// The integrator's endpoint; a widget channel has none.
    #[serde(default)]
    pub customer_endpoint: String,
    /// `custom` (an integrator's server) or `widget` (the hub's script in
    /// visitors' browsers).
    #[serde(default, rename = "type")]
    pub kind: ChannelType,
    /// A widget's id as pages embed it; random when not given.
    #[serde(default)]
    pub widget_id: Option<String>,
    /// A widget's colour, `#rrggbb`.
    #[serde(default)]
    pub color: Option<String>,
    /// Origins (`https://shop.example.com`) allowed to use a widget; empty: any.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// A widget's callback calls; absent: off.
    #[serde(default)]
    pub calls: Option<CallsConfig>,
    #[serde(default)]
    pub chunked: bool,
    #[serde(default)]
    pub agents: Vec<String>,
    /// Where the channel's event webhooks go.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// A Standard Webhooks secret (`whsec_…`) turns on signing of them.
    #[serde(default)]
    pub webhook_secret: Option<String>,
}

/// `[[channels]] type`: how a channel's customers reach the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelType {
    /// An integrator's server.
    #[default]
    Custom,
    /// The hub's script in visitors' browsers.
    Widget,
}

/// Checks a widget's settings: every problem, each naming its key
/// (`color: …`). Custom channels may not have them.
pub fn check_widget_settings(
    widget: bool,
    widget_id: Option<&str>,
    color: Option<&str>,
    allowed_origins: &[String],
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if !widget {
        for (key, set) in [
            ("widget_id", widget_id.is_some()),
            ("color", color.is_some()),
            ("allowed_origins", !allowed_origins.is_empty()),
        ] {
            if set {
                problems.push(format!("{key}: only a channel of type `widget` has one"));
            }
        }
    } else {
        if let Some(id) = widget_id
            && !(id.len() >= 6 && is_provider_id(id))
        {
            problems.push(format!(
                "widget_id: `{id}` must be 6 or more letters, digits, `-` or `_`"
            ));
        }
        if let Some(c) = color {
            let hex = c.strip_prefix('#').unwrap_or("");
            if !((hex.len() == 6 || hex.len() == 3) && hex.chars().all(|h| h.is_ascii_hexdigit())) {
                problems.push(format!("color: `{c}` is not a colour like #1e88e5"));
            }
        }
        for origin in allowed_origins {
            let host = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"));
            if !host.is_some_and(|h| !h.is_empty() && !h.contains('/')) {
                problems.push(format!(
                    "allowed_origins: `{origin}` is not an origin like https://shop.example.com"
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// A custom channel needs an http(s) endpoint; a widget has none (or one).
pub fn customer_endpoint_ok(widget: bool, endpoint: &str) -> bool {
    is_http_url(endpoint) || (widget && endpoint.is_empty())
}

/// The checks of every `[[channels]]` entry, each problem naming its key
/// (`channels[1].color`).
pub(super) fn check(channels: &[ChannelConfig], problems: &mut Vec<String>) {
    let mut names = std::collections::HashSet::new();
    for (i, ch) in channels.iter().enumerate() {
        if ch.name.trim().is_empty() {
            problems.push(format!("channels[{i}].name: must not be empty"));
        }
        if !names.insert(ch.name.as_str()) {
            problems.push(format!(
                "channels[{i}].name: `{}` is declared twice",
                ch.name
            ));
        }
        let widget = ch.kind == ChannelType::Widget;
        if !widget && ch.customer_endpoint.is_empty() {
            problems.push(format!(
                "channels[{i}].customer_endpoint: required (the integrator's endpoint; \
                 a channel of type \"widget\" has none)"
            ));
        } else if !customer_endpoint_ok(widget, &ch.customer_endpoint) {
            problems.push(format!(
                "channels[{i}].customer_endpoint: `{}` is not an http(s) URL",
                ch.customer_endpoint
            ));
        }
        if let Err(problem) = check_widget_settings(
            widget,
            ch.widget_id.as_deref(),
            ch.color.as_deref(),
            &ch.allowed_origins,
        ) {
            for problem in problem {
                problems.push(format!("channels[{i}].{problem}"));
            }
        }
        if let Some(calls) = &ch.calls {
            if !widget {
                problems.push(format!(
                    "channels[{i}].calls: only a channel of type `widget` has one"
                ));
            }
            for problem in calls.problems() {
                problems.push(format!("channels[{i}].{problem}"));
            }
        }
        if let Some(url) = &ch.webhook_url
            && !is_http_url(url)
        {
            problems.push(format!(
                "channels[{i}].webhook_url: `{url}` is not an http(s) URL"
            ));
        }
        if let Some(secret) = &ch.webhook_secret
            && let Err(e) = crate::outbound::signing::Secret::parse(secret)
        {
            problems.push(format!("channels[{i}].webhook_secret: {e}"));
        }
        for (j, agent) in ch.agents.iter().enumerate() {
            if !agent.contains('@') {
                problems.push(format!(
                    "channels[{i}].agents[{j}]: `{agent}` is not an e-mail address"
                ));
            }
        }
    }
}
