//! AWS credentials and the standard chain that finds them, in the AWS
//! SDKs' order: the environment, the shared credentials file's keys, web
//! identity (EKS's IAM roles for service accounts), the container
//! credentials endpoint (ECS task roles, EKS Pod Identity), the EC2
//! instance profile. Reading each source is
//! pure where it can be ([`from_env`], [`super::sts::parse_response`],
//! [`parse_temporary`]); [`Chain::resolve`] does the I/O.
//!
//! Not covered: profiles that assume a role, use SSO or run a
//! `credential_process`: there, export the keys in the environment.

use std::path::PathBuf;
use std::time::SystemTime;

use super::super::error::excerpt;
use super::super::error::OAuthError;
use super::super::http::Url;
use super::super::token::Secret;
use super::super::transport::{Client, Timeouts};
use super::{container, imds, profile, sts};

/// A set of AWS credentials. `Debug` hides the secret and the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    /// For temporary credentials (STS, instance profiles).
    pub session_token: Option<Secret>,
    /// When temporary credentials stop working.
    pub expires: Option<SystemTime>,
}

/// Credentials from the environment (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`): `None` when neither key
/// is set, an error when only one is.
pub fn from_env(env: &impl Fn(&str) -> Option<String>) -> Option<Result<Credentials, OAuthError>> {
    let id = env("AWS_ACCESS_KEY_ID").filter(|v| !v.is_empty());
    let secret = env("AWS_SECRET_ACCESS_KEY").filter(|v| !v.is_empty());
    match (id, secret) {
        (None, None) => None,
        (Some(access_key_id), Some(secret)) => Some(Ok(Credentials {
            access_key_id,
            secret_access_key: Secret::new(secret),
            session_token: env("AWS_SESSION_TOKEN")
                .filter(|v| !v.is_empty())
                .map(Secret::new),
            expires: None,
        })),
        (Some(_), None) => Some(Err(OAuthError::config(
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not; set both",
        ))),
        (None, Some(_)) => Some(Err(OAuthError::config(
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not; set both",
        ))),
    }
}

/// Web identity settings from the environment, as EKS sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebIdentity {
    pub token_file: PathBuf,
    pub role_arn: String,
    pub session_name: String,
}

/// `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` (both, or neither),
/// with `AWS_ROLE_SESSION_NAME` or `walrelay` as the session's name.
pub fn web_identity_from_env(
    env: &impl Fn(&str) -> Option<String>,
) -> Option<Result<WebIdentity, OAuthError>> {
    let file = env("AWS_WEB_IDENTITY_TOKEN_FILE").filter(|v| !v.is_empty());
    let role = env("AWS_ROLE_ARN").filter(|v| !v.is_empty());
    match (file, role) {
        (None, None) => None,
        (Some(file), Some(role_arn)) => Some(Ok(WebIdentity {
            token_file: PathBuf::from(file),
            role_arn,
            session_name: env("AWS_ROLE_SESSION_NAME")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "walrelay".to_owned()),
        })),
        (Some(_), None) => Some(Err(OAuthError::config(
            "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not; set both",
        ))),
        (None, Some(_)) => Some(Err(OAuthError::config(
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_ROLE_ARN is set but AWS_WEB_IDENTITY_TOKEN_FILE is not; set both",
        ))),
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Temporary {
    code: Option<String>,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    token: Option<String>,
    expiration: Option<String>,
}

/// Temporary credentials as the instance metadata service and the
/// container credentials endpoint answer them (`AccessKeyId`,
/// `SecretAccessKey`, `Token`, `Expiration`; the former adds `Code`).
pub fn parse_temporary(
    service: &'static str,
    endpoint: String,
    body: &[u8],
) -> Result<Credentials, OAuthError> {
    let unreadable = |reason: String| OAuthError::Unreadable {
        service,
        endpoint: endpoint.clone(),
        reason,
    };
    let answer: Temporary = serde_json::from_slice(body)
        .map_err(|e| unreadable(format!("not the credentials JSON ({e})")))?;
    if let Some(code) = answer.code.filter(|c| c != "Success") {
        return Err(unreadable(format!("Code `{}`", excerpt(&code, 60))));
    }
    let (Some(access_key_id), Some(secret), Some(token), Some(expiration)) = (
        answer.access_key_id,
        answer.secret_access_key,
        answer.token,
        answer.expiration,
    ) else {
        return Err(unreadable(
            "AccessKeyId, SecretAccessKey, Token or Expiration missing".to_owned(),
        ));
    };
    let expires = humantime::parse_rfc3339_weak(&expiration)
        .map_err(|e| unreadable(format!("Expiration `{}`: {e}", excerpt(&expiration, 40))))?;
    Ok(Credentials {
        access_key_id,
        secret_access_key: Secret::new(secret),
        session_token: Some(Secret::new(token)),
        expires: Some(expires),
    })
}

/// The credential chain for one region.
#[derive(Debug)]
pub struct Chain {
    region: String,
    sts: Client,
    container: Client,
    imds: Client,
}

impl Chain {
    /// The chain for `region` (STS is asked in that region); refused
    /// unless it is a region's name.
    pub fn new(region: &str) -> Result<Chain, OAuthError> {
        let region = super::check_region(region)?;
        // The instance metadata service answers within a millisecond
        // when it exists; off EC2 the connect must fail fast.
        let imds_timeouts = Timeouts {
            connect: std::time::Duration::from_secs(1),
            response: std::time::Duration::from_secs(2),
        };
        Ok(Chain {
            region: region.to_owned(),
            sts: Client::new("AWS STS", None, Timeouts::default())?,
            container: Client::new(
                "the container credentials endpoint",
                None,
                Timeouts::default(),
            )?,
            imds: Client::new("the EC2 instance metadata service", None, imds_timeouts)?,
        })
    }

    /// The first credentials found, from the process environment.
    pub fn resolve(&self, now: SystemTime) -> Result<Credentials, OAuthError> {
        self.resolve_with(&|name: &str| std::env::var(name).ok(), now)
    }

    /// [`resolve`](Self::resolve) with the environment `env` (tests give
    /// their own). The container endpoint is where the platform's
    /// variables say; the SDKs' endpoint overrides are honoured:
    /// `AWS_ENDPOINT_URL_STS` (or `AWS_ENDPOINT_URL`) for STS,
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT` for the metadata service.
    pub fn resolve_with(
        &self,
        env: &impl Fn(&str) -> Option<String>,
        now: SystemTime,
    ) -> Result<Credentials, OAuthError> {
        if let Some(found) = from_env(env) {
            return found;
        }
        if let Some(found) = profile::from_file(env) {
            return found;
        }
        if let Some(identity) = web_identity_from_env(env) {
            let endpoint = sts::endpoint(&self.region, env)?;
            return self.assume_role(&identity?, &endpoint, now);
        }
        if let Some(endpoint) = container::from_env(env) {
            return container::credentials(&self.container, &endpoint?);
        }
        if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Err(OAuthError::NoAwsCredentials {
                tried: "no keys in the environment or the shared credentials file, no web \
                        identity, no container credentials endpoint, the instance metadata \
                        service disabled by AWS_EC2_METADATA_DISABLED"
                    .to_owned(),
            });
        }
        imds::credentials(&self.imds, &imds::base(env)?).map_err(|e| match e {
            OAuthError::Transport { reason, .. } => OAuthError::NoAwsCredentials {
                tried: format!(
                    "no keys in the environment or the shared credentials file, no web \
                     identity, no container credentials endpoint, no instance metadata \
                     service ({reason})"
                ),
            },
            other => other,
        })
    }

    fn assume_role(
        &self,
        identity: &WebIdentity,
        endpoint: &Url,
        now: SystemTime,
    ) -> Result<Credentials, OAuthError> {
        let token =
            std::fs::read_to_string(&identity.token_file).map_err(|e| OAuthError::File {
                what: "the web identity token file (AWS_WEB_IDENTITY_TOKEN_FILE)",
                path: identity.token_file.clone(),
                reason: e.to_string(),
            })?;
        let request = sts::request(endpoint, identity, token.trim());
        let answer = self.sts.send(&request)?;
        let shown = endpoint.shown();
        let credentials = sts::parse_response(&shown, answer.status, &answer.body)?;
        if credentials.expires.is_some_and(|t| t <= now) {
            return Err(OAuthError::Unusable {
                source_name: format!("AWS STS {shown}"),
                reason: "its credentials expired on arrival (is this machine's clock right?)"
                    .to_owned(),
            });
        }
        Ok(credentials)
    }
}

#[cfg(test)]
mod chain_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::env_of;

    #[test]
    fn keys_from_the_environment_come_in_pairs() {
        assert!(from_env(&env_of::<&str, &str>([])).is_none());
        let got = from_env(&env_of([
            ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE"),
            (
                "AWS_SECRET_ACCESS_KEY",
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            ),
            ("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLE"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(got.access_key_id, "AKIAIOSFODNN7EXAMPLE");
        assert_eq!(
            got.session_token.as_ref().map(Secret::expose),
            Some("FwoGZXIvYXdzEXAMPLE")
        );
        let shown = format!("{got:?}");
        assert!(
            !shown.contains("EXAMPLEKEY") && !shown.contains("FwoGZXIvYXdz"),
            "{shown}"
        );
        let e = from_env(&env_of([("AWS_ACCESS_KEY_ID", "AKIA")]))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("set both"), "{e}");
    }

    #[test]
    fn web_identity_needs_the_file_and_the_role() {
        let got = web_identity_from_env(&env_of([
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/eks/token"),
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/walrelay"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(got.session_name, "walrelay");
        assert_eq!(got.token_file, PathBuf::from("/var/run/secrets/eks/token"));
        let e = web_identity_from_env(&env_of([("AWS_ROLE_ARN", "arn")]))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("AWS_WEB_IDENTITY_TOKEN_FILE"), "{e}");
    }
}
