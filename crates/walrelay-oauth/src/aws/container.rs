//! The container credentials endpoint: an ECS task's role
//! (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`, answered at
//! `169.254.170.2`) and EKS Pod Identity
//! (`AWS_CONTAINER_CREDENTIALS_FULL_URI` with
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`), both set by the platform in
//! the container's environment. One GET, answered with the same JSON as
//! the instance metadata service's. Where it is and the request are pure;
//! [`credentials`] makes the call.

use std::path::PathBuf;

use super::super::error::OAuthError;
use super::super::http::{Request, Url};
use super::super::token::Secret;
use super::super::transport::Client;
use super::credentials::{parse_temporary, Credentials};

const SERVICE: &str = "the container credentials endpoint";
/// Where ECS answers a relative URI.
const ECS_BASE: &str = "http://169.254.170.2";
/// Plain-HTTP hosts the SDKs allow besides the loopback: ECS's and EKS
/// Pod Identity's link-local agents.
const AGENTS: &[&str] = &["169.254.170.2", "169.254.170.23", "fd00:ec2::23"];

/// How the request is authorized, if at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    None,
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN`.
    Token(Secret),
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`, read at each request (EKS
    /// rotates it).
    File(PathBuf),
}

/// The endpoint and its authorization, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: Url,
    pub authorization: Authorization,
}

/// The endpoint the environment names: `None` when neither URI variable
/// is set; refused when the full URI is plain HTTP to a host that is
/// neither this machine nor a container agent (credentials would cross
/// the network in clear).
pub fn from_env(env: &impl Fn(&str) -> Option<String>) -> Option<Result<Endpoint, OAuthError>> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let url = if let Some(relative) = set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
        const NAME: &str = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI";
        if !relative.starts_with('/') {
            return Some(Err(OAuthError::config(NAME, "a path starting with `/`")));
        }
        Url::parse(&format!("{ECS_BASE}{}", relative.trim()))
            .map_err(|e| OAuthError::config(NAME, e))
    } else {
        const NAME: &str = "AWS_CONTAINER_CREDENTIALS_FULL_URI";
        let full = set(NAME)?;
        Url::parse(full.trim())
            .map_err(|e| OAuthError::config(NAME, e))
            .and_then(|url| {
                if url.https || url.is_loopback() || AGENTS.contains(&url.host.as_str()) {
                    Ok(url)
                } else {
                    Err(OAuthError::config(
                        NAME,
                        format!(
                            "plain HTTP to {} would send credentials over the network; use \
                             https, the loopback or the container agent's address",
                            url.host
                        ),
                    ))
                }
            })
    };
    let authorization = if let Some(file) = set("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        Authorization::File(PathBuf::from(file))
    } else if let Some(token) = set("AWS_CONTAINER_AUTHORIZATION_TOKEN") {
        Authorization::Token(Secret::new(token))
    } else {
        Authorization::None
    };
    Some(url.map(|url| Endpoint { url, authorization }))
}

/// The GET, with `authorization` (the token's value) when there is one.
#[must_use]
pub fn request(endpoint: &Endpoint, authorization: Option<&str>) -> Request {
    let mut headers = vec![("Accept".to_owned(), "application/json".to_owned())];
    if let Some(value) = authorization {
        headers.push(("Authorization".to_owned(), value.to_owned()));
    }
    Request {
        method: "GET",
        url: endpoint.url.clone(),
        headers,
        body: Vec::new(),
    }
}

/// The container's credentials.
pub fn credentials(client: &Client, endpoint: &Endpoint) -> Result<Credentials, OAuthError> {
    let token = match &endpoint.authorization {
        Authorization::None => None,
        Authorization::Token(token) => Some(token.expose().trim().to_owned()),
        Authorization::File(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| OAuthError::File {
                    what: "the container authorization token file \
                           (AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE)",
                    path: path.clone(),
                    reason: e.to_string(),
                })?
                .trim()
                .to_owned(),
        ),
    };
    let get = request(endpoint, token.as_deref());
    let answer = client.send(&get)?;
    let shown = get.url.shown();
    if answer.status != 200 {
        let text = String::from_utf8_lossy(&answer.body);
        return Err(OAuthError::Refused {
            service: SERVICE,
            endpoint: shown,
            status: answer.status,
            answer: super::super::error::excerpt(&text, 200),
            advice: "check the task's or the pod's IAM role (ECS task role, EKS Pod Identity \
                     association) and that the container agent runs",
        });
    }
    parse_temporary(SERVICE, shown, &answer.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::env_of;

    #[test]
    fn ecs_answers_a_relative_uri_at_its_agent() {
        let e = from_env(&env_of([(
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "/v2/credentials/4d1e-task",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(
            e.url.shown(),
            "http://169.254.170.2/v2/credentials/4d1e-task"
        );
        assert_eq!(e.authorization, Authorization::None);
        assert!(from_env(&env_of::<&str, &str>([])).is_none());
    }

    #[test]
    fn eks_pod_identity_sends_the_token_files_contents() {
        let e = from_env(&env_of([
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "http://169.254.170.23/v1/credentials",
            ),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token",
            ),
        ]))
        .unwrap()
        .unwrap();
        assert!(matches!(e.authorization, Authorization::File(_)));
        let text = String::from_utf8(request(&e, Some("tok")).encode()).unwrap();
        assert!(
            text.starts_with("GET /v1/credentials HTTP/1.1\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nAuthorization: tok\r\n"), "{text}");
    }

    #[test]
    fn plain_http_off_this_machine_and_the_agents_is_refused() {
        for (uri, ok) in [
            ("http://127.0.0.1:51679/creds", true),
            ("https://creds.example.com/v1", true),
            ("http://creds.example.com/v1", false),
        ] {
            let got = from_env(&env_of([("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri)])).unwrap();
            assert_eq!(got.is_ok(), ok, "{uri}: {got:?}");
        }
        let e = from_env(&env_of([(
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "v2/x",
        )]))
        .unwrap()
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
            "{e}"
        );
    }
}
