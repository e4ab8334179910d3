//! The end-to-end suite, one test binary: each module drives real hubs (in
//! process, or the `hub` binary) against loopback integrators, receivers,
//! CRMs and plugins. One binary because every test target links wasmtime,
//! sqlx and hyper, and linking dominated the suite's build on two cores.

mod support;

mod agent_api;
mod authoring;
mod bots;
mod channel_ingress;
mod console;
mod crm;
mod delivery;
mod deploy;
mod examples;
mod hostile;
mod instances;
mod layout;
mod metrics;
mod outbound;
mod plugins;
mod polyglot;
mod postgres;
mod process;
mod replay;
mod scaleout;
mod webhooks;
mod widget_api;
