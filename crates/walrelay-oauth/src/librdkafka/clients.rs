//! [`ClientTokens`]: every librdkafka client of one login, handed the
//! login's token when it is made and each new token after that, from one
//! thread per login.
//!
//! A client is kept by a weak reference: the thread holds it strongly only
//! while it hands a token over, so a client is never used after it is
//! gone, and a dropped client simply leaves the list.

use std::sync::{Arc, Mutex, Once, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use rdkafka::admin::AdminClient;
use rdkafka::client::{Client, ClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::producer::{
    BaseProducer, FutureProducer, Producer, ProducerContext, ThreadedProducer,
};

use super::set_token::{set_token, set_token_failure};
use crate::error::OAuthError;
use crate::refresh::{TokenSource, RETRY_AFTER_FAILURE};
use crate::token::Token;

/// How often the thread asks the token source whether it has a new
/// token. The source refreshes at 80 % of a token's lifetime, which leaves
/// a fifth of it (three seconds of a fifteen-second token, minutes in
/// production) for this second to pass.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A librdkafka client whose token can be set: each of rdkafka's client
/// types gives its [`Client`].
pub trait HasClient: Send + Sync + 'static {
    type Context: ClientContext;
    fn native_client(&self) -> &Client<Self::Context>;
}

impl<C: ConsumerContext + 'static> HasClient for BaseConsumer<C> {
    type Context = C;
    fn native_client(&self) -> &Client<C> {
        self.client()
    }
}

impl<C: ConsumerContext + 'static> HasClient for StreamConsumer<C> {
    type Context = C;
    fn native_client(&self) -> &Client<C> {
        self.client()
    }
}

impl<C: ProducerContext + 'static> HasClient for BaseProducer<C> {
    type Context = C;
    fn native_client(&self) -> &Client<C> {
        self.client()
    }
}

impl<C: ProducerContext + 'static> HasClient for ThreadedProducer<C> {
    type Context = C;
    fn native_client(&self) -> &Client<C> {
        self.client()
    }
}

impl<C: ClientContext + 'static> HasClient for FutureProducer<C> {
    type Context = rdkafka::producer::future_producer::FutureProducerContext<C>;
    fn native_client(&self) -> &Client<Self::Context> {
        self.client()
    }
}

impl<C: ClientContext + 'static> HasClient for AdminClient<C> {
    type Context = C;
    fn native_client(&self) -> &Client<C> {
        self.inner()
    }
}

/// A client in the list, held weakly.
struct Kept<T>(Weak<T>);

/// What the thread does with a kept client of any kind.
trait Keep: Send + Sync {
    /// Hands the client `token` (or the reason there is none); `false`
    /// once the client is gone.
    fn hand(&self, token: &Result<Token, OAuthError>) -> bool;
    fn is_gone(&self) -> bool;
}

impl<T: HasClient> Keep for Kept<T> {
    fn hand(&self, token: &Result<Token, OAuthError>) -> bool {
        let Some(client) = self.0.upgrade() else {
            return false;
        };
        hand(client.native_client(), token);
        true
    }

    fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// The librdkafka clients that log in with one token source. Cheap to
/// share (`Arc`); the refreshing thread ends within a second of the last
/// `Arc` being dropped.
pub struct ClientTokens {
    source: Arc<dyn TokenSource>,
    clients: Mutex<Vec<Box<dyn Keep>>>,
    thread: Once,
}

impl std::fmt::Debug for ClientTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTokens").finish_non_exhaustive()
    }
}

impl ClientTokens {
    #[must_use]
    pub fn new(source: Arc<dyn TokenSource>) -> Arc<ClientTokens> {
        Arc::new(ClientTokens {
            source,
            clients: Mutex::new(Vec::new()),
            thread: Once::new(),
        })
    }

    /// The token source (for connections that are not librdkafka's).
    #[must_use]
    pub fn source(&self) -> &Arc<dyn TokenSource> {
        &self.source
    }

    /// A token now (the cached one while fresh).
    pub fn token(&self) -> Result<Token, OAuthError> {
        self.source.token()
    }

    /// Hands `client` a token now (an error if none can be had: a wrong
    /// secret or endpoint stops its maker with the endpoint's answer) and
    /// every new one while it lives. Call it right after making the
    /// client, before its first request: librdkafka waits for a token
    /// before it connects.
    pub fn keep_fresh<T: HasClient>(self: &Arc<Self>, client: &Arc<T>) -> Result<(), OAuthError> {
        // Under the list's lock: a new token the thread hands out meanwhile
        // either is the one taken here or reaches this client too.
        let mut clients = lock(&self.clients);
        set_token(client.native_client(), &self.source.token()?)?;
        // The gone ones leave here too, so that a process making short-lived
        // clients (an admin client per check) keeps a short list.
        clients.retain(|kept| !kept.is_gone());
        clients.push(Box::new(Kept(Arc::downgrade(client))));
        drop(clients);
        self.thread.call_once(|| spawn(Arc::downgrade(self)));
        Ok(())
    }

    /// Hands every live client `token`, and forgets the gone ones.
    fn hand_to_all(&self, token: &Result<Token, OAuthError>) {
        lock(&self.clients).retain(|kept| kept.hand(token));
    }
}

/// One client, one token: a refusal is logged (librdkafka keeps the token
/// it had); no token is reported to librdkafka, which logs it as the
/// login's failure.
fn hand<C: ClientContext>(client: &Client<C>, token: &Result<Token, OAuthError>) {
    match token {
        Ok(token) => {
            if let Err(e) = set_token(client, token) {
                tracing::warn!("Kafka OAuth token: {e}");
            }
        }
        Err(e) => set_token_failure(client, &e.to_string()),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the thread does with the token source's answer, given the expiry
/// of the token it last handed out: `Some` to hand it (or its failure) to
/// every client. Pure.
fn news(
    last: Option<SystemTime>,
    answer: Result<Token, OAuthError>,
) -> Option<Result<Token, OAuthError>> {
    match answer {
        Ok(token) if Some(token.expires_at) == last => None,
        other => Some(other),
    }
}

fn spawn(tokens: Weak<ClientTokens>) {
    let started = std::thread::Builder::new()
        .name("walrelay-oauth".into())
        .spawn(move || {
            let mut last = None;
            let mut wait = CHECK_EVERY;
            loop {
                std::thread::sleep(wait);
                wait = CHECK_EVERY;
                let Some(tokens) = tokens.upgrade() else {
                    return;
                };
                if lock(&tokens.clients).is_empty() {
                    continue;
                }
                // The source hands out a token it still has while a refresh
                // fails; with none left, the endpoint is asked again only
                // after RETRY_AFTER_FAILURE, as librdkafka would.
                if let Some(news) = news(last, tokens.source.token()) {
                    last = news.as_ref().ok().map(|t| t.expires_at);
                    if news.is_err() {
                        wait = RETRY_AFTER_FAILURE;
                    }
                    tokens.hand_to_all(&news);
                }
            }
        });
    if let Err(e) = started {
        tracing::error!("cannot start the Kafka OAuth token thread ({e}): tokens will expire");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Extensions, Secret};

    fn token(expires_in: u64) -> Token {
        Token {
            value: Secret::new("eyJ.x.y"),
            principal: "relay".into(),
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_secs(expires_in),
            extensions: Extensions::default(),
        }
    }

    #[test]
    fn only_a_new_token_or_a_failure_is_handed_out() {
        let t = token(100);
        assert!(news(None, Ok(t.clone())).is_some());
        assert!(news(Some(t.expires_at), Ok(t.clone())).is_none());
        assert!(news(Some(t.expires_at), Ok(token(200))).is_some());
        let failed = OAuthError::config("x", "y");
        assert!(matches!(
            news(Some(t.expires_at), Err(failed)),
            Some(Err(_))
        ));
    }
}

#[cfg(test)]
#[path = "clients_tests.rs"]
mod wire_tests;
