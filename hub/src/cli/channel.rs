//! `hub channel`: channels from the command line.

use anyhow::Result;
use clap::Subcommand;
use hub::config::Config;
use hub::core::provisioning::{self, ChannelSpec};
use hub::store::ChannelKind;

use super::{open_store, out};

#[derive(Subcommand)]
pub(crate) enum ChannelCommand {
    /// Create a channel and print its endpoint URL.
    Create {
        #[arg(long)]
        name: String,
        /// `custom` (an integrator's server) or `widget` (the hub's script in
        /// visitors' browsers).
        #[arg(long = "type", default_value = "custom")]
        kind: String,
        /// The integrator's endpoint agent messages are posted to (custom channels).
        #[arg(long, default_value = "")]
        endpoint: String,
        /// A widget's id as pages embed it (random when not given).
        #[arg(long = "widget-id")]
        widget_id: Option<String>,
        /// A widget's colour, `#rrggbb`.
        #[arg(long)]
        color: Option<String>,
        /// An origin allowed to use the widget (repeatable; none: any).
        #[arg(long = "allowed-origin")]
        allowed_origins: Vec<String>,
        /// Send agent messages with Transfer-Encoding: chunked.
        #[arg(long)]
        chunked: bool,
        /// E-mail of an agent who receives the channel's chats (repeatable).
        #[arg(long = "agent")]
        agents: Vec<String>,
        /// Receiver of the channel's event webhooks.
        #[arg(long = "webhook-url")]
        webhook_url: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List channels with their endpoint URLs.
    List {
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn channel(config: Config, cmd: ChannelCommand) -> Result<()> {
    let store = open_store(&config).await?;
    let outbound = config.outbound.policy();
    provisioning::sync_declared(&store, &config.channels, &outbound).await?;
    let secret = provisioning::path_secret(&store).await?;
    let base = config.public_base(config.server.listen);
    match cmd {
        ChannelCommand::Create {
            name,
            kind,
            widget_id,
            color,
            allowed_origins,
            endpoint,
            chunked,
            agents,
            webhook_url,
            json,
        } => {
            let spec = ChannelSpec {
                name,
                customer_endpoint: endpoint,
                chunked,
                agents,
                webhook_url,
                webhook_secret: None,
                kind: match kind.as_str() {
                    "custom" => ChannelKind::Custom,
                    "widget" => ChannelKind::Widget,
                    other => anyhow::bail!("--type: `{other}` is neither custom nor widget"),
                },
                widget_id,
                color,
                allowed_origins,
                calls: None,
            };
            let ch = provisioning::create_channel(&store, &spec, false, &outbound).await?;
            let view = provisioning::view(ch, &base, &secret);
            if json {
                out(&serde_json::to_string_pretty(&view)?)?;
            } else {
                match &view.widget {
                    Some(w) => out(&format!(
                        "created widget {} (widget id {})\nembed: {}\ndemo:  {}",
                        view.name, w.widget_id, w.embed, w.demo_url
                    ))?,
                    None => out(&format!(
                        "created channel {} (public id {})\nendpoint: {}\nstatus:   {}",
                        view.name, view.public_id, view.endpoint_url, view.status_url
                    ))?,
                }
            }
        }
        ChannelCommand::List { json } => {
            let views: Vec<_> = store
                .list_channels()
                .await?
                .into_iter()
                .map(|c| provisioning::view(c, &base, &secret))
                .collect();
            if json {
                out(&serde_json::to_string_pretty(&views)?)?;
            } else {
                for v in views {
                    out(&format!(
                        "{}\t{}\t{}\tagents: {}",
                        v.name,
                        v.endpoint_url,
                        v.customer_endpoint,
                        v.agents.join(",")
                    ))?;
                }
            }
        }
    }
    store.close().await;
    Ok(())
}
