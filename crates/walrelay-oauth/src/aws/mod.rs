//! AWS: the MSK IAM token ([`msk`]) and what it is made from: SigV4
//! presigning ([`sigv4`]) and the credential chain ([`credentials`]:
//! environment, the shared credentials file ([`profile`]), web identity
//! through [`sts`], ECS task roles and EKS Pod
//! Identity through [`container`], instance profile through [`imds`]).
//!
//! Untested against AWS: the signing is checked against AWS's published
//! SigV4 examples and the answers' reading against AWS's documented
//! shapes, but no test here reaches MSK, STS, a container agent or an EC2
//! metadata service.

pub mod container;
pub mod credentials;
pub mod imds;
pub mod msk;
pub mod profile;
pub mod sigv4;
pub mod sts;

use super::error::OAuthError;

/// Whether `region` looks like an AWS region name (`eu-west-1`): it goes
/// into a host name, so anything else is refused at start.
#[must_use]
pub fn is_region(region: &str) -> bool {
    !region.is_empty()
        && region.contains('-')
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// `region`, or why it is not one.
pub fn check_region(region: &str) -> Result<&str, OAuthError> {
    if is_region(region) {
        Ok(region)
    } else {
        Err(OAuthError::config(
            "aws_region",
            format!("`{region}` is not an AWS region name (like eu-west-1)"),
        ))
    }
}

/// A test's environment: `pairs` and nothing else (the process's own is
/// never read by the tests).
#[cfg(test)]
pub(crate) fn env_of<K: Into<String>, V: Into<String>>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    move |k: &str| map.get(k).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_checked_before_they_become_a_host_name() {
        assert!(is_region("eu-west-1") && is_region("us-gov-west-1"));
        assert!(!is_region("") && !is_region("evil.example.com/") && !is_region("EU-WEST-1"));
        assert!(check_region("a b")
            .unwrap_err()
            .to_string()
            .contains("aws_region"));
    }
}
