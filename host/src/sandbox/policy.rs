//! What a processor may import, decided from the component's bytes before
//! anything is compiled or run.
//!
//! The whole policy is the table in [`classify_import`]: the Onceflow
//! interfaces, and the WASI 0.2 interfaces that common language runtimes
//! import even when the program never uses them, each granted in a form that
//! cannot touch the outside world. Everything else is refused, `wasi:http`
//! by name.

use wasmparser::{Encoding, Parser, Payload};

/// What a component imports and exports, read from its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentInterface {
    /// Top-level import names, e.g. `onceflow:processor/state@0.1.0`.
    pub imports: Vec<String>,
    /// Top-level export names, e.g. `process`.
    pub exports: Vec<String>,
}

/// How the sandbox provides an allowed import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// An Onceflow interface: state, output, log, context.
    Onceflow,
    /// WASI plumbing with no outside effect (streams, polling, errors).
    Plumbing,
    /// `wasi:cli`: no arguments, no environment, stdin closed, stdout and
    /// stderr captured into the host's log.
    Cli,
    /// `wasi:clocks`: the wall clock reads the current record's timestamp;
    /// the monotonic clock advances 1 µs per read.
    DeterministicClock,
    /// `wasi:random`: seeded from the current record's topic, partition and
    /// offset.
    DeterministicRandom,
    /// `wasi:filesystem` with no preopened directory: nothing to open.
    NoFilesystem,
    /// `wasi:sockets`: every address check fails and name lookup is off.
    DenyAllNetwork,
}

impl Grant {
    /// One line for `onceflow validate`.
    pub fn describe(self) -> &'static str {
        match self {
            Grant::Onceflow => "onceflow interface",
            Grant::Plumbing => "WASI plumbing (no outside effect)",
            Grant::Cli => "no args, no env, stdin closed, stdout/stderr to the log",
            Grant::DeterministicClock => "deterministic: the record's timestamp",
            Grant::DeterministicRandom => "deterministic: seeded from the record's coordinates",
            Grant::NoFilesystem => "no preopened directory: no file can be opened",
            Grant::DenyAllNetwork => "deny-all: every connection and lookup fails",
        }
    }
}

/// Why the sandbox refuses a component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The bytes are not a WebAssembly component.
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),
    /// An import is outside the allowlist.
    #[error("import `{import}` is refused: {reason}")]
    ForbiddenImport {
        /// The import's full name.
        import: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A required export is missing.
    #[error(
        "the component does not export `{0}`: build it against the world onceflow:processor/processor@0.2.0"
    )]
    MissingExport(String),
}

/// The exports the host calls. `process` is required; `init` and `punctuate`
/// are called when present.
pub const REQUIRED_EXPORTS: &[&str] = &["process"];

/// Reads the top-level imports and exports of a component without compiling
/// it.
pub fn inspect(bytes: &[u8]) -> Result<ComponentInterface, PolicyError> {
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    // Nested modules and components appear inline; only depth 1 is the
    // component itself.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| PolicyError::NotAComponent(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } => {
                depth += 1;
                if depth == 1 && encoding != Encoding::Component {
                    return Err(PolicyError::NotAComponent(
                        "this is a core WebAssembly module; turn it into a component with \
                         `onceflow build` (or `wasm-tools component new`)"
                            .to_owned(),
                    ));
                }
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| PolicyError::NotAComponent(e.to_string()))?;
                    // A world's `use` of types becomes type imports (`record`,
                    // `process-error`): type equalities, not capabilities.
                    if matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        continue;
                    }
                    imports.push(import.name.full_name().into_owned());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| PolicyError::NotAComponent(e.to_string()))?;
                    exports.push(export.name.full_name().into_owned());
                }
            }
            _ => {}
        }
    }
    if depth != 0 || (imports.is_empty() && exports.is_empty() && bytes.len() < 8) {
        return Err(PolicyError::NotAComponent("truncated file".to_owned()));
    }
    Ok(ComponentInterface { imports, exports })
}

impl ComponentInterface {
    /// Checks every import against the allowlist and the required exports;
    /// returns the grant of each import, in order.
    pub fn check(&self) -> Result<Vec<(String, Grant)>, PolicyError> {
        let grants = self
            .imports
            .iter()
            .map(|name| {
                classify_import(name)
                    .map(|grant| (name.clone(), grant))
                    .map_err(|reason| PolicyError::ForbiddenImport {
                        import: name.clone(),
                        reason,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for export in REQUIRED_EXPORTS {
            if !self.exports.iter().any(|e| e == export) {
                return Err(PolicyError::MissingExport((*export).to_owned()));
            }
        }
        Ok(grants)
    }
}

/// The allowlist. Returns how an import is granted, or why it is refused.
pub fn classify_import(name: &str) -> Result<Grant, String> {
    let (path, version) = match name.split_once('@') {
        Some((p, v)) => (p, Some(v)),
        None => (name, None),
    };
    let Some((package, interface)) = path.split_once('/') else {
        return Err(
            "a bare import (not a WIT interface) cannot be provided by the host".to_owned(),
        );
    };
    if package == "onceflow:processor" {
        return match version {
            Some(v) if v.starts_with("0.1.") => match interface {
                "types" | "state" | "output" | "log" | "context" => Ok(Grant::Onceflow),
                _ => Err(format!(
                    "onceflow:processor@{v} has no interface `{interface}`"
                )),
            },
            Some(v) if v.starts_with("0.2.") => match interface {
                "types" | "state" | "output" | "log" | "context" | "windows" => Ok(Grant::Onceflow),
                _ => Err(format!(
                    "onceflow:processor@{v} has no interface `{interface}`"
                )),
            },
            _ => Err(format!(
                "this host implements onceflow:processor@0.2.x (and runs 0.1.x), not {}: \
                 rebuild with a matching SDK or upgrade the host",
                version.unwrap_or("an unversioned package")
            )),
        };
    }
    let Some(wasi) = package.strip_prefix("wasi:") else {
        return Err(format!(
            "package `{package}` is not provided by the Onceflow sandbox: a processor may import \
             only onceflow:processor and a sandboxed subset of WASI 0.2"
        ));
    };
    if wasi == "http" {
        return Err(
            "the sandbox never links wasi:http: a processor cannot make network \
                    requests (its result would change on retry); bring the data in through a \
                    Kafka topic instead"
                .to_owned(),
        );
    }
    if !version.is_some_and(|v| v.starts_with("0.2.")) {
        return Err(format!(
            "only WASI 0.2 is supported, not {}: build for wasm32-wasip2 or WASI 0.2",
            version.unwrap_or("an unversioned WASI")
        ));
    }
    let grant = match (wasi, interface) {
        ("io", "error" | "poll" | "streams") => Grant::Plumbing,
        (
            "cli",
            "environment" | "exit" | "stdin" | "stdout" | "stderr" | "terminal-input"
            | "terminal-output" | "terminal-stdin" | "terminal-stdout" | "terminal-stderr",
        ) => Grant::Cli,
        ("clocks", "wall-clock" | "monotonic-clock") => Grant::DeterministicClock,
        ("random", "random" | "insecure" | "insecure-seed") => Grant::DeterministicRandom,
        ("filesystem", "types" | "preopens") => Grant::NoFilesystem,
        (
            "sockets",
            "network" | "instance-network" | "tcp" | "tcp-create-socket" | "udp"
            | "udp-create-socket" | "ip-name-lookup",
        ) => Grant::DenyAllNetwork,
        _ => {
            return Err(format!(
                "wasi:{wasi}/{interface} is not in the sandbox's allowlist (wasi:io, wasi:cli, \
                 wasi:clocks, wasi:random, wasi:filesystem without directories, wasi:sockets \
                 deny-all)"
            ));
        }
    };
    Ok(grant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_table() {
        let allowed = [
            ("onceflow:processor/state@0.1.0", Grant::Onceflow),
            ("onceflow:processor/types@0.1.0", Grant::Onceflow),
            ("onceflow:processor/windows@0.2.0", Grant::Onceflow),
            ("onceflow:processor/context@0.2.0", Grant::Onceflow),
            ("wasi:io/streams@0.2.3", Grant::Plumbing),
            ("wasi:cli/environment@0.2.0", Grant::Cli),
            ("wasi:clocks/wall-clock@0.2.6", Grant::DeterministicClock),
            ("wasi:random/random@0.2.0", Grant::DeterministicRandom),
            ("wasi:filesystem/preopens@0.2.0", Grant::NoFilesystem),
            ("wasi:sockets/tcp@0.2.0", Grant::DenyAllNetwork),
            ("wasi:sockets/ip-name-lookup@0.2.0", Grant::DenyAllNetwork),
        ];
        for (name, grant) in allowed {
            assert_eq!(classify_import(name), Ok(grant), "{name}");
        }
        let refused = [
            ("wasi:http/outgoing-handler@0.2.0", "never links wasi:http"),
            ("wasi:http/types@0.2.0", "never links wasi:http"),
            ("wasi:keyvalue/store@0.2.0", "allowlist"),
            ("wasi:cli/run@0.2.0", "allowlist"),
            ("wasi:clocks/wall-clock@0.3.0", "only WASI 0.2"),
            ("onceflow:processor/state@0.3.0", "0.2.x"),
            ("onceflow:processor/windows@0.1.0", "no interface"),
            ("onceflow:processor/admin@0.1.0", "no interface"),
            ("acme:evil/exfiltrate", "not provided"),
            ("env", "bare import"),
        ];
        for (name, needle) in refused {
            let reason = classify_import(name).unwrap_err();
            assert!(reason.contains(needle), "{name}: {reason}");
        }
    }

    #[test]
    fn inspect_reads_top_level_imports_and_refuses_http() {
        let bytes = wat::parse_str(
            r#"(component
                (import "wasi:http/outgoing-handler@0.2.0" (instance))
                (core module (func (export "x")))
            )"#,
        )
        .unwrap();
        let iface = inspect(&bytes).unwrap();
        assert_eq!(iface.imports, ["wasi:http/outgoing-handler@0.2.0"]);
        let err = iface.check().unwrap_err().to_string();
        assert!(err.contains("wasi:http/outgoing-handler@0.2.0"), "{err}");
        assert!(err.contains("never links wasi:http"), "{err}");
    }

    #[test]
    fn core_modules_and_garbage_are_not_components() {
        let module = wat::parse_str("(module)").unwrap();
        assert!(
            matches!(inspect(&module), Err(PolicyError::NotAComponent(m)) if m.contains("core WebAssembly module"))
        );
        assert!(inspect(b"not wasm at all").is_err());
        assert!(inspect(b"").is_err());
    }

    #[test]
    fn process_export_is_required() {
        let iface = ComponentInterface {
            imports: vec![],
            exports: vec!["init".to_owned()],
        };
        assert_eq!(
            iface.check().unwrap_err(),
            PolicyError::MissingExport("process".to_owned())
        );
    }
}
