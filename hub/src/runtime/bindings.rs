//! Rust bindings of the `hub:plugin` WIT world `handler`, generated at build
//! time from `plugin-api/wit`, the same file plugin authors build against.
//! The hub binds `handler` (only `handle` is required of a component); the
//! optional `validate-config` and `needs-for` exports of the SDK's `plugin`
//! world are looked up by name (`runtime::plugin`).

wasmtime::component::bindgen!({
    path: "../plugin-api/wit",
    world: "handler",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::hub::plugin::types::{Action, Direction, Level, Needs, Response};
