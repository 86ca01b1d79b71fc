//! Deployments: the manifest (`onceflow.toml`) and building a processor's
//! component from source.

pub mod build;
pub mod manifest;
pub mod registry;

pub use manifest::{Manifest, ManifestError};
