//! `hub deliveries`: the outbox as operators see it, and replays.

use anyhow::{Context, Result};
use clap::Subcommand;
use hub::config::Config;
use hub::store::OutboxState;

use super::{open_store, out};

#[derive(Subcommand)]
pub(crate) enum DeliveriesCommand {
    /// List deliveries in a state (default: dead letters).
    List {
        /// dead (= failed), pending, delivered, dropped.
        #[arg(long, default_value = "dead")]
        state: String,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Send dead letters again with their delivery ids; a running hub picks
    /// them up within a second.
    Replay {
        /// Delivery ids; none with --all.
        ids: Vec<String>,
        /// Every failed webhook.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

pub(crate) async fn deliveries(config: Config, cmd: DeliveriesCommand) -> Result<()> {
    let store = open_store(&config).await?;
    match cmd {
        DeliveriesCommand::List { state, limit, json } => {
            let parsed = match state.as_str() {
                "dead" => Some(OutboxState::Failed),
                s => OutboxState::parse(s),
            };
            let state = parsed.with_context(|| {
                format!("state `{state}` is none of dead, failed, pending, delivered, dropped")
            })?;
            let list = store.list_deliveries(state, limit).await?;
            if json {
                out(&serde_json::to_string_pretty(&list)?)?;
            } else {
                for d in list {
                    out(&format!(
                        "{}\t{}\t{}\tattempts {}\t{}",
                        d.id,
                        d.kind,
                        d.target_url,
                        d.attempts,
                        d.last_error.unwrap_or_default()
                    ))?;
                }
            }
        }
        DeliveriesCommand::Replay { ids, all } => {
            if ids.is_empty() && !all {
                anyhow::bail!("name delivery ids, or --all for every dead letter");
            }
            let replayed = store.replay_dead(&ids, hub::clock::now_ms()).await?;
            if let Some(missing) = ids.iter().find(|id| !replayed.contains(id)) {
                anyhow::bail!("`{missing}` is not a failed delivery");
            }
            out(&format!("replayed {} deliveries", replayed.len()))?;
        }
    }
    store.close().await;
    Ok(())
}
