//! The CLI's commands, one file each; what they share.

pub(crate) mod agent;
pub(crate) mod bot;
pub(crate) mod channel;
pub(crate) mod check;
pub(crate) mod deliveries;
pub(crate) mod events;
pub(crate) mod plugin;
pub(crate) mod serve;

use anyhow::{Context, Result};
use hub::config::Config;
use hub::store::Store;
use std::io::Write;

pub(crate) fn out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").context("writing to stdout")
}

pub(crate) async fn open_store(config: &Config) -> Result<Store> {
    hub::app::open_store(&config.storage)
        .await
        .with_context(|| format!("opening {}", hub::store::redacted_url(&config.storage.url)))
}
