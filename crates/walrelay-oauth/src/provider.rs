//! A [`ProviderPlan`] made into a working token provider: the HTTP
//! clients built, the unsecured mode's warning logged. What the rest of
//! walrelay will hold, behind a [`super::TokenCache`].

use std::time::SystemTime;

use super::aws::msk::MskIam;
use super::error::OAuthError;
use super::oidc::Oidc;
use super::plan::ProviderPlan;
use super::refresh::Fetch;
use super::token::Token;
use super::transport::{Client, Timeouts};
use super::unsecured::{self, Unsecured};

/// One of the token providers.
#[derive(Debug)]
pub enum Provider {
    Oidc(Oidc),
    MskIam(MskIam),
    Unsecured(Unsecured),
}

impl Provider {
    /// The provider of `plan`. Logs a warning for unsecured tokens: the
    /// relay starts with them only when asked, and says so each time.
    pub fn new(plan: ProviderPlan) -> Result<Provider, OAuthError> {
        Ok(match plan {
            ProviderPlan::Oidc { settings, ca_file } => Provider::Oidc(Oidc {
                settings,
                client: Client::new("the OAuth token endpoint", ca_file, Timeouts::default())?,
            }),
            ProviderPlan::MskIam { region } => Provider::MskIam(MskIam::new(&region)?),
            ProviderPlan::Unsecured(u) => {
                tracing::warn!("{}", unsecured::WARNING);
                Provider::Unsecured(u)
            }
        })
    }

    /// Which provider, for logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Provider::Oidc(_) => "OIDC client credentials",
            Provider::MskIam(_) => "AWS MSK IAM",
            Provider::Unsecured(_) => "unsecured JWT (development only)",
        }
    }
}

impl Fetch for Provider {
    fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
        match self {
            Provider::Oidc(p) => p.fetch(now),
            Provider::MskIam(p) => p.fetch(now),
            Provider::Unsecured(p) => p.fetch(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extensions::Extensions;

    #[test]
    fn an_unsecured_provider_makes_tokens_without_io() {
        let plan = ProviderPlan::Unsecured(Unsecured {
            principal: "dev".into(),
            lifetime: std::time::Duration::from_secs(10),
            scope: vec![],
            extensions: Extensions::default(),
        });
        let provider = Provider::new(plan).unwrap();
        assert_eq!(provider.kind(), "unsecured JWT (development only)");
        let token = provider.fetch(SystemTime::now()).unwrap();
        assert_eq!(token.principal, "dev");
    }

    #[test]
    fn providers_build_without_contacting_anyone() {
        let p = Provider::new(ProviderPlan::MskIam {
            region: "eu-west-1".into(),
        })
        .unwrap();
        assert_eq!(p.kind(), "AWS MSK IAM");
    }
}
