//! Deployments: the manifest (`onceflow.toml`) and building a processor's
//! component from source.

pub mod build;
pub mod manifest;

pub use manifest::{Manifest, ManifestError};
