//! HTTPS for the admin API: rustls (with ring) over a certificate chain and
//! key in PEM files (`onceflow host --tls-cert --tls-key`). This module
//! owns rustls and axum-server; the CLI's client trusts the certificate's
//! CA with `--ca-cert` (see `cli/remote.rs`).
//!
//! The files are read once, at start: a rotated certificate takes a host
//! restart (rolling, one host at a time, loses nothing).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The PEM files of the admin API's certificate.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why the admin API's certificate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing, unreadable or not PEM.
    #[error("{what} {path}: {message}")]
    File {
        /// `--tls-cert` or `--tls-key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// rustls refused the pair (a key that does not match the certificate,
    /// an unsupported key type).
    #[error(
        "--tls-cert {cert} and --tls-key {key} do not make a server certificate: \
         check that the key is the certificate's"
    )]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
}

/// A server configuration ready to accept connections.
#[derive(Clone)]
pub struct ServerTls(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

fn file_error(what: &'static str, path: &Path, message: impl Into<String>) -> TlsError {
    TlsError::File {
        what,
        path: path.to_owned(),
        message: message.into(),
    }
}

fn pem_message(e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(e) => format!("cannot read it: {e}"),
        rustls::pki_types::pem::Error::NoItemsFound => {
            "no PEM block of the expected kind in it".to_owned()
        }
        other => format!("not valid PEM: {other}"),
    }
}

impl ServerTls {
    /// Reads and checks the certificate chain and key.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .map_err(|e| file_error("--tls-cert", &files.cert, pem_message(e)))?
            .collect::<Result<_, _>>()
            .map_err(|e| file_error("--tls-cert", &files.cert, pem_message(e)))?;
        if chain.is_empty() {
            return Err(file_error(
                "--tls-cert",
                &files.cert,
                "no CERTIFICATE block in it: give the server's certificate chain in PEM, leaf first",
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
            file_error(
                "--tls-key",
                &files.key,
                format!(
                    "{}: give the certificate's private key in PEM (PKCS#8, PKCS#1 or SEC1)",
                    pem_message(e)
                ),
            )
        })?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|source| TlsError::Config {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
        Ok(Self(Arc::new(config)))
    }

    /// Serves `app` over TLS on `listener` until `shutdown` resolves, then
    /// lets open requests finish for up to `drain`.
    pub(super) async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        app: axum::Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
        drain: std::time::Duration,
    ) -> std::io::Result<()> {
        let handle = axum_server::Handle::new();
        let stopper = handle.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopper.graceful_shutdown(Some(drain));
        });
        let listener = listener.into_std()?;
        let config = axum_server::tls_rustls::RustlsConfig::from_config(self.0.clone());
        axum_server::from_tcp_rustls(listener, config)
            .handle(handle)
            .serve(app.into_make_service())
            .await
    }
}
