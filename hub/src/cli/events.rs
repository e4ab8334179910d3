//! `hub events show`: one logged event.

use anyhow::{Context, Result};
use clap::Subcommand;
use hub::config::Config;
use hub::tryout;

use super::{open_store, out};

#[derive(Subcommand)]
pub(crate) enum EventsCommand {
    /// Print one logged event as JSON.
    Show {
        /// The event's id (a UUID, as in logs and delivery results).
        id: String,
        /// Print it as an event file for `hub plugin test`.
        #[arg(long)]
        as_event: bool,
    },
}

pub(crate) async fn events(config: Config, cmd: EventsCommand) -> Result<()> {
    let store = open_store(&config).await?;
    let EventsCommand::Show { id, as_event } = cmd;
    let event = store
        .event_by_id(&id)
        .await?
        .with_context(|| format!("no event has the id `{id}`"))?;
    let outcomes = store.outcomes_of(&id).await?;
    let text = if as_event {
        let channel = match event.channel_id {
            Some(channel_id) => store.channel_by_id(channel_id).await?.map(|c| c.name),
            None => None,
        };
        let mut file = tryout::EventFile::of(&event, channel);
        // Plugins see the channel's agents online when the event passes; the
        // log does not keep that, so the file gets today's count.
        if let Some(channel_id) = event.channel_id {
            let online = store.channel_online_agents(channel_id).await?;
            file.context = Some(serde_json::json!({ "agents_online": online }));
            eprintln!(
                "note: context.agents_online is the channel's count now ({online}), not when the event passed"
            );
        }
        serde_json::to_string_pretty(&file)?
    } else {
        // What each plugin of the live chain did, so "which plugin changed
        // this message?" has an answer.
        let mut value = serde_json::to_value(&event)?;
        value["outcomes"] = outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "plugin": o.plugin,
                    "verdict": o.verdict,
                    "payload_hash": o.payload_hash,
                    "forwards": o.forwards,
                    "error_kind": o.error_kind,
                })
            })
            .collect();
        serde_json::to_string_pretty(&value)?
    };
    store.close().await;
    out(&text)
}
