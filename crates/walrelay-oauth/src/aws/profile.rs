//! Static keys from the shared credentials file (`~/.aws/credentials`, or
//! `AWS_SHARED_CREDENTIALS_FILE`), in the profile `AWS_PROFILE` names or
//! `default`: what a developer's machine usually has. The file's reading
//! ([`parse`]) is pure; [`from_file`] opens it.
//!
//! Only keys are read: a profile that assumes a role, uses SSO or runs a
//! `credential_process` (in `~/.aws/config`) is not followed; export its
//! keys in the environment instead.

use std::path::PathBuf;

use super::super::error::OAuthError;
use super::super::token::Secret;
use super::credentials::Credentials;

/// Where the file is and which profile: `None` without a home directory
/// or an explicit file. The profile is explicit when `AWS_PROFILE` names
/// it.
fn location(env: &impl Fn(&str) -> Option<String>) -> Option<(PathBuf, String, bool)> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let path = match set("AWS_SHARED_CREDENTIALS_FILE") {
        Some(file) => PathBuf::from(file),
        None => PathBuf::from(set("HOME")?).join(".aws").join("credentials"),
    };
    let named = set("AWS_PROFILE");
    let explicit = named.is_some();
    Some((
        path,
        named.unwrap_or_else(|| "default".to_owned()),
        explicit,
    ))
}

/// The keys of `profile` in the file's `text`: `None` when the profile is
/// not there; an error when it is but lacks a key.
pub fn parse(text: &str, profile: &str, path: &str) -> Option<Result<Credentials, OAuthError>> {
    let mut in_profile = false;
    let mut found = false;
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = section.trim() == profile;
            found |= in_profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().to_owned();
        match key.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => id = Some(value),
            "aws_secret_access_key" => secret = Some(value),
            "aws_session_token" => token = Some(value),
            _ => {}
        }
    }
    if !found {
        return None;
    }
    Some(match (id, secret) {
        (Some(access_key_id), Some(secret)) if !access_key_id.is_empty() && !secret.is_empty() => {
            Ok(Credentials {
                access_key_id,
                secret_access_key: Secret::new(secret),
                session_token: token.filter(|t| !t.is_empty()).map(Secret::new),
                expires: None,
            })
        }
        _ => Err(OAuthError::NoAwsCredentials {
            tried: format!(
                "the profile `{profile}` in {path} has no aws_access_key_id and \
                 aws_secret_access_key (walrelay reads keys only; for a role, SSO or a \
                 credential_process, export the keys in the environment)"
            ),
        }),
    })
}

/// The keys of the profile in the shared credentials file: `None` when
/// there is no file or the profile is not in it, unless `AWS_PROFILE`
/// named it (then its absence is an error, not a silent fallback to
/// other credentials).
pub fn from_file(env: &impl Fn(&str) -> Option<String>) -> Option<Result<Credentials, OAuthError>> {
    let (path, profile, explicit) = location(env)?;
    let shown = path.display().to_string();
    let missing = || OAuthError::NoAwsCredentials {
        tried: format!(
            "AWS_PROFILE names `{profile}`, which is not in {shown} (walrelay reads keys from \
             the shared credentials file only; for SSO or a role, export the keys in the \
             environment)"
        ),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return explicit.then(|| Err(missing()));
        }
        Err(e) => {
            return Some(Err(OAuthError::File {
                what: "the AWS shared credentials file",
                path,
                reason: e.to_string(),
            }))
        }
    };
    match parse(&text, &profile, &shown) {
        Some(found) => Some(found),
        None if explicit => Some(Err(missing())),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::env_of;

    const FILE: &str = "\
# a comment
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = s1

[msk-dev]
aws_access_key_id=ASIADEV
aws_secret_access_key=s2
aws_session_token = tok
[role-only]
role_arn = arn:aws:iam::123456789012:role/x
";

    #[test]
    fn the_named_profile_and_its_session_token_are_read() {
        let dev = parse(FILE, "msk-dev", "f").unwrap().unwrap();
        assert_eq!(dev.access_key_id, "ASIADEV");
        assert_eq!(dev.session_token.as_ref().map(Secret::expose), Some("tok"));
        let default = parse(FILE, "default", "f").unwrap().unwrap();
        assert_eq!(
            (default.access_key_id.as_str(), default.session_token),
            ("AKIADEFAULT", None)
        );
        assert!(parse(FILE, "absent", "f").is_none());
        let e = parse(FILE, "role-only", "f")
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("role-only") && e.contains("export the keys"),
            "{e}"
        );
    }

    #[test]
    fn a_named_profile_that_is_nowhere_is_an_error_not_a_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        let file = path.display().to_string();
        // No file: nothing, unless a profile was named.
        assert!(from_file(&env_of(vec![("AWS_SHARED_CREDENTIALS_FILE", file.clone())])).is_none());
        let named = env_of(vec![
            ("AWS_SHARED_CREDENTIALS_FILE", file.clone()),
            ("AWS_PROFILE", "msk-dev".into()),
        ]);
        assert!(from_file(&named).unwrap().is_err());
        std::fs::write(&path, FILE).unwrap();
        assert_eq!(from_file(&named).unwrap().unwrap().access_key_id, "ASIADEV");
        let other = env_of(vec![
            ("AWS_SHARED_CREDENTIALS_FILE", file),
            ("AWS_PROFILE", "prod".into()),
        ]);
        let e = from_file(&other).unwrap().unwrap_err().to_string();
        assert!(e.contains("`prod`"), "{e}");
    }
}
