//! The core: what the hub does with an event once an edge has parsed it —
//! conversations and their delivery outcomes, the bot exchange, offline messages, agent actions
//! integrators hear of, provisioning, event and CRM webhooks, live updates to
//! agents and CRM task reminders. It runs every event through the pipeline
//! before it touches state.

pub mod accounts;
mod batch;
mod bot_hooks;
pub(crate) mod bots;
mod chats;
pub(crate) mod conversations;
pub(crate) mod crm;
pub(crate) mod door;
pub(crate) mod error;
mod ingress;
pub(crate) mod integration;
pub mod live;
pub(crate) mod messages;
pub(crate) mod offline;
pub(crate) mod outcomes;
mod outgoing;
pub mod provisioning;
pub(crate) mod reminders;
mod results;
pub(crate) mod webhooks;
pub(crate) mod widget;

pub use door::{Handled, Inbound};
