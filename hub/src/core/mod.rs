//! The core: what the hub does with an event once an edge has parsed it —
//! conversations and their delivery outcomes, the bot exchange, offline messages, agent actions
//! integrators hear of, provisioning, event and CRM webhooks, live updates to
//! agents and CRM task reminders. It runs every event through the pipeline
//! before it touches state.

pub mod accounts;
mod batch;
mod bot_hooks;
pub mod bots;
mod chats;
pub mod conversations;
pub mod crm;
pub mod door;
pub mod error;
mod ingress;
pub mod integration;
pub mod live;
pub mod messages;
pub mod offline;
pub mod outcomes;
mod outgoing;
pub mod provisioning;
pub mod reminders;
mod results;
pub mod webhooks;
pub mod widget;

pub use door::{Handled, Inbound};
