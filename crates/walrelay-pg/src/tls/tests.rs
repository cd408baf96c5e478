//! Tests for the TLS negotiation, using an in-process server.

use super::*;
use crate::config::{ConfigError, RootCert};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SignatureAlgorithm,
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ED25519,
};
use rustls::{CertificateError, ServerConfig};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::Digest;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn make_ca(alg: &'static SignatureAlgorithm) -> Ca {
    let key = KeyPair::generate_for(alg).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "walrelay test CA");
    let cert = params.self_signed(&key).unwrap();
    Ca { cert, key }
}

struct Leaf {
    der: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

fn make_leaf(ca: &Ca, alg: &'static SignatureAlgorithm, names: &[&str]) -> Leaf {
    let key = KeyPair::generate_for(alg).unwrap();
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "walrelay test server");
    let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
    Leaf {
        der: cert.der().clone(),
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

fn write_pem(dir: &tempfile::TempDir, name: &str, ca: &Ca) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, ca.cert.pem()).unwrap();
    path
}

fn acceptor(leaf: &Leaf) -> TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], leaf.key.clone_key())
        .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

enum Reply {
    /// Answer with these bytes and stop.
    Bytes(&'static [u8]),
    /// Answer 'S' then run a TLS server that writes "hello".
    Tls(TlsAcceptor),
    /// Expect no SSLRequest: read 5 plaintext bytes and echo them.
    Plain,
    /// Accept but never answer.
    Silent,
}

/// Serves one connection; returns the address to connect to.
async fn serve(reply: Reply) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        if let Reply::Plain = reply {
            let mut buf = [0u8; 5];
            sock.read_exact(&mut buf).await.unwrap();
            sock.write_all(&buf).await.unwrap();
            return;
        }
        let mut req = [0u8; 8];
        if sock.read_exact(&mut req).await.is_err() {
            return;
        }
        assert_eq!(req, SSL_REQUEST);
        match reply {
            Reply::Bytes(b) => {
                let _ = sock.write_all(b).await;
                // Keep the socket open a little so the client reads the answer.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Reply::Tls(acceptor) => {
                sock.write_all(b"S").await.unwrap();
                if let Ok(mut tls) = acceptor.accept(sock).await {
                    let _ = tls.write_all(b"hello").await;
                    let _ = tls.flush().await;
                    let mut buf = [0u8; 1];
                    let _ = tls.read(&mut buf).await;
                }
            }
            Reply::Silent => tokio::time::sleep(Duration::from_secs(30)).await,
            Reply::Plain => unreachable!(),
        }
    });
    addr
}

fn base() -> Config {
    Config::new().user("u")
}

async fn read_hello(stream: &mut Stream) {
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
}

// ----- DER / channel binding -----

fn leaf_der(alg: &'static SignatureAlgorithm) -> Vec<u8> {
    let ca = make_ca(alg);
    make_leaf(&ca, alg, &["localhost"]).der.to_vec()
}

/// Builds `SEQUENCE { SEQUENCE {} , SEQUENCE { OID, NULL }, BIT STRING {0} }`.
fn fixture(oid: &[u8]) -> Vec<u8> {
    let mut alg = vec![0x06, oid.len() as u8];
    alg.extend_from_slice(oid);
    alg.extend_from_slice(&[0x05, 0x00]);
    let mut body = vec![0x30, 0x00, 0x30, alg.len() as u8];
    body.extend_from_slice(&alg);
    body.extend_from_slice(&[0x03, 0x01, 0x00]);
    let mut cert = vec![0x30, body.len() as u8];
    cert.extend_from_slice(&body);
    cert
}

const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];

fn rsa_oid(last: u8) -> Vec<u8> {
    let mut v = RSA.to_vec();
    v.push(last);
    v
}

#[test]
fn end_point_hash_from_rcgen_certs() {
    let der = leaf_der(&PKCS_ECDSA_P256_SHA256);
    assert_eq!(end_point_hash_for(&der), Some(EndPointHash::Sha256));
    assert_eq!(
        server_end_point_hash(&der).unwrap(),
        sha2::Sha256::digest(&der).to_vec()
    );

    let der = leaf_der(&PKCS_ECDSA_P384_SHA384);
    assert_eq!(end_point_hash_for(&der), Some(EndPointHash::Sha384));
    assert_eq!(
        server_end_point_hash(&der).unwrap(),
        sha2::Sha384::digest(&der).to_vec()
    );

    let der = leaf_der(&PKCS_ED25519);
    assert_eq!(end_point_hash_for(&der), None);
    assert_eq!(server_end_point_hash(&der), None);
}

#[test]
fn end_point_hash_from_fixtures() {
    use EndPointHash::*;
    let cases: &[(Vec<u8>, Option<EndPointHash>)] = &[
        (rsa_oid(0x04), Some(Sha256)), // md5WithRSAEncryption
        (rsa_oid(0x05), Some(Sha256)), // sha1WithRSAEncryption
        (rsa_oid(0x0b), Some(Sha256)),
        (rsa_oid(0x0c), Some(Sha384)),
        (rsa_oid(0x0d), Some(Sha512)),
        (rsa_oid(0x0e), Some(Sha224)),
        (rsa_oid(0x0a), None), // RSASSA-PSS
        (vec![0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01], Some(Sha256)), // ecdsa-with-SHA1
        (
            vec![0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04],
            Some(Sha512),
        ),
        (vec![0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x03], Some(Sha256)), // dsa-with-sha1
        (vec![0x2b, 0x65, 0x70], None),                                 // Ed25519
    ];
    for (oid, want) in cases {
        let der = fixture(oid);
        assert_eq!(end_point_hash_for(&der), *want, "oid {oid:02x?}");
    }
    let der = fixture(&rsa_oid(0x0d));
    assert_eq!(server_end_point_hash(&der).unwrap().len(), 64);
    let der = fixture(&rsa_oid(0x0e));
    assert_eq!(server_end_point_hash(&der).unwrap().len(), 28);
}

#[test]
fn der_parser_rejects_garbage() {
    assert_eq!(end_point_hash_for(&[]), None);
    assert_eq!(end_point_hash_for(&[0x30]), None);
    assert_eq!(end_point_hash_for(&[0x30, 0x85, 0, 0, 0, 0, 1]), None);
    assert_eq!(
        end_point_hash_for(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
        None
    );
    assert_eq!(end_point_hash_for(&[0x30, 0x80, 0x00, 0x00]), None); // indefinite
    assert_eq!(end_point_hash_for(&[0x1f, 0x01, 0x00]), None); // high tag
    let mut der = fixture(&rsa_oid(0x0b));
    // Truncate anywhere: never panics, never matches.
    for len in 0..der.len() {
        assert_eq!(end_point_hash_for(&der[..len]), None, "len {len}");
    }
    // Wrong tag for the OID.
    let pos = der.iter().position(|&b| b == 0x06).unwrap();
    der[pos] = 0x04;
    assert_eq!(end_point_hash_for(&der), None);
    // Long-form lengths are fine.
    let mut long = vec![0x30, 0x81, 0x00];
    let inner = fixture(&rsa_oid(0x0c));
    long[2] = (inner.len() - 2) as u8;
    long.extend_from_slice(&inner[2..]);
    assert_eq!(end_point_hash_for(&long), Some(EndPointHash::Sha384));
}

// ----- verification policy -----

#[test]
fn verification_choice() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = RootCert::File(dir.path().join("ca.pem"));
    let missing_default = dir.path().join("nope/root.crt");
    let present_default = dir.path().join("root.crt");
    std::fs::write(&present_default, "x").unwrap();

    let v = |c: Config| verification_for(&c);
    assert_eq!(v(base().sslmode(SslMode::Disable)).unwrap(), None);
    assert_eq!(v(base()).unwrap(), Some(Verification::None));
    assert_eq!(
        v(base().sslmode(SslMode::Require)).unwrap(),
        Some(Verification::None)
    );
    assert_eq!(
        v(base()
            .sslmode(SslMode::Require)
            .default_sslrootcert(&missing_default))
        .unwrap(),
        Some(Verification::None)
    );
    // libpq: require (and prefer) with root certificates behave like verify-ca.
    assert_eq!(
        v(base()
            .sslmode(SslMode::Require)
            .sslrootcert(ca_file.clone()))
        .unwrap(),
        Some(Verification::Chain(ca_file.clone()))
    );
    assert_eq!(
        v(base()
            .sslmode(SslMode::Require)
            .default_sslrootcert(&present_default))
        .unwrap(),
        Some(Verification::Chain(RootCert::File(present_default.clone())))
    );
    assert_eq!(
        v(base()
            .sslmode(SslMode::VerifyCa)
            .sslrootcert(ca_file.clone()))
        .unwrap(),
        Some(Verification::Chain(ca_file.clone()))
    );
    assert_eq!(
        v(base()
            .sslmode(SslMode::VerifyFull)
            .sslrootcert(ca_file.clone()))
        .unwrap(),
        Some(Verification::ChainAndName(ca_file.clone()))
    );
    assert_eq!(
        v(base().sslrootcert(RootCert::System)).unwrap(),
        Some(Verification::ChainAndName(RootCert::System))
    );
    assert_eq!(
        v(base()
            .sslmode(SslMode::VerifyFull)
            .default_sslrootcert(&present_default))
        .unwrap(),
        Some(Verification::ChainAndName(RootCert::File(
            present_default.clone()
        )))
    );
    // verify-* without roots: libpq-like error naming the fix.
    let e = v(base()
        .sslmode(SslMode::VerifyFull)
        .default_sslrootcert(&missing_default))
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, TlsError::NoRootCert { .. }));
    assert!(
        msg.contains("sslrootcert") && msg.contains("system"),
        "{msg}"
    );
    assert!(msg.contains("root.crt"), "{msg}");
    let e = v(base().sslmode(SslMode::VerifyCa)).unwrap_err();
    assert!(e.to_string().contains("HOME is not set"), "{e}");
    // system roots with a weak mode.
    let e = v(base()
        .sslmode(SslMode::Require)
        .sslrootcert(RootCert::System))
    .unwrap_err();
    assert!(matches!(
        e,
        TlsError::Config(ConfigError::WeakSslModeWithSystemRoots { .. })
    ));
}

#[test]
fn root_cert_file_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let e = load_roots(&RootCert::File(missing.clone())).unwrap_err();
    assert!(matches!(e, TlsError::RootCertMissing { .. }), "{e}");
    assert!(e.to_string().contains("missing.pem"), "{e}");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let e = load_roots(&RootCert::File(empty)).unwrap_err();
    assert!(matches!(e, TlsError::RootCertEmpty { .. }), "{e}");
    assert!(e.to_string().contains("empty.pem"), "{e}");

    let junk = dir.path().join("junk.pem");
    std::fs::write(
        &junk,
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let e = load_roots(&RootCert::File(junk)).unwrap_err();
    assert!(
        matches!(
            e,
            TlsError::RootCertParse { .. } | TlsError::RootCertInvalid { .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("junk.pem"), "{e}");

    let e = load_roots(&RootCert::File(dir.path().to_path_buf())).unwrap_err();
    assert!(matches!(e, TlsError::RootCertRead { .. }), "{e}");

    // Two CAs in one file.
    let two = dir.path().join("two.pem");
    let a = make_ca(&PKCS_ECDSA_P256_SHA256);
    let b = make_ca(&PKCS_ECDSA_P384_SHA384);
    std::fs::write(&two, format!("{}\n{}", a.cert.pem(), b.cert.pem())).unwrap();
    assert_eq!(load_roots(&RootCert::File(two)).unwrap().len(), 2);
}

#[test]
fn client_config_uses_alpn_and_builds_for_each_policy() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(&PKCS_ECDSA_P256_SHA256);
    let file = RootCert::File(write_pem(&dir, "ca.pem", &ca));
    for v in [
        Verification::None,
        Verification::Chain(file.clone()),
        Verification::ChainAndName(file),
    ] {
        let c = client_config(&v).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"postgresql".to_vec()]);
    }
}

// ----- negotiation against an in-process server -----

#[tokio::test]
async fn server_refuses_tls() {
    let addr = serve(Reply::Bytes(b"N")).await;
    let s = connect(&base(), "127.0.0.1", addr.port()).await.unwrap();
    assert!(!s.is_tls());
    assert!(matches!(s, Stream::Tcp(_)));
    assert_eq!(s.tls_server_end_point(), None);

    let addr = serve(Reply::Bytes(b"N")).await;
    let e = connect(&base().sslmode(SslMode::Require), "127.0.0.1", addr.port())
        .await
        .unwrap_err();
    assert!(matches!(e, TlsError::TlsNotSupported { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("does not support TLS but sslmode=require")
            && msg.contains(&format!("127.0.0.1:{}", addr.port()))
            && msg.contains("sslmode=prefer"),
        "{msg}"
    );

    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(&PKCS_ECDSA_P256_SHA256);
    let file = write_pem(&dir, "ca.pem", &ca);
    let addr = serve(Reply::Bytes(b"N")).await;
    let cfg = base()
        .sslmode(SslMode::VerifyFull)
        .sslrootcert(RootCert::File(file));
    let e = connect(&cfg, "127.0.0.1", addr.port()).await.unwrap_err();
    assert!(matches!(e, TlsError::TlsNotSupported { .. }), "{e}");
}

#[tokio::test]
async fn unexpected_answers() {
    let addr = serve(Reply::Bytes(b"E")).await;
    let e = connect(&base(), "127.0.0.1", addr.port())
        .await
        .unwrap_err();
    assert!(
        matches!(e, TlsError::ErrorResponseToSslRequest { .. }),
        "{e}"
    );

    let addr = serve(Reply::Bytes(b"X")).await;
    let e = connect(&base(), "127.0.0.1", addr.port())
        .await
        .unwrap_err();
    assert!(
        matches!(e, TlsError::UnexpectedSslResponse { byte: b'X', .. }),
        "{e}"
    );

    let addr = serve(Reply::Bytes(b"")).await;
    let e = connect(&base(), "127.0.0.1", addr.port())
        .await
        .unwrap_err();
    assert!(matches!(e, TlsError::Io { .. }), "{e}");
}

#[tokio::test]
async fn bytes_after_s_are_not_taken_as_plaintext() {
    // A server (or attacker) sending data right after 'S' must not have it
    // treated as anything but TLS: the handshake fails.
    let addr = serve(Reply::Bytes(b"SZ\0\0\0\x08injected")).await;
    let e = connect(&base().sslmode(SslMode::Require), "127.0.0.1", addr.port())
        .await
        .unwrap_err();
    assert!(matches!(e, TlsError::Handshake { .. }), "{e}");
}

#[tokio::test]
async fn disable_sends_no_ssl_request() {
    let addr = serve(Reply::Plain).await;
    let mut s = connect(&base().sslmode(SslMode::Disable), "127.0.0.1", addr.port())
        .await
        .unwrap();
    assert!(!s.is_tls());
    s.write_all(b"plain").await.unwrap();
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"plain");
}

#[tokio::test]
async fn verify_full_with_right_and_wrong_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(&PKCS_ECDSA_P256_SHA256);
    let other_ca = make_ca(&PKCS_ECDSA_P256_SHA256);
    let leaf = make_leaf(&ca, &PKCS_ECDSA_P256_SHA256, &["localhost", "127.0.0.1"]);
    let ca_file = write_pem(&dir, "ca.pem", &ca);
    let wrong_file = write_pem(&dir, "wrong.pem", &other_ca);

    let full = |f: &PathBuf| {
        base()
            .sslmode(SslMode::VerifyFull)
            .sslrootcert(RootCert::File(f.clone()))
    };

    // DNS name.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let mut s = connect(&full(&ca_file), "localhost", addr.port())
        .await
        .unwrap();
    assert!(s.is_tls());
    read_hello(&mut s).await;
    assert_eq!(
        s.tls_server_end_point().unwrap(),
        sha2::Sha256::digest(leaf.der.as_ref()).to_vec()
    );

    // IP address, matched against the IP SAN.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let mut s = connect(&full(&ca_file), "127.0.0.1", addr.port())
        .await
        .unwrap();
    read_hello(&mut s).await;

    // Wrong CA.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let e = connect(&full(&wrong_file), "localhost", addr.port())
        .await
        .unwrap_err();
    assert!(matches!(e, TlsError::CertificateVerification { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("verify-full") && msg.contains("wrong.pem"),
        "{msg}"
    );
}

#[tokio::test]
async fn verify_ca_ignores_name_but_not_chain() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(&PKCS_ECDSA_P384_SHA384);
    let other_ca = make_ca(&PKCS_ECDSA_P256_SHA256);
    let leaf = make_leaf(&ca, &PKCS_ECDSA_P384_SHA384, &["db.example.com"]);
    let ca_file = write_pem(&dir, "ca.pem", &ca);
    let wrong_file = write_pem(&dir, "wrong.pem", &other_ca);
    let with = |mode, f: &PathBuf| base().sslmode(mode).sslrootcert(RootCert::File(f.clone()));

    // verify-ca: name mismatch accepted.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let mut s = connect(&with(SslMode::VerifyCa, &ca_file), "localhost", addr.port())
        .await
        .unwrap();
    read_hello(&mut s).await;
    assert_eq!(
        s.tls_server_end_point().unwrap(),
        sha2::Sha384::digest(leaf.der.as_ref()).to_vec()
    );

    // verify-full: the same certificate is rejected for its name.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let e = connect(
        &with(SslMode::VerifyFull, &ca_file),
        "localhost",
        addr.port(),
    )
    .await
    .unwrap_err();
    match &e {
        TlsError::CertificateVerification { reason, .. } => assert!(
            matches!(
                reason,
                rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                )
            ),
            "{reason:?}"
        ),
        other => panic!("unexpected {other}"),
    }
    assert!(e.to_string().contains("host name"), "{e}");

    // verify-ca with the wrong CA (and a mismatching name) fails.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let e = connect(
        &with(SslMode::VerifyCa, &wrong_file),
        "localhost",
        addr.port(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, TlsError::CertificateVerification { .. }), "{e}");

    // require + sslrootcert behaves like verify-ca.
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let e = connect(
        &with(SslMode::Require, &wrong_file),
        "localhost",
        addr.port(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, TlsError::CertificateVerification { .. }), "{e}");
    let addr = serve(Reply::Tls(acceptor(&leaf))).await;
    let mut s = connect(&with(SslMode::Require, &ca_file), "localhost", addr.port())
        .await
        .unwrap();
    read_hello(&mut s).await;
}

#[tokio::test]
async fn require_and_prefer_without_ca_accept_any_certificate() {
    let ca = make_ca(&PKCS_ECDSA_P256_SHA256);
    let leaf = make_leaf(&ca, &PKCS_ECDSA_P256_SHA256, &["unrelated.example"]);
    for mode in [SslMode::Require, SslMode::Prefer] {
        let addr = serve(Reply::Tls(acceptor(&leaf))).await;
        let mut s = connect(&base().sslmode(mode), "127.0.0.1", addr.port())
            .await
            .unwrap();
        assert!(s.is_tls(), "{mode}");
        read_hello(&mut s).await;
        assert!(s.tls_server_end_point().is_some());
    }
}

#[tokio::test]
async fn connect_timeout_covers_negotiation() {
    let addr = serve(Reply::Silent).await;
    let cfg = base().connect_timeout(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let e = connect(&cfg, "127.0.0.1", addr.port()).await.unwrap_err();
    assert!(matches!(e, TlsError::Timeout { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("connect_timeout"), "{e}");
}

#[tokio::test]
async fn connection_refused_is_actionable() {
    // Bind then drop to get a port nobody listens on.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let e = connect(&base(), "127.0.0.1", port).await.unwrap_err();
    assert!(matches!(e, TlsError::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
}

#[cfg(unix)]
#[tokio::test]
async fn unix_socket_never_uses_tls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".s.PGSQL.5499");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 5];
        sock.read_exact(&mut buf).await.unwrap();
        sock.write_all(&buf).await.unwrap();
    });
    let host = dir.path().to_str().unwrap().to_string();
    let cfg = base().sslmode(SslMode::Require);
    let mut s = connect(&cfg, &host, 5499).await.unwrap();
    assert!(matches!(s, Stream::Unix(_)));
    assert!(!s.is_tls());
    s.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");

    let e = connect(&cfg, &host, 5500).await.unwrap_err();
    assert!(matches!(e, TlsError::UnixConnect { .. }), "{e}");
    assert!(e.to_string().contains(".s.PGSQL.5500"), "{e}");
}
