//! From the librdkafka properties of walrelay's Kafka clients to how its
//! own connections reach a broker: TLS or not and how the certificate is
//! checked, SASL or not and with which credentials. A pure reading of the
//! properties ([`plan`]), tested on its own; [`super::tls`] turns the TLS
//! half into a rustls configuration. An OAUTHBEARER login's token is not
//! in the properties: the plan says only that one is needed
//! ([`Login::Token`]).
//!
//! What librdkafka would do is the rule: the same listener, the same CA,
//! the same host-name check, the same client certificate, the same user.
//! A setting walrelay cannot honour exactly (a Kerberos login, a
//! keystore, a revocation list, an inline CA) is not approximated: the
//! plan fails with the property's name, and the caller goes without its
//! own request (see [`crate::kafka::requests::api_versions`] and
//! [`crate::kafka::requests::readable`] for what that costs).

use std::path::PathBuf;

use walrelay_pg::tls::Verification;
use walrelay_pg::RootCert;

use super::sasl::Mechanism;

/// How one connection is made.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub tls: Option<TlsPlan>,
    pub sasl: Option<SaslPlan>,
}

/// The TLS half of a [`Plan`].
#[derive(Debug, PartialEq, Eq)]
pub struct TlsPlan {
    pub verification: Verification,
    pub client_cert: Option<ClientCert>,
}

/// Where a PEM comes from: a file, or the property's own value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pem {
    File(PathBuf),
    Inline(String),
}

/// A client certificate and its key (mutual TLS).
#[derive(Debug, PartialEq, Eq)]
pub struct ClientCert {
    pub chain: Pem,
    pub key: Pem,
}

/// The SASL half of a [`Plan`].
#[derive(Debug, PartialEq, Eq)]
pub struct SaslPlan {
    pub mechanism: Mechanism,
    pub login: Login,
}

/// What a SASL mechanism logs in with. `Debug` hides the password.
#[derive(PartialEq, Eq)]
pub enum Login {
    /// `PLAIN` and `SCRAM-*`: `sasl.username` and `sasl.password`.
    Password { username: String, password: String },
    /// `OAUTHBEARER`: a token from the relay's token provider, which the
    /// properties do not hold (see [`super::Settings::from_client_config_with_tokens`]).
    Token,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Login::Password { username, .. } => f
                .debug_struct("Password")
                .field("username", username)
                .field("password", &"********")
                .finish(),
            Login::Token => f.write_str("Token"),
        }
    }
}

/// TLS properties whose meaning walrelay's connections cannot reproduce.
const UNSUPPORTED_TLS: [(&str, &str); 6] = [
    ("ssl.ca.pem", "give the CA certificate as a file in ssl.ca.location"),
    ("ssl.keystore.location", "give the client certificate and key as PEM files in ssl.certificate.location and ssl.key.location"),
    ("ssl.key.password", "give the client key unencrypted in ssl.key.location (readable only by walrelay's user)"),
    ("ssl.crl.location", "walrelay's own requests do not read revocation lists"),
    ("ssl.engine.location", "walrelay's own requests do not load OpenSSL engines"),
    ("ssl.providers", "walrelay's own requests do not load OpenSSL providers"),
];

/// The plan for the properties `get` returns (the client's resolved
/// configuration: secrets already read from their files), or the reason
/// walrelay cannot connect as that client would.
pub fn plan<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Plan, String> {
    let protocol = get("security.protocol")
        .unwrap_or("plaintext")
        .to_ascii_lowercase();
    let (tls, sasl) = match protocol.as_str() {
        "plaintext" => (false, false),
        "ssl" => (true, false),
        "sasl_plaintext" => (false, true),
        "sasl_ssl" => (true, true),
        other => return Err(format!("security.protocol {other} is not a Kafka protocol")),
    };
    Ok(Plan {
        tls: if tls { Some(tls_plan(&get)?) } else { None },
        sasl: if sasl { Some(sasl_plan(&get)?) } else { None },
    })
}

fn tls_plan<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Result<TlsPlan, String> {
    if let Some((key, fix)) = UNSUPPORTED_TLS.iter().find(|(key, _)| get(key).is_some()) {
        return Err(format!("{key} is set ({fix})"));
    }
    let roots = match get("ssl.ca.location") {
        None | Some("probe") => RootCert::System,
        Some(path) if std::path::Path::new(path).is_dir() => {
            return Err(format!(
                "ssl.ca.location {path} is a directory (give the CA certificates as one PEM file)"
            ))
        }
        Some(path) => RootCert::File(PathBuf::from(path)),
    };
    let verify_chain = get("enable.ssl.certificate.verification")
        .is_none_or(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"));
    // librdkafka checks the host name by default since 2.0.
    let verify_name = get("ssl.endpoint.identification.algorithm")
        .is_none_or(|v| v.eq_ignore_ascii_case("https"));
    let verification = match (verify_chain, verify_name) {
        (false, _) => Verification::None,
        (true, false) => Verification::Chain(roots),
        (true, true) => Verification::ChainAndName(roots),
    };
    let pem = |location: &str, inline: &str| match (get(location), get(inline)) {
        (Some(path), _) => Some(Pem::File(PathBuf::from(path))),
        (None, Some(pem)) => Some(Pem::Inline(pem.to_owned())),
        (None, None) => None,
    };
    let client_cert = match (
        pem("ssl.certificate.location", "ssl.certificate.pem"),
        pem("ssl.key.location", "ssl.key.pem"),
    ) {
        (Some(chain), Some(key)) => Some(ClientCert { chain, key }),
        (None, None) => None,
        _ => {
            return Err(
                "a client certificate without its key, or a key without its certificate \
                 (set both ssl.certificate.location and ssl.key.location)"
                    .to_owned(),
            )
        }
    };
    Ok(TlsPlan {
        verification,
        client_cert,
    })
}

fn sasl_plan<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Result<SaslPlan, String> {
    // librdkafka's default mechanism is GSSAPI.
    let name = get("sasl.mechanism")
        .or_else(|| get("sasl.mechanisms"))
        .unwrap_or("GSSAPI");
    let mechanism = Mechanism::parse(name).ok_or_else(|| {
        format!(
            "SASL mechanism {name} (walrelay's own requests speak PLAIN, SCRAM and OAUTHBEARER \
             only)"
        )
    })?;
    if mechanism == Mechanism::OAuthBearer {
        return Ok(SaslPlan {
            mechanism,
            login: Login::Token,
        });
    }
    let field = |key: &str| {
        get(key)
            .map(str::to_owned)
            .ok_or_else(|| format!("SASL {} without {key}", mechanism.name()))
    };
    Ok(SaslPlan {
        mechanism,
        login: Login::Password {
            username: field("sasl.username")?,
            password: field("sasl.password")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn plan_of(pairs: &[(&str, &str)]) -> Result<Plan, String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        plan(|k| map.get(k).map(String::as_str))
    }

    #[test]
    fn plaintext_needs_nothing_and_an_unknown_protocol_is_refused() {
        assert_eq!(
            plan_of(&[]).unwrap(),
            Plan {
                tls: None,
                sasl: None
            }
        );
        assert!(plan_of(&[("security.protocol", "carrier-pigeon")]).is_err());
    }

    #[test]
    fn sasl_ssl_checks_chain_and_name_against_the_ca_file_as_librdkafka_does() {
        let p = plan_of(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "relay"),
            ("sasl.password", "s3cret"),
            ("ssl.ca.location", "/etc/walrelay/ca.pem"),
        ])
        .unwrap();
        let tls = p.tls.unwrap();
        assert_eq!(
            tls.verification,
            Verification::ChainAndName(RootCert::File("/etc/walrelay/ca.pem".into()))
        );
        assert_eq!(tls.client_cert, None);
        let sasl = p.sasl.unwrap();
        assert_eq!(sasl.mechanism, Mechanism::ScramSha512);
        assert!(
            matches!(&sasl.login, Login::Password { username, .. } if username == "relay"),
            "{sasl:?}"
        );
        assert!(!format!("{sasl:?}").contains("s3cret"));
    }

    #[test]
    fn the_checks_follow_the_properties_that_loosen_them() {
        let none = plan_of(&[
            ("security.protocol", "ssl"),
            ("enable.ssl.certificate.verification", "false"),
        ])
        .unwrap();
        assert_eq!(none.tls.unwrap().verification, Verification::None);
        let chain = plan_of(&[
            ("security.protocol", "ssl"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ])
        .unwrap();
        assert_eq!(
            chain.tls.unwrap().verification,
            Verification::Chain(RootCert::System)
        );
        let mtls = plan_of(&[
            ("security.protocol", "ssl"),
            ("ssl.certificate.location", "/c.pem"),
            ("ssl.key.pem", "-----BEGIN PRIVATE KEY-----"),
        ])
        .unwrap();
        assert_eq!(
            mtls.tls.unwrap().client_cert,
            Some(ClientCert {
                chain: Pem::File("/c.pem".into()),
                key: Pem::Inline("-----BEGIN PRIVATE KEY-----".into()),
            })
        );
    }

    #[test]
    fn what_cannot_be_reproduced_is_refused_with_the_property_named() {
        let cases: [(&[(&str, &str)], &str); 4] = [
            (&[("security.protocol", "sasl_ssl")], "GSSAPI"),
            (
                &[
                    ("security.protocol", "sasl_plaintext"),
                    ("sasl.mechanism", "PLAIN"),
                    ("sasl.username", "u"),
                ],
                "sasl.password",
            ),
            (
                &[
                    ("security.protocol", "ssl"),
                    ("ssl.keystore.location", "/k.p12"),
                ],
                "ssl.keystore.location",
            ),
            (
                &[
                    ("security.protocol", "ssl"),
                    ("ssl.certificate.location", "/c.pem"),
                ],
                "ssl.key.location",
            ),
        ];
        for (pairs, named) in cases {
            let e = plan_of(pairs).unwrap_err();
            assert!(e.contains(named), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn oauthbearer_logs_in_with_a_token_not_a_password() {
        let p = plan_of(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
        ])
        .unwrap();
        assert_eq!(
            p.sasl,
            Some(SaslPlan {
                mechanism: Mechanism::OAuthBearer,
                login: Login::Token,
            })
        );
    }
}
