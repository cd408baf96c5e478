//! How each of walrelay's Kafka clients logs in with `OAUTHBEARER`: one
//! token cache per token provider in the process, shared by the producer,
//! the fence's reader and admin client, the source record's writer, the
//! readiness probe and walrelay's own connections, so that they fetch one
//! token between them and refresh it once.
//!
//! walrelay's librdkafka is built without libcurl (a leaner binary, no
//! second TLS stack), so librdkafka's own OIDC client is not there: the
//! login properties (`sasl.oauthbearer.method`, `.client.id`,
//! `.client.secret`, `.token.endpoint.url`, `.scope`, `.extensions`) are
//! read by walrelay ([`walrelay_oauth::plan`]), removed from what librdkafka
//! sees ([`LOGIN_PROPERTIES`]), and each librdkafka client is handed its
//! tokens with their SASL extensions ([`ClientTokens`]) as soon as it is
//! made and before each expires.
//!
//! Every other mechanism (SCRAM, PLAIN, none) is [`Login::none`]: no
//! client is handed a token.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use rdkafka::admin::AdminClient;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::error::KafkaError;

use super::error::ClientError;
use walrelay_oauth::librdkafka::{self, ClientTokens, HasClient};
use walrelay_oauth::plan::{plan, OAuthOptions, ProviderPlan};
use walrelay_oauth::{OAuthError, Provider, TokenCache, TokenSource};

pub use walrelay_oauth::librdkafka::LOGIN_PROPERTIES;

/// Whether `props` (resolved) log in with `OAUTHBEARER`.
#[must_use]
pub fn is_oauthbearer(props: &BTreeMap<String, String>) -> bool {
    librdkafka::is_oauthbearer(|name| props.get(name).map(String::as_str))
}

/// Where a client's tokens come from: nowhere (no `OAUTHBEARER`), or the
/// process's cache for its provider. Cheap to clone. `Debug` shows the
/// provider's kind only.
#[derive(Clone, Default)]
pub struct Login {
    clients: Option<Arc<ClientTokens>>,
    kind: &'static str,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.clients {
            Some(_) => write!(f, "Login({})", self.kind),
            None => f.write_str("Login(none)"),
        }
    }
}

impl Login {
    /// No token login.
    #[must_use]
    pub fn none() -> Login {
        Login::default()
    }

    /// The login of a client made from `props` (the user's properties,
    /// secrets resolved) with walrelay's `options`: the process's cache
    /// for that provider, made on first use. Refuses, with the setting's
    /// name, what the provider cannot do.
    pub fn for_properties(
        props: &BTreeMap<String, String>,
        options: &OAuthOptions,
    ) -> Result<Login, ClientError> {
        if !is_oauthbearer(props) {
            return Ok(Login::none());
        }
        let plan = plan(
            |name| props.get(name).map(String::as_str),
            options,
            |name| std::env::var(name).ok(),
        )?;
        Ok(shared(plan)?)
    }

    /// Whether this is a token login.
    #[must_use]
    pub fn is_token(&self) -> bool {
        self.clients.is_some()
    }

    /// The token source for walrelay's own connections
    /// ([`super::conn::Settings::from_client_config_with_tokens`]).
    #[must_use]
    pub fn token_source(&self) -> Option<Arc<dyn TokenSource>> {
        self.clients.as_ref().map(|c| Arc::clone(c.source()))
    }

    /// A token now (the cached one while fresh): what `walrelay run`
    /// fetches at start so that a wrong secret or endpoint stops it with
    /// the endpoint's answer rather than as failed Kafka logins later.
    pub fn check(&self) -> Result<(), OAuthError> {
        match &self.clients {
            Some(clients) => clients.token().map(|_| ()),
            None => Ok(()),
        }
    }

    /// Hands `client`, just made, its first token and every new one while
    /// it lives ([`ClientTokens::keep_fresh`]); nothing for a login
    /// without tokens. librdkafka connects once it has a token.
    fn keep_fresh<T: HasClient>(&self, client: &Arc<T>) -> Result<(), KafkaError> {
        match &self.clients {
            Some(clients) => Ok(clients.keep_fresh(client)?),
            None => Ok(()),
        }
    }

    /// Makes a client of kind `T` with `context` and this login.
    pub fn client<T, C>(&self, config: &ClientConfig, context: C) -> Result<Arc<T>, KafkaError>
    where
        T: HasClient + FromClientConfigAndContext<C>,
        C: ClientContext,
    {
        let client = Arc::new(T::from_config_and_context(config, context)?);
        self.keep_fresh(&client)?;
        Ok(client)
    }

    /// Creates an admin client that logs in with this login's token.
    pub fn admin_client(
        &self,
        config: &ClientConfig,
    ) -> Result<Arc<AdminClient<PlainContext>>, KafkaError> {
        self.client(config, PlainContext)
    }
}

/// The process's one cache per provider plan: clients configured alike
/// share their tokens; a changed secret (a new plan) gets a new cache.
fn shared(plan: ProviderPlan) -> Result<Login, OAuthError> {
    static CACHES: OnceLock<Mutex<Vec<(ProviderPlan, Login)>>> = OnceLock::new();
    let mut caches = CACHES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, login)) = caches.iter().find(|(p, _)| *p == plan) {
        return Ok(login.clone());
    }
    let provider = Provider::new(plan.clone())?;
    let kind = provider.kind();
    let login = Login {
        kind,
        clients: Some(ClientTokens::new(Arc::new(TokenCache::new(provider)))),
    };
    tracing::info!(provider = kind, "Kafka clients log in with OAUTHBEARER");
    caches.push((plan, login.clone()));
    Ok(login)
}

/// A librdkafka client context with rdkafka's default behaviour, for the
/// clients that need nothing else (readers, admin clients, the source
/// record's writer, the readiness probe). Their tokens come from their
/// [`Login`], not from the context.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainContext;

impl ClientContext for PlainContext {}

impl rdkafka::consumer::ConsumerContext for PlainContext {}

/// For producers whose deliveries nobody awaits through the context (the
/// probe sends nothing; the source record's writer awaits futures).
impl rdkafka::producer::ProducerContext for PlainContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

impl From<OAuthError> for ClientError {
    fn from(e: OAuthError) -> ClientError {
        ClientError::Login(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn other_mechanisms_log_in_without_tokens() {
        let login = Login::for_properties(
            &props(&[("sasl.mechanism", "SCRAM-SHA-512")]),
            &OAuthOptions::default(),
        )
        .unwrap();
        assert!(!login.is_token());
        assert!(login.check().is_ok());
        assert_eq!(format!("{login:?}"), "Login(none)");
    }

    #[test]
    fn clients_configured_alike_share_one_cache() {
        let oidc = props(&[
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "http://127.0.0.1:9/token",
            ),
            ("sasl.oauthbearer.client.id", "relay"),
            ("sasl.oauthbearer.client.secret", "s3cret-login-test"),
        ]);
        let a = Login::for_properties(&oidc, &OAuthOptions::default()).unwrap();
        let b = Login::for_properties(&oidc, &OAuthOptions::default()).unwrap();
        assert!(Arc::ptr_eq(
            a.clients.as_ref().unwrap(),
            b.clients.as_ref().unwrap()
        ));
        let mut other = oidc.clone();
        other.insert(
            "sasl.oauthbearer.client.secret".into(),
            "rotated-login-test".into(),
        );
        let c = Login::for_properties(&other, &OAuthOptions::default()).unwrap();
        assert!(!Arc::ptr_eq(
            a.clients.as_ref().unwrap(),
            c.clients.as_ref().unwrap()
        ));
        let shown = format!("{a:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn extensions_are_taken_with_the_login() {
        let login = Login::for_properties(
            &props(&[
                ("sasl.mechanism", "OAUTHBEARER"),
                ("sasl.oauthbearer.method", "oidc"),
                (
                    "sasl.oauthbearer.token.endpoint.url",
                    "https://idp.example/token",
                ),
                ("sasl.oauthbearer.client.id", "relay"),
                ("sasl.oauthbearer.client.secret", "x-extensions-test"),
                ("sasl.oauthbearer.extensions", "logicalCluster=lkc-1"),
            ]),
            &OAuthOptions::default(),
        )
        .unwrap();
        assert!(login.is_token());
    }

    /// Against librdkafka itself: every kind of client is created with a
    /// token login and takes its first token.
    #[test]
    fn every_kind_of_client_is_created_with_its_first_token() {
        let props = props(&[
            ("bootstrap.servers", "127.0.0.1:1"),
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("enable.sasl.oauthbearer.unsecure.jwt", "true"),
            ("sasl.oauthbearer.config", "principal=relay-login-test"),
        ]);
        let options = OAuthOptions {
            insecure_allow_unsecured_jwt: true,
            ..OAuthOptions::default()
        };
        let login = Login::for_properties(&props, &options).unwrap();
        assert!(login.is_token());
        login.check().unwrap();
        let mut config = ClientConfig::new();
        for (k, v) in &props {
            if !LOGIN_PROPERTIES.contains(&k.as_str()) {
                config.set(k, v);
            }
        }
        let admin = login.admin_client(&config).unwrap();
        drop(admin);
        let setup = crate::kafka::client::ClientSetup { config, login };
        drop(setup.consumer().unwrap());
        drop(setup.base_producer().unwrap());
        drop(setup.future_producer().unwrap());
    }

    #[test]
    fn the_client_secret_is_a_secret_reference_like_any_other() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("client-secret");
        let mut kafka = crate::kafka::properties::KafkaConfig::default();
        for (k, v) in [
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "https://idp.example/token",
            ),
            ("sasl.oauthbearer.client.id", "relay"),
        ] {
            kafka.properties.insert(k.into(), v.into());
        }
        kafka.properties.insert(
            "sasl.oauthbearer.client.secret".into(),
            format!("file:{}", missing.display()),
        );
        let e = crate::kafka::client::login(&kafka).unwrap_err().to_string();
        assert!(e.contains("sasl.oauthbearer.client.secret"), "{e}");
        std::fs::write(&missing, "from-a-file\n").unwrap();
        assert!(crate::kafka::client::login(&kafka).unwrap().is_token());
    }

    #[test]
    fn walrelays_own_options_parse_from_the_kafka_section() {
        let kafka: crate::kafka::properties::KafkaConfig =
            toml::from_str("oauth_provider = \"aws-msk-iam\"\naws_region = \"eu-west-1\"\n")
                .unwrap();
        let options = kafka.oauth_options();
        assert_eq!(
            options.oauth_provider,
            Some(walrelay_oauth::plan::ProviderName::AwsMskIam)
        );
        assert_eq!(options.aws_region.as_deref(), Some("eu-west-1"));
        assert!(!options.insecure_allow_unsecured_jwt);
        for wrong in ["oauth_provider = \"gcp\"", "insecure = true"] {
            assert!(
                toml::from_str::<crate::kafka::properties::KafkaConfig>(wrong).is_err(),
                "{wrong}"
            );
        }
    }

    #[test]
    fn a_missing_provider_is_refused_with_what_to_set() {
        let e = Login::for_properties(
            &props(&[("sasl.mechanism", "OAUTHBEARER")]),
            &OAuthOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("sasl.oauthbearer.method=oidc"), "{e}");
    }
}
