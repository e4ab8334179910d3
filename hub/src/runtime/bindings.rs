//! Rust bindings of the `hub:plugin` WIT world, generated at build time from
//! `plugin-api/wit`, the same file plugin authors build against.

wasmtime::component::bindgen!({
    path: "../plugin-api/wit",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::hub::plugin::types::{Action, Direction, Level, Response};
