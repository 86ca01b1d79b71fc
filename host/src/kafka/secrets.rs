//! Secrets among the `-X` properties: read from a file or the environment,
//! never shown by `Debug` (issue 45, item 7; docs/kafka-security.md).

use super::Connection;

/// What [`Connection`]'s `Debug` shows instead of a secret value.
const REDACTED: &str = "[redacted]";

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extra: Vec<(&str, &str)> = self
            .extra_config
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret(k) { REDACTED } else { v }))
            .collect();
        f.debug_struct("Connection")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("extra_config", &extra)
            .finish()
    }
}

/// Whether a librdkafka property's value is a secret, never to be shown in
/// `Debug` or a log. A superset of rdkafka's own `ClientConfig` redaction
/// (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `ssl.truststore.password`, `sasl.oauthbearer.client.secret`) and of the
/// values librdkafka marks sensitive (`ssl.key.pem`, `ssl_key`,
/// `sasl.oauthbearer.config`, the OIDC assertion's private key and
/// passphrase, ...); `sasl.username` and `ssl.*.location` are shown.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "passphrase",
        ".pem",
        "ssl_key",
        "private.key",
        "oauthbearer.config",
    ]
    .iter()
    .any(|part| key.contains(part))
}

/// The environment variable that gives `sasl.password` when neither `-X
/// sasl.password=` nor `-X sasl.password.file=` does (docs/kafka-security.md).
pub const PASSWORD_ENV: &str = "ONCEFLOW_KAFKA_PASSWORD";

/// The properties whose value may be given as `-X <key>.file=PATH` (the
/// file's first line), to keep it out of the process list; given as
/// `-X <key>=value` they work, with a warning. None of `<key>.file` is a
/// librdkafka property.
pub const FILE_SECRETS: &[&str] = &[
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
];

/// A `-X` argument that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not `key=value`.
    #[error("-X {given:?}: expected key=value")]
    NotKeyValue {
        /// The argument.
        given: String,
    },
    /// `-X <key>.file=PATH` names a file that cannot be read.
    #[error(
        "-X {key}.file={}: cannot read it: give a file this user may read, with the {key} on \
         its first line",
        path.display()
    )]
    SecretFile {
        /// The property, e.g. `sasl.password`.
        key: String,
        /// The file.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// `-X <key>.file=PATH` names a file whose first line is empty.
    #[error("-X {key}.file={}: its first line is empty: write the {key} on it", path.display())]
    EmptySecretFile {
        /// The property.
        key: String,
        /// The file.
        path: std::path::PathBuf,
    },
    /// Both `-X <key>=` and `-X <key>.file=`.
    #[error(
        "-X {key}= and -X {key}.file= are both given: give only -X {key}.file= (a value on the \
         command line is visible in the process list)"
    )]
    Twice {
        /// The property.
        key: String,
    },
}

/// The extra librdkafka properties from `-X key=value` arguments, in order
/// (a later one wins, as librdkafka's last `set` does). Secrets come from
/// outside the command line, where `ps` cannot show them:
/// `-X <key>.file=PATH` for a key of [`FILE_SECRETS`] sets `<key>` to the
/// file's first line, as is; `env_password` (the value of [`PASSWORD_ENV`],
/// an empty one ignored) sets `sasl.password` when no `-X` does. A secret
/// given literally still works (it did before), with a warning that names
/// the alternatives.
pub fn extra_config(
    pairs: &[String],
    env_password: Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len() + 1);
    let (mut literal, mut from_file) = (Vec::new(), Vec::new());
    for kv in pairs {
        let (k, v) = kv
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| ConfigError::NotKeyValue { given: kv.clone() })?;
        let secret = k
            .strip_suffix(".file")
            .and_then(|s| FILE_SECRETS.iter().find(|f| **f == s));
        if let Some(key) = secret {
            let path = std::path::PathBuf::from(v);
            let text =
                std::fs::read_to_string(&path).map_err(|source| ConfigError::SecretFile {
                    key: (*key).to_owned(),
                    path: path.clone(),
                    source,
                })?;
            let value = text.lines().next().unwrap_or_default();
            if value.is_empty() {
                return Err(ConfigError::EmptySecretFile {
                    key: (*key).to_owned(),
                    path,
                });
            }
            from_file.push(*key);
            out.push(((*key).to_owned(), value.to_owned()));
        } else {
            if FILE_SECRETS.contains(&k) {
                literal.push(k.to_owned());
            }
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    if let Some(key) = literal.iter().find(|k| from_file.contains(&k.as_str())) {
        return Err(ConfigError::Twice { key: key.clone() });
    }
    literal.sort();
    literal.dedup();
    for key in &literal {
        let env = if key == "sasl.password" {
            format!(" or the environment variable {PASSWORD_ENV}")
        } else {
            String::new()
        };
        tracing::warn!(
            "-X {key}=...: the value is visible to every user of this machine in the process \
             list (ps): give it with -X {key}.file=PATH (the file's first line){env} instead \
             (docs/kafka-security.md)"
        );
    }
    if let Some(password) = env_password.filter(|p| !p.is_empty())
        && !out.iter().any(|(k, _)| k == "sasl.password")
    {
        out.push(("sasl.password".to_owned(), password));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[&str]) -> Vec<String> {
        pairs.iter().map(|p| (*p).to_owned()).collect()
    }

    /// `Debug` of a connection (and of what holds one) shows no secret
    /// value; the other settings stay readable.
    #[test]
    fn debug_redacts_secret_values() {
        let conn = Connection {
            bootstrap_servers: "kafka-1:9093".to_owned(),
            extra_config: extra_config(
                &args(&[
                    "security.protocol=SASL_SSL",
                    "sasl.username=acme",
                    "sasl.password=hunter2-sasl",
                    "ssl.key.password=hunter2-key",
                    "ssl.key.pem=-----BEGIN PRIVATE KEY-----hunter2-pem",
                    "sasl.oauthbearer.config=principal=acme secret=hunter2-oauth",
                    "sasl.oauthbearer.client.secret=hunter2-client",
                    "ssl.ca.location=/etc/onceflow/kafka-ca.pem",
                ]),
                None,
            )
            .expect("valid -X"),
        };
        for shown in [format!("{conn:?}"), format!("{conn:#?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("[redacted]"), "{shown}");
            for visible in [
                "kafka-1:9093",
                "SASL_SSL",
                "acme",
                "/etc/onceflow/kafka-ca.pem",
            ] {
                assert!(shown.contains(visible), "{visible} not in {shown}");
            }
        }
        // rdkafka's own list, and librdkafka's sensitive values, are secret.
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.truststore.password",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "ssl.key.pem",
            "ssl_key",
            "sasl.oauthbearer.assertion.private.key.pem",
            "sasl.oauthbearer.assertion.private.key.passphrase",
        ] {
            assert!(is_secret(key), "{key}");
        }
        for key in ["sasl.username", "ssl.ca.location", "bootstrap.servers"] {
            assert!(!is_secret(key), "{key}");
        }
    }

    /// `-X sasl.password.file=` and the environment variable give the
    /// clients the same settings as the literal `-X sasl.password=`; so does
    /// `-X ssl.key.password.file=`.
    #[test]
    fn a_password_from_a_file_or_the_environment_is_the_literal_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (password, key_password) = ("s3cret =x", "k3y");
        let file = dir.path().join("kafka.password");
        std::fs::write(&file, format!("{password}\n")).expect("write");
        let key_file = dir.path().join("key.password");
        std::fs::write(&key_file, format!("{key_password}\r\nignored\n")).expect("write");
        let common = ["security.protocol=SASL_SSL", "sasl.username=acme"];
        let connect = |pairs: Vec<String>, env: Option<&str>| Connection {
            bootstrap_servers: "127.0.0.1:9093".to_owned(),
            extra_config: extra_config(&pairs, env.map(str::to_owned)).expect("valid -X"),
        };
        let with = |more: &[String]| {
            let mut pairs = args(&common);
            pairs.extend_from_slice(more);
            pairs
        };
        let literal = connect(
            with(&[
                format!("sasl.password={password}"),
                format!("ssl.key.password={key_password}"),
            ]),
            None,
        );
        let from_files = connect(
            with(&[
                format!("sasl.password.file={}", file.display()),
                format!("ssl.key.password.file={}", key_file.display()),
            ]),
            None,
        );
        let from_env = connect(
            with(&[format!("ssl.key.password.file={}", key_file.display())]),
            Some(password),
        );
        for other in [&from_files, &from_env] {
            let sorted = |c: &Connection| {
                let mut v = c.extra_config.clone();
                v.sort();
                v
            };
            assert_eq!(sorted(other), sorted(&literal));
            let (a, b) = (literal.config(), other.config());
            for key in [
                "bootstrap.servers",
                "security.protocol",
                "sasl.username",
                "sasl.password",
                "ssl.key.password",
            ] {
                assert_eq!(a.get(key), b.get(key), "{key}");
            }
            assert_eq!(b.get("sasl.password"), Some(password));
            assert_eq!(b.get("ssl.key.password"), Some(key_password));
            assert_eq!(b.get("sasl.password.file"), None);
        }
        // -X wins over the environment; an empty variable is no password.
        let both = connect(with(&[format!("sasl.password={password}")]), Some("other"));
        assert_eq!(both.config().get("sasl.password"), Some(password));
        let empty = connect(with(&[]), Some(""));
        assert_eq!(empty.config().get("sasl.password"), None);
    }

    /// What cannot be used is refused, naming the argument and what to do.
    #[test]
    fn unusable_secret_arguments_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\nsecond line\n").expect("write");
        let present = dir.path().join("present");
        std::fs::write(&present, "pw\n").expect("write");
        let refused = |pairs: &[String]| {
            let e = extra_config(pairs, None).expect_err("refused");
            crate::types::error_chain(&e)
        };
        let e = refused(&[format!("sasl.password.file={}", missing.display())]);
        assert!(e.contains("cannot read it") && e.contains("missing"), "{e}");
        let e = refused(&[format!("sasl.password.file={}", empty.display())]);
        assert!(e.contains("first line is empty"), "{e}");
        let e = refused(&[
            "sasl.password=pw".to_owned(),
            format!("sasl.password.file={}", present.display()),
        ]);
        assert!(e.contains("both given"), "{e}");
        let e = refused(&["sasl.password".to_owned()]);
        assert!(e.contains("expected key=value"), "{e}");
        // A `.file` key that is not a secret of ours is librdkafka's own.
        let own = extra_config(
            &args(&["sasl.oauthbearer.assertion.jwt.template.file=/t.json"]),
            None,
        )
        .expect("passed through");
        assert_eq!(
            own,
            [(
                "sasl.oauthbearer.assertion.jwt.template.file".to_owned(),
                "/t.json".to_owned()
            )]
        );
    }
}
