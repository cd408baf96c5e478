use super::*;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

fn settings() -> OidcSettings {
    OidcSettings {
        endpoint: Url::parse("https://idp.example.com/oauth2/token").unwrap(),
        client_id: "walrelay".into(),
        client_secret: Secret::new("s3cret value"),
        scope: Some("kafka".into()),
        extensions: Extensions::parse("logicalCluster=lkc-1", "x").unwrap(),
    }
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn jwt(payload: &str) -> String {
    format!(
        "eyJhbGciOiJSUzI1NiJ9.{}.c2ln",
        URL_SAFE_NO_PAD.encode(payload)
    )
}

#[test]
fn the_request_is_a_basic_authenticated_client_credentials_form() {
    let request = token_request(&settings());
    let text = String::from_utf8(request.encode()).unwrap();
    // base64("walrelay:s3cret+value"), the secret form-encoded first.
    assert!(text.starts_with(
        "POST /oauth2/token HTTP/1.1\r\nHost: idp.example.com\r\nConnection: close\r\n\
         Authorization: Basic d2FscmVsYXk6czNjcmV0K3ZhbHVl\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nAccept: application/json\r\n"
    ));
    assert!(
        text.ends_with("Content-Length: 41\r\n\r\ngrant_type=client_credentials&scope=kafka"),
        "{text}"
    );
    let mut no_scope = settings();
    no_scope.scope = None;
    assert_eq!(
        token_request(&no_scope).body,
        b"grant_type=client_credentials"
    );
    assert!(!format!("{:?} {:?}", request, settings()).contains("s3cret"));
}

#[test]
fn a_jwt_answer_gives_principal_and_the_earlier_expiry() {
    let token = jwt(r#"{"sub":"svc-relay","exp":5000}"#);
    let body = format!(r#"{{"access_token":"{token}","token_type":"Bearer","expires_in":3600}}"#);
    let got = parse_token_response(&settings(), 200, body.as_bytes(), at(1000)).unwrap();
    assert_eq!(got.value.expose(), token);
    assert_eq!(got.principal, "svc-relay");
    assert_eq!(got.expires_at, at(4600));
    assert_eq!(got.extensions, settings().extensions);
    // `exp` earlier than expires_in says.
    let body = format!(r#"{{"access_token":"{token}","token_type":"bearer","expires_in":"9000"}}"#);
    let got = parse_token_response(&settings(), 200, body.as_bytes(), at(1000)).unwrap();
    assert_eq!(got.expires_at, at(5000));
    // No expires_in: the JWT's exp.
    let body = format!(r#"{{"access_token":"{token}"}}"#);
    let got = parse_token_response(&settings(), 200, body.as_bytes(), at(1000)).unwrap();
    assert_eq!(got.expires_at, at(5000));
}

#[test]
fn an_opaque_token_needs_expires_in_and_is_the_clients() {
    let body = br#"{"access_token":"opaque-abc","token_type":"Bearer","expires_in":300}"#;
    let got = parse_token_response(&settings(), 200, body, at(10)).unwrap();
    assert_eq!(
        (got.principal.as_str(), got.expires_at),
        ("walrelay", at(310))
    );
    let e = parse_token_response(&settings(), 200, br#"{"access_token":"opaque"}"#, at(10))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no expires_in"), "{e}");
}

#[test]
fn the_endpoints_refusal_is_quoted_with_what_to_check() {
    let body = br#"{"error":"invalid_client","error_description":"Invalid client secret"}"#;
    let e = parse_token_response(&settings(), 401, body, at(0))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "the OAuth token endpoint https://idp.example.com/oauth2/token refused the request \
         (HTTP 401): invalid_client: Invalid client secret; check sasl.oauthbearer.client.id, \
         sasl.oauthbearer.client.secret and sasl.oauthbearer.scope against the identity \
         provider's client"
    );
    let e = parse_token_response(&settings(), 502, b"<html>Bad Gateway</html>\n", at(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HTTP 502): <html>Bad Gateway</html>; the identity provider"),
        "{e}"
    );
    let e = parse_token_response(&settings(), 404, b"", at(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("an empty body; check sasl.oauthbearer.token.endpoint.url"),
        "{e}"
    );
}

#[test]
fn answers_that_are_not_bearer_tokens_are_unreadable() {
    let cases: [(&[u8], &str); 4] = [
        (b"not json", "not a token answer"),
        (
            br#"{"access_token":"x","token_type":"mac","expires_in":1}"#,
            "token_type `mac`",
        ),
        (
            br#"{"access_token":"","expires_in":1}"#,
            "empty access_token",
        ),
        (br#"{"access_token":"x","expires_in":"soon"}"#, "expires_in"),
    ];
    for (body, says) in cases {
        let e = parse_token_response(&settings(), 200, body, at(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn fetch_posts_to_the_endpoint_and_reads_the_token() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.ends_with(b"grant_type=client_credentials&scope=kafka") {
            let n = socket.read(&mut buf).unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
        let body = br#"{"access_token":"opaque","token_type":"Bearer","expires_in":60}"#;
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        socket.write_all(head.as_bytes()).unwrap();
        socket.write_all(body).unwrap();
    });
    let mut settings = settings();
    settings.endpoint = Url::parse(&format!("http://127.0.0.1:{port}/token")).unwrap();
    let client = Client::new(SERVICE, None, super::super::transport::Timeouts::default()).unwrap();
    let oidc = Oidc { settings, client };
    let token = oidc.fetch(at(100)).unwrap();
    assert_eq!(
        (token.value.expose(), token.expires_at),
        ("opaque", at(160))
    );
    server.join().unwrap();
}
