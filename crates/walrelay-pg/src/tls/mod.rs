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

mod channel_binding;
mod error;
mod verify;

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::{Config, SslMode};

pub use channel_binding::{end_point_hash_for, server_end_point_hash, EndPointHash};
use error::handshake_error;
pub use error::TlsError;
use verify::server_name;
pub use verify::{client_config, load_roots, server_verifier, verification_for, Verification};

/// SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

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
