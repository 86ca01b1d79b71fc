//! C: clang with the wasm32-wasi target and wasi-libc (Debian: `clang`,
//! `lld`, `wasi-libc`, `libclang-rt-14-dev-wasm32`), bindings from
//! `wit-bindgen c` (installed with `cargo install wit-bindgen-cli` into the
//! toolchain cache), the onceflow SDK layer (`onceflow.h`, `onceflow.c`),
//! then `wit-component` in-process.
//!
//! `[build] source` is a directory: every `.c` file in it is compiled, with
//! the directory, the bindings and the SDK on the include path. The module
//! is built as a WASI reactor; it imports WASI preview1 only if the code
//! calls into the outside world through libc (the wallet does not), and
//! then goes through the same preview1 adapter as Go.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::toolchain::{find_on_path, is_executable, toolchains_dir};
use super::{BuildError, Toolchain, output_of, read, run};
use crate::manifest::Manifest;

/// The wit-bindgen release that generates the C bindings.
pub const WIT_BINDGEN_VERSION: &str = "0.63.0";

pub(super) const SDK_HEADER: &str = include_str!("../../../guest-sdk/c/onceflow.h");
pub(super) const SDK_SOURCE: &str = include_str!("../../../guest-sdk/c/onceflow.c");

/// `wit-bindgen` from the toolchain cache (or PATH), installed with cargo
/// if missing. Shared with Go.
pub(super) fn ensure_wit_bindgen() -> Result<PathBuf, BuildError> {
    let root = toolchains_dir().join("wit-bindgen");
    let cached = root.join("bin").join("wit-bindgen");
    let wanted = format!("wit-bindgen-cli {WIT_BINDGEN_VERSION}");
    let version_of = |path: &Path| output_of(Command::new(path).arg("--version"));
    if version_of(&cached).is_some_and(|v| v.trim().starts_with(&wanted)) {
        return Ok(cached);
    }
    if let Some(on_path) = find_on_path(&["wit-bindgen"])
        && version_of(&on_path).is_some_and(|v| v.trim().starts_with(&wanted))
    {
        return Ok(on_path);
    }
    let cargo = find_on_path(&["cargo"]).ok_or(BuildError::MissingTool {
        tool: "cargo",
        hint: "wit-bindgen is installed with `cargo install wit-bindgen-cli`: install Rust with rustup",
    })?;
    eprintln!(
        "installing wit-bindgen-cli {WIT_BINDGEN_VERSION} into {} (cargo install, once: a few minutes)",
        root.display()
    );
    run(
        "cargo install wit-bindgen-cli",
        Command::new(cargo)
            .args(["install", "wit-bindgen-cli", "--locked", "--version"])
            .arg(WIT_BINDGEN_VERSION)
            // Only the two generators Onceflow runs (C, Go), unoptimised and
            // without debug info: it writes a few bindings files per build,
            // and the default (every generator, optimised) took ~9 minutes of
            // a fresh CI run. (With debug info the binary is 170 MB.)
            .args(["--no-default-features", "--features", "c,go", "--debug"])
            .env("CARGO_PROFILE_DEV_DEBUG", "false")
            .arg("--root")
            .arg(&root)
            // Not the caller's target directory (it may be locked by the
            // `cargo test` that runs us).
            .env("CARGO_TARGET_DIR", root.join("build")),
    )?;
    // The intermediate build (about a gigabyte) is not needed any more.
    let _ = std::fs::remove_dir_all(root.join("build"));
    Ok(cached)
}

pub(super) fn ensure_toolchain() -> Result<Toolchain, BuildError> {
    let clang = find_on_path(&[
        "clang", "clang-19", "clang-18", "clang-16", "clang-15", "clang-14",
    ])
    .ok_or(BuildError::MissingTool {
        tool: "clang",
        hint: "apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32 (scripts/setup does)",
    })?;
    let sysroot_ok = Path::new("/usr/lib/wasm32-wasi/libc.a").is_file()
        || std::env::var_os("WASI_SYSROOT").is_some();
    if !sysroot_ok {
        return Err(BuildError::MissingTool {
            tool: "wasi-libc",
            hint: "apt-get install wasi-libc libclang-rt-14-dev-wasm32, or set WASI_SYSROOT to a wasi-sdk sysroot",
        });
    }
    let wit_bindgen = ensure_wit_bindgen()?;
    let clang_version = output_of(Command::new(&clang).arg("--version")).unwrap_or_default();
    Ok(Toolchain {
        version: format!(
            "{}, wit-bindgen {WIT_BINDGEN_VERSION}",
            clang_version.lines().next().unwrap_or("clang")
        ),
        tools: vec![("clang", clang), ("wit-bindgen", wit_bindgen)],
    })
}

pub(super) fn build(
    manifest: &Manifest,
    toolchain: &Toolchain,
    work: &Path,
) -> Result<Vec<u8>, BuildError> {
    let source = manifest.source_dir();
    let sources = super::sources_with_extension(manifest, "c", "C")?;
    let bindings = work.join("bindings");
    super::wit_bindgen(toolchain, "c", work, &bindings)?;
    std::fs::write(bindings.join("onceflow.h"), SDK_HEADER)
        .and_then(|()| std::fs::write(bindings.join("onceflow.c"), SDK_SOURCE))
        .map_err(|e| BuildError::step("writing the onceflow SDK layer", e))?;
    let module = work.join("core.wasm");
    let mut clang = Command::new(toolchain.tool("clang"));
    clang
        .args([
            "--target=wasm32-wasi",
            "-mexec-model=reactor",
            "-O2",
            "-std=c11",
        ])
        .args(["-Wall", "-Wextra", "-Wno-unused-parameter"]);
    if let Some(sysroot) = std::env::var_os("WASI_SYSROOT") {
        clang.arg("--sysroot").arg(sysroot);
    }
    clang
        .arg("-I")
        .arg(&bindings)
        .arg("-I")
        .arg(&source)
        .args(&sources)
        .arg(bindings.join("processor.c"))
        .arg(bindings.join("onceflow.c"))
        .arg(bindings.join("processor_component_type.o"))
        .arg("-o")
        .arg(&module);
    run("clang", &mut clang)?;
    if !is_executable(&module) && !module.is_file() {
        return Err(BuildError::step("clang", "wrote no module"));
    }
    super::componentize_core_module(&read(&module)?, false)
}
