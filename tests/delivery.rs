//! placeholder
mod support;
