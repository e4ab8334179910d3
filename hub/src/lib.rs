//! The conversation integration hub: a custom chat channel, the agent side it
//! implies, and the durable delivery of everything the hub sends.

pub mod admin;
pub mod agents;
pub mod app;
pub mod channel;
pub mod clock;
pub mod config;
pub mod conversations;
pub mod delivery;
pub mod event;
pub mod ids;
pub mod live;
pub mod pipeline;
pub mod provisioning;
pub mod server;
pub mod store;
pub mod web;
