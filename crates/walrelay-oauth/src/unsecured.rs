//! Unsecured tokens (`alg: none`) for development brokers that accept
//! them: librdkafka's built-in provider (`enable.sasl.oauthbearer.unsecure.jwt`),
//! reading its `sasl.oauthbearer.config` the way librdkafka does. Anyone
//! can make such a token for any principal, so walrelay refuses this mode
//! unless `[kafka] insecure_allow_unsecured_jwt = true` asks for it, and
//! warns when it starts with it ([`super::provider::Provider::new`]).

use std::time::{Duration, SystemTime};

use super::error::OAuthError;
use super::extensions::Extensions;
use super::jwt;
use super::refresh::Fetch;
use super::token::{Secret, Token};

const PROPERTY: &str = "sasl.oauthbearer.config";

/// The warning logged when the relay starts with unsecured tokens.
pub const WARNING: &str = "Kafka OAUTHBEARER with unsecured tokens \
    (enable.sasl.oauthbearer.unsecure.jwt=true, insecure_allow_unsecured_jwt = true): \
    anyone who reaches the brokers can log in as any principal; for development only";

/// What an unsecured token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsecured {
    pub principal: String,
    pub lifetime: Duration,
    pub scope: Vec<String>,
    pub extensions: Extensions,
}

impl Unsecured {
    /// Reads librdkafka's `sasl.oauthbearer.config`: space-separated
    /// `principal=NAME` (required), `lifeSeconds=N` (default 3600),
    /// `scope=a,b`, `extension_KEY=VALUE`. librdkafka's claim-name keys
    /// (`principalClaimName`, `scopeClaimName`) are refused: walrelay
    /// writes `sub` and `scope`.
    pub fn parse(config: &str) -> Result<Unsecured, OAuthError> {
        let mut principal = None;
        let mut lifetime = Duration::from_secs(3600);
        let mut scope = Vec::new();
        let mut extensions = Extensions::default();
        for item in config.split_whitespace() {
            let Some((key, value)) = item.split_once('=') else {
                return Err(OAuthError::config(
                    PROPERTY,
                    format!("`{item}` is not key=value"),
                ));
            };
            match key {
                "principal" if !value.is_empty() => principal = Some(value.to_owned()),
                "lifeSeconds" => {
                    let secs = value
                        .parse::<u64>()
                        .ok()
                        .filter(|s| *s > 0)
                        .ok_or_else(|| {
                            OAuthError::config(
                                PROPERTY,
                                format!("lifeSeconds `{value}` is not a positive number"),
                            )
                        })?;
                    lifetime = Duration::from_secs(secs);
                }
                "scope" => {
                    scope = value
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                }
                _ => match key.strip_prefix("extension_") {
                    Some(name) => extensions
                        .insert(name, value)
                        .map_err(|reason| OAuthError::config(PROPERTY, reason))?,
                    None => {
                        return Err(OAuthError::config(
                            PROPERTY,
                            format!(
                                "`{key}` is not one walrelay reads (principal, lifeSeconds, \
                                 scope, extension_NAME)"
                            ),
                        ))
                    }
                },
            }
        }
        let principal = principal
            .ok_or_else(|| OAuthError::config(PROPERTY, "unsecured tokens need principal=NAME"))?;
        Ok(Unsecured {
            principal,
            lifetime,
            scope,
            extensions,
        })
    }
}

impl Fetch for Unsecured {
    fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
        Ok(Token {
            value: Secret::new(jwt::unsecured(
                &self.principal,
                now,
                self.lifetime,
                &self.scope,
            )),
            principal: self.principal.clone(),
            expires_at: now + self.lifetime,
            extensions: self.extensions.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafkas_config_string_is_read() {
        let u = Unsecured::parse("principal=dev lifeSeconds=60 scope=a,b extension_traceId=x1")
            .unwrap();
        assert_eq!(u.principal, "dev");
        assert_eq!(u.lifetime, Duration::from_secs(60));
        assert_eq!(u.scope, ["a", "b"]);
        assert_eq!(u.extensions.iter().collect::<Vec<_>>(), [("traceId", "x1")]);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let token = u.fetch(now).unwrap();
        assert_eq!(token.expires_at, now + Duration::from_secs(60));
        let claims = jwt::claims(token.value.expose()).unwrap();
        assert_eq!(claims.subject.as_deref(), Some("dev"));
        assert_eq!(claims.expires, Some(token.expires_at));
    }

    #[test]
    fn a_config_without_principal_or_with_unknown_keys_is_refused() {
        for (config, says) in [
            ("", "principal=NAME"),
            ("lifeSeconds=0 principal=a", "positive"),
            ("principal=a principalClaimName=azp", "principalClaimName"),
            ("principal=a extension_auth=x", "reserved"),
            ("principal", "key=value"),
        ] {
            let e = Unsecured::parse(config).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(PROPERTY), "{config}: {e}");
        }
    }
}
