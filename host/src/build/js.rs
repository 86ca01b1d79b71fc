//! JavaScript and TypeScript: ComponentizeJS (SpiderMonkey through
//! StarlingMonkey, pre-initialized with Wizer) from npm.
//!
//! `js`: `[build] source` is the ES module (a file, or a directory holding
//! `index.js`). `ts`: the same with `index.ts`; it is compiled with `tsc`
//! first, against declarations of the `onceflow:processor/*` modules
//! generated from the WIT (see [`super::ts_types`]).
//!
//! Every WASI feature of the engine is disabled (`--disable stdio random
//! clocks http fetch-event`): the component imports `onceflow:processor`
//! and nothing else. ComponentizeJS runs through `js_glue.mjs`, which
//! rewrites the import glue it generates (the per-record calls cost half
//! as much fuel; see the script's header and docs/languages.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::toolchain::{find_on_path, toolchains_dir};
use super::{BuildError, Toolchain, output_of, read, run};
use crate::manifest::{Language, Manifest};

/// The ComponentizeJS release `onceflow build` installs.
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";
/// The preview2-shim release componentize-js needs at run time.
pub const PREVIEW2_SHIM_VERSION: &str = "0.17.9";
/// The TypeScript compiler release for `ts`.
pub const TYPESCRIPT_VERSION: &str = "5.9.3";

/// The JavaScript SDK layer, written next to the processor's modules.
pub(super) const SDK: &str = include_str!("../../../guest-sdk/js/onceflow.js");
/// Its TypeScript declarations.
pub(super) const SDK_TYPES: &str = include_str!("../../../guest-sdk/js/onceflow.d.ts");
/// The script that runs ComponentizeJS with leaner import glue (see its
/// header); part of the build digest.
pub(super) const GLUE: &str = include_str!("js_glue.mjs");

fn prefix() -> PathBuf {
    toolchains_dir().join("js")
}

fn installed_version(prefix: &Path, package: &str) -> Option<String> {
    let manifest = prefix
        .join("node_modules")
        .join(package)
        .join("package.json");
    let text = std::fs::read_to_string(manifest).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("version")?.as_str().map(str::to_owned)
}

/// Installs ComponentizeJS (and for `ts` TypeScript) into
/// `<toolchains>/js` with npm if missing.
pub(super) fn ensure_toolchain(language: Language) -> Result<Toolchain, BuildError> {
    let node = find_on_path(&["node"]).ok_or(BuildError::MissingTool {
        tool: "node",
        hint: "install Node.js 18 or later (apt-get install nodejs npm)",
    })?;
    let prefix = prefix();
    let mut wanted = vec![
        ("@bytecodealliance/componentize-js", COMPONENTIZE_JS_VERSION),
        // componentize-js 0.23 imports it at run time but lists it only as a
        // devDependency: without it, any later npm install may prune it
        // ("Cannot find package '@bytecodealliance/preview2-shim'").
        ("@bytecodealliance/preview2-shim", PREVIEW2_SHIM_VERSION),
    ];
    if language == Language::Ts {
        wanted.push(("typescript", TYPESCRIPT_VERSION));
    }
    let all_present = wanted
        .iter()
        .all(|(package, version)| installed_version(&prefix, package).as_deref() == Some(*version));
    if !all_present {
        // All of them in one install: npm prunes what the package.json does
        // not list.
        let missing: Vec<String> = wanted
            .iter()
            .map(|(package, version)| format!("{package}@{version}"))
            .collect();
        let npm = find_on_path(&["npm"]).ok_or(BuildError::MissingTool {
            tool: "npm",
            hint: "install npm (apt-get install npm)",
        })?;
        eprintln!(
            "installing {} into {} (npm, once)",
            missing.join(" "),
            prefix.display()
        );
        std::fs::create_dir_all(&prefix)
            .map_err(|e| BuildError::step(format!("creating {}", prefix.display()), e))?;
        let package_json = prefix.join("package.json");
        if !package_json.exists() {
            std::fs::write(
                &package_json,
                r#"{"name":"onceflow-js-toolchain","private":true}"#,
            )
            .map_err(|e| BuildError::step(format!("writing {}", package_json.display()), e))?;
        }
        run(
            "npm install",
            Command::new(npm)
                .arg("install")
                .arg("--prefix")
                .arg(&prefix)
                .args(["--no-audit", "--no-fund", "--loglevel=error"])
                .args(&missing),
        )?;
    }
    let node_version = output_of(Command::new(&node).arg("--version")).unwrap_or_default();
    let mut version = format!(
        "componentize-js {COMPONENTIZE_JS_VERSION}, node {}",
        node_version.trim()
    );
    if language == Language::Ts {
        version.push_str(&format!(", typescript {TYPESCRIPT_VERSION}"));
    }
    Ok(Toolchain {
        version,
        tools: vec![("node", node), ("prefix", prefix)],
    })
}

/// The entry module: `source` itself when it is a file, else `index.<ext>`
/// in it.
fn entry(manifest: &Manifest, extension: &str) -> Result<PathBuf, BuildError> {
    let source = manifest.source_dir();
    let entry = if source.is_file() {
        source
    } else {
        source.join(format!("index.{extension}"))
    };
    if !entry.is_file() {
        return Err(BuildError::step(
            "finding the entry module",
            format!(
                "{} does not exist: set [build] source in {} to the processor's .{extension} file",
                entry.display(),
                manifest.path.display()
            ),
        ));
    }
    Ok(entry)
}

pub(super) fn build(
    manifest: &Manifest,
    toolchain: &Toolchain,
    work: &Path,
) -> Result<Vec<u8>, BuildError> {
    let node = toolchain.tool("node");
    let prefix = toolchain.tool("prefix");
    let typescript = manifest.build.language == Language::Ts;
    let entry = entry(manifest, if typescript { "ts" } else { "js" })?;
    // The processor's modules with the SDK layer beside them, in the build
    // directory (the sources stay untouched).
    let sources = work.join("src");
    let root = super::parent_dir(&entry);
    let extensions: &[&str] = if typescript {
        &["ts", "mts", "js", "mjs", "json"]
    } else {
        &["js", "mjs", "json"]
    };
    copy_sources(&root, &sources, extensions)?;
    write(&sources.join("onceflow.js"), SDK)?;
    let relative_entry = entry.strip_prefix(&root).unwrap_or(&entry).to_path_buf();
    let module = if typescript {
        write(&sources.join("onceflow.d.ts"), SDK_TYPES)?;
        write(
            &sources.join("onceflow-processor.d.ts"),
            &super::ts_types::declarations(),
        )?;
        let compiled = compile_typescript(node, prefix, &sources, &relative_entry, work)?;
        write(&work.join("js").join("onceflow.js"), SDK)?;
        compiled
    } else {
        sources.join(&relative_entry)
    };
    let out = work.join("component.wasm");
    let driver = work.join("js_glue.mjs");
    write(&driver, GLUE)?;
    let request = work.join("componentize.json");
    // Ahead-of-time compilation with weval when `ONCEFLOW_WEVAL_BIN` names a
    // weval binary: the npm package downloads one from GitHub at build time,
    // which fails offline; `cargo install weval --version 0.5.0 --locked`
    // builds one (slowly). About 25% less fuel per record for the wallet,
    // 3.5 MiB more component (docs/languages.md).
    let weval_bin = std::env::var("ONCEFLOW_WEVAL_BIN").unwrap_or_default();
    write(
        &request,
        &serde_json::json!({
            "componentize": prefix.join("node_modules/@bytecodealliance/componentize-js/src/componentize.js"),
            "source": module,
            "wit": work.join("wit"),
            "out": out,
            "wevalBin": weval_bin,
        })
        .to_string(),
    )?;
    run(
        "componentize-js",
        Command::new(node).arg(&driver).arg(&request),
    )?;
    read(&out)
}

fn write(path: &Path, text: &str) -> Result<(), BuildError> {
    std::fs::write(path, text)
        .map_err(|e| BuildError::step(format!("writing {}", path.display()), e))
}

/// Copies the files with one of `extensions` under `from` to `to`.
fn copy_sources(from: &Path, to: &Path, extensions: &[&str]) -> Result<(), BuildError> {
    std::fs::create_dir_all(to)
        .map_err(|e| BuildError::step(format!("creating {}", to.display()), e))?;
    for file in super::source_files(from)? {
        let wanted = file
            .extension()
            .is_some_and(|e| extensions.iter().any(|x| e == *x));
        if !wanted {
            continue;
        }
        let target = to.join(file.strip_prefix(from).unwrap_or(&file));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| BuildError::step(format!("creating {}", parent.display()), e))?;
        }
        std::fs::copy(&file, &target)
            .map_err(|e| BuildError::step(format!("copying {}", file.display()), e))?;
    }
    Ok(())
}

/// `tsc` on the entry `.ts` file (and what it imports) in `sources`, with
/// the WIT's declarations; returns the compiled entry module.
fn compile_typescript(
    node: &Path,
    prefix: &Path,
    sources: &Path,
    entry: &Path,
    work: &Path,
) -> Result<PathBuf, BuildError> {
    let out_dir = work.join("js");
    let tsc = prefix.join("node_modules/typescript/bin/tsc");
    run(
        "tsc",
        Command::new(node)
            .arg(&tsc)
            .args([
                "--strict",
                "--target",
                "es2022",
                "--module",
                "es2022",
                "--moduleResolution",
                "bundler",
                "--skipLibCheck",
                "--lib",
                "es2022",
                "--outDir",
            ])
            .arg(&out_dir)
            .arg("--rootDir")
            .arg(sources)
            .arg(sources.join(entry))
            .arg(sources.join("onceflow-processor.d.ts")),
    )?;
    Ok(out_dir.join(entry.with_extension("js")))
}
