//! The words the core's parts share: why an action was refused, and what the
//! pipeline left of an event.

use crate::pipeline::Routed;
use crate::store::StoreError;

/// Why an action was refused; edges map each case to their status codes.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("not found")]
    NotFound,
    /// Not found, naming what ("no such deal").
    #[error("{0}")]
    Missing(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// Refused for now (a plugin failed on a route that rejects); the sender may retry.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the pipeline left of an event.
pub(crate) enum Passage {
    /// Go on, maybe with a changed payload, or with a plugin's reply.
    Through(Box<Routed>),
    /// A plugin dropped it; the event and its effects are recorded.
    Dropped(String),
}
