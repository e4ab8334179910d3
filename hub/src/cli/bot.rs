//! `hub bot`: bots from the command line.

use anyhow::Result;
use clap::Subcommand;
use hub::config::Config;
use hub::core::provisioning::{self, BotSpec};
use hub::store::bots::BotTarget;

use super::{open_store, out};

#[derive(Subcommand)]
pub(crate) enum BotCommand {
    /// Connect a bot and print the URLs its provider posts to. A running
    /// hub sees it after SIGHUP (the admin API takes effect at once).
    Create {
        /// Shown to customers and agents as the sender.
        #[arg(long)]
        name: String,
        /// The provider's URL; the hub posts to `<endpoint>/<token>`.
        #[arg(long, requires = "token", conflicts_with = "plugin")]
        endpoint: Option<String>,
        /// The provider's token.
        #[arg(long, requires = "endpoint")]
        token: Option<String>,
        /// A plugin that is the bot, instead of a provider.
        #[arg(long)]
        plugin: Option<String>,
        /// The id in the provider's URLs (random when not given).
        #[arg(long = "provider-id")]
        provider_id: Option<String>,
        /// A channel whose new chats start with this bot (repeatable).
        #[arg(long = "channel")]
        channels: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List bots with the URLs their providers post to.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a bot (by id, name or provider id); its URLs answer 404.
    Delete { bot: String },
}

pub(crate) async fn bot(config: Config, cmd: BotCommand) -> Result<()> {
    let store = open_store(&config).await?;
    let outbound = config.outbound.policy();
    provisioning::sync_declared_bots(&store, &config.bots, &outbound).await?;
    let base = config.public_base(config.server.listen);
    match cmd {
        BotCommand::Create {
            name,
            endpoint,
            token,
            plugin,
            provider_id,
            channels,
            json,
        } => {
            let target = match (endpoint, token, plugin) {
                (Some(endpoint), Some(token), None) => BotTarget::Provider {
                    endpoint,
                    token,
                    auth: None,
                },
                (None, None, Some(plugin)) => BotTarget::Plugin(plugin),
                _ => anyhow::bail!("give either --endpoint and --token, or --plugin"),
            };
            let spec = BotSpec {
                name,
                provider_id,
                target,
                channels,
            };
            let bot = provisioning::create_bot(&store, &spec, false, &outbound).await?;
            let view = provisioning::bot_view(&bot, &base);
            if json {
                out(&serde_json::to_string_pretty(&view)?)?;
            } else {
                let mut text = format!(
                    "created bot {} (provider id {})",
                    view.name, view.provider_id
                );
                if let (Some(w), Some(p)) = (&view.webhooks_url, &view.providers_url) {
                    text.push_str(&format!("\nwebhooks:  {w}\nproviders: {p}"));
                }
                out(&text)?;
            }
        }
        BotCommand::List { json } => {
            let views: Vec<_> = store
                .list_bots()
                .await?
                .iter()
                .map(|b| provisioning::bot_view(b, &base))
                .collect();
            if json {
                out(&serde_json::to_string_pretty(&views)?)?;
            } else {
                for v in views {
                    let target = v
                        .webhooks_url
                        .clone()
                        .or_else(|| v.plugin.as_ref().map(|p| format!("plugin {p}")))
                        .unwrap_or_default();
                    out(&format!(
                        "{}\t{}\t{}\tchannels: {}",
                        v.name,
                        v.provider_id,
                        target,
                        v.channels.join(",")
                    ))?;
                }
            }
        }
        BotCommand::Delete { bot } => {
            let Some(found) = provisioning::find_bot(&store, &bot).await? else {
                anyhow::bail!("no bot `{bot}`");
            };
            store.delete_bot(found.id).await?;
            out(&format!("deleted bot {}", found.name))?;
        }
    }
    // Hubs running on a PostgreSQL database reload their bots now.
    if let Err(e) = hub::core::live::announce_bots_changed(&store).await {
        tracing::warn!(error = %e, "running hubs were not told of the change; a reload (SIGHUP) picks it up");
    }
    store.close().await;
    Ok(())
}
