//! The suite on an OAuth cluster (`WALRELAY_CONFORMANCE_LOGIN=oauth`): an
//! Apache Kafka node whose SASL_SSL listener takes OAUTHBEARER tokens,
//! validated by Kafka's own validator against a token endpoint this suite
//! serves. The scenarios' producer and topic administration use the
//! node's PLAINTEXT listener; every consumer logs in with the crate's
//! OIDC login (librdkafka's property names), with tokens of 15 s that
//! the broker makes it renew (`connections.max.reauth.ms`).

use std::time::Duration;

use anyhow::Context;
use walrelay_testkit::oauth::{IssuerOptions, OAuthClient, TokenIssuer};
use walrelay_testkit::{
    KafkaCluster, KafkaOptions, KafkaSecurity, OAuthValidation, TestBroker, TestCa,
};

const CLIENT: &str = "conformance";
const SECRET: &str = "conformance-oauth-secret-3c6ef372";

/// How the consumers reach the broker.
pub struct ConsumerLogin {
    /// The listener they log in to.
    pub bootstrap: String,
    /// Their login properties (beside `bootstrap.servers`).
    pub properties: Vec<(String, String)>,
    /// Serves the tokens for as long as the suite runs.
    _issuer: TokenIssuer,
}

/// An OAuth node and the consumers' login to it. Blocking.
pub fn oauth_broker() -> anyhow::Result<(TestBroker, ConsumerLogin)> {
    let issuer = TokenIssuer::start(IssuerOptions::default())?;
    issuer.register_client(CLIENT, SECRET);
    let ca = TestCa::new("walrelay conformance Kafka CA")?;
    let validation = OAuthValidation::for_issuer(&issuer).with_max_reauth(Duration::from_secs(60));
    let mut security = KafkaSecurity::oauth(&ca, validation)?;
    // ACLs are not this suite's subject.
    security.super_users.push(format!("User:{CLIENT}"));
    let kafka = KafkaCluster::start(KafkaOptions {
        security: Some(security),
        ..KafkaOptions::default()
    })?;
    let ca_path = kafka.nodes()[0].dir().join("client-ca.pem");
    std::fs::write(&ca_path, kafka.ca_pem().context("a secured node")?)?;
    let client = OAuthClient::new(&issuer.token_url(), CLIENT, SECRET).with_scope("kafka");
    let config = kafka.oauth_client_config(&client, &ca_path)?;
    let properties = config
        .librdkafka_oidc()
        .into_iter()
        .filter(|(k, _)| k != "bootstrap.servers")
        .collect();
    let login = ConsumerLogin {
        bootstrap: config.bootstrap.clone(),
        properties,
        _issuer: issuer,
    };
    eprintln!(
        "the consumers log in with OAUTHBEARER at {}",
        login.bootstrap
    );
    Ok((TestBroker::from_cluster(kafka), login))
}
