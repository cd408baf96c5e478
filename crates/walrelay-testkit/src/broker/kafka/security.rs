//! A secured Kafka node's settings: a SASL_SSL listener for clients (a
//! server certificate from a [`TestCa`]) that takes either SCRAM-SHA-512,
//! with SCRAM users created when the storage is formatted, or OAUTHBEARER
//! tokens validated against a test issuer ([`super::oauth`]), and the
//! standard authorizer, so that every client principal (`User:<name>`, or
//! `User:<sub>` of a token) gets only the ACLs a test grants it.
//!
//! The PLAINTEXT listener (inter-broker traffic, and the test's own admin
//! client: topic creation, reading back, ACLs) and the CONTROLLER listener
//! stay unauthenticated; their principal `User:ANONYMOUS` is a super user,
//! as are the [`KafkaSecurity::super_users`]. Nothing else is allowed
//! without an ACL (`allow.everyone.if.no.acl.found=false`, the default).

use std::fmt::Write as _;

use super::oauth::{OAuthValidation, OAUTH_MECHANISM};
use crate::cluster::HOST;
use crate::tls::TestCa;

/// The SASL mechanism of the secured listener.
pub const SCRAM_MECHANISM: &str = "SCRAM-SHA-512";
/// The secured listener's name (and security protocol).
pub const SECURE_LISTENER: &str = "SASL_SSL";

/// A SCRAM user created at format time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramUser {
    pub name: String,
    pub password: String,
}

impl ScramUser {
    pub fn new(name: &str, password: &str) -> ScramUser {
        ScramUser {
            name: name.to_owned(),
            password: password.to_owned(),
        }
    }

    /// The user's ACL principal, `User:<name>`.
    pub fn principal(&self) -> String {
        format!("User:{}", self.name)
    }
}

/// How the SASL_SSL listener authenticates clients: one mechanism per
/// node, so that a client of the other one is refused.
#[derive(Clone, PartialEq, Eq)]
pub enum ListenerAuth {
    /// SCRAM-SHA-512 with these users (created at format time).
    Scram(Vec<ScramUser>),
    /// OAUTHBEARER tokens checked by Kafka's JWT validator.
    OAuthBearer(OAuthValidation),
}

impl std::fmt::Debug for ListenerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Names only: passwords stay out of test output.
            ListenerAuth::Scram(users) => f
                .debug_tuple("Scram")
                .field(&users.iter().map(|u| &u.name).collect::<Vec<_>>())
                .finish(),
            ListenerAuth::OAuthBearer(oauth) => f.debug_tuple("OAuthBearer").field(oauth).finish(),
        }
    }
}

impl ListenerAuth {
    /// The SASL mechanism name.
    pub fn mechanism(&self) -> &'static str {
        match self {
            ListenerAuth::Scram(_) => SCRAM_MECHANISM,
            ListenerAuth::OAuthBearer(_) => OAUTH_MECHANISM,
        }
    }
}

/// What secures a node: its certificate (PEM, issued for 127.0.0.1 by the
/// CA whose certificate clients get), how clients authenticate and the
/// super users.
#[derive(Clone)]
pub struct KafkaSecurity {
    /// The CA certificate (PEM), for clients' `ssl.ca.location`.
    pub ca_pem: String,
    /// The server certificate (PEM).
    pub cert_pem: String,
    /// The server certificate's key (unencrypted PKCS#8 PEM).
    pub key_pem: String,
    /// SCRAM users, or OAuth validation.
    pub auth: ListenerAuth,
    /// Principals (`User:name`) allowed everything besides
    /// `User:ANONYMOUS` (the PLAINTEXT listeners).
    pub super_users: Vec<String>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Passwords and the key stay out of test output.
        f.debug_struct("KafkaSecurity")
            .field("auth", &self.auth)
            .field("super_users", &self.super_users)
            .finish_non_exhaustive()
    }
}

impl KafkaSecurity {
    /// A node certificate for [`HOST`] (and `localhost`) issued by `ca`,
    /// with `users` and no super user but the PLAINTEXT listeners'.
    pub fn new(ca: &TestCa, users: Vec<ScramUser>) -> anyhow::Result<KafkaSecurity> {
        Self::with_auth(ca, ListenerAuth::Scram(users))
    }

    /// Like [`KafkaSecurity::new`], with a listener that takes OAUTHBEARER
    /// tokens validated as `oauth` says (e.g.
    /// [`OAuthValidation::for_issuer`]) instead of SCRAM.
    pub fn oauth(ca: &TestCa, oauth: OAuthValidation) -> anyhow::Result<KafkaSecurity> {
        Self::with_auth(ca, ListenerAuth::OAuthBearer(oauth))
    }

    fn with_auth(ca: &TestCa, auth: ListenerAuth) -> anyhow::Result<KafkaSecurity> {
        let server = ca.server_cert(&[HOST, "localhost"])?;
        Ok(KafkaSecurity {
            ca_pem: ca.cert_pem(),
            cert_pem: server.cert_pem,
            key_pem: server.key_pem,
            auth,
            super_users: Vec::new(),
        })
    }

    /// The OAuth validation, on an OAUTHBEARER listener.
    pub fn oauth_validation(&self) -> Option<&OAuthValidation> {
        match &self.auth {
            ListenerAuth::OAuthBearer(oauth) => Some(oauth),
            ListenerAuth::Scram(_) => None,
        }
    }

    /// Options the node's JVM needs (the OAuth URL allow list).
    pub(crate) fn jvm_options(&self) -> Vec<String> {
        self.oauth_validation()
            .map(OAuthValidation::jvm_options)
            .unwrap_or_default()
    }

    /// `--add-scram` arguments of the storage tool's `format`.
    pub(crate) fn format_args(&self) -> Vec<String> {
        let ListenerAuth::Scram(users) = &self.auth else {
            return Vec::new();
        };
        users
            .iter()
            .flat_map(|u| {
                [
                    "--add-scram".to_owned(),
                    format!(
                        "{SCRAM_MECHANISM}=[name={},password={}]",
                        u.name, u.password
                    ),
                ]
            })
            .collect()
    }
}

/// A PEM value as one `server.properties` line: Java's properties format
/// reads `\n` as a newline.
fn one_line(pem: &str) -> String {
    pem.trim().replace('\r', "").replace('\n', "\\n")
}

/// The settings [`super::config::server_properties`] adds for `security`
/// (listeners are set there).
pub(crate) fn security_properties(security: &KafkaSecurity) -> String {
    let mut s = String::new();
    let mut set = |k: &str, v: &str| {
        let _ = writeln!(s, "{k}={v}");
    };
    let listener = SECURE_LISTENER.to_ascii_lowercase();
    let mechanism = security.auth.mechanism();
    set(
        &format!("listener.name.{listener}.sasl.enabled.mechanisms"),
        mechanism,
    );
    match &security.auth {
        ListenerAuth::Scram(_) => set(
            &format!(
                "listener.name.{listener}.{}.sasl.jaas.config",
                mechanism.to_ascii_lowercase()
            ),
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        ),
        ListenerAuth::OAuthBearer(oauth) => {
            for (key, value) in oauth.properties(&listener) {
                set(&key, &value);
            }
        }
    }
    // A PEM key store given inline: an unencrypted key needs no password
    // (a PEM key store *file* would require `ssl.key.password`).
    set(
        &format!("listener.name.{listener}.ssl.keystore.type"),
        "PEM",
    );
    set(
        &format!("listener.name.{listener}.ssl.keystore.certificate.chain"),
        &one_line(&security.cert_pem),
    );
    set(
        &format!("listener.name.{listener}.ssl.keystore.key"),
        &one_line(&security.key_pem),
    );
    set(
        "authorizer.class.name",
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    );
    let mut supers = vec!["User:ANONYMOUS".to_owned()];
    supers.extend(security.super_users.iter().cloned());
    set("super.users", &supers.join(";"));
    set("allow.everyone.if.no.acl.found", "false");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn security() -> KafkaSecurity {
        KafkaSecurity {
            ca_pem: "CA".into(),
            cert_pem: "-----BEGIN CERTIFICATE-----\nAAA\nBBB\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\r\nKKK\r\n-----END PRIVATE KEY-----\r\n".into(),
            auth: ListenerAuth::Scram(vec![
                ScramUser::new("relay", "r-pw"),
                ScramUser::new("consumer", "c-pw"),
            ]),
            super_users: vec!["User:admin".into()],
        }
    }

    #[test]
    fn pem_values_are_single_properties_lines() {
        let text = security_properties(&security());
        for line in [
            "listener.name.sasl_ssl.ssl.keystore.type=PEM",
            "listener.name.sasl_ssl.ssl.keystore.certificate.chain=-----BEGIN CERTIFICATE-----\\nAAA\\nBBB\\n-----END CERTIFICATE-----",
            "listener.name.sasl_ssl.ssl.keystore.key=-----BEGIN PRIVATE KEY-----\\nKKK\\n-----END PRIVATE KEY-----",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=User:ANONYMOUS;User:admin",
            "allow.everyone.if.no.acl.found=false",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("r-pw"), "passwords go to format only");
    }

    #[test]
    fn users_become_add_scram_arguments() {
        assert_eq!(
            security().format_args(),
            [
                "--add-scram",
                "SCRAM-SHA-512=[name=relay,password=r-pw]",
                "--add-scram",
                "SCRAM-SHA-512=[name=consumer,password=c-pw]",
            ]
        );
        assert_eq!(ScramUser::new("relay", "x").principal(), "User:relay");
        let debug = format!("{:?}", security());
        assert!(!debug.contains("pw") && !debug.contains("KKK"), "{debug}");
    }

    #[test]
    fn an_oauth_listener_takes_oauthbearer_and_its_jvm_allows_the_jwks() {
        let oauth = OAuthValidation {
            jwks_url: "http://127.0.0.1:7/jwks".into(),
            expected_issuer: "http://127.0.0.1:7".into(),
            expected_audience: "kafka".into(),
            jwks_refresh: std::time::Duration::from_secs(1),
            max_reauth: None,
            clock_skew: std::time::Duration::from_secs(30),
        };
        let security = KafkaSecurity {
            auth: ListenerAuth::OAuthBearer(oauth),
            ..security()
        };
        let text = security_properties(&security);
        for line in [
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=OAUTHBEARER",
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;",
            "sasl.oauthbearer.jwks.endpoint.url=http://127.0.0.1:7/jwks",
            "sasl.oauthbearer.expected.issuer=http://127.0.0.1:7",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=User:ANONYMOUS;User:admin",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("scram"), "{text}");
        assert!(security.format_args().is_empty());
        assert_eq!(
            security.jvm_options(),
            ["-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=http://127.0.0.1:7/jwks"]
        );
        assert!(format!("{security:?}").contains("jwks"));
        assert!(super::tests::security().jvm_options().is_empty());
    }
}
