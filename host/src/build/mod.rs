//! `onceflow build`: from a processor's source to a checked component, as
//! `rpk transform build` does, for every language the manifest names in
//! `[build] language`:
//!
//! | language | toolchain (installed into the toolchain cache on first use) |
//! |---|---|
//! | `rust` | cargo + the `wasm32-unknown-unknown` target; `wit-component` in-process |
//! | `js`, `ts` | ComponentizeJS from npm (`ts`: `tsc` from npm first) |
//! | `python` | componentize-py from PyPI, in a virtualenv |
//! | `go` | the machine's Go (1.24+), `wit-bindgen go`; `wit-component` in-process with the WASI preview1 adapter |
//! | `c` | Debian clang + wasi-libc, `wit-bindgen c`; `wit-component` in-process |
//!
//! Toolchains live under `$ONCEFLOW_TOOLCHAINS` (default
//! `$ONCEFLOW_CACHE/toolchains`, i.e. `~/.cache/onceflow/toolchains`), never
//! in the checkout. Components built from another language are cached by a
//! digest of their sources, the WIT and the toolchain version under
//! `$ONCEFLOW_CACHE/guests`, so an unchanged processor is not rebuilt (a
//! ComponentizeJS or componentize-py build takes 5-20 s).

mod c;
mod go;
mod js;
mod python;
mod rust;
mod toolchain;
mod ts_types;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::manifest::{Language, Manifest};
use crate::sandbox::policy;

pub use toolchain::toolchains_dir;

/// The WIT every processor is built against (the host's own contract).
pub const PROCESSOR_WIT: &str = include_str!("../../../wit/processor.wit");

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A tool is missing.
    #[error("`{tool}` is not installed or not on PATH: {hint}")]
    MissingTool {
        /// The tool.
        tool: &'static str,
        /// How to get it.
        hint: &'static str,
    },
    /// A build step failed.
    #[error("{step} failed: {message}")]
    Step {
        /// Which step.
        step: String,
        /// What it said.
        message: String,
    },
    /// The built component breaks the sandbox policy.
    #[error("the built component is refused by the sandbox")]
    Policy(#[from] policy::PolicyError),
}

impl BuildError {
    fn step(step: impl Into<String>, message: impl ToString) -> Self {
        BuildError::Step {
            step: step.into(),
            message: message.to_string(),
        }
    }
}

/// What a build produced.
#[derive(Debug, Clone)]
pub struct BuildOutput {
    /// The component file.
    pub component: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its imports.
    pub imports: Vec<String>,
}

/// Builds the component a manifest describes and writes it to the
/// manifest's component path.
pub fn build(manifest: &Manifest) -> Result<BuildOutput, BuildError> {
    let language = manifest.build.language;
    if language == Language::Rust {
        // cargo keeps its own cache.
        return rust::build(manifest);
    }
    let toolchain = match language {
        Language::Rust => unreachable!("handled above"),
        Language::Js | Language::Ts => js::ensure_toolchain(language)?,
        Language::Python => python::ensure_toolchain()?,
        Language::Go => go::ensure_toolchain()?,
        Language::C => c::ensure_toolchain()?,
    };
    let digest = source_digest(manifest, &toolchain.version)?;
    let cached = guest_cache_dir().join(format!("{}-{digest}.wasm", manifest.name));
    if let Ok(component) = std::fs::read(&cached) {
        eprintln!(
            "{} ({}) is unchanged: using the cached build {}",
            manifest.name,
            language.name(),
            cached.display()
        );
        return write_component(manifest, component);
    }
    let work = work_dir(manifest)?;
    eprintln!(
        "building {} ({}, {})",
        manifest.name,
        language.name(),
        toolchain.version
    );
    let component = match language {
        Language::Rust => unreachable!("handled above"),
        Language::Js | Language::Ts => js::build(manifest, &toolchain, &work)?,
        Language::Python => python::build(manifest, &toolchain, &work)?,
        Language::Go => go::build(manifest, &toolchain, &work)?,
        Language::C => c::build(manifest, &toolchain, &work)?,
    };
    let out = write_component(manifest, component.clone())?;
    // A failed cache write only costs a rebuild next time.
    if std::fs::create_dir_all(guest_cache_dir()).is_ok() {
        let partial = cached.with_extension("partial");
        if std::fs::write(&partial, &component).is_ok() {
            let _ = std::fs::rename(&partial, &cached);
        }
    }
    Ok(out)
}

/// A toolchain ready to use.
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// What goes into the build cache's digest: tool names and versions.
    pub version: String,
    /// The tools' paths, by role.
    pub tools: Vec<(&'static str, PathBuf)>,
}

impl Toolchain {
    fn tool(&self, role: &str) -> &Path {
        self.tools
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, p)| p.as_path())
            .unwrap_or_else(|| Path::new(""))
    }
}

/// `$ONCEFLOW_CACHE/guests`: built components by source digest.
fn guest_cache_dir() -> PathBuf {
    toolchain::cache_root().join("guests")
}

/// A scratch directory for one build, next to the component
/// (`target/onceflow/<name>.build`), recreated empty.
fn work_dir(manifest: &Manifest) -> Result<PathBuf, BuildError> {
    let component = manifest.component_path();
    let dir = component
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(format!("{}.build", manifest.name));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| BuildError::step(format!("cleaning {}", dir.display()), e))?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| BuildError::step(format!("creating {}", dir.display()), e))?;
    // Absolute: the tools run in other directories.
    let dir = dir
        .canonicalize()
        .map_err(|e| BuildError::step(format!("resolving {}", dir.display()), e))?;
    // The WIT, for the external tools.
    let wit = dir.join("wit");
    std::fs::create_dir_all(&wit)
        .and_then(|()| std::fs::write(wit.join("processor.wit"), PROCESSOR_WIT))
        .map_err(|e| BuildError::step(format!("writing {}", wit.display()), e))?;
    Ok(dir)
}

/// Directories never part of a processor's sources.
const SKIPPED_DIRS: &[&str] = &["target", "node_modules", "__pycache__", ".git"];

/// The files under `dir`, recursively, sorted, without [`SKIPPED_DIRS`].
fn source_files(dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| BuildError::step(format!("reading {}", dir.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| BuildError::step(format!("reading {}", dir.display()), e))?;
            let path = entry.path();
            let name = entry.file_name();
            let file_type = entry
                .file_type()
                .map_err(|e| BuildError::step(format!("reading {}", path.display()), e))?;
            if file_type.is_dir() {
                if !SKIPPED_DIRS.iter().any(|s| name == *s) {
                    pending.push(path);
                }
            } else if file_type.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// A digest of everything a non-Rust build depends on: the language and
/// toolchain versions, the WIT, the manifest's `[build]` section and every
/// source file (paths and contents), and the SDK layer `onceflow build`
/// adds to the sources.
fn source_digest(manifest: &Manifest, toolchain_version: &str) -> Result<String, BuildError> {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    field(manifest.build.language.name().as_bytes());
    field(toolchain_version.as_bytes());
    field(PROCESSOR_WIT.as_bytes());
    field(format!("{:?}", manifest.build).as_bytes());
    field(env!("CARGO_PKG_VERSION").as_bytes());
    // JS ahead-of-time compilation changes the output.
    field(
        std::env::var("ONCEFLOW_WEVAL_BIN")
            .unwrap_or_default()
            .as_bytes(),
    );
    for text in embedded_sdk(manifest.build.language) {
        field(text.as_bytes());
    }
    let source = manifest.source_dir();
    let root = if source.is_file() {
        parent_dir(&source)
    } else {
        source
    };
    for file in source_files(&root)? {
        let relative = file.strip_prefix(&root).unwrap_or(&file);
        field(relative.to_string_lossy().as_bytes());
        let bytes = std::fs::read(&file)
            .map_err(|e| BuildError::step(format!("reading {}", file.display()), e))?;
        field(&bytes);
    }
    Ok(hex::encode(&hash.finalize()[..12]))
}

/// The SDK files `onceflow build` writes next to a language's sources.
fn embedded_sdk(language: Language) -> Vec<&'static str> {
    match language {
        Language::Rust => Vec::new(),
        Language::Js => vec![js::SDK, js::GLUE],
        Language::Ts => vec![js::SDK, js::SDK_TYPES, js::GLUE],
        Language::Python => vec![python::SDK],
        Language::Go => go::SDK.iter().map(|(_, text)| *text).collect(),
        Language::C => vec![c::SDK_HEADER, c::SDK_SOURCE],
    }
}

/// The directory holding `file` (`.` for a bare file name).
fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Runs a build command, its output going to our stderr; fails with the
/// step's name.
/// The processor's source files ending in `.ext`; an error naming the
/// directory and the manifest key when there is none.
fn sources_with_extension(
    manifest: &Manifest,
    ext: &str,
    language: &str,
) -> Result<Vec<PathBuf>, BuildError> {
    let source = manifest.source_dir();
    let sources: Vec<PathBuf> = source_files(&source)?
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == ext))
        .collect();
    if sources.is_empty() {
        return Err(BuildError::step(
            format!("finding the {language} sources"),
            format!(
                "no .{ext} file in {}: set [build] source in {} to the processor's directory",
                source.display(),
                manifest.path.display()
            ),
        ));
    }
    Ok(sources)
}

/// `wit-bindgen <language>` for the `processor` world (copied to
/// `work/wit`) into `out`.
fn wit_bindgen(
    toolchain: &Toolchain,
    language: &str,
    work: &Path,
    out: &Path,
) -> Result<(), BuildError> {
    run(
        &format!("wit-bindgen {language}"),
        Command::new(toolchain.tool("wit-bindgen"))
            .arg(language)
            .arg(work.join("wit"))
            .args(["--world", "processor", "--out-dir"])
            .arg(out),
    )
}

fn run(step: &str, command: &mut Command) -> Result<(), BuildError> {
    tracing::debug!(?command, "build step: {step}");
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| BuildError::step(step, format!("could not start {command:?}: {e}")))?;
    if !status.success() {
        return Err(BuildError::step(
            step,
            format!("{status} (its messages are above)"),
        ));
    }
    Ok(())
}

/// Runs a command and returns its stdout, or None if it cannot run or fails.
fn output_of(command: &mut Command) -> Option<String> {
    let out = command.stdin(Stdio::null()).stderr(Stdio::null()).output();
    match out {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => None,
    }
}

fn read(path: &Path) -> Result<Vec<u8>, BuildError> {
    std::fs::read(path).map_err(|e| BuildError::step(format!("reading {}", path.display()), e))
}

/// Makes a component from a core module built against the `processor` world:
/// the module must carry the world's `component-type` section (the
/// generated bindings add it) unless `embed_world` is set, in which case it
/// is embedded here. WASI preview1 imports are adapted to WASI 0.2 with
/// wasmtime's adapter.
fn componentize_core_module(module: &[u8], embed_world: bool) -> Result<Vec<u8>, BuildError> {
    let mut module = module.to_vec();
    if embed_world {
        let mut resolve = wit_parser::Resolve::default();
        let package = resolve
            .push_str("processor.wit", PROCESSOR_WIT)
            .map_err(|e| BuildError::step("reading the processor WIT", format!("{e:#}")))?;
        let world = resolve
            .select_world(&[package], Some("processor"))
            .map_err(|e| BuildError::step("reading the processor WIT", format!("{e:#}")))?;
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            wit_component::StringEncoding::UTF8,
            false,
        )
        .map_err(|e| BuildError::step("embedding the WIT world", format!("{e:#}")))?;
    }
    let mut encoder = wit_component::ComponentEncoder::default();
    encoder
        .validate(true)
        .module(&module)
        .map_err(|e| BuildError::step("turning the module into a component", format!("{e:#}")))?;
    if imports_preview1(&module) {
        encoder
            .adapter(
                "wasi_snapshot_preview1",
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
            .map_err(|e| BuildError::step("loading the WASI preview1 adapter", format!("{e:#}")))?;
    }
    encoder
        .encode()
        .map_err(|e| BuildError::step("turning the module into a component", format!("{e:#}")))
}

/// Whether a core module imports WASI preview1 functions.
fn imports_preview1(module: &[u8]) -> bool {
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let Ok(wasmparser::Payload::ImportSection(reader)) = payload {
            for import in reader.into_imports().flatten() {
                if import.module == "wasi_snapshot_preview1" {
                    return true;
                }
            }
        }
    }
    false
}

/// Checks the component against the sandbox policy and writes it.
fn write_component(manifest: &Manifest, component: Vec<u8>) -> Result<BuildOutput, BuildError> {
    let interface = policy::inspect(&component)?;
    interface.check()?;
    let path = manifest.component_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| BuildError::step(format!("creating {}", dir.display()), e))?;
    }
    std::fs::write(&path, &component)
        .map_err(|e| BuildError::step(format!("writing {}", path.display()), e))?;
    Ok(BuildOutput {
        component: path,
        bytes: component.len() as u64,
        imports: interface.imports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_files_skip_build_outputs_and_are_sorted() {
        let dir = tempfile_dir();
        std::fs::create_dir_all(dir.join("target/onceflow")).unwrap();
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("target/onceflow/x.wasm"), b"x").unwrap();
        std::fs::write(dir.join("src/b.go"), b"b").unwrap();
        std::fs::write(dir.join("a.go"), b"a").unwrap();
        let files = source_files(&dir).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.strip_prefix(&dir).unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.go", "src/b.go"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "onceflow-build-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_module_embedded_with_the_world_becomes_a_component() {
        // The smallest core module that implements the world's exports with
        // the canonical ABI: enough for wit-component to type-check.
        let wat = r#"(module
            (memory (export "memory") 1)
            (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 8)
            (func (export "init") (param i32 i32) (result i32) i32.const 0)
            (func (export "process") (param i32 i32) (result i32) i32.const 0)
            (func (export "punctuate") (param i64) (result i32) i32.const 0)
        )"#;
        let module = wat::parse_str(wat).unwrap();
        assert!(!imports_preview1(&module));
        let component = componentize_core_module(&module, true).unwrap();
        assert!(wasmparser::Parser::is_component(&component));
        let interface = policy::inspect(&component).unwrap();
        // Only the types the exports use; no WASI, no adapter.
        assert_eq!(interface.imports, ["onceflow:processor/types@0.2.0"]);
    }
}
