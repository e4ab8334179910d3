//! What plugin authors and the hub share: the typed wire payloads of the hub's
//! interfaces, so that each wire format has exactly one definition, and the SDK
//! plugins are written with ([`sdk`], [`testing`], and `guest` for wasm).

#![forbid(unsafe_code)]

// The generated bindings name this crate by its absolute path so that
// `export_plugin!` expands the same inside plugin crates.
#[cfg(feature = "guest")]
extern crate self as plugin_api;

pub mod bot;
pub mod channel;
pub mod crm;
#[cfg(feature = "guest")]
pub mod guest;
pub mod json;
pub mod lenient;
pub mod sdk;
pub mod testing;
pub mod webhook;
pub mod widget;

/// For the schema of the payload types (tests/polyglot.rs writes sdk/payloads.schema.json).
#[cfg(feature = "schema")]
pub use schemars;
