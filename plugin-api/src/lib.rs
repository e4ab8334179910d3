//! What plugin authors and the hub share: the typed wire payloads of the hub's
//! interfaces, so that each wire format has exactly one definition.

pub mod channel;
pub mod lenient;
