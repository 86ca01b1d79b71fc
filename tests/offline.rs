//! The integration tests that need no broker: `onceflow build` +
//! `onceflow test` on the examples, the sandbox's hostile guests, and the
//! processors in other languages (with the toolchains `onceflow build`
//! installs into the toolchain cache).

mod common;

#[path = "offline/examples.rs"]
mod examples;
#[path = "offline/formats.rs"]
mod formats;
#[path = "offline/languages.rs"]
mod languages;
#[path = "offline/sandbox.rs"]
mod sandbox;
#[path = "offline/time.rs"]
mod time;
