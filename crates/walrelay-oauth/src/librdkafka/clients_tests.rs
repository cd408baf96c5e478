//! A librdkafka client against a fake broker on loopback that accepts
//! every OAUTHBEARER login and records what each carried: the client logs
//! in with the source's token and its extensions, and with each new token
//! once the old one is replaced.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;

use super::*;
use crate::{Extensions, Secret};

/// A new token every two seconds (`tok0`, `tok1`, ...), each good for a
/// second past its successor's arrival, with one extension.
struct Rotating(Instant, SystemTime);

impl TokenSource for Rotating {
    fn token(&self) -> Result<Token, OAuthError> {
        let n = self.0.elapsed().as_secs() / 2;
        Ok(Token {
            value: Secret::new(format!("tok{n}")),
            principal: "relay".into(),
            expires_at: self.1 + Duration::from_secs(2 * (n + 1) + 1),
            extensions: Extensions::parse("logicalCluster=lkc-1", "test").unwrap(),
        })
    }
}

/// One request: (api key, version, correlation id, body after the
/// client id).
fn read_request(socket: &mut TcpStream) -> Option<(i16, i16, i32, Vec<u8>)> {
    let mut len = [0u8; 4];
    socket.read_exact(&mut len).ok()?;
    let mut frame = vec![0u8; usize::try_from(i32::from_be_bytes(len)).ok()?];
    socket.read_exact(&mut frame).ok()?;
    let api = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let client_len = i16::from_be_bytes([frame[8], frame[9]]);
    let body = frame[10 + usize::try_from(client_len.max(0)).ok()?..].to_vec();
    Some((api, version, correlation, body))
}

fn respond(socket: &mut TcpStream, correlation: i32, body: &[u8]) {
    let len = i32::try_from(body.len() + 4).unwrap();
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(&correlation.to_be_bytes());
    out.extend_from_slice(body);
    let _ = socket.write_all(&out);
}

/// An ApiVersions v3 answer (flexible body, header v0): ApiVersions,
/// SaslHandshake and SaslAuthenticate up to v1, Metadata up to v4.
fn api_versions() -> Vec<u8> {
    let apis: [(i16, i16, i16); 4] = [(18, 0, 3), (17, 0, 1), (36, 0, 1), (3, 0, 4)];
    let mut body = vec![0, 0]; // no error
    body.push(u8::try_from(apis.len() + 1).unwrap()); // compact array
    for (key, min, max) in apis {
        body.extend_from_slice(&key.to_be_bytes());
        body.extend_from_slice(&min.to_be_bytes());
        body.extend_from_slice(&max.to_be_bytes());
        body.push(0); // no tagged fields
    }
    body.extend_from_slice(&0i32.to_be_bytes()); // throttle
    body.push(0);
    body
}

/// Serves one connection: ApiVersions, SaslHandshake, then SaslAuthenticate, whose
/// bytes it sends to `seen`; then hangs up, so that the client connects
/// again.
fn serve(mut socket: TcpStream, seen: &mpsc::Sender<String>) {
    let Some((18, _, correlation, _)) = read_request(&mut socket) else {
        return;
    };
    respond(&mut socket, correlation, &api_versions());
    let Some((17, _, correlation, _)) = read_request(&mut socket) else {
        return;
    };
    let mut handshake = vec![0, 0, 0, 0, 0, 1, 0, 11];
    handshake.extend_from_slice(b"OAUTHBEARER");
    respond(&mut socket, correlation, &handshake);
    let Some((36, version, correlation, body)) = read_request(&mut socket) else {
        return;
    };
    let _ = seen.send(String::from_utf8_lossy(&body[4..]).into_owned());
    // No error, no message, no challenge; v1 adds the session lifetime.
    let mut ok = vec![0, 0, 0xff, 0xff, 0, 0, 0, 0];
    if version >= 1 {
        ok.extend_from_slice(&0i64.to_be_bytes());
    }
    respond(&mut socket, correlation, &ok);
}

#[test]
fn a_client_logs_in_with_the_extensions_and_with_each_new_token() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap().to_string();
    let (tx, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for socket in listener.incoming().flatten() {
            serve(socket, &tx);
        }
    });
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &server)
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "OAUTHBEARER")
        .set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "200");
    let producer: Arc<BaseProducer> = Arc::new(config.create().unwrap());
    let tokens = ClientTokens::new(Arc::new(Rotating(Instant::now(), SystemTime::now())));
    tokens.keep_fresh(&producer).unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut logins: Vec<String> = Vec::new();
    while !logins.iter().any(|l| l.contains("tok2")) {
        assert!(
            Instant::now() < deadline,
            "no login with the third token within 20 s: {logins:?}"
        );
        // A request makes the client connect (and log in); the fake hangs
        // up after the login, so each makes a new connection.
        let _ = producer
            .client()
            .fetch_metadata(None, Duration::from_millis(300));
        logins.extend(seen.try_iter());
    }
    assert!(logins[0].contains("auth=Bearer tok0\u{1}"), "{logins:?}");
    for login in &logins {
        assert!(login.starts_with("n,,\u{1}auth=Bearer tok"), "{login:?}");
        assert!(
            login.ends_with("\u{1}logicalCluster=lkc-1\u{1}\u{1}"),
            "{login:?}"
        );
    }
    assert!(logins.iter().any(|l| l.contains("tok1")), "{logins:?}");
    // Dropped clients leave the list at the next token, or when another
    // client is kept.
    drop(producer);
    tokens.hand_to_all(&tokens.token());
    assert!(lock(&tokens.clients).is_empty());
    let (a, b): (Arc<BaseProducer>, Arc<BaseProducer>) = (
        Arc::new(config.create().unwrap()),
        Arc::new(config.create().unwrap()),
    );
    tokens.keep_fresh(&a).unwrap();
    drop(a);
    tokens.keep_fresh(&b).unwrap();
    assert_eq!(lock(&tokens.clients).len(), 1);
}
