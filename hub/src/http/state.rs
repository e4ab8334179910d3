//! What every request handler can reach: the edges share this, never the assembler.

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::core::conversations::Conversations;
use crate::core::live::Live;
use crate::delivery::Kick;
use crate::pipeline::wiring::WiringHandle;
use crate::runtime::Runtime;
use crate::store::Store;

/// What every request handler can reach.
pub struct App {
    pub config: Arc<Config>,
    pub store: Store,
    pub live: Live,
    pub conversations: Arc<Conversations>,
    pub runtime: Runtime,
    pub wiring: WiringHandle,
    /// Wakes the deliverer after something was queued outside the core.
    pub kick: Kick,
    /// Public base URL, no trailing slash.
    pub base: String,
    /// The installation's random path segment of channel endpoints.
    pub path_secret: String,
    pub admin_token: Option<String>,
    /// Signs and checks widget visitors' tokens.
    pub visitor_keys: crate::core::widget::VisitorKeys,
    /// `[geoip] database`, opened once.
    pub geoip: Option<std::sync::Arc<crate::http::geoip::GeoIp>>,
    /// Failed console sign-ins per account and address.
    pub sign_ins: crate::core::accounts::SignIns,
    /// Rate limits of the widget's public endpoints.
    pub widget_limits: crate::http::limits::WidgetLimits,
    /// The connection cap (and its refusal count), the channel and bot
    /// rate limits, and failed credentials per source address.
    pub limits: crate::http::limits::Limits,
    /// The hub's outbound client; its policy (reloaded on SIGHUP) judges
    /// the URLs the admin API registers.
    pub sender: crate::outbound::HttpSender,
    /// Turns true when the hub stops; long-lived responses end on it.
    pub shutdown: watch::Receiver<bool>,
}
