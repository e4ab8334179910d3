//! Where every event is routed before it touches core state (inbound) or the
//! outbox (outbound). The plugin chain plugs in here; edges and the core never
//! skip this step, so adding plugins changes no edge.

use crate::event::Event;

/// What the chain decided for an event.
#[derive(Debug)]
pub enum Flow {
    /// Go on with this (possibly changed) event.
    Continue(Event),
    /// Stop here; the reason is logged.
    Drop { event: Event, reason: String },
}

/// The routing table and plugin chains; no route is configured yet, so every
/// event continues unchanged.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {}

impl Pipeline {
    pub async fn run(&self, event: Event) -> Flow {
        Flow::Continue(event)
    }
}
