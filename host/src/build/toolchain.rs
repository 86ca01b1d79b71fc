//! Where toolchains are installed, and small helpers to find tools.

use std::path::{Path, PathBuf};

/// `$ONCEFLOW_CACHE` (default `~/.cache/onceflow`).
pub(super) fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("ONCEFLOW_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".cache").join("onceflow")
}

/// Where `onceflow build` installs language toolchains:
/// `$ONCEFLOW_TOOLCHAINS`, else `$ONCEFLOW_CACHE/toolchains`.
pub fn toolchains_dir() -> PathBuf {
    match std::env::var_os("ONCEFLOW_TOOLCHAINS").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => cache_root().join("toolchains"),
    }
}

/// The first of `names` found on PATH.
pub(super) fn find_on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for name in names {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if is_executable(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Installs `requirement` (`name==version`) from PyPI into the virtualenv
/// `venv`, creating it with `python` first if needed.
pub(super) fn pip_install(
    python: &Path,
    venv: &Path,
    requirement: &str,
) -> Result<(), super::BuildError> {
    if !is_executable(&venv.join("bin").join("python")) {
        super::run(
            &format!("creating the virtualenv {}", venv.display()),
            std::process::Command::new(python)
                .args(["-m", "venv"])
                .arg(venv),
        )?;
    }
    super::run(
        &format!("pip install {requirement}"),
        std::process::Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(requirement),
    )
}
