//! A schema registry client (Confluent's REST API; Apicurio's `ccompat/v7`
//! serves it too): schemas by id, kept for good, and output schemas
//! registered under their subject with the registry's compatibility check.
//!
//! The host's own configuration says where the registry is and how to log
//! in (`--schema-registry`, `--schema-registry-credentials`,
//! `--schema-registry-ca`); a manifest never does. Under a fleet, each
//! tenant reaches only the subjects in its namespace ([`RegistrySource`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Deserialize;

use super::{FormatError, Parsed, SchemaKind, SchemaSource, SetupError};

/// How long one request to the registry may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the registry is and how to reach it.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Base URL, such as `https://registry:8443/apis/ccompat/v7`.
    pub url: String,
    /// A file whose first line is `username:password` (HTTP basic
    /// authentication).
    pub credentials: Option<PathBuf>,
    /// PEM certificates to trust for the registry's TLS, beside the
    /// system's roots.
    pub ca_cert: Option<PathBuf>,
}

/// Why the registry did not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    /// The configuration cannot be used.
    #[error("schema registry configuration: {0}")]
    Config(String),
    /// The registry could not be reached or failed.
    #[error("schema registry {url}: {message}")]
    Unavailable {
        /// The request.
        url: String,
        /// What happened.
        message: String,
    },
    /// The registry has no such schema or subject.
    #[error("not found in the schema registry: {0}")]
    NotFound(String),
    /// The schema is not compatible with the subject's earlier versions.
    #[error(
        "the schema registry refused the schema as incompatible with subject {subject:?}'s \
         earlier versions: {message} (make the change compatible, e.g. give a new field a \
         default, or deploy under another output topic)"
    )]
    Incompatible {
        /// The subject.
        subject: String,
        /// The registry's message.
        message: String,
    },
    /// The registry refused the schema itself.
    #[error("the schema registry refused the schema for {subject:?}: {message}")]
    Invalid {
        /// The subject.
        subject: String,
        /// The registry's message.
        message: String,
    },
}

/// A schema registry.
pub struct Registry {
    config: RegistryConfig,
    base: String,
    auth: Option<(String, String)>,
    /// Made on first use, on the thread that uses it (reqwest's blocking
    /// client cannot be made inside an async runtime).
    client: OnceLock<Result<reqwest::blocking::Client, String>>,
    /// How long one request may take.
    timeout: Duration,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("url", &self.base).finish()
    }
}

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<String>,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    #[serde(default)]
    error_code: Option<i64>,
    #[serde(default)]
    message: Option<String>,
}

impl Registry {
    /// A registry client; reads the credentials file now, so a bad one
    /// stops the host at its start.
    pub fn new(config: RegistryConfig) -> Result<Self, RegistryError> {
        let base = config.url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(RegistryError::Config(format!(
                "--schema-registry {base:?} is not an http:// or https:// URL"
            )));
        }
        let auth = match &config.credentials {
            Some(path) => Some(read_credentials(path)?),
            None => None,
        };
        if let Some(ca) = &config.ca_cert {
            std::fs::metadata(ca).map_err(|e| {
                RegistryError::Config(format!("--schema-registry-ca {}: {e}", ca.display()))
            })?;
        }
        Ok(Self {
            config,
            base,
            auth,
            client: OnceLock::new(),
            timeout: REQUEST_TIMEOUT,
        })
    }

    /// The same, giving a request `timeout` instead of 10 s.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    fn client(&self) -> Result<&reqwest::blocking::Client, RegistryError> {
        self.client
            .get_or_init(|| {
                let mut b = reqwest::blocking::Client::builder()
                    .timeout(self.timeout)
                    .connect_timeout(self.timeout.min(Duration::from_secs(5)));
                if let Some(ca) = &self.config.ca_cert {
                    let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
                    for cert in reqwest::Certificate::from_pem_bundle(&pem)
                        .map_err(|e| format!("{}: not PEM certificates: {e}", ca.display()))?
                    {
                        b = b.add_root_certificate(cert);
                    }
                }
                b.build().map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| RegistryError::Config(e.clone()))
    }

    fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, Vec<u8>), RegistryError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.client()?.request(method, &url).header(
            reqwest::header::ACCEPT,
            "application/vnd.schemaregistry.v1+json, application/json",
        );
        if let Some((user, password)) = &self.auth {
            req = req.basic_auth(user, Some(password));
        }
        if let Some(body) = body {
            req = req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/vnd.schemaregistry.v1+json",
                )
                .body(body.to_string());
        }
        let unavailable = |message: String| RegistryError::Unavailable {
            url: url.clone(),
            message,
        };
        let resp = req
            .send()
            .map_err(|e| unavailable(crate::types::error_chain(&e)))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .map_err(|e| unavailable(crate::types::error_chain(&e)))?;
        match status {
            401 | 403 => Err(unavailable(format!(
                "HTTP {status}: the registry refused this host's credentials \
                 (--schema-registry-credentials)"
            ))),
            500.. => Err(unavailable(format!(
                "HTTP {status}: {}",
                message_of(&bytes)
            ))),
            _ => Ok((status, bytes.to_vec())),
        }
    }

    /// The schema with this id: its text and type (`AVRO` when the
    /// registry names none).
    pub fn schema_by_id(&self, id: u32) -> Result<(String, String), RegistryError> {
        let (status, body) =
            self.send(reqwest::Method::GET, &format!("/schemas/ids/{id}"), None)?;
        match status {
            200 => {
                let a: SchemaAnswer = parse(&body, "/schemas/ids")?;
                Ok((a.schema, a.schema_type.unwrap_or_else(|| "AVRO".to_owned())))
            }
            404 => Err(RegistryError::NotFound(format!("schema id {id}"))),
            _ => Err(RegistryError::Unavailable {
                url: format!("{}/schemas/ids/{id}", self.base),
                message: format!("HTTP {status}: {}", message_of(&body)),
            }),
        }
    }

    /// The subjects that hold the schema with this id (from its
    /// versions: `/schemas/ids/{id}/versions`, which every registry with
    /// Confluent's API answers; Apicurio 3.0 answers `.../subjects` empty).
    pub fn subjects_of(&self, id: u32) -> Result<Vec<String>, RegistryError> {
        #[derive(Deserialize)]
        struct SubjectVersion {
            subject: String,
        }
        let path = format!("/schemas/ids/{id}/versions");
        let (status, body) = self.send(reqwest::Method::GET, &path, None)?;
        match status {
            200 => Ok(parse::<Vec<SubjectVersion>>(&body, &path)?
                .into_iter()
                .map(|v| v.subject)
                .collect()),
            404 => Err(RegistryError::NotFound(format!("schema id {id}"))),
            _ => Err(RegistryError::Unavailable {
                url: format!("{}{path}", self.base),
                message: format!("HTTP {status}: {}", message_of(&body)),
            }),
        }
    }

    /// Registers an Avro schema under `subject` (or finds it there) and
    /// returns its id; the registry checks it against the subject's
    /// compatibility setting first.
    pub fn register(&self, subject: &str, text: &str) -> Result<u32, RegistryError> {
        self.register_kind(subject, text, SchemaKind::Avro)
    }

    /// [`Registry::register`], for a schema of `kind`.
    pub fn register_kind(
        &self,
        subject: &str,
        text: &str,
        kind: SchemaKind,
    ) -> Result<u32, RegistryError> {
        let path = format!("/subjects/{subject}/versions");
        let body = serde_json::json!({ "schema": text, "schemaType": kind.api_name() });
        let (status, answer) = self.send(reqwest::Method::POST, &path, Some(body))?;
        match status {
            200 => Ok(parse::<IdAnswer>(&answer, &path)?.id),
            409 => Err(RegistryError::Incompatible {
                subject: subject.to_owned(),
                message: message_of(&answer),
            }),
            400 | 422 => Err(RegistryError::Invalid {
                subject: subject.to_owned(),
                message: message_of(&answer),
            }),
            _ => Err(RegistryError::Unavailable {
                url: format!("{}{path}", self.base),
                message: format!("HTTP {status}: {}", message_of(&answer)),
            }),
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, RegistryError> {
    serde_json::from_slice(body).map_err(|e| RegistryError::Unavailable {
        url: what.to_owned(),
        message: format!("an answer that is not the registry API's: {e}"),
    })
}

/// The registry's error message (`{"error_code": .., "message": ..}`), or
/// the body's start.
fn message_of(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(ErrorAnswer {
            message: Some(m),
            error_code,
        }) => match error_code {
            Some(code) => format!("{m} (error {code})"),
            None => m,
        },
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            text[..text.floor_char_boundary(300)].to_owned()
        }
    }
}

fn read_credentials(path: &Path) -> Result<(String, String), RegistryError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        RegistryError::Config(format!(
            "--schema-registry-credentials {}: {e}",
            path.display()
        ))
    })?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_default();
    match line.split_once(':') {
        Some((user, password)) if !user.is_empty() => Ok((user.to_owned(), password.to_owned())),
        _ => Err(RegistryError::Config(format!(
            "--schema-registry-credentials {}: the first line must be `username:password`",
            path.display()
        ))),
    }
}

/// One deployment's view of the registry: with `namespace` set (a fleet
/// tenant's topic prefix), only schemas held by a subject that starts with
/// it are read, and outputs register only under such subjects.
pub struct RegistrySource {
    registry: Arc<Registry>,
    namespace: Option<String>,
}

impl RegistrySource {
    /// A view limited to `namespace`'s subjects (`None`: every subject).
    pub fn new(registry: Arc<Registry>, namespace: Option<String>) -> Self {
        Self {
            registry,
            namespace,
        }
    }
}

impl SchemaSource for RegistrySource {
    fn schema(&self, id: u32) -> Result<Arc<Parsed>, FormatError> {
        let lookup = |e: RegistryError| match e {
            RegistryError::NotFound(_) => {
                FormatError::Invalid(format!("schema id {id} is not in the schema registry"))
            }
            other => FormatError::Unavailable(other.to_string()),
        };
        if let Some(ns) = &self.namespace {
            let subjects = self.registry.subjects_of(id).map_err(lookup)?;
            if !subjects.iter().any(|s| s.starts_with(ns.as_str())) {
                return Err(FormatError::Invalid(format!(
                    "schema id {id} belongs to no subject of this tenant (its subjects start \
                     with {ns:?}): a value may only name its own tenant's schemas"
                )));
            }
        }
        let (text, kind) = self.registry.schema_by_id(id).map_err(lookup)?;
        let kind = match kind.to_ascii_uppercase().as_str() {
            "AVRO" => SchemaKind::Avro,
            "JSON" => SchemaKind::Json,
            "PROTOBUF" => SchemaKind::Protobuf,
            other => {
                return Err(FormatError::Invalid(format!(
                    "schema id {id} is a {other} schema, which this host does not read yet"
                )));
            }
        };
        Parsed::parse(kind, &text)
            .map(Arc::new)
            .map_err(|e| FormatError::Invalid(format!("schema id {id}: {e}")))
    }

    fn id_of(&self, subject: &str, text: &str, kind: SchemaKind) -> Result<u32, SetupError> {
        if let Some(ns) = &self.namespace
            && !subject.starts_with(ns.as_str())
        {
            return Err(SetupError::Registry {
                key: subject.to_owned(),
                source: RegistryError::Config(format!(
                    "subject {subject:?} is outside this tenant's namespace {ns:?}"
                )),
            });
        }
        self.registry
            .register_kind(subject, text, kind)
            .map_err(|source| SetupError::Registry {
                key: format!("subject {subject:?}"),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_one_line_and_a_bad_file_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "# the registry\nonceflow:s3cr:et\n").unwrap();
        assert_eq!(
            read_credentials(&good).unwrap(),
            ("onceflow".to_owned(), "s3cr:et".to_owned())
        );
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "just-a-token\n").unwrap();
        let e = read_credentials(&bad).unwrap_err().to_string();
        assert!(e.contains("username:password"), "{e}");
    }

    #[test]
    fn the_registrys_message_is_kept() {
        assert_eq!(
            message_of(
                br#"{"error_code":409,"message":"Schema being registered is incompatible"}"#
            ),
            "Schema being registered is incompatible (error 409)"
        );
        assert_eq!(message_of(b"  plain  "), "plain");
    }

    #[test]
    fn a_registry_that_does_not_answer_is_given_up_on_in_time() {
        // Accepts connections and never answers, as a stopped process does
        // (the kernel completes the handshake).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let timeout = Duration::from_millis(300);
        let registry = Registry::new(RegistryConfig {
            url,
            credentials: None,
            ca_cert: None,
        })
        .unwrap()
        .with_timeout(timeout);
        let started = std::time::Instant::now();
        let e = registry.schema_by_id(1).unwrap_err();
        assert!(matches!(e, RegistryError::Unavailable { .. }), "{e}");
        assert!(started.elapsed() >= timeout, "{e}");
        drop(listener);
    }
}
