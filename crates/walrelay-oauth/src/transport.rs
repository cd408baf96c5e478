//! Sending one [`Request`] and reading its [`Response`]: TCP with a
//! connect timeout, TLS for `https://` (the system's roots or a CA file,
//! host names checked, by the same rules as walrelay's other TLS
//! connections), and a deadline on the whole answer. Blocking: see
//! [`super::http`] for why.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use walrelay_pg::tls::Verification;
use walrelay_pg::RootCert;

use super::error::OAuthError;
use super::http::{parse_response, Request, Response, Url, MAX_RESPONSE};

/// How long each step may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Until the TCP connection is up.
    pub connect: Duration,
    /// From the first byte sent to the last byte of the answer.
    pub response: Duration,
}

impl Default for Timeouts {
    /// 10 s to connect, 30 s for the answer: librdkafka's token callback
    /// blocks its thread meanwhile, and an identity provider slower than
    /// that is down for the relay's purposes (the cached token carries
    /// it through, see [`super::refresh`]).
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(10),
            response: Duration::from_secs(30),
        }
    }
}

/// An HTTP client: the TLS trust settings and the timeouts.
#[derive(Clone)]
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    timeouts: Timeouts,
    service: &'static str,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("service", &self.service)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client trusting `ca_file` (librdkafka's `https.ca.location`) or
    /// the system's roots; `service` names the other end in errors.
    pub fn new(
        service: &'static str,
        ca_file: Option<PathBuf>,
        timeouts: Timeouts,
    ) -> Result<Client, OAuthError> {
        let roots = ca_file.map_or(RootCert::System, RootCert::File);
        let verifier = walrelay_pg::tls::server_verifier(&Verification::ChainAndName(roots))
            .map_err(|e| OAuthError::config("https.ca.location", e.to_string()))?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| OAuthError::config("https.ca.location", e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
        Ok(Client {
            tls: Arc::new(tls),
            timeouts,
            service,
        })
    }

    /// Sends `request`, returns the answer whatever its status.
    pub fn send(&self, request: &Request) -> Result<Response, OAuthError> {
        let url = &request.url;
        let fail = |step: &'static str| {
            move |reason: String| OAuthError::Transport {
                service: self.service,
                endpoint: url.shown(),
                step,
                reason,
            }
        };
        let tcp = connect(url, self.timeouts.connect).map_err(fail("connecting"))?;
        let deadline = Instant::now() + self.timeouts.response;
        let result = if url.https {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone()).map_err(|_| {
                fail("the TLS handshake")(format!("{} is not a TLS name", url.host))
            })?;
            let mut tls = rustls::ClientConnection::new(self.tls.clone(), name)
                .map_err(|e| fail("the TLS handshake")(e.to_string()))?;
            // The handshake on its own, so that a certificate refused is
            // reported as such and not as a failure to send.
            let mut tcp = tcp;
            handshake(&mut tls, &mut tcp, self.timeouts.response)
                .map_err(fail("the TLS handshake"))?;
            let mut stream = rustls::StreamOwned::new(tls, tcp);
            exchange(&mut stream, request, deadline, |s| &s.sock)
        } else {
            let mut stream = tcp;
            exchange(&mut stream, request, deadline, |s| s)
        };
        result.map_err(|(step, reason)| fail(step)(reason))
    }
}

fn connect(url: &Url, timeout: Duration) -> Result<TcpStream, String> {
    let addrs = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {}: {e}", url.host))?;
    let mut last = format!("{} resolves to no address", url.host);
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

/// Completes the TLS handshake, each socket wait bounded by `timeout`.
fn handshake(
    tls: &mut rustls::ClientConnection,
    tcp: &mut TcpStream,
    timeout: Duration,
) -> Result<(), String> {
    tcp.set_read_timeout(Some(timeout))
        .and_then(|()| tcp.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(tcp).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes the request and reads until the answer is complete, each
/// socket wait bounded by what is left of `deadline`.
fn exchange<S: Read + Write>(
    stream: &mut S,
    request: &Request,
    deadline: Instant,
    socket: impl Fn(&S) -> &TcpStream,
) -> Result<Response, (&'static str, String)> {
    let set_timeout = |s: &S| -> Result<(), String> {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or("no complete answer within the response timeout")?;
        let tcp = socket(s);
        tcp.set_read_timeout(Some(left))
            .and_then(|()| tcp.set_write_timeout(Some(left)))
            .map_err(|e| e.to_string())
    };
    set_timeout(stream).map_err(|e| ("sending", e))?;
    stream
        .write_all(&request.encode())
        .and_then(|()| stream.flush())
        .map_err(|e| ("sending", e.to_string()))?;
    let mut received = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        set_timeout(stream).map_err(|e| ("reading the answer", e))?;
        let (n, eof) = match stream.read(&mut buf) {
            Ok(0) => (0, true),
            Ok(n) => (n, false),
            // A TLS peer that closes without close_notify: the body's
            // framing (length, chunks) still tells whether it is whole.
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => (0, true),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err((
                    "reading the answer",
                    "no complete answer within the response timeout".to_owned(),
                ))
            }
            Err(e) => return Err(("reading the answer", e.to_string())),
        };
        received.extend_from_slice(&buf[..n]);
        if received.len() > MAX_RESPONSE {
            return Err((
                "reading the answer",
                format!("an answer over {MAX_RESPONSE} bytes"),
            ));
        }
        if let Some(response) =
            parse_response(&received, eof).map_err(|e| ("reading the answer", e))?
        {
            return Ok(response);
        }
    }
}

#[cfg(test)]
mod tls_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot HTTP server on loopback answering `answer` after
    /// reading the request head.
    fn serve(answer: &'static [u8], delay: Duration) -> (Url, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            std::thread::sleep(delay);
            let _ = socket.write_all(answer);
            seen
        });
        let url = Url::parse(&format!("http://127.0.0.1:{port}/token")).unwrap();
        (url, handle)
    }

    fn get(url: Url) -> Request {
        Request {
            method: "GET",
            url,
            headers: vec![],
            body: vec![],
        }
    }

    #[test]
    fn a_plain_http_exchange_returns_the_status_and_body() {
        let (url, server) = serve(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nnope!",
            Duration::ZERO,
        );
        let client = Client::new("the test endpoint", None, Timeouts::default()).unwrap();
        let answer = client.send(&get(url)).unwrap();
        assert_eq!(
            (answer.status, answer.body.as_slice()),
            (400, &b"nope!"[..])
        );
        let request = server.join().unwrap();
        assert!(request.starts_with(b"GET /token HTTP/1.1\r\nHost: 127.0.0.1:"));
    }

    #[test]
    fn a_slow_answer_times_out_with_the_step_named() {
        let (url, server) = serve(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_millis(800));
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_millis(200),
        };
        let client = Client::new("the test endpoint", None, timeouts).unwrap();
        let e = client.send(&get(url)).unwrap_err().to_string();
        assert!(
            e.contains("reading the answer") && e.contains("timeout"),
            "{e}"
        );
        drop(server.join());
    }
}
