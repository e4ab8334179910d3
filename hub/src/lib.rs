//! The conversation integration hub: a custom chat channel, the agent side it
//! implies, sandboxed WebAssembly plugins on every event, and the durable
//! delivery of everything the hub sends.
//!
//! Layers, each importing only those below it (ARCHITECTURE.md):
//! `http` (the edges) → `core` (actions, webhooks, live updates) →
//! `pipeline` / `runtime` (plugins) and `delivery` (the outbox worker) →
//! `store` (SQL) and the outbound HTTP client. `app` assembles them.

pub mod app;
pub mod clock;
pub mod config;
pub mod core;
pub(crate) mod delivery;
pub mod event;
pub mod http;
pub mod ids;
pub(crate) mod obs;
pub mod outbound;
pub mod pipeline;
#[cfg(test)]
mod proptests;
pub mod runtime;
pub mod scaffold;
pub mod store;
pub mod tryout;
