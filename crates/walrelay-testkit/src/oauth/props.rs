//! The client properties a test hands a client of an OAUTHBEARER
//! listener, in librdkafka's form (the relay, the Rust and Python
//! consumers: `sasl.oauthbearer.method=oidc`) and in Java's
//! (`OAuthBearerLoginCallbackHandler`), plus the test kit's own rdkafka
//! configuration (see [`super::context`]).

use std::path::{Path, PathBuf};

use rdkafka::ClientConfig;

use super::client::OAuthClient;
use crate::broker::kafka::ALLOWED_URLS_PROPERTY;

/// A client of a cluster's OAUTHBEARER listener. Its `Debug` hides the
/// secret; the property lists carry it, as clients need it.
#[derive(Clone, Debug)]
pub struct OAuthClientConfig {
    /// The SASL_SSL listeners, for `bootstrap.servers`.
    pub bootstrap: String,
    /// The test CA's certificate file (PEM).
    pub ca_location: PathBuf,
    /// The credentials.
    pub client: OAuthClient,
}

/// The SASL extensions the librdkafka clients' logins carry, shaped like
/// Confluent Cloud's (`logicalCluster`, `identityPoolId`).
pub const LOGIN_EXTENSIONS: &str = "logicalCluster=lkc-walrelay,identityPoolId=pool-test";

impl OAuthClientConfig {
    pub fn new(bootstrap: &str, ca_location: &Path, client: OAuthClient) -> OAuthClientConfig {
        OAuthClientConfig {
            bootstrap: bootstrap.to_owned(),
            ca_location: ca_location.to_owned(),
            client,
        }
    }

    fn common(&self) -> Vec<(String, String)> {
        pairs(&[
            ("bootstrap.servers", &self.bootstrap),
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER"),
        ])
    }

    /// librdkafka's properties with its own OIDC client credentials login
    /// (`sasl.oauthbearer.method=oidc`: confluent-kafka's wheels do it with
    /// libcurl, the relay and the Rust consumer with walrelay's token
    /// provider), with a SASL extension as Confluent Cloud asks for one
    /// ([`LOGIN_EXTENSIONS`]; Kafka's validator accepts any).
    pub fn librdkafka_oidc(&self) -> Vec<(String, String)> {
        let mut props = self.common();
        props.extend(pairs(&[
            ("ssl.ca.location", &self.ca_location.display().to_string()),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                &self.client.token_url,
            ),
            ("sasl.oauthbearer.client.id", &self.client.client_id),
            (
                "sasl.oauthbearer.client.secret",
                self.client.client_secret(),
            ),
            ("sasl.oauthbearer.extensions", LOGIN_EXTENSIONS),
        ]));
        if let Some(scope) = &self.client.scope {
            props.extend(pairs(&[("sasl.oauthbearer.scope", scope)]));
        }
        props
    }

    /// kafka-clients' properties: the login callback handler fetches
    /// tokens with the JAAS options' client id and secret, and trusts the
    /// test CA from a PEM trust store. The JVM also needs
    /// [`OAuthClientConfig::java_jvm_flag`].
    pub fn java(&self) -> Vec<(String, String)> {
        let mut jaas = format!(
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
             clientId=\"{}\" clientSecret=\"{}\"",
            jaas_escape(&self.client.client_id),
            jaas_escape(self.client.client_secret())
        );
        if let Some(scope) = &self.client.scope {
            jaas.push_str(&format!(" scope=\"{}\"", jaas_escape(scope)));
        }
        // kafka-clients takes SASL extensions as `extension_<key>` options.
        for pair in LOGIN_EXTENSIONS.split(',') {
            let (key, value) = pair.split_once('=').expect("key=value");
            jaas.push_str(&format!(" extension_{key}=\"{}\"", jaas_escape(value)));
        }
        jaas.push(';');
        let mut props = self.common();
        props.extend(pairs(&[
            ("ssl.truststore.type", "PEM"),
            (
                "ssl.truststore.location",
                &self.ca_location.display().to_string(),
            ),
            (
                "sasl.login.callback.handler.class",
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
            ),
            (
                "sasl.oauthbearer.token.endpoint.url",
                &self.client.token_url,
            ),
            ("sasl.jaas.config", &jaas),
        ]));
        props
    }

    /// The JVM flag a Java client needs, Kafka 4 refusing OAuth URLs it
    /// does not list: `-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=<token url>`.
    pub fn java_jvm_flag(&self) -> String {
        format!("-D{ALLOWED_URLS_PROPERTY}={}", self.client.token_url)
    }

    /// An rdkafka configuration for the test kit's own clients (built
    /// without libcurl): SASL_SSL and OAUTHBEARER without a login method,
    /// to be created with an [`super::OAuthContext`] that supplies tokens.
    pub fn rdkafka_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in self.common() {
            config.set(k, v);
        }
        config.set("ssl.ca.location", self.ca_location.display().to_string());
        config
    }
}

fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A value inside a JAAS option's double quotes.
fn jaas_escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> OAuthClientConfig {
        OAuthClientConfig::new(
            "127.0.0.1:9",
            Path::new("/tmp/ca.pem"),
            OAuthClient::new("http://127.0.0.1:5/token", "relay", "pa\"ss").with_scope("kafka"),
        )
    }

    fn get<'a>(props: &'a [(String, String)], key: &str) -> Option<&'a str> {
        props
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn librdkafka_gets_oidc_settings() {
        let props = config().librdkafka_oidc();
        for (k, v) in [
            ("bootstrap.servers", "127.0.0.1:9"),
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("ssl.ca.location", "/tmp/ca.pem"),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "http://127.0.0.1:5/token",
            ),
            ("sasl.oauthbearer.client.id", "relay"),
            ("sasl.oauthbearer.client.secret", "pa\"ss"),
            ("sasl.oauthbearer.scope", "kafka"),
            ("sasl.oauthbearer.extensions", LOGIN_EXTENSIONS),
        ] {
            assert_eq!(get(&props, k), Some(v), "{k}");
        }
    }

    #[test]
    fn java_gets_the_login_handler_jaas_options_and_the_allow_list() {
        let c = config();
        let props = c.java();
        assert_eq!(
            get(&props, "sasl.jaas.config"),
            Some(
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
                 clientId=\"relay\" clientSecret=\"pa\\\"ss\" scope=\"kafka\" \
                 extension_logicalCluster=\"lkc-walrelay\" extension_identityPoolId=\"pool-test\";"
            )
        );
        assert_eq!(get(&props, "ssl.truststore.type"), Some("PEM"));
        assert!(get(&props, "sasl.oauthbearer.method").is_none());
        assert_eq!(
            c.java_jvm_flag(),
            "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=http://127.0.0.1:5/token"
        );
        assert!(!format!("{c:?}").contains("pa\\\"ss"), "{c:?}");
    }
}
