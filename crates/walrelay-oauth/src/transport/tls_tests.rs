//! The https:// path against a loopback TLS server whose certificate a
//! throwaway CA issued for `localhost`: trusted through a CA file
//! (librdkafka's `https.ca.location`), refused for another name or
//! without the CA, each refusal named as the TLS handshake's.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use walrelay_testkit::TestCa;

use super::*;

/// A TLS server for one connection, answering `200 {}` to a request.
fn serve(ca: &TestCa) -> (u16, std::thread::JoinHandle<()>) {
    let material = ca.server_cert(&["localhost"]).unwrap();
    let chain = CertificateDer::pem_slice_iter(material.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(material.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        let connection = rustls::ServerConnection::new(Arc::new(config)).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, socket);
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
        tls.conn.send_close_notify();
        let _ = tls.flush();
    });
    (port, handle)
}

fn get(url: &str) -> Request {
    Request {
        method: "GET",
        url: Url::parse(url).unwrap(),
        headers: vec![],
        body: vec![],
    }
}

fn client(ca_file: Option<PathBuf>) -> Client {
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        response: Duration::from_secs(5),
    };
    Client::new("the test endpoint", ca_file, timeouts).unwrap()
}

#[test]
fn a_server_the_ca_file_vouches_for_answers() {
    let ca = TestCa::new("walrelay test IdP CA").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    ca.write_cert(&ca_file).unwrap();
    let (port, server) = serve(&ca);
    let answer = client(Some(ca_file))
        .send(&get(&format!("https://localhost:{port}/token")))
        .unwrap();
    assert_eq!((answer.status, answer.body.as_slice()), (200, &b"{}"[..]));
    server.join().unwrap();
}

#[test]
fn another_name_or_an_unknown_ca_fails_the_handshake() {
    let ca = TestCa::new("walrelay test IdP CA").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    ca.write_cert(&ca_file).unwrap();

    let (port, server) = serve(&ca);
    let e = client(Some(ca_file))
        .send(&get(&format!("https://127.0.0.1:{port}/token")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the TLS handshake failed") && e.contains("certificate"),
        "{e}"
    );
    server.join().unwrap();

    let (port, server) = serve(&ca);
    let e = client(None)
        .send(&get(&format!("https://localhost:{port}/token")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the TLS handshake failed") && e.contains("certificate"),
        "{e}"
    );
    server.join().unwrap();
}
