//! Transport: TCP or Unix socket, with libpq `sslmode` semantics on rustls.
//!
//! [`connect`] opens the transport for one host and negotiates TLS:
//!
//! * Unix sockets (host starting with `/`) never use TLS; sslmode is ignored
//!   for them, as in libpq.
//! * `disable`: plaintext, no SSLRequest.
//! * otherwise an SSLRequest is sent and exactly one byte is read as the
//!   answer (nothing the server sent after it is read as plaintext, so bytes
//!   injected before the handshake can only break the handshake —
//!   CVE-2021-23214 class):
//!   * `S`: TLS handshake (SNI for DNS names only, never for IP addresses;
//!     ALPN `postgresql`, like libpq 17).
//!   * `N`: plaintext for `prefer`; an error for `require`, `verify-ca`,
//!     `verify-full`.
//!   * anything else (`E` from a pre-7.0 server, or not PostgreSQL at all): error.
//!
//! Certificate checks:
//!
//! * `prefer`/`require`: encrypted but the certificate is not verified —
//!   unless root certificates are available (explicit `sslrootcert`, or
//!   `~/.postgresql/root.crt` exists), in which case the chain is verified as
//!   with `verify-ca` (libpq does the same). The handshake signature is
//!   always checked against the certificate's key.
//! * `verify-ca`: chain verified against the roots; the host name is not checked.
//! * `verify-full`: chain and host name (IP SANs for IP hosts).
//!
//! `prefer` falls back to plaintext only when the server refuses TLS (`N`).
//! If the server accepts and the TLS handshake itself fails, that is an error
//! (libpq would reconnect without TLS; walrelay does not silently downgrade).
//!
//! The ring crypto provider is installed explicitly in every `ClientConfig`;
//! no process-wide default provider is needed.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::Digest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::{Config, ConfigError, RootCert, SslMode};

/// SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Errors while connecting and negotiating TLS. Messages name the host,
/// the sslmode and root certificates where relevant, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The connection settings are inconsistent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// TCP connect failed (including name resolution).
    #[error(
        "could not connect to server at {host}:{port}: {source}; check that the server is \
         running and accepts TCP/IP connections on that host and port"
    )]
    Connect {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// Underlying error.
        source: io::Error,
    },
    /// Unix-socket connect failed.
    #[error(
        "could not connect to server on Unix socket \"{}\": {source}; check that the server is \
         running locally and that the socket directory (host) and port are right",
        path.display()
    )]
    UnixConnect {
        /// Socket path.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Unix sockets are not available on this platform.
    #[error(
        "Unix-domain sockets (host \"{host}\") are not supported on this platform; use a TCP host"
    )]
    UnixUnsupported {
        /// Host.
        host: String,
    },
    /// `connect_timeout` elapsed.
    #[error(
        "timed out after {timeout:?} connecting to {host}:{port} (connect_timeout); check the \
         address and the network, or raise connect_timeout"
    )]
    Timeout {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// The timeout.
        timeout: Duration,
    },
    /// I/O error while sending the SSLRequest or reading its answer.
    #[error("I/O error with {host}:{port} while {during}: {source}")]
    Io {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// What was being done.
        during: &'static str,
        /// Underlying error.
        source: io::Error,
    },
    /// The server answered `N` but the sslmode requires TLS.
    #[error(
        "server at {host}:{port} does not support TLS but sslmode={sslmode}; enable ssl on the \
         server or use sslmode=prefer"
    )]
    TlsNotSupported {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// The sslmode.
        sslmode: SslMode,
    },
    /// The server answered the SSLRequest with an ErrorResponse.
    #[error(
        "server at {host}:{port} answered the TLS request with an error message; it is either \
         much too old (before PostgreSQL 7.0) or not a PostgreSQL server"
    )]
    ErrorResponseToSslRequest {
        /// Host.
        host: String,
        /// Port.
        port: u16,
    },
    /// The server answered the SSLRequest with something else than `S`/`N`/`E`.
    #[error(
        "server at {host}:{port} answered the TLS request with unexpected byte 0x{byte:02x}; \
         check that host and port point at a PostgreSQL server"
    )]
    UnexpectedSslResponse {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// The byte received.
        byte: u8,
    },
    /// verify-ca/verify-full without any root certificates.
    #[error(
        "sslmode={sslmode} needs root certificates to verify the server, but sslrootcert is not \
         set and {} does not exist; set sslrootcert (or PGSSLROOTCERT) to a CA file in PEM \
         format or to \"system\" for the operating system's trust store, or use sslmode=require \
         to encrypt without verification",
        default_path.as_ref().map_or_else(|| "the default root certificate file (~/.postgresql/root.crt, HOME is not set)".to_string(), |p| format!("\"{}\"", p.display()))
    )]
    NoRootCert {
        /// The sslmode.
        sslmode: SslMode,
        /// The default file that was looked for.
        default_path: Option<PathBuf>,
    },
    /// The sslrootcert file does not exist.
    #[error(
        "root certificate file \"{}\" does not exist; point sslrootcert (or PGSSLROOTCERT) at the \
         CA certificate(s) in PEM format, or use sslrootcert=system",
        path.display()
    )]
    RootCertMissing {
        /// The file.
        path: PathBuf,
    },
    /// The sslrootcert file could not be read.
    #[error(
        "could not read root certificate file \"{}\": {source}; check the path and permissions \
         of sslrootcert",
        path.display()
    )]
    RootCertRead {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The sslrootcert file has no certificates.
    #[error(
        "root certificate file \"{}\" contains no PEM certificates (\"-----BEGIN CERTIFICATE-----\"); \
         point sslrootcert at the CA certificate(s) in PEM format",
        path.display()
    )]
    RootCertEmpty {
        /// The file.
        path: PathBuf,
    },
    /// The sslrootcert file is not valid PEM.
    #[error(
        "root certificate file \"{}\" is not valid PEM: {detail}; point sslrootcert at the CA \
         certificate(s) in PEM format",
        path.display()
    )]
    RootCertParse {
        /// The file.
        path: PathBuf,
        /// Parser message.
        detail: String,
    },
    /// A certificate in the sslrootcert file is not usable as a trust anchor.
    #[error(
        "root certificate file \"{}\" contains a certificate that cannot be used as a trust \
         anchor: {detail}",
        path.display()
    )]
    RootCertInvalid {
        /// The file.
        path: PathBuf,
        /// Detail.
        detail: String,
    },
    /// `sslrootcert=system` but no system roots could be loaded.
    #[error(
        "sslrootcert=system, but no trusted root certificates could be loaded from the operating \
         system ({detail}); install the CA certificates package (e.g. ca-certificates) or set \
         sslrootcert to a CA file"
    )]
    SystemRoots {
        /// What went wrong.
        detail: String,
    },
    /// The host cannot be used as a TLS server name.
    #[error(
        "host \"{host}\" is neither a valid DNS name nor an IP address, so it cannot be used for \
         TLS; fix the host name or use sslmode=disable"
    )]
    InvalidServerName {
        /// Host.
        host: String,
    },
    /// Building the rustls configuration failed.
    #[error("could not set up TLS: {0}")]
    Rustls(rustls::Error),
    /// The server certificate was rejected.
    #[error(
        "server certificate verification failed for {host}:{port} (sslmode={sslmode}, \
         sslrootcert={rootcert}): {reason}; check that sslrootcert holds the CA that signed the \
         server certificate{}",
        if *sslmode == SslMode::VerifyFull { " and that the host name matches the certificate (or use sslmode=verify-ca)" } else { "" }
    )]
    CertificateVerification {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// Effective sslmode.
        sslmode: SslMode,
        /// The roots used (file path or `system`).
        rootcert: String,
        /// rustls's reason.
        reason: rustls::Error,
    },
    /// The TLS handshake failed for another reason.
    #[error("TLS handshake with {host}:{port} failed (sslmode={sslmode}): {source}")]
    Handshake {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// Effective sslmode.
        sslmode: SslMode,
        /// Underlying error.
        source: io::Error,
    },
}

/// A connected transport.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// Unix-domain socket (never TLS).
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Stream {
    /// Whether the transport is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// SCRAM `tls-server-end-point` channel-binding data (RFC 5929): the hash
    /// of the server's leaf certificate. `None` without TLS, or when the
    /// certificate's signature algorithm has no single well-known hash
    /// (e.g. Ed25519, RSA-PSS) — then SCRAM should not use channel binding.
    pub fn tls_server_end_point(&self) -> Option<Vec<u8>> {
        match self {
            Stream::Tls(tls) => {
                let certs = tls.get_ref().1.peer_certificates()?;
                server_end_point_hash(certs.first()?.as_ref())
            }
            _ => None,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            #[cfg(unix)]
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

// ----- channel binding -----

/// Hash used for `tls-server-end-point` channel binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndPointHash {
    /// SHA-224 (certificate signed with a SHA-224 based algorithm).
    Sha224,
    /// SHA-256 (also used for MD5 and SHA-1 based signatures, per RFC 5929).
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

/// Reads one DER TLV: (tag, contents, rest). Only low-tag-number form and
/// definite lengths up to 4 bytes are accepted; every length is bounds-checked.
fn der_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (len_bytes, after) = rest.split_at(n);
        rest = after;
        len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if len > rest.len() {
        return None;
    }
    let (contents, after) = rest.split_at(len);
    Some((tag, contents, after))
}

/// The `signatureAlgorithm` OID (contents octets) of a DER certificate.
fn signature_algorithm_oid(cert_der: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (tag, cert, _) = der_tlv(cert_der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, _tbs, rest) = der_tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, alg_id, _) = der_tlv(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, oid, _) = der_tlv(alg_id)?;
    if tag != OID {
        return None;
    }
    Some(oid)
}

/// The channel-binding hash for a certificate, chosen from its
/// signatureAlgorithm as RFC 5929 section 4.1 says (and as the PostgreSQL
/// server does): MD5/SHA-1 become SHA-256, SHA-2 variants are kept, anything
/// else (Ed25519, RSA-PSS, unknown) gives `None`.
pub fn end_point_hash_for(cert_der: &[u8]) -> Option<EndPointHash> {
    // 1.2.840.113549.1.1.x (PKCS#1)
    const PKCS1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    // 1.2.840.10045.4 (ECDSA signatures)
    const ECDSA_SIG: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    // 1.2.840.10040.4.3 dsa-with-sha1
    const DSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x03];
    // 2.16.840.1.101.3.4.3.x (NIST: dsa-with-sha2)
    const NIST_SIG: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03];
    // 1.3.14.3.2.29 sha1WithRSASignature (OIW)
    const OIW_SHA1_RSA: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1d];

    use EndPointHash::*;
    let oid = signature_algorithm_oid(cert_der)?;
    if oid == DSA_SHA1 || oid == OIW_SHA1_RSA {
        return Some(Sha256);
    }
    if let Some(rest) = oid.strip_prefix(PKCS1) {
        return match rest {
            [0x04] | [0x05] => Some(Sha256), // md5WithRSA, sha1WithRSA
            [0x0b] => Some(Sha256),
            [0x0c] => Some(Sha384),
            [0x0d] => Some(Sha512),
            [0x0e] => Some(Sha224),
            _ => None, // incl. 0x0a RSASSA-PSS: hash lives in parameters
        };
    }
    if let Some(rest) = oid.strip_prefix(ECDSA_SIG) {
        return match rest {
            [0x01] => Some(Sha256), // ecdsa-with-SHA1
            [0x03, 0x01] => Some(Sha224),
            [0x03, 0x02] => Some(Sha256),
            [0x03, 0x03] => Some(Sha384),
            [0x03, 0x04] => Some(Sha512),
            _ => None,
        };
    }
    if let Some(rest) = oid.strip_prefix(NIST_SIG) {
        return match rest {
            [0x01] => Some(Sha224),
            [0x02] => Some(Sha256),
            [0x03] => Some(Sha384),
            [0x04] => Some(Sha512),
            _ => None,
        };
    }
    None
}

/// `tls-server-end-point` channel-binding data for a DER certificate.
pub fn server_end_point_hash(cert_der: &[u8]) -> Option<Vec<u8>> {
    Some(match end_point_hash_for(cert_der)? {
        EndPointHash::Sha224 => sha2::Sha224::digest(cert_der).to_vec(),
        EndPointHash::Sha256 => sha2::Sha256::digest(cert_der).to_vec(),
        EndPointHash::Sha384 => sha2::Sha384::digest(cert_der).to_vec(),
        EndPointHash::Sha512 => sha2::Sha512::digest(cert_der).to_vec(),
    })
}

// ----- certificate verification policy -----

/// How the server certificate will be checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Encrypt, but accept any certificate (the handshake signature is still
    /// checked against the certificate's key).
    None,
    /// Verify the chain against the roots, not the host name.
    Chain(RootCert),
    /// Verify the chain and the host name.
    ChainAndName(RootCert),
}

/// Decides, from the configuration, whether TLS is attempted (`None` means
/// `sslmode=disable`) and how the certificate is checked. Looks at the file
/// system only to see whether the default root certificate file exists.
pub fn verification_for(config: &Config) -> Result<Option<Verification>, TlsError> {
    let mode = config.get_sslmode();
    if config.get_sslrootcert() == Some(&RootCert::System) && mode != SslMode::VerifyFull {
        return Err(ConfigError::WeakSslModeWithSystemRoots { sslmode: mode }.into());
    }
    let default = config.get_default_sslrootcert();
    let roots = match config.get_sslrootcert() {
        Some(r) => Some(r.clone()),
        None => default
            .filter(|p| p.is_file())
            .map(|p| RootCert::File(p.to_path_buf())),
    };
    Ok(match mode {
        SslMode::Disable => None,
        SslMode::Prefer | SslMode::Require => {
            Some(roots.map_or(Verification::None, Verification::Chain))
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = roots.ok_or_else(|| TlsError::NoRootCert {
                sslmode: mode,
                default_path: default.map(Path::to_path_buf),
            })?;
            Some(if mode == SslMode::VerifyFull {
                Verification::ChainAndName(roots)
            } else {
                Verification::Chain(roots)
            })
        }
    })
}

fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads trust anchors.
pub fn load_roots(root: &RootCert) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match root {
        RootCert::File(path) => {
            let bytes = std::fs::read(path).map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    TlsError::RootCertMissing { path: path.clone() }
                } else {
                    TlsError::RootCertRead {
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
            let certs = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::RootCertParse {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(TlsError::RootCertEmpty { path: path.clone() });
            }
            for cert in certs {
                store.add(cert).map_err(|e| TlsError::RootCertInvalid {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            }
        }
        RootCert::System => {
            let result = rustls_native_certs::load_native_certs();
            for e in &result.errors {
                tracing::warn!(error = %e, "problem loading a system root certificate");
            }
            let (added, ignored) = store.add_parsable_certificates(result.certs);
            if ignored > 0 {
                tracing::warn!(ignored, "ignored unparsable system root certificates");
            }
            if added == 0 {
                let detail = match result.errors.first() {
                    Some(e) => e.to_string(),
                    None => "the trust store is empty".to_string(),
                };
                return Err(TlsError::SystemRoots { detail });
            }
        }
    }
    Ok(store)
}

/// Accepts any certificate but still checks handshake signatures.
#[derive(Debug)]
struct AcceptAnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// verify-ca: the WebPKI verifier with only the host-name mismatch forgiven.
/// `WebPkiServerVerifier::verify_server_cert` checks the chain (signatures,
/// validity, trust anchor) before the name, so a name error means the chain
/// was fine.
#[derive(Debug)]
struct VerifyChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for VerifyChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Builds the rustls client configuration for a verification policy.
pub fn client_config(verification: &Verification) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = ring_provider();
    let webpki = |roots: &RootCert| -> Result<Arc<WebPkiServerVerifier>, TlsError> {
        let store = load_roots(roots)?;
        WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
            .build()
            .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))
    };
    let verifier: Arc<dyn ServerCertVerifier> = match verification {
        Verification::None => Arc::new(AcceptAnyCertificate {
            algorithms: provider.signature_verification_algorithms,
        }),
        Verification::Chain(roots) => Arc::new(VerifyChainOnly {
            inner: webpki(roots)?,
        }),
        Verification::ChainAndName(roots) => webpki(roots)?,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Arc::new(config))
}

fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::InvalidServerName {
        host: host.to_string(),
    })
}

// ----- connecting -----

/// Opens a TCP connection (no timeout; see [`connect`]) with TCP_NODELAY.
pub async fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, TlsError> {
    let connect_err = |source| TlsError::Connect {
        host: host.to_string(),
        port,
        source,
    };
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(connect_err)?;
    tcp.set_nodelay(true).map_err(connect_err)?;
    Ok(tcp)
}

/// Runs the sslmode negotiation on a fresh TCP connection to `host:port`.
pub async fn negotiate(
    mut tcp: TcpStream,
    config: &Config,
    host: &str,
    port: u16,
) -> Result<Stream, TlsError> {
    let mode = config.get_sslmode();
    let Some(verification) = verification_for(config)? else {
        return Ok(Stream::Tcp(tcp));
    };
    // Set up everything that can fail locally before talking to the server.
    let tls_config = client_config(&verification)?;
    let name = server_name(host)?;
    let io_err = |during| {
        move |source| TlsError::Io {
            host: host.to_string(),
            port,
            during,
            source,
        }
    };

    tcp.write_all(&SSL_REQUEST)
        .await
        .map_err(io_err("sending the TLS request"))?;
    tcp.flush()
        .await
        .map_err(io_err("sending the TLS request"))?;
    // Exactly one byte: whatever follows belongs to the TLS handshake (or,
    // after 'N', to the plaintext protocol).
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .await
        .map_err(io_err("waiting for the answer to the TLS request"))?;

    match answer[0] {
        b'S' => {
            let rootcert = match &verification {
                Verification::None => "none".to_string(),
                Verification::Chain(r) | Verification::ChainAndName(r) => r.to_string(),
            };
            tracing::debug!(host, port, %mode, %rootcert, "starting TLS handshake");
            let tls = TlsConnector::from(tls_config)
                .connect(name, tcp)
                .await
                .map_err(|e| handshake_error(e, host, port, mode, rootcert))?;
            Ok(Stream::Tls(Box::new(tls)))
        }
        b'N' if mode == SslMode::Prefer => {
            static UNENCRYPTED: crate::log_limit::LogLimit =
                crate::log_limit::LogLimit::new(Duration::from_secs(60));
            if let Some(suppressed) = UNENCRYPTED.check() {
                tracing::info!(
                    host,
                    port,
                    suppressed,
                    "server does not support TLS; continuing unencrypted (sslmode=prefer)"
                );
            }
            Ok(Stream::Tcp(tcp))
        }
        b'N' => Err(TlsError::TlsNotSupported {
            host: host.to_string(),
            port,
            sslmode: mode,
        }),
        b'E' => Err(TlsError::ErrorResponseToSslRequest {
            host: host.to_string(),
            port,
        }),
        byte => Err(TlsError::UnexpectedSslResponse {
            host: host.to_string(),
            port,
            byte,
        }),
    }
}

fn handshake_error(
    e: io::Error,
    host: &str,
    port: u16,
    sslmode: SslMode,
    rootcert: String,
) -> TlsError {
    let rustls_err = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_err {
        Some(reason @ rustls::Error::InvalidCertificate(_)) => TlsError::CertificateVerification {
            host: host.to_string(),
            port,
            sslmode,
            rootcert,
            reason: reason.clone(),
        },
        _ => TlsError::Handshake {
            host: host.to_string(),
            port,
            sslmode,
            source: e,
        },
    }
}

/// Connects to one host and negotiates TLS per the configuration. A host
/// starting with `/` is a Unix-socket directory (socket
/// `{host}/.s.PGSQL.{port}`, never TLS). `connect_timeout` covers the TCP
/// connect and the TLS negotiation.
pub async fn connect(config: &Config, host: &str, port: u16) -> Result<Stream, TlsError> {
    let attempt = async {
        if host.starts_with('/') {
            return connect_unix(host, port).await;
        }
        let tcp = connect_tcp(host, port).await?;
        negotiate(tcp, config, host, port).await
    };
    match config.get_connect_timeout() {
        Some(timeout) => {
            tokio::time::timeout(timeout, attempt)
                .await
                .map_err(|_| TlsError::Timeout {
                    host: host.to_string(),
                    port,
                    timeout,
                })?
        }
        None => attempt.await,
    }
}

#[cfg(unix)]
async fn connect_unix(dir: &str, port: u16) -> Result<Stream, TlsError> {
    let path = Path::new(dir).join(format!(".s.PGSQL.{port}"));
    tracing::debug!(path = %path.display(), "connecting over Unix socket (sslmode does not apply)");
    let s = tokio::net::UnixStream::connect(&path)
        .await
        .map_err(|source| TlsError::UnixConnect { path, source })?;
    Ok(Stream::Unix(s))
}

#[cfg(not(unix))]
async fn connect_unix(dir: &str, _port: u16) -> Result<Stream, TlsError> {
    Err(TlsError::UnixUnsupported {
        host: dir.to_string(),
    })
}

#[cfg(test)]
mod tests;
