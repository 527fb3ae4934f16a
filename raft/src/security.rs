//! Who may talk to a node: TLS ([`TlsFiles`]), a shared bearer token
//! ([`Token`]) and the rule that a node listening beyond loopback needs
//! them ([`check_listen`]).
//!
//! - With [`TlsFiles`], the node serves HTTPS with its certificate and
//!   presents the same certificate as its client identity on its RPCs to
//!   peers. With a CA ([`TlsFiles::ca`]) it verifies peers' server
//!   certificates against that CA and requires every client of its server
//!   to present a certificate that CA signed (mutual TLS). Without one, it
//!   verifies peers against the system's trusted roots and asks clients
//!   for no certificate.
//! - With a [`Token`], every request must carry `Authorization: Bearer
//!   <token>`; peers send it on their RPCs.
//!
//! Secrets stay out of sight: a [`Token`]'s `Debug` prints no bytes, and
//! errors about key or token files name the file, never its contents.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// A shared secret every request must present as `Authorization: Bearer
/// <token>`. Its `Debug` output is `Token(<redacted>)`.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl Token {
    /// A token from its text: trailing `\n` and `\r` are dropped (a file
    /// written by `echo` ends with one); the rest must be non-empty
    /// printable ASCII without spaces, as an HTTP header carries it.
    pub fn new(secret: &str) -> Result<Self> {
        let secret = secret.trim_end_matches(['\n', '\r']);
        if secret.is_empty() {
            return Err(Error::Config("the token is empty".into()));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::Config(
                "the token must be printable ASCII without spaces or control characters".into(),
            ));
        }
        Ok(Self(secret.into()))
    }

    /// Reads a token from a file (see [`Token::new`]). Errors name the
    /// file and never show its contents.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::Config(format!("reading the token file {}: {e}", path.display()))
        })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            Error::Config(format!("the token file {} is not UTF-8", path.display()))
        })?;
        Self::new(&text)
            .map_err(|e| Error::Config(format!("the token file {}: {e}", path.display())))
    }

    /// Whether `presented` is this token, compared in constant time (only
    /// a difference in length shows).
    #[must_use]
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }

    /// The `Authorization` header value that carries the token, marked
    /// sensitive so that HTTP libraries do not log it.
    pub(crate) fn header_value(&self) -> Result<axum::http::HeaderValue> {
        let mut value = axum::http::HeaderValue::try_from(format!("Bearer {}", self.0))
            .map_err(|_| Error::Config("the token cannot be sent in a header".into()))?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The PEM files of a node's TLS identity and, optionally, the CA of its
/// cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The node's certificate chain (PEM, leaf first). Its subject
    /// alternative names must cover the host part of the address peers
    /// and clients reach the node at (e.g. `IP:127.0.0.1`); with mutual
    /// TLS it also needs the `clientAuth` extended key usage, as the node
    /// presents it to its peers.
    pub cert: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA (PEM, one or more certificates) that signed the cluster's
    /// certificates. When set, peers' server certificates are verified
    /// against it alone, and clients of this node must present a
    /// certificate it signed (mutual TLS). When unset, peers are verified
    /// against the system's trusted roots and clients present none.
    pub ca: Option<PathBuf>,
}

impl TlsFiles {
    /// TLS with `cert` and `key`, without a CA of its own.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            ca: None,
        }
    }

    /// The same, verifying peers and clients with the CA in `ca`.
    #[must_use]
    pub fn with_ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.ca = Some(ca.into());
        self
    }
}

/// The loaded TLS configuration of a node: its server side and the client
/// side of its RPCs to peers.
#[derive(Clone)]
pub struct LoadedTls {
    /// Serves HTTPS, requiring client certificates when there is a CA.
    pub server: Arc<rustls::ServerConfig>,
    /// Reaches peers: verifies them, presents the node's certificate.
    pub client: rustls::ClientConfig,
}

impl fmt::Debug for LoadedTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedTls").finish_non_exhaustive()
    }
}

/// Describes a PEM error without quoting the file: rustls-pki-types puts
/// the offending line in some of its errors, and that line can be key
/// material.
fn pem_problem(e: &pem::Error) -> String {
    match e {
        pem::Error::Io(e) => e.to_string(),
        pem::Error::NoItemsFound => "no PEM item of the expected kind".into(),
        pem::Error::SectionTooLarge => "a PEM section is too large".into(),
        _ => "malformed PEM".into(),
    }
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("reading {what} {}: {e}", path.display())))
}

fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read_file(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("{what} {}: {}", path.display(), pem_problem(&e))))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{what} {}: no CERTIFICATE in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read_file("the TLS key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        Error::Config(format!(
            "the TLS key {}: {} (expected a PKCS#8, PKCS#1 or SEC1 private key)",
            path.display(),
            pem_problem(&e)
        ))
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(what: &str, e: rustls::Error) -> Error {
    Error::Config(format!("{what}: {e}"))
}

impl TlsFiles {
    /// Reads the files and builds the server and client configurations.
    /// Errors name the file at fault and never quote a key.
    pub fn load(&self) -> Result<LoadedTls> {
        let certs = load_certs("the TLS certificate", &self.cert)?;
        let key = load_key(&self.key)?;
        let roots = match &self.ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in load_certs("the TLS CA", ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| tls_error(&format!("the TLS CA {}", ca.display()), e))?;
                }
                Some(Arc::new(roots))
            }
            None => None,
        };

        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("TLS protocol versions", e))?;
        let server = match &roots {
            Some(roots) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                        .build()
                        .map_err(|e| Error::Config(format!("client certificate checks: {e}")))?;
                server.with_client_cert_verifier(verifier)
            }
            None => server.with_no_client_auth(),
        };
        let mut server = server
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| {
                tls_error(
                    &format!(
                        "the TLS certificate {} and key {}",
                        self.cert.display(),
                        self.key.display()
                    ),
                    e,
                )
            })?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];

        let client_roots = match roots {
            Some(roots) => roots,
            None => {
                let native = rustls_native_certs::load_native_certs();
                let mut roots = RootCertStore::empty();
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    return Err(Error::Config(
                        "no --tls-ca given and no trusted roots found on the system to verify \
                         peers with: pass the CA that signed the cluster's certificates"
                            .into(),
                    ));
                }
                Arc::new(roots)
            }
        };
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("TLS protocol versions", e))?
            .with_root_certificates(client_roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| tls_error("the TLS client identity", e))?;
        Ok(LoadedTls {
            server: Arc::new(server),
            client,
        })
    }
}

/// Checks that a node may listen on `listen` with this security: a
/// loopback address always may; any other needs TLS and either a token or
/// mutual TLS, unless `allow_insecure` is set. Returns the warning to show
/// when an insecure node is allowed beyond loopback.
pub fn check_listen(
    listen: SocketAddr,
    tls: Option<&TlsFiles>,
    token: Option<&Token>,
    allow_insecure: bool,
) -> Result<Option<String>> {
    if listen.ip().is_loopback() {
        return Ok(None);
    }
    let authenticated = token.is_some() || tls.is_some_and(|t| t.ca.is_some());
    if tls.is_some() && authenticated {
        return Ok(None);
    }
    let mut missing = Vec::new();
    if tls.is_none() {
        missing.push("TLS (--tls-cert and --tls-key)");
    }
    if !authenticated {
        missing.push("authentication (--token-file, or --tls-ca for mutual TLS)");
    }
    let missing = missing.join(" and ");
    if allow_insecure {
        return Ok(Some(format!(
            "warning: serving {listen} beyond loopback without {missing} \
             (--allow-insecure-network): anyone who can reach it can read and change \
             every key and the cluster's membership"
        )));
    }
    Err(Error::Config(format!(
        "refusing to listen on {listen}, which is not a loopback address, without {missing}: \
         add those flags, or --allow-insecure-network to serve it unprotected anyway"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_drop_the_trailing_newline_and_refuse_empty_or_odd_text() {
        let token = Token::new("s3cret\r\n").unwrap();
        assert!(token.matches(b"s3cret"));
        assert!(!token.matches(b"s3cret\n"));
        assert!(!token.matches(b"s3cre"));
        assert!(!token.matches(b""));
        assert!(Token::new("\n").is_err());
        assert!(Token::new("").is_err());
        assert!(Token::new("two words").is_err());
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
        let config =
            crate::node::NodeConfig::new(1, "127.0.0.1:1".parse().unwrap(), "d").with_token(token);
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    #[test]
    fn a_token_file_error_does_not_show_the_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "has a space\n").unwrap();
        let message = Token::from_file(&path).unwrap_err().to_string();
        assert!(!message.contains("has a space"), "{message}");
        let missing = Token::from_file(&dir.path().join("absent")).unwrap_err();
        assert!(missing.to_string().contains("absent"), "{missing}");
    }

    #[test]
    fn only_loopback_may_go_without_tls_and_authentication() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let tls = TlsFiles::new("c", "k");
        let mtls = TlsFiles::new("c", "k").with_ca("ca");
        let token = Token::new("t").unwrap();
        assert!(check_listen(lo, None, None, false).unwrap().is_none());
        assert!(check_listen("[::1]:1".parse().unwrap(), None, None, false)
            .unwrap()
            .is_none());
        let refused = check_listen(any, None, None, false)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("--tls-cert") && refused.contains("--token-file"),
            "{refused}"
        );
        let refused = check_listen(any, Some(&tls), None, false)
            .unwrap_err()
            .to_string();
        assert!(
            !refused.contains("--tls-cert") && refused.contains("--token-file"),
            "{refused}"
        );
        assert!(check_listen(any, None, Some(&token), false).is_err());
        assert!(check_listen(any, Some(&tls), Some(&token), false)
            .unwrap()
            .is_none());
        assert!(check_listen(any, Some(&mtls), None, false)
            .unwrap()
            .is_none());
        let warning = check_listen(any, None, None, true).unwrap().unwrap();
        assert!(warning.contains("warning"), "{warning}");
    }
}
