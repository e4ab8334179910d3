//! A plugin built without the SDK, against the hub's `handler` world alone:
//! what the hub sees of a component made by another toolchain, or by an SDK
//! from before `validate-config` and `needs-for`. It lets every event pass.

wit_bindgen::generate!({
    world: "handler",
    path: "../../../plugin-api/wit",
});

use hub::plugin::types::Action;

struct Bare;

impl Guest for Bare {
    fn handle(_event: Event) -> Result<Outcome, String> {
        Ok(Outcome {
            action: Action::Continue(None),
            forwards: Vec::new(),
        })
    }
}

export!(Bare);
