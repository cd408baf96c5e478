//! [`OAuthError`]: why no token could be had. Each message says what
//! failed, why, and what to do; none holds a secret (client secrets,
//! tokens, AWS keys are never formatted into one: the endpoint's own
//! answer is quoted, shortened, because it is the user's best clue).

use std::path::PathBuf;

/// Why an OAuth token could not be configured, fetched or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthError {
    /// A setting is missing, contradictory or malformed.
    #[error("Kafka OAuth setting `{property}`: {reason}")]
    Config {
        /// The property or walrelay option.
        property: String,
        /// What is wrong and what to set instead.
        reason: String,
    },
    /// The token endpoint (or AWS service) answered with an error.
    #[error("{service} {endpoint} refused the request (HTTP {status}): {answer}; {advice}")]
    Refused {
        /// Which service: "the OAuth token endpoint", "AWS STS", ...
        service: &'static str,
        /// Its URL, without query.
        endpoint: String,
        status: u16,
        /// What it answered (`error: error_description`, or a short
        /// excerpt of the body).
        answer: String,
        /// What to check.
        advice: &'static str,
    },
    /// An answer walrelay cannot read as the protocol says it should be.
    #[error(
        "{service} {endpoint} answered something unreadable: {reason} (is that the service's \
         URL?)"
    )]
    Unreadable {
        service: &'static str,
        endpoint: String,
        reason: String,
    },
    /// Connecting, TLS, sending or receiving failed, or timed out.
    #[error(
        "{service} {endpoint}: {step} failed: {reason} (check that it is reachable from this \
         host and that its certificate is trusted)"
    )]
    Transport {
        service: &'static str,
        endpoint: String,
        /// "connecting", "the TLS handshake", "sending", "reading the answer".
        step: &'static str,
        reason: String,
    },
    /// A token was received but cannot be used (no expiry, already expired).
    #[error("the OAuth token from {source_name} cannot be used: {reason}")]
    Unusable { source_name: String, reason: String },
    /// No AWS credentials in any link of the chain.
    #[error(
        "no AWS credentials found ({tried}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
         or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN (EKS), or run on an EC2 instance \
         with an instance profile"
    )]
    NoAwsCredentials {
        /// What was tried and why each link gave nothing.
        tried: String,
    },
    /// A file named by a setting could not be read.
    #[error("cannot read {what} {}: {reason}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

impl OAuthError {
    pub(crate) fn config(property: &str, reason: impl Into<String>) -> OAuthError {
        OAuthError::Config {
            property: property.to_owned(),
            reason: reason.into(),
        }
    }

    /// Whether trying again later may succeed without a change by the
    /// user: the service unreachable, overloaded or failing (HTTP 5xx,
    /// 429). A refusal of the credentials (4xx), a wrong setting or an
    /// unusable token would fail the same way again.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            OAuthError::Transport { .. } => true,
            OAuthError::Refused { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// At most `max` characters of an answer, control characters shown as
/// spaces: enough to recognise an error page, too little to flood a log.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push_str("...");
    }
    out.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_short_and_on_one_line() {
        assert_eq!(excerpt("<html>\r\n<b>502</b>", 100), "<html>  <b>502</b>");
        assert_eq!(excerpt("abcdef", 3), "abc...");
    }

    #[test]
    fn a_refusal_names_the_service_the_answer_and_the_fix() {
        let e = OAuthError::Refused {
            service: "the OAuth token endpoint",
            endpoint: "https://idp.example/token".into(),
            status: 401,
            answer: "invalid_client: bad credentials".into(),
            advice: "check sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret",
        };
        assert_eq!(
            e.to_string(),
            "the OAuth token endpoint https://idp.example/token refused the request (HTTP 401): \
             invalid_client: bad credentials; check sasl.oauthbearer.client.id and \
             sasl.oauthbearer.client.secret"
        );
    }

    #[test]
    fn every_kind_says_what_to_check() {
        let transport = OAuthError::Transport {
            service: "AWS STS",
            endpoint: "https://sts.eu-west-1.amazonaws.com/".into(),
            step: "connecting",
            reason: "timed out".into(),
        };
        assert_eq!(
            transport.to_string(),
            "AWS STS https://sts.eu-west-1.amazonaws.com/: connecting failed: timed out (check \
             that it is reachable from this host and that its certificate is trusted)"
        );
        let unreadable = OAuthError::Unreadable {
            service: "the OAuth token endpoint",
            endpoint: "https://idp/token".into(),
            reason: "not JSON".into(),
        };
        assert!(unreadable
            .to_string()
            .ends_with("(is that the service's URL?)"));
    }
}
