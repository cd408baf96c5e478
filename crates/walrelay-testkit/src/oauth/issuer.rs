//! [`TokenIssuer`]: an OAuth 2 authorization server for tests, on
//! `http://127.0.0.1:<ephemeral port>`, serving `POST /token` (client
//! credentials, RS256 JWTs) and `GET /jwks` (the published keys) from a
//! thread of its own, so that blocking test code, librdkafka's and the
//! brokers' fetches all reach it.
//!
//! Plain HTTP on loopback: the brokers and clients that use it are told to
//! allow exactly its URLs (Kafka's `org.apache.kafka.sasl.oauthbearer.allowed.urls`).

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use super::endpoint::{authorize, error};
use super::http::{read_request, write_response, Request, Response};
use super::jwt::{sign, Claims};
use super::keys::{SigningKey, KEY_COUNT};
use crate::cluster::HOST;

/// The token lifetime by default: short, so that a test lasting a minute
/// sees clients refresh (librdkafka at 80 % of it, Java at 80 % too).
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(15);
/// The `aud` of tokens by default, and what brokers expect.
pub const DEFAULT_AUDIENCE: &str = "walrelay-kafka";
/// How long a connection may take to send its request.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How an issuer starts.
#[derive(Clone, Debug)]
pub struct IssuerOptions {
    /// `iss` of the tokens; by default the issuer's base URL
    /// (`http://127.0.0.1:<port>`).
    pub issuer: Option<String>,
    /// `aud` of the tokens.
    pub audience: String,
    /// `exp - iat` of the tokens.
    pub token_lifetime: Duration,
}

impl Default for IssuerOptions {
    fn default() -> Self {
        IssuerOptions {
            issuer: None,
            audience: DEFAULT_AUDIENCE.to_owned(),
            token_lifetime: DEFAULT_TOKEN_LIFETIME,
        }
    }
}

/// Which key signs a token [`TokenIssuer::sign`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyChoice {
    /// The published key, as `/token` signs.
    Current,
    /// The key the last [`TokenIssuer::rotate_key`] retired from the JWKS.
    Retired,
    /// A key this issuer never published (the last test key, while
    /// rotations have not reached it).
    Unpublished,
}

/// What the endpoints share with the test.
struct State {
    clients: HashMap<String, String>,
    keys: Vec<SigningKey>,
    /// Index of the published key; those before it are retired.
    current: usize,
    issued: BTreeMap<String, u64>,
    refused: u64,
    jwks_fetches: u64,
}

impl State {
    /// The JWKS document: the published key only.
    fn jwks(&self) -> serde_json::Value {
        serde_json::json!({"keys": [self.keys[self.current].jwk()]})
    }
}

struct Shared {
    state: Mutex<State>,
    /// Signalled whenever the counters change.
    changed: Condvar,
    issuer: String,
    audience: String,
    lifetime: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running test OAuth server; dropping it stops it.
pub struct TokenIssuer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Client ids only: secrets stay out of test output.
        let state = self.shared.lock();
        f.debug_struct("TokenIssuer")
            .field("url", &self.base_url())
            .field("clients", &state.clients.keys().collect::<Vec<_>>())
            .field("kid", &state.keys[state.current].kid())
            .finish_non_exhaustive()
    }
}

impl TokenIssuer {
    /// Binds `127.0.0.1:0` and serves on a thread of its own.
    pub fn start(opts: IssuerOptions) -> anyhow::Result<TokenIssuer> {
        let listener = TcpListener::bind((HOST, 0)).context("binding the token issuer")?;
        let addr = listener.local_addr()?;
        let base = format!("http://{addr}");
        // Key ids unique to this issuer, so two issuers' keys never pass
        // for each other by name.
        let kid_prefix = format!("walrelay-test-{}", addr.port());
        let keys = (0..KEY_COUNT)
            .map(|i| SigningKey::fixture(i, &kid_prefix))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                clients: HashMap::new(),
                keys,
                current: 0,
                issued: BTreeMap::new(),
                refused: 0,
                jwks_fetches: 0,
            }),
            changed: Condvar::new(),
            issuer: opts.issuer.unwrap_or_else(|| base.clone()),
            audience: opts.audience,
            lifetime: opts.token_lifetime,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("walrelay-token-issuer".into())
            .spawn({
                let (shared, stop) = (shared.clone(), stop.clone());
                move || accept_loop(&listener, &shared, &stop)
            })
            .context("starting the token issuer's thread")?;
        tracing::debug!("test token issuer at {base}");
        Ok(TokenIssuer {
            addr,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The token endpoint, `<base>/token`.
    pub fn token_url(&self) -> String {
        format!("{}/token", self.base_url())
    }

    /// The JWKS endpoint, `<base>/jwks`.
    pub fn jwks_url(&self) -> String {
        format!("{}/jwks", self.base_url())
    }

    /// The `iss` of its tokens.
    pub fn issuer(&self) -> &str {
        &self.shared.issuer
    }

    /// The `aud` of its tokens.
    pub fn audience(&self) -> &str {
        &self.shared.audience
    }

    /// The lifetime of its tokens.
    pub fn token_lifetime(&self) -> Duration {
        self.shared.lifetime
    }

    /// Lets client `id` (the tokens' `sub`, so the principal `User:<id>`)
    /// get tokens with `secret`; a second call replaces the secret.
    pub fn register_client(&self, id: &str, secret: &str) {
        self.shared
            .lock()
            .clients
            .insert(id.to_owned(), secret.to_owned());
    }

    /// Tokens `/token` issued, to all clients.
    pub fn tokens_issued(&self) -> u64 {
        self.shared.lock().issued.values().sum()
    }

    /// Tokens `/token` issued to client `id`.
    pub fn tokens_issued_to(&self, id: &str) -> u64 {
        self.shared.lock().issued.get(id).copied().unwrap_or(0)
    }

    /// Requests `/token` refused (bad client, secret or grant).
    pub fn requests_refused(&self) -> u64 {
        self.shared.lock().refused
    }

    /// How often `/jwks` was fetched.
    pub fn jwks_fetches(&self) -> u64 {
        self.shared.lock().jwks_fetches
    }

    /// Waits until `/token` has issued `count` tokens to client `id`.
    pub fn await_tokens_issued_to(
        &self,
        id: &str,
        count: u64,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        self.await_state(timeout, |s| s.issued.get(id).copied().unwrap_or(0) >= count)
            .with_context(|| format!("{count} token(s) for {id:?}"))
    }

    /// Waits until `/jwks` has been fetched `count` times in all: after a
    /// [`TokenIssuer::rotate_key`], one more fetch than before it means a
    /// broker's cache holds the new key set.
    pub fn await_jwks_fetches(&self, count: u64, timeout: Duration) -> anyhow::Result<()> {
        self.await_state(timeout, |s| s.jwks_fetches >= count)
            .with_context(|| format!("{count} JWKS fetch(es)"))
    }

    fn await_state(&self, timeout: Duration, done: impl Fn(&State) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while !done(&state) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("not within {timeout:?}");
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// The key id `/token` signs with, the one `/jwks` publishes.
    pub fn current_kid(&self) -> String {
        let state = self.shared.lock();
        state.keys[state.current].kid().to_owned()
    }

    /// Publishes the next test key and retires the current one from the
    /// JWKS at once (no overlap): tokens signed before stay valid only
    /// while a validator still caches the old set. Returns the new key id;
    /// an error once the test keys are used up.
    pub fn rotate_key(&self) -> anyhow::Result<String> {
        let mut state = self.shared.lock();
        if state.current + 1 >= state.keys.len() {
            bail!("the issuer has used up its {KEY_COUNT} test keys");
        }
        state.current += 1;
        let kid = state.keys[state.current].kid().to_owned();
        tracing::debug!("token issuer rotated to key {kid}");
        Ok(kid)
    }

    /// The claims `/token` would sign for `subject` now (no scope).
    pub fn claims(&self, subject: &str) -> Claims {
        Claims::new(
            &self.shared.issuer,
            &self.shared.audience,
            subject,
            self.shared.lifetime,
            None,
        )
    }

    /// `claims` signed by the key `key` picks, for negative tests (a
    /// retired key, an unknown key, another audience, an expired token).
    /// Not counted as issued.
    pub fn sign(&self, claims: &Claims, key: KeyChoice) -> anyhow::Result<String> {
        let state = self.shared.lock();
        let index = match key {
            KeyChoice::Current => state.current,
            KeyChoice::Retired => state
                .current
                .checked_sub(1)
                .ok_or_else(|| anyhow!("no key was retired yet: rotate_key first"))?,
            KeyChoice::Unpublished if state.current + 1 < state.keys.len() => state.keys.len() - 1,
            KeyChoice::Unpublished => bail!("every test key has been published"),
        };
        sign(claims, &state.keys[index])
    }

    /// The JWKS document `/jwks` serves now.
    pub fn jwks(&self) -> serde_json::Value {
        self.shared.lock().jwks()
    }
}

impl Drop for TokenIssuer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = conn else { continue };
        // A thread per connection: a client that connects and stalls does
        // not hold up a broker's JWKS fetch.
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("walrelay-token-issuer-conn".into())
            .spawn(move || {
                if let Err(e) = serve(stream, &shared) {
                    tracing::debug!("token issuer: a connection failed: {e:#}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("token issuer: no thread for a connection: {e}");
        }
    }
}

fn serve(stream: TcpStream, shared: &Shared) -> anyhow::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let request = read_request(&stream)?;
    let response = respond(&request, shared);
    tracing::debug!(
        "token issuer: {} {} -> {}",
        request.method,
        request.path,
        response.status
    );
    write_response(&stream, &response)
}

fn respond(request: &Request, shared: &Shared) -> Response {
    match request.path.as_str() {
        "/token" => token(request, shared),
        "/jwks" if request.method == "GET" => {
            let mut state = shared.lock();
            state.jwks_fetches += 1;
            let jwks = state.jwks();
            drop(state);
            shared.changed.notify_all();
            Response::json(200, jwks)
        }
        "/jwks" => error(405, "invalid_request", "the JWKS endpoint takes GET"),
        other => error(404, "not_found", &format!("no endpoint {other}")),
    }
}

fn token(request: &Request, shared: &Shared) -> Response {
    let mut state = shared.lock();
    let answer = match authorize(request, &state.clients) {
        Ok(grant) => {
            let claims = Claims::new(
                &shared.issuer,
                &shared.audience,
                &grant.client_id,
                shared.lifetime,
                grant.scope.as_deref(),
            );
            match sign(&claims, &state.keys[state.current]) {
                Ok(jwt) => {
                    *state.issued.entry(grant.client_id).or_default() += 1;
                    Response::json(
                        200,
                        serde_json::json!({
                            "access_token": jwt,
                            "token_type": "Bearer",
                            "expires_in": claims.expires_at - claims.issued_at,
                        }),
                    )
                }
                Err(e) => error(500, "server_error", &format!("{e:#}")),
            }
        }
        Err(refusal) => {
            state.refused += 1;
            refusal
        }
    };
    drop(state);
    shared.changed.notify_all();
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oauth::{decode_unverified, OAuthClient};
    use std::io::{Read, Write};

    fn raw(issuer: &TokenIssuer, request: &str) -> String {
        let mut s = TcpStream::connect(issuer.addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn tokens_are_issued_counted_and_published_keys_rotate() {
        let issuer = TokenIssuer::start(IssuerOptions {
            token_lifetime: Duration::from_secs(15),
            ..IssuerOptions::default()
        })
        .unwrap();
        issuer.register_client("relay", "s3cret");
        assert!(!format!("{issuer:?}").contains("s3cret"));
        let client = OAuthClient::new(&issuer.token_url(), "relay", "s3cret").with_scope("kafka");
        let token = client.fetch_token().unwrap();
        assert_eq!(token.expires_in, 15);
        let (header, claims) = decode_unverified(&token.access_token).unwrap();
        assert_eq!(header["kid"], issuer.current_kid().as_str());
        assert_eq!(claims["sub"], "relay");
        assert_eq!(claims["iss"], issuer.base_url().as_str());
        assert_eq!(claims["aud"], DEFAULT_AUDIENCE);
        assert_eq!(claims["scope"], "kafka");
        // Form-field credentials work too.
        let body = "grant_type=client_credentials&client_id=relay&client_secret=s3cret";
        let answer = raw(
            &issuer,
            &format!(
                "POST /token HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(issuer.tokens_issued_to("relay"), 2);
        issuer
            .await_tokens_issued_to("relay", 2, Duration::from_secs(1))
            .unwrap();
        assert!(issuer
            .await_tokens_issued_to("relay", 3, Duration::from_millis(20))
            .is_err());

        let wrong = OAuthClient::new(&issuer.token_url(), "relay", "nope");
        let err = format!("{:#}", wrong.fetch_token().unwrap_err());
        assert!(
            err.contains("401") && err.contains("invalid_client"),
            "{err}"
        );
        assert_eq!((issuer.tokens_issued(), issuer.requests_refused()), (2, 1));

        let jwks = raw(&issuer, "GET /jwks HTTP/1.1\r\n\r\n");
        let first = issuer.current_kid();
        assert!(jwks.contains(&format!("\"kid\":\"{first}\"")), "{jwks}");
        assert_eq!(issuer.jwks_fetches(), 1);
        assert!(issuer
            .sign(&issuer.claims("x"), KeyChoice::Retired)
            .is_err());
        let second = issuer.rotate_key().unwrap();
        assert_ne!(first, second);
        let keys = issuer.jwks()["keys"].as_array().unwrap().clone();
        assert_eq!(keys.len(), 1, "the old key is retired at once");
        assert_eq!(keys[0]["kid"], second.as_str());
        let retired = issuer
            .sign(&issuer.claims("x"), KeyChoice::Retired)
            .unwrap();
        assert_eq!(
            decode_unverified(&retired).unwrap().0["kid"],
            first.as_str()
        );
        let unpublished = issuer
            .sign(&issuer.claims("x"), KeyChoice::Unpublished)
            .unwrap();
        let kid = decode_unverified(&unpublished).unwrap().0["kid"].clone();
        assert!(kid != first.as_str() && kid != second.as_str());
        issuer.rotate_key().unwrap();
        issuer.rotate_key().unwrap();
        assert!(issuer.rotate_key().is_err(), "four test keys");
        assert!(issuer
            .sign(&issuer.claims("x"), KeyChoice::Unpublished)
            .is_err());

        assert!(raw(&issuer, "GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(raw(&issuer, "GET /token HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    }
}
