//! OAUTHBEARER logins on walrelay's own connections, against a fake
//! broker on loopback that speaks SaslHandshake v1 and SaslAuthenticate
//! v1 and records what it was sent.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::kafka::wire::Reader;
use walrelay_oauth::{Extensions, OAuthError, Secret, Token};

struct Fixed(Result<Token, OAuthError>);

impl TokenSource for Fixed {
    fn token(&self) -> Result<Token, OAuthError> {
        self.0.clone()
    }
}

fn token() -> Token {
    let mut extensions = Extensions::default();
    extensions.insert("logicalCluster", "lkc-1").unwrap();
    Token {
        value: Secret::new("eyJhbGciOiJub25lIn0.eyJzdWIiOiJyZWxheSJ9."),
        principal: "relay".into(),
        expires_at: SystemTime::now() + Duration::from_secs(600),
        extensions,
    }
}

/// One request read off `socket`: (api key, correlation id, the rest).
fn read_request(socket: &mut std::net::TcpStream) -> (i16, i32, Vec<u8>) {
    let mut len = [0u8; 4];
    socket.read_exact(&mut len).unwrap();
    let mut frame = vec![0u8; usize::try_from(i32::from_be_bytes(len)).unwrap()];
    socket.read_exact(&mut frame).unwrap();
    let mut r = Reader::new(&frame);
    let api_key = r.i16().unwrap();
    let _version = r.i16().unwrap();
    let correlation = r.i32().unwrap();
    let _client = r.nullable_string().unwrap();
    let body = match api_key {
        36 => r.bytes().unwrap().to_vec(),
        _ => r.string().unwrap().into_bytes(),
    };
    (api_key, correlation, body)
}

fn respond(socket: &mut std::net::TcpStream, body: &[u8]) {
    socket
        .write_all(&i32::try_from(body.len()).unwrap().to_be_bytes())
        .unwrap();
    socket.write_all(body).unwrap();
}

/// A SaslAuthenticate v1 response.
fn authenticate_response(correlation: i32, error: i16, message: &str, auth: &[u8]) -> Vec<u8> {
    let mut out = correlation.to_be_bytes().to_vec();
    out.extend_from_slice(&error.to_be_bytes());
    if message.is_empty() {
        out.extend_from_slice(&(-1i16).to_be_bytes());
    } else {
        out.extend_from_slice(&i16::try_from(message.len()).unwrap().to_be_bytes());
        out.extend_from_slice(message.as_bytes());
    }
    out.extend_from_slice(&i32::try_from(auth.len()).unwrap().to_be_bytes());
    out.extend_from_slice(auth);
    out.extend_from_slice(&0i64.to_be_bytes());
    out
}

/// A broker that accepts the handshake, answers the first SaslAuthenticate
/// with `challenge` and, when that is not empty, the second with error 58.
/// Returns what each SaslAuthenticate carried.
fn broker(challenge: &'static [u8]) -> (String, std::thread::JoinHandle<Vec<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let (api, correlation, mechanism) = read_request(&mut socket);
        assert_eq!((api, mechanism.as_slice()), (17, &b"OAUTHBEARER"[..]));
        let mut handshake = correlation.to_be_bytes().to_vec();
        handshake.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, 11]);
        handshake.extend_from_slice(b"OAUTHBEARER");
        respond(&mut socket, &handshake);
        let mut seen = Vec::new();
        let (api, correlation, auth) = read_request(&mut socket);
        assert_eq!(api, 36);
        seen.push(auth);
        respond(
            &mut socket,
            &authenticate_response(correlation, 0, "", challenge),
        );
        if !challenge.is_empty() {
            let (_, correlation, auth) = read_request(&mut socket);
            seen.push(auth);
            let failed = "Authentication failed during authentication due to invalid credentials";
            respond(
                &mut socket,
                &authenticate_response(correlation, 58, failed, b""),
            );
        }
        seen
    });
    (server, handle)
}

fn oauth_settings(tokens: Option<Arc<dyn TokenSource>>) -> Result<Settings, RequestError> {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "OAUTHBEARER")
        .set("sasl.oauthbearer.method", "oidc");
    Settings::from_client_config_with_tokens(&config, tokens)
}

#[test]
fn the_token_and_its_extensions_log_in() {
    let (server, broker) = broker(b"");
    let settings = oauth_settings(Some(Arc::new(Fixed(Ok(token()))))).unwrap();
    assert!(format!("{settings:?}").contains("OAuthBearer"));
    Connection::open(&server, &settings, Duration::from_secs(5)).unwrap();
    let seen = broker.join().unwrap();
    assert_eq!(
        seen,
        [
            b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJyZWxheSJ9.\x01\
           logicalCluster=lkc-1\x01\x01"
                .to_vec()
        ]
    );
}

#[test]
fn a_refused_token_reports_the_brokers_error_after_the_abort() {
    let (server, broker) = broker(br#"{"status":"invalid_token"}"#);
    let settings = oauth_settings(Some(Arc::new(Fixed(Ok(token()))))).unwrap();
    let e = Connection::open(&server, &settings, Duration::from_secs(5))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "{server}: the broker refused the OAuth token: status invalid_token"
        )),
        "{e}"
    );
    let seen = broker.join().unwrap();
    assert_eq!(seen[1], b"\x01");
}

#[test]
fn no_token_no_login_and_no_provider_no_settings() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let (_, correlation, _) = read_request(&mut socket);
        let mut handshake = correlation.to_be_bytes().to_vec();
        handshake.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        respond(&mut socket, &handshake);
    });
    let failing = Fixed(Err(OAuthError::NoAwsCredentials {
        tried: "nothing".into(),
    }));
    let settings = oauth_settings(Some(Arc::new(failing))).unwrap();
    let e = Connection::open(&server, &settings, Duration::from_secs(5))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no AWS credentials found"), "{e}");
    handle.join().unwrap();

    let e = oauth_settings(None).unwrap_err().to_string();
    assert!(
        e.contains("OAUTHBEARER without walrelay's token provider"),
        "{e}"
    );
}

/// A token endpoint for one request, answering a JWT for `relay-svc`.
fn token_endpoint(jwt: String) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/token",
        listener.local_addr().unwrap().port()
    );
    let handle = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.ends_with(b"grant_type=client_credentials") {
            let n = socket.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early");
            seen.extend_from_slice(&buf[..n]);
        }
        let body = format!(r#"{{"access_token":"{jwt}","token_type":"Bearer","expires_in":300}}"#);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        socket.write_all(head.as_bytes()).unwrap();
        socket.write_all(body.as_bytes()).unwrap();
    });
    (url, handle)
}

#[test]
fn an_oidc_token_from_the_cache_logs_in_every_connection() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use walrelay_oauth::plan::{plan, OAuthOptions};
    use walrelay_oauth::{Provider, TokenCache};

    let jwt = format!(
        "eyJhbGciOiJSUzI1NiJ9.{}.c2ln",
        URL_SAFE_NO_PAD.encode(r#"{"sub":"relay-svc","exp":4102444800}"#)
    );
    let (url, endpoint) = token_endpoint(jwt.clone());
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "OAUTHBEARER")
        .set("sasl.oauthbearer.method", "oidc")
        .set("sasl.oauthbearer.token.endpoint.url", &url)
        .set("sasl.oauthbearer.client.id", "walrelay")
        .set("sasl.oauthbearer.client.secret", "s3cret")
        .set("sasl.oauthbearer.extensions", "logicalCluster=lkc-1");
    let plan = plan(|k| config.get(k), &OAuthOptions::default(), |_| None).unwrap();
    let cache = TokenCache::new(Provider::new(plan).unwrap());
    let settings =
        Settings::from_client_config_with_tokens(&config, Some(Arc::new(cache))).unwrap();
    // Two connections, one token: the endpoint answers only once.
    for _ in 0..2 {
        let (server, broker) = broker(b"");
        Connection::open(&server, &settings, Duration::from_secs(5)).unwrap();
        let seen = broker.join().unwrap();
        let expected = format!("n,,\x01auth=Bearer {jwt}\x01logicalCluster=lkc-1\x01\x01");
        assert_eq!(seen, [expected.into_bytes()]);
    }
    endpoint.join().unwrap();
}
