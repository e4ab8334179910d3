//! The conversation integration hub: a custom chat channel, the agent side it
//! implies, sandboxed WebAssembly plugins on every event, and the durable
//! delivery of everything the hub sends.

pub mod admin;
pub mod agents;
pub mod app;
pub mod channel;
pub mod clock;
pub mod config;
pub mod conversations;
pub mod crm;
pub mod delivery;
pub mod destinations;
pub mod event;
pub mod ids;
pub mod integration;
pub mod live;
pub mod metrics;
pub mod offline;
pub mod pipeline;
pub mod provisioning;
pub mod runtime;
pub mod server;
pub mod store;
pub mod tryout;
pub mod web;
pub mod webhooks;
pub mod widget;
pub mod wiring;
