use super::*;

#[test]
fn urls_parse_with_default_ports_and_refuse_credentials() {
    let u = Url::parse("https://idp.example.com/realms/kafka/token").unwrap();
    assert_eq!(
        u,
        Url {
            https: true,
            host: "idp.example.com".into(),
            port: 443,
            target: "/realms/kafka/token".into()
        }
    );
    assert_eq!(u.authority(), "idp.example.com");
    let u = Url::parse("http://[::1]:8080?x=1").unwrap();
    assert_eq!((u.host.as_str(), u.port), ("::1", 8080));
    assert_eq!(u.target, "/?x=1");
    assert_eq!(u.authority(), "[::1]:8080");
    assert!(u.is_loopback());
    assert_eq!(u.shown(), "http://[::1]:8080/");
    assert!(!Url::parse("https://idp.example.com").unwrap().is_loopback());
    for bad in [
        "ftp://x/",
        "https://user:pw@idp/token",
        "https://idp/t#frag",
        "https://idp:99999/",
        "https:///path",
        "https://idp/a b",
    ] {
        assert!(Url::parse(bad).is_err(), "{bad}");
    }
    assert!(!Url::parse("https://user:pw@idp/token")
        .unwrap_err()
        .contains("pw"));
}

#[test]
fn a_request_encodes_as_http_1_1_with_a_length() {
    let request = Request {
        method: "POST",
        url: Url::parse("https://idp.example.com:8443/token").unwrap(),
        headers: vec![("Authorization".into(), "Basic abc".into())],
        body: b"a=b".to_vec(),
    };
    assert_eq!(
        String::from_utf8(request.encode()).unwrap(),
        "POST /token HTTP/1.1\r\nHost: idp.example.com:8443\r\nConnection: close\r\n\
         Authorization: Basic abc\r\nContent-Length: 3\r\n\r\na=b"
    );
    let shown = format!("{request:?}");
    assert!(!shown.contains("abc") && !shown.contains("a=b"), "{shown}");
    let get = Request {
        method: "GET",
        url: Url::parse("http://169.254.169.254/latest/meta-data/").unwrap(),
        headers: vec![],
        body: vec![],
    };
    assert_eq!(
        String::from_utf8(get.encode()).unwrap(),
        "GET /latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn answers_complete_by_length_by_chunks_or_by_close() {
    let full = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let ok = Response {
        status: 200,
        body: b"{}".to_vec(),
    };
    assert_eq!(parse_response(full, false), Ok(Some(ok.clone())));
    assert_eq!(parse_response(&full[..full.len() - 1], false), Ok(None));
    assert!(parse_response(&full[..full.len() - 1], true).is_err());
    assert_eq!(
        parse_response(b"HTTP/1.1 200 OK\r\nServer: x", false),
        Ok(None)
    );

    let chunked = b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n\
                    4;ext=1\r\n{\"er\r\n3\r\nr\":\r\n0\r\n\r\n";
    assert_eq!(
        parse_response(chunked, false),
        Ok(Some(Response {
            status: 401,
            body: b"{\"err\":".to_vec()
        }))
    );
    assert_eq!(parse_response(&chunked[..70], false), Ok(None));

    let until_close = b"HTTP/1.0 200 OK\r\n\r\n{}";
    assert_eq!(parse_response(until_close, false), Ok(None));
    assert_eq!(parse_response(until_close, true), Ok(Some(ok)));

    assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n", false)
        .unwrap_err()
        .contains("status line"));
    assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false).is_err());
}

#[test]
fn forms_and_basic_credentials_are_encoded_per_rfc_6749() {
    assert_eq!(
        String::from_utf8(form(&[
            ("grant_type", "client_credentials"),
            ("scope", "kafka openid")
        ]))
        .unwrap(),
        "grant_type=client_credentials&scope=kafka+openid"
    );
    assert_eq!(form_encode("a*b-c._d~"), "a*b-c._d%7E");
    // Values computed with Python's urllib.parse.quote_plus and base64.
    assert_eq!(
        basic_auth("walrelay client", "p@ss:w/rd+\u{e9}"),
        "Basic d2FscmVsYXkrY2xpZW50OnAlNDBzcyUzQXclMkZyZCUyQiVDMyVBOQ=="
    );
}
