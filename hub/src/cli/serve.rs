//! `hub serve`: the hub until a stop signal.

use anyhow::{Context, Result};
use hub::config::Config;

pub(crate) async fn serve(config: Config) -> Result<()> {
    let running = hub::app::start(config).await?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let stop = wait_for_stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = &mut stop => { r?; break; }
            _ = hangup.recv() => {
                if let Err(e) = running.reload().await {
                    tracing::error!(error = %e, "reload failed; the previous plugins stay in force");
                }
            }
        }
    }
    tracing::info!("stopping: no new requests; finishing deliveries in flight");
    running.shutdown().await;
    Ok(())
}

pub(crate) async fn wait_for_stop_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
    }
    Ok(())
}
