//! When a token is refreshed, and the cache that holds it between
//! refreshes, so that the producer's token callback and walrelay's own
//! connections share one token rather than each asking the endpoint.
//!
//! The rule ([`freshness`]) is librdkafka's: a token is refreshed once
//! 80 % of its lifetime has passed, which leaves a fifth of it (three
//! minutes of an MSK IAM token's fifteen, twelve of an hour's JWT) to
//! retry a failing endpoint before the brokers see an expired token.
//! While a refresh fails and the old token has not expired, the old
//! token is still handed out: an identity provider's brief outage must
//! not stop the relay.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::error::OAuthError;
use super::token::Token;

/// The part of a token's lifetime after which it is refreshed.
const REFRESH_AT_PERCENT: u32 = 80;

/// How long after a failed refresh the next is tried while the old token
/// still works (the endpoint is not hammered by every connection).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// What a cached token is good for at a given moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Use it.
    Fresh,
    /// Still accepted, but past the refresh point: fetch a new one, and
    /// use this one if that fails.
    Stale,
    /// No longer accepted: a new one is needed.
    Expired,
}

/// The moment a token received at `received` and expiring at `expires`
/// should be replaced: 80 % into its lifetime (at once when it arrived
/// already expired, or the clock went back).
#[must_use]
pub fn refresh_at(received: SystemTime, expires: SystemTime) -> SystemTime {
    match expires.duration_since(received) {
        Ok(lifetime) => received + lifetime * REFRESH_AT_PERCENT / 100,
        Err(_) => received,
    }
}

/// What the token received at `received`, expiring at `expires`, is good
/// for at `now`.
#[must_use]
pub fn freshness(now: SystemTime, received: SystemTime, expires: SystemTime) -> Freshness {
    if now >= expires {
        Freshness::Expired
    } else if now >= refresh_at(received, expires) || now < received {
        // A clock that went back makes the age unknowable: refresh.
        Freshness::Stale
    } else {
        Freshness::Fresh
    }
}

/// Something that fetches a new token (a [`super::provider::Provider`],
/// or a test's fake). Blocking: librdkafka calls its token callback on
/// its own thread, and walrelay's own connections are blocking.
pub trait Fetch: Send + Sync {
    fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError>;
}

/// Where a connection gets its token: a [`TokenCache`], or a test's
/// fixed token. Object-safe, so that walrelay's own connections
/// (the relay's `kafka::conn::Settings`) hold one without knowing the
/// provider.
pub trait TokenSource: Send + Sync {
    fn token(&self) -> Result<Token, OAuthError>;
}

impl<F: Fetch> TokenSource for TokenCache<F> {
    fn token(&self) -> Result<Token, OAuthError> {
        TokenCache::token(self)
    }
}

struct Cached {
    token: Token,
    received: SystemTime,
    /// When a failed refresh may be tried again.
    retry_after: Option<SystemTime>,
}

/// A token shared by every user, refreshed by [`freshness`]'s rule.
pub struct TokenCache<F> {
    fetcher: F,
    clock: Box<dyn Fn() -> SystemTime + Send + Sync>,
    state: Mutex<Option<Cached>>,
}

impl<F: Fetch> TokenCache<F> {
    /// A cache on the system clock.
    pub fn new(fetcher: F) -> TokenCache<F> {
        TokenCache::with_clock(fetcher, SystemTime::now)
    }

    /// A cache on `clock` (tests give a fake one).
    pub fn with_clock(
        fetcher: F,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> TokenCache<F> {
        TokenCache {
            fetcher,
            clock: Box::new(clock),
            state: Mutex::new(None),
        }
    }

    /// A token the brokers accept now: the cached one while fresh, else a
    /// new one; the cached one again when the refresh fails but it has not
    /// expired (the failure logged as a warning).
    pub fn token(&self) -> Result<Token, OAuthError> {
        // One refresh at a time: the lock is held across the fetch so
        // that concurrent callers wait for it rather than each fetching.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Read after the lock: a caller that waited for another's refresh
        // must not see the new token as received in its future (and
        // refresh it again).
        let now = (self.clock)();
        if let Some(cached) = state.as_mut() {
            match freshness(now, cached.received, cached.token.expires_at) {
                Freshness::Fresh => return Ok(cached.token.clone()),
                Freshness::Stale if cached.retry_after.is_some_and(|t| now < t) => {
                    return Ok(cached.token.clone());
                }
                Freshness::Stale => match self.fetch(now) {
                    Ok(token) => return Ok(store(&mut state, token, now)),
                    Err(e) => {
                        tracing::warn!(
                            "refreshing the Kafka OAuth token failed; the current one is \
                             used until it expires: {e}"
                        );
                        cached.retry_after = Some(now + RETRY_AFTER_FAILURE);
                        return Ok(cached.token.clone());
                    }
                },
                Freshness::Expired => {}
            }
        }
        let token = self.fetch(now)?;
        Ok(store(&mut state, token, now))
    }

    /// A new token, refused when it arrives already expired.
    fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
        let token = self.fetcher.fetch(now)?;
        if token.expires_at <= now {
            return Err(OAuthError::Unusable {
                source_name: format!("the token provider (principal {})", token.principal),
                reason: "it expired before it arrived (is this machine's clock right?)".into(),
            });
        }
        Ok(token)
    }
}

fn store(state: &mut Option<Cached>, token: Token, now: SystemTime) -> Token {
    *state = Some(Cached {
        token: token.clone(),
        received: now,
        retry_after: None,
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extensions::Extensions;
    use crate::token::Secret;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_token_is_refreshed_at_80_percent_of_its_lifetime() {
        assert_eq!(refresh_at(at(1000), at(2000)), at(1800));
        assert_eq!(refresh_at(at(1000), at(1900)), at(1720));
        // Arrived expired, or the clocks disagree: refresh at once.
        assert_eq!(refresh_at(at(1000), at(900)), at(1000));
        assert_eq!(freshness(at(1000), at(1000), at(2000)), Freshness::Fresh);
        assert_eq!(freshness(at(1799), at(1000), at(2000)), Freshness::Fresh);
        assert_eq!(freshness(at(1800), at(1000), at(2000)), Freshness::Stale);
        assert_eq!(freshness(at(1999), at(1000), at(2000)), Freshness::Stale);
        assert_eq!(freshness(at(2000), at(1000), at(2000)), Freshness::Expired);
        // The clock went back before the token's arrival.
        assert_eq!(freshness(at(500), at(1000), at(2000)), Freshness::Stale);
    }

    /// A fake provider: each fetch returns a token valid for `lifetime`
    /// seconds from the fake clock, numbered; fails while `failing`.
    struct Fake {
        clock: Arc<AtomicU64>,
        fetches: AtomicU64,
        failing: std::sync::atomic::AtomicBool,
        lifetime: u64,
    }

    impl Fetch for Arc<Fake> {
        fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
            assert_eq!(now, at(self.clock.load(Ordering::SeqCst)));
            if self.failing.load(Ordering::SeqCst) {
                return Err(OAuthError::Unusable {
                    source_name: "the fake".into(),
                    reason: "down".into(),
                });
            }
            let n = self.fetches.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Token {
                value: Secret::new(format!("token-{n}")),
                principal: "relay".into(),
                expires_at: now + Duration::from_secs(self.lifetime),
                extensions: Extensions::default(),
            })
        }
    }

    fn cache(lifetime: u64) -> (Arc<Fake>, TokenCache<Arc<Fake>>) {
        let clock = Arc::new(AtomicU64::new(1000));
        let fake = Arc::new(Fake {
            clock: clock.clone(),
            fetches: AtomicU64::new(0),
            failing: false.into(),
            lifetime,
        });
        let cache = TokenCache::with_clock(fake.clone(), move || at(clock.load(Ordering::SeqCst)));
        (fake, cache)
    }

    fn value(cache: &TokenCache<Arc<Fake>>) -> String {
        cache.token().unwrap().value.expose().to_owned()
    }

    #[test]
    fn the_cache_fetches_once_then_again_past_the_refresh_point() {
        let (fake, cache) = cache(100);
        assert_eq!(value(&cache), "token-1");
        fake.clock.store(1079, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-1");
        fake.clock.store(1080, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-2");
        // The new token's lifetime counts from its own arrival.
        fake.clock.store(1159, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-2");
        fake.clock.store(1160, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-3");
    }

    #[test]
    fn a_failed_refresh_keeps_the_valid_token_and_waits_before_retrying() {
        let (fake, cache) = cache(100);
        assert_eq!(value(&cache), "token-1");
        fake.failing.store(true, Ordering::SeqCst);
        fake.clock.store(1085, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-1");
        // Within the retry pause nothing is fetched, even when it works.
        fake.failing.store(false, Ordering::SeqCst);
        fake.clock.store(1094, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-1");
        fake.clock.store(1095, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-2");
    }

    #[test]
    fn an_expired_token_is_never_handed_out() {
        let (fake, cache) = cache(100);
        assert_eq!(value(&cache), "token-1");
        fake.failing.store(true, Ordering::SeqCst);
        fake.clock.store(1100, Ordering::SeqCst);
        let e = cache.token().unwrap_err();
        assert!(e.to_string().contains("down"), "{e}");
        fake.failing.store(false, Ordering::SeqCst);
        assert_eq!(value(&cache), "token-2");
    }

    #[test]
    fn a_token_that_arrives_expired_is_refused() {
        let (_fake, cache) = cache(0);
        let e = cache.token().unwrap_err();
        assert!(e.to_string().contains("clock"), "{e}");
    }

    /// A provider whose fetch takes 5 s of the fake clock (and 100 ms of
    /// real time, so that a second caller queues behind it).
    struct Slow {
        clock: Arc<AtomicU64>,
        fetches: AtomicU64,
    }

    impl Fetch for Arc<Slow> {
        fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            self.clock.fetch_add(5, Ordering::SeqCst);
            Ok(Token {
                value: Secret::new("t"),
                principal: "relay".into(),
                expires_at: now + Duration::from_secs(100),
                extensions: Extensions::default(),
            })
        }
    }

    #[test]
    fn callers_queued_behind_a_refresh_take_its_token() {
        let clock = Arc::new(AtomicU64::new(1000));
        let slow = Arc::new(Slow {
            clock: clock.clone(),
            fetches: AtomicU64::new(0),
        });
        let reading = clock.clone();
        let cache = Arc::new(TokenCache::with_clock(slow.clone(), move || {
            at(reading.load(Ordering::SeqCst))
        }));
        let first = {
            let cache = cache.clone();
            std::thread::spawn(move || cache.token().map(drop))
        };
        std::thread::sleep(Duration::from_millis(20));
        cache.token().unwrap();
        first.join().unwrap().unwrap();
        assert_eq!(slow.fetches.load(Ordering::SeqCst), 1);
    }
}
