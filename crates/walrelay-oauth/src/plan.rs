//! Which token provider a client's properties ask for, read before any
//! token is fetched so that a mistake stops `walrelay run` with the
//! setting's name. Pure: the properties (resolved, as
//! the relay's secret references leave them: a client secret
//! given as `env:NAME` or `file:/path` is already the secret), walrelay's
//! own options and the environment are arguments.
//!
//! librdkafka's property names are the interface wherever they exist, so
//! that a configuration that works with any librdkafka client works here:
//!
//! | provider | chosen by |
//! |---|---|
//! | OIDC client credentials | `sasl.oauthbearer.method=oidc` with `sasl.oauthbearer.token.endpoint.url`, `.client.id`, `.client.secret`, `.scope`, `.extensions`; `https.ca.location` for a private CA |
//! | AWS MSK IAM | `[kafka] oauth_provider = "aws-msk-iam"` and `aws_region` (or `AWS_REGION`) |
//! | unsecured (development) | `enable.sasl.oauthbearer.unsecure.jwt=true` with `sasl.oauthbearer.config`, and `[kafka] insecure_allow_unsecured_jwt = true` |

use std::path::PathBuf;

use serde::Deserialize;

use super::error::OAuthError;
use super::extensions::Extensions;
use super::http::Url;
use super::oidc::OidcSettings;
use super::token::Secret;
use super::unsecured::Unsecured;

/// walrelay's own OAuth options, for what librdkafka has no property
/// for (the relay's `[kafka]` section has them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthOptions {
    /// A token provider librdkafka does not have.
    pub oauth_provider: Option<ProviderName>,
    /// The MSK cluster's region (default: `AWS_REGION`, then
    /// `AWS_DEFAULT_REGION`).
    pub aws_region: Option<String>,
    /// Accept librdkafka's unsecured tokens: anyone can forge one, so the
    /// name says what it is.
    pub insecure_allow_unsecured_jwt: bool,
}

/// `oauth_provider`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderName {
    /// `aws-msk-iam`.
    AwsMskIam,
}

/// The provider a client's properties ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderPlan {
    Oidc {
        settings: OidcSettings,
        /// `https.ca.location`: the CA file for the token endpoint.
        ca_file: Option<PathBuf>,
    },
    MskIam {
        region: String,
    },
    Unsecured(Unsecured),
}

const ENDPOINT: &str = "sasl.oauthbearer.token.endpoint.url";
const UNSECURE: &str = "enable.sasl.oauthbearer.unsecure.jwt";
const EXTENSIONS: &str = "sasl.oauthbearer.extensions";
/// OIDC properties of librdkafka that walrelay does not implement: refused
/// rather than ignored, since ignoring them would log in differently.
/// An empty accepted value: any value is refused.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("sasl.oauthbearer.grant.type", "client_credentials"),
    ("sasl.oauthbearer.sub.claim.name", "sub"),
    ("sasl.oauthbearer.metadata.authentication.type", "none"),
    ("sasl.oauthbearer.assertion.file", ""),
    ("sasl.oauthbearer.assertion.private.key.file", ""),
    ("sasl.oauthbearer.assertion.private.key.pem", ""),
];

/// The plan for an `OAUTHBEARER` client whose resolved properties `get`
/// returns, with walrelay's `options` and the environment `env`.
pub fn plan<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    options: &OAuthOptions,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ProviderPlan, OAuthError> {
    let method = get("sasl.oauthbearer.method")
        .map_or_else(|| "default".to_owned(), |m| m.trim().to_ascii_lowercase());
    // librdkafka's boolean syntax, any case.
    let unsecure = get(UNSECURE)
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "t" | "1"));
    if options.insecure_allow_unsecured_jwt && !unsecure {
        return Err(OAuthError::config(
            "insecure_allow_unsecured_jwt",
            format!("is set, but {UNSECURE} is not true; remove it"),
        ));
    }
    match (options.oauth_provider, method.as_str()) {
        (Some(ProviderName::AwsMskIam), "default") if !unsecure => msk_plan(&get, options, &env),
        (Some(ProviderName::AwsMskIam), _) => Err(OAuthError::config(
            "oauth_provider",
            format!(
                "aws-msk-iam makes its own tokens; remove sasl.oauthbearer.method and {UNSECURE}"
            ),
        )),
        (None, "oidc") if unsecure => Err(OAuthError::config(
            UNSECURE,
            "contradicts sasl.oauthbearer.method=oidc; remove it",
        )),
        (None, "oidc") => oidc_plan(&get),
        (None, "default") if unsecure => unsecured_plan(&get, options),
        (None, "default") => Err(OAuthError::config(
            "sasl.oauthbearer.method",
            "sasl.mechanism=OAUTHBEARER needs a token provider: set \
             sasl.oauthbearer.method=oidc with sasl.oauthbearer.token.endpoint.url, \
             sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret, or \
             oauth_provider = \"aws-msk-iam\" in [kafka] for AWS MSK IAM",
        )),
        (None, other) => Err(OAuthError::config(
            "sasl.oauthbearer.method",
            format!("`{other}` is not a method librdkafka knows (oidc or default)"),
        )),
    }
}

fn oidc_plan<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Result<ProviderPlan, OAuthError> {
    for &(property, accepted) in UNSUPPORTED {
        if let Some(value) = get(property) {
            if accepted.is_empty() || !value.trim().eq_ignore_ascii_case(accepted) {
                return Err(OAuthError::config(
                    property,
                    "walrelay's OIDC login does client credentials with a client secret only",
                ));
            }
        }
    }
    let required = |names: &[&str]| {
        names
            .iter()
            .find_map(|name| get(name).filter(|v| !v.trim().is_empty()))
            .ok_or_else(|| OAuthError::config(names[0], "sasl.oauthbearer.method=oidc needs it"))
    };
    let url = required(&[ENDPOINT])?;
    let endpoint = Url::parse(url.trim()).map_err(|e| OAuthError::config(ENDPOINT, e))?;
    if !endpoint.https && !endpoint.is_loopback() {
        return Err(OAuthError::config(
            ENDPOINT,
            "plain http:// would send the client secret in clear text; use https:// (http:// \
             is accepted only on this machine's loopback)",
        ));
    }
    let client_id = required(&[
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.credentials.client.id",
    ])?;
    let client_secret = required(&[
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
    ])?;
    Ok(ProviderPlan::Oidc {
        settings: OidcSettings {
            endpoint,
            client_id: client_id.to_owned(),
            client_secret: Secret::new(client_secret),
            scope: get("sasl.oauthbearer.scope")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
            extensions: Extensions::parse(get(EXTENSIONS).unwrap_or_default(), EXTENSIONS)?,
        },
        ca_file: get("https.ca.location").map(PathBuf::from),
    })
}

fn msk_plan<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    options: &OAuthOptions,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<ProviderPlan, OAuthError> {
    for property in [
        ENDPOINT,
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
        EXTENSIONS,
    ] {
        if get(property).is_some() {
            return Err(OAuthError::config(
                property,
                "is an OIDC setting; oauth_provider = \"aws-msk-iam\" does not use it",
            ));
        }
    }
    let region = options
        .aws_region
        .clone()
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            OAuthError::config(
                "aws_region",
                "aws-msk-iam needs the cluster's region: set aws_region in [kafka] or AWS_REGION",
            )
        })?;
    super::aws::check_region(&region)?;
    Ok(ProviderPlan::MskIam { region })
}

fn unsecured_plan<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    options: &OAuthOptions,
) -> Result<ProviderPlan, OAuthError> {
    if !options.insecure_allow_unsecured_jwt {
        return Err(OAuthError::config(
            UNSECURE,
            "unsecured tokens let anyone log in as anyone; walrelay makes them only for \
             development, with insecure_allow_unsecured_jwt = true in [kafka]",
        ));
    }
    let config = get("sasl.oauthbearer.config").unwrap_or_default();
    Ok(ProviderPlan::Unsecured(Unsecured::parse(config)?))
}

#[cfg(test)]
mod tests;
