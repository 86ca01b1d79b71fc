//! Rust: `cargo build --release` for `wasm32-unknown-unknown` (installing the
//! target with rustup if needed), then the core module is wrapped into a
//! component in-process with `wit-component` (what `wasm-tools component
//! new` does). Such a component imports no WASI at all. With
//! `target = "wasm32-wasip2"` rustc already produces a component.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{BuildError, BuildOutput, write_component};
use crate::manifest::Manifest;

pub(super) fn build(manifest: &Manifest) -> Result<BuildOutput, BuildError> {
    let target = manifest
        .build
        .target
        .as_deref()
        .unwrap_or("wasm32-unknown-unknown");
    ensure_rust_target(target)?;
    let cargo_toml = manifest.source_dir().join("Cargo.toml");
    if !cargo_toml.is_file() {
        return Err(BuildError::Step {
            step: "finding the Rust crate".to_owned(),
            message: format!(
                "{} does not exist: set [build] source in {} to the crate's directory",
                cargo_toml.display(),
                manifest.path.display()
            ),
        });
    }
    let cargo_toml = cargo_toml.canonicalize().unwrap_or(cargo_toml);
    eprintln!(
        "building {} for {target} (cargo build --release)",
        manifest.name
    );
    let output = Command::new(cargo())
        .args(["build", "--release", "--target", target])
        .arg("--manifest-path")
        .arg(&cargo_toml)
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| BuildError::Step {
            step: "running cargo".to_owned(),
            message: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(BuildError::Step {
            step: "cargo build".to_owned(),
            message: format!("{} (compiler messages above)", output.status),
        });
    }
    let wasm = find_artifact(&output.stdout, &cargo_toml).ok_or_else(|| BuildError::Step {
        step: "finding the built module".to_owned(),
        message: format!(
            "cargo built no .wasm for {}: is it a library with crate-type = [\"cdylib\"]?",
            cargo_toml.display()
        ),
    })?;
    let bytes = std::fs::read(&wasm).map_err(|e| BuildError::Step {
        step: format!("reading {}", wasm.display()),
        message: e.to_string(),
    })?;
    let component = if wasmparser::Parser::is_component(&bytes) {
        bytes
    } else {
        wit_component::ComponentEncoder::default()
            .validate(true)
            .module(&bytes)
            .and_then(|e| e.encode())
            .map_err(|e| BuildError::Step {
                step: "turning the module into a component".to_owned(),
                message: format!(
                    "{e:#}\n(does the crate use onceflow-sdk and call export_processor!?)"
                ),
            })?
    };
    write_component(manifest, component)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Installs the Rust target with rustup if it is missing.
fn ensure_rust_target(target: &str) -> Result<(), BuildError> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .stderr(Stdio::null())
        .output();
    let installed = match installed {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        // Without rustup (a distribution's Rust), let cargo report a
        // missing target itself.
        _ => return Ok(()),
    };
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    eprintln!("installing the Rust target {target} (rustup target add {target})");
    let status = Command::new("rustup")
        .args(["target", "add", target])
        .status()
        .map_err(|e| BuildError::Step {
            step: format!("rustup target add {target}"),
            message: e.to_string(),
        })?;
    if !status.success() {
        return Err(BuildError::Step {
            step: format!("rustup target add {target}"),
            message: status.to_string(),
        });
    }
    Ok(())
}

/// The `.wasm` cargo reported for the package at `cargo_toml`.
fn find_artifact(cargo_stdout: &[u8], cargo_toml: &Path) -> Option<PathBuf> {
    #[derive(serde::Deserialize)]
    struct Message {
        reason: String,
        #[serde(default)]
        manifest_path: Option<PathBuf>,
        #[serde(default)]
        filenames: Vec<PathBuf>,
    }
    let mut found = None;
    for line in cargo_stdout.split(|&b| b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<Message>(line) else {
            continue;
        };
        if msg.reason != "compiler-artifact" {
            continue;
        }
        if msg.manifest_path.as_deref() != Some(cargo_toml) {
            continue;
        }
        if let Some(wasm) = msg
            .filenames
            .into_iter()
            .find(|f| f.extension().is_some_and(|e| e == "wasm"))
        {
            found = Some(wasm);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_package_artifact_among_cargo_messages() {
        let out = br#"{"reason":"compiler-artifact","manifest_path":"/dep/Cargo.toml","filenames":["/t/libdep.rlib"]}
not json
{"reason":"compiler-artifact","manifest_path":"/p/Cargo.toml","filenames":["/t/wasm32-unknown-unknown/release/p.wasm"]}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            find_artifact(out, Path::new("/p/Cargo.toml")),
            Some(PathBuf::from("/t/wasm32-unknown-unknown/release/p.wasm"))
        );
        assert_eq!(find_artifact(out, Path::new("/q/Cargo.toml")), None);
    }
}
