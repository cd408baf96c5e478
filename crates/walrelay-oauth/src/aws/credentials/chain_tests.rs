//! The chain's I/O against loopback fakes of STS and the instance
//! metadata service, reached through the SDKs' endpoint overrides; the
//! environment is the test's own, not the process's.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use super::*;
use crate::aws::env_of;

/// A server answering one connection per entry of `answers`, in order;
/// returns each request as text.
fn serve(answers: Vec<String>) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let handle = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for answer in answers {
            let (mut socket, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = socket.read(&mut buf).unwrap();
                seen.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&seen).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .map_or(0, |n| n.parse::<usize>().unwrap());
                    if body.len() >= length {
                        requests.push(text);
                        break;
                    }
                }
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                answer.len()
            );
            socket.write_all(head.as_bytes()).unwrap();
            socket.write_all(answer.as_bytes()).unwrap();
        }
        requests
    });
    (base, handle)
}

fn now() -> SystemTime {
    // 2014-10-24T22:00:00Z, an hour before the STS answer's expiry.
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_414_188_000)
}

#[test]
fn keys_in_the_environment_win() {
    let chain = Chain::new("eu-west-1").unwrap();
    let env = env_of(vec![
        ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "secret".to_owned()),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/unused".to_owned(),
        ),
    ]);
    let got = chain.resolve_with(&env, now()).unwrap();
    assert_eq!(got.access_key_id, "AKIAIOSFODNN7EXAMPLE");
}

#[test]
fn web_identity_asks_sts_with_the_token_files_contents() {
    let answer = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>\
        <Credentials><SessionToken>session</SessionToken><SecretAccessKey>secret</SecretAccessKey>\
        <Expiration>2014-10-24T23:00:23Z</Expiration><AccessKeyId>ASIAEXAMPLE</AccessKeyId>\
        </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
    let (base, sts) = serve(vec![answer.to_owned()]);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.sa.sig\n").unwrap();
    let env = env_of(vec![
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            token_file.display().to_string(),
        ),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/walrelay".to_owned(),
        ),
        ("AWS_ENDPOINT_URL_STS", format!("{base}/")),
    ]);
    let chain = Chain::new("eu-west-1").unwrap();
    let got = chain.resolve_with(&env, now()).unwrap();
    assert_eq!(got.access_key_id, "ASIAEXAMPLE");
    assert_eq!(
        got.session_token.as_ref().map(Secret::expose),
        Some("session")
    );
    let requests = sts.join().unwrap();
    assert!(
        requests[0].starts_with("POST / HTTP/1.1\r\n"),
        "{}",
        requests[0]
    );
    assert!(
        requests[0].ends_with("&WebIdentityToken=eyJhbGciOiJSUzI1NiJ9.sa.sig"),
        "{}",
        requests[0]
    );

    // Credentials already expired by this machine's clock are refused.
    let (base, sts) = serve(vec![answer.to_owned()]);
    let env = env_of(vec![
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            token_file.display().to_string(),
        ),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/walrelay".to_owned(),
        ),
        ("AWS_ENDPOINT_URL_STS", base),
    ]);
    let late = now() + Duration::from_secs(7200);
    let e = chain.resolve_with(&env, late).unwrap_err().to_string();
    assert!(e.contains("expired on arrival"), "{e}");
    sts.join().unwrap();
}

#[test]
fn the_instance_profile_is_read_with_an_imdsv2_session() {
    let credentials = r#"{"Code":"Success","AccessKeyId":"ASIAINSTANCE","SecretAccessKey":"s",
        "Token":"t","Expiration":"2014-10-24T23:00:23Z"}"#;
    let (base, imds) = serve(vec![
        "session-123".to_owned(),
        "walrelay-role\n".to_owned(),
        credentials.into(),
    ]);
    let env = env_of(vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT", base)]);
    let chain = Chain::new("eu-west-1").unwrap();
    let got = chain.resolve_with(&env, now()).unwrap();
    assert_eq!(got.access_key_id, "ASIAINSTANCE");
    let requests = imds.join().unwrap();
    assert!(requests[0].starts_with("PUT /latest/api/token HTTP/1.1\r\n"));
    assert!(requests[0].contains("X-aws-ec2-metadata-token-ttl-seconds: 60\r\n"));
    assert!(requests[1].starts_with("GET /latest/meta-data/iam/security-credentials/ HTTP/1.1"));
    assert!(requests[2]
        .starts_with("GET /latest/meta-data/iam/security-credentials/walrelay-role HTTP/1.1"));
    for request in &requests[1..] {
        assert!(
            request.contains("X-aws-ec2-metadata-token: session-123\r\n"),
            "{request}"
        );
    }
}

#[test]
fn nothing_found_says_what_was_tried() {
    let chain = Chain::new("eu-west-1").unwrap();
    let disabled = env_of(vec![("AWS_EC2_METADATA_DISABLED", "true".to_owned())]);
    let e = chain
        .resolve_with(&disabled, now())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "no AWS credentials found (no keys in the environment or the shared credentials \
             file, no web identity, no container credentials endpoint",
        ) && e.contains("AWS_EC2_METADATA_DISABLED"),
        "{e}"
    );
    // A metadata endpoint where nothing listens.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let nowhere = env_of(vec![(
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    )]);
    let e = chain.resolve_with(&nowhere, now()).unwrap_err().to_string();
    assert!(e.contains("no instance metadata service"), "{e}");
}

#[test]
fn the_container_endpoint_is_asked_with_the_pods_token() {
    let credentials = r#"{"AccessKeyId":"ASIAPOD","SecretAccessKey":"s","Token":"t",
        "AccountId":"123456789012","Expiration":"2014-10-24T23:00:23Z"}"#;
    let (base, agent) = serve(vec![credentials.into()]);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, "pod-token-1\n").unwrap();
    let env = env_of(vec![
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            format!("{base}/v1/credentials"),
        ),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            token_file.display().to_string(),
        ),
        // Consulted only after the container endpoint: never reached.
        (
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            "http://127.0.0.1:9".to_owned(),
        ),
    ]);
    let chain = Chain::new("eu-west-1").unwrap();
    let got = chain.resolve_with(&env, now()).unwrap();
    assert_eq!(got.access_key_id, "ASIAPOD");
    assert!(got.expires.is_some());
    let requests = agent.join().unwrap();
    assert!(
        requests[0].starts_with("GET /v1/credentials HTTP/1.1\r\n"),
        "{}",
        requests[0]
    );
    assert!(
        requests[0].contains("\r\nAuthorization: pod-token-1\r\n"),
        "{}",
        requests[0]
    );
}
