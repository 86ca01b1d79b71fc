//! Python: componentize-py (CPython embedded in the component) from PyPI,
//! installed into a virtualenv in the toolchain cache.
//!
//! `[build] source` is a directory holding `app.py` (the module that defines
//! `class WitWorld`), or a `.py` file. componentize-py bundles the whole
//! `--python-path` directory and writes a `__pycache__` into it, so the
//! sources are copied into the build directory first, together with the
//! onceflow SDK layer (`onceflow.py`).

use std::path::Path;
use std::process::Command;

use super::toolchain::{find_on_path, pip_install, toolchains_dir};
use super::{BuildError, Toolchain, output_of, read, run};
use crate::manifest::Manifest;

/// The componentize-py release `onceflow build` installs.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// The Python SDK layer, vendored into every Python build.
pub(super) const SDK: &str = include_str!("../../../guest-sdk/python/onceflow.py");

pub(super) fn ensure_toolchain() -> Result<Toolchain, BuildError> {
    let venv = toolchains_dir().join("python").join("venv");
    let componentize = venv.join("bin").join("componentize-py");
    let wanted = format!("componentize-py {COMPONENTIZE_PY_VERSION}");
    let installed = output_of(Command::new(&componentize).arg("--version"));
    if installed.as_deref().map(str::trim) != Some(wanted.as_str()) {
        let python = find_on_path(&["python3"]).ok_or(BuildError::MissingTool {
            tool: "python3",
            hint: "install Python 3.10 or later with venv (apt-get install python3-venv)",
        })?;
        eprintln!(
            "installing componentize-py=={COMPONENTIZE_PY_VERSION} into {} (pip, once)",
            venv.display()
        );
        pip_install(
            &python,
            &venv,
            &format!("componentize-py=={COMPONENTIZE_PY_VERSION}"),
        )?;
    }
    Ok(Toolchain {
        version: wanted,
        tools: vec![("componentize-py", componentize)],
    })
}

pub(super) fn build(
    manifest: &Manifest,
    toolchain: &Toolchain,
    work: &Path,
) -> Result<Vec<u8>, BuildError> {
    let source = manifest.source_dir();
    let (dir, module) = if source.is_file() {
        let module = source
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        (super::parent_dir(&source), module)
    } else {
        (source, "app".to_owned())
    };
    if !dir.join(format!("{module}.py")).is_file() {
        return Err(BuildError::step(
            "finding the Python module",
            format!(
                "{}/{module}.py does not exist: set [build] source in {} to the processor's .py file or its directory (with app.py)",
                dir.display(),
                manifest.path.display()
            ),
        ));
    }
    let python_path = work.join("python-src");
    copy_python_sources(&dir, &python_path)?;
    std::fs::write(python_path.join("onceflow.py"), SDK)
        .map_err(|e| BuildError::step("writing the onceflow SDK layer", e))?;
    let out = work.join("component.wasm");
    run(
        "componentize-py",
        Command::new(toolchain.tool("componentize-py"))
            .arg("-d")
            .arg(work.join("wit"))
            .args(["-w", "processor", "componentize", "--python-path"])
            .arg(&python_path)
            .arg(&module)
            .arg("-o")
            .arg(&out),
    )?;
    read(&out)
}

/// Copies the `.py` files under `from` (recursively, without build outputs).
fn copy_python_sources(from: &Path, to: &Path) -> Result<(), BuildError> {
    for file in super::source_files(from)? {
        if file.extension().is_none_or(|e| e != "py") {
            continue;
        }
        let relative = file.strip_prefix(from).unwrap_or(&file);
        let target = to.join(relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| BuildError::step(format!("creating {}", parent.display()), e))?;
        }
        std::fs::copy(&file, &target)
            .map_err(|e| BuildError::step(format!("copying {}", file.display()), e))?;
    }
    Ok(())
}
