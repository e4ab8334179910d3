//! What plugin authors and the hub share: the typed wire payloads of the hub's
//! interfaces, so that each wire format has exactly one definition.

pub mod bot;
pub mod channel;
pub mod crm;
pub mod lenient;
pub mod webhook;
pub mod widget;
