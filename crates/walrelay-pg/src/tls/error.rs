//! What can go wrong while connecting and negotiating TLS. Messages name the
//! host, the sslmode and root certificates where relevant, and what to do.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConfigError, SslMode};

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

pub(super) fn handshake_error(
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
