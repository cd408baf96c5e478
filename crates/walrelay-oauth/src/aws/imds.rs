//! The EC2 instance metadata service, version 2 (session tokens): a PUT
//! for a session token, a GET for the instance profile's role name, a GET
//! for that role's credentials (JSON). The requests and the answers'
//! reading are pure; [`credentials`] makes the three calls.

use super::super::error::{excerpt, OAuthError};
use super::super::http::{Request, Response, Url};
use super::super::transport::Client;
use super::credentials::{parse_temporary, Credentials};

const SERVICE: &str = "the EC2 instance metadata service";
/// The service's address on every EC2 instance.
const DEFAULT_BASE: &str = "http://169.254.169.254";
const ROLES: &str = "/latest/meta-data/iam/security-credentials/";
/// How long the metadata session token lives (seconds); one is fetched
/// per credential lookup, so a short life is enough.
const SESSION_TTL: &str = "60";

/// The service's base URL: `AWS_EC2_METADATA_SERVICE_ENDPOINT` (the SDKs'
/// override: an IPv6 endpoint, a test double), else `169.254.169.254`.
pub fn base(env: &impl Fn(&str) -> Option<String>) -> Result<String, OAuthError> {
    const NAME: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";
    match env(NAME).filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT_BASE.to_owned()),
        Some(value) => {
            let url = Url::parse(value.trim()).map_err(|e| OAuthError::config(NAME, e))?;
            Ok(url.shown().trim_end_matches('/').to_owned())
        }
    }
}

fn url(base: &str, path: &str) -> Url {
    Url::parse(&format!("{base}{path}")).expect("a base from base() and an encoded path")
}

/// `PUT /latest/api/token`: the session token's request.
#[must_use]
pub fn token_request(base: &str) -> Request {
    Request {
        method: "PUT",
        url: url(base, "/latest/api/token"),
        headers: vec![(
            "X-aws-ec2-metadata-token-ttl-seconds".to_owned(),
            SESSION_TTL.to_owned(),
        )],
        body: Vec::new(),
    }
}

/// A GET of `path` with the session token.
#[must_use]
pub fn get(base: &str, path: &str, session: &str) -> Request {
    Request {
        method: "GET",
        url: url(base, path),
        headers: vec![("X-aws-ec2-metadata-token".to_owned(), session.to_owned())],
        body: Vec::new(),
    }
}

/// The role's credentials path.
#[must_use]
pub fn role_path(role: &str) -> String {
    format!("{ROLES}{}", super::sigv4::uri_encode(role))
}

/// The first role name in the role listing (one per line).
pub fn parse_role(body: &str) -> Result<String, OAuthError> {
    body.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| OAuthError::NoAwsCredentials {
            tried: "the instance has no instance profile (no IAM role attached)".to_owned(),
        })
}

/// The credentials JSON of a role.
pub fn parse_credentials(body: &[u8]) -> Result<Credentials, OAuthError> {
    parse_temporary(SERVICE, format!("{DEFAULT_BASE}{ROLES}"), body)
}

fn ok(request: &Request, answer: Response) -> Result<String, OAuthError> {
    if answer.status == 200 {
        return String::from_utf8(answer.body).map_err(|_| OAuthError::Unreadable {
            service: SERVICE,
            endpoint: request.url.shown(),
            reason: "an answer that is not UTF-8".to_owned(),
        });
    }
    let text = String::from_utf8_lossy(&answer.body);
    Err(OAuthError::Refused {
        service: SERVICE,
        endpoint: request.url.shown(),
        status: answer.status,
        answer: excerpt(&text, 200),
        advice: "check that the instance has an instance profile and that the metadata \
                 service allows IMDSv2 with a hop limit of at least 2 for containers",
    })
}

/// The instance profile's credentials: three calls to the service at
/// `base` ([`base`]).
pub fn credentials(client: &Client, base: &str) -> Result<Credentials, OAuthError> {
    let put = token_request(base);
    let session = ok(&put, client.send(&put)?)?;
    let list = get(base, ROLES, session.trim());
    let role = parse_role(&ok(&list, client.send(&list)?)?)?;
    let fetch = get(base, &role_path(&role), session.trim());
    let body = ok(&fetch, client.send(&fetch)?)?;
    parse_credentials(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;

    #[test]
    fn the_requests_follow_imdsv2() {
        let base = base(&|_: &str| None).unwrap();
        let put = String::from_utf8(token_request(&base).encode()).unwrap();
        assert_eq!(
            put,
            "PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\
             X-aws-ec2-metadata-token-ttl-seconds: 60\r\nContent-Length: 0\r\n\r\n"
        );
        let request = get(&base, &role_path("walrelay-role"), "sess");
        assert_eq!(
            request.url.target,
            "/latest/meta-data/iam/security-credentials/walrelay-role"
        );
        assert!(!format!("{request:?}").contains("sess"));
        let ipv6 = |_: &str| Some("http://[fd00:ec2::254]".to_owned());
        assert_eq!(super::base(&ipv6).unwrap(), "http://[fd00:ec2::254]");
    }

    #[test]
    fn the_role_and_its_credentials_are_read() {
        assert_eq!(parse_role("walrelay-role\n").unwrap(), "walrelay-role");
        assert!(parse_role("\n")
            .unwrap_err()
            .to_string()
            .contains("instance profile"));
        let body = br#"{
  "Code" : "Success",
  "LastUpdated" : "2012-04-26T16:39:16Z",
  "Type" : "AWS-HMAC",
  "AccessKeyId" : "ASIAIOSFODNN7EXAMPLE",
  "SecretAccessKey" : "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
  "Token" : "token",
  "Expiration" : "2017-05-17T15:09:54Z"
}"#;
        let got = parse_credentials(body).unwrap();
        assert_eq!(got.access_key_id, "ASIAIOSFODNN7EXAMPLE");
        assert_eq!(
            got.session_token.as_ref().map(Secret::expose),
            Some("token")
        );
        assert_eq!(
            got.expires,
            Some(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_495_033_794))
        );
        let e = parse_credentials(br#"{"Code":"AssumeRoleUnauthorizedAccess"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("AssumeRoleUnauthorizedAccess"), "{e}");
    }
}
