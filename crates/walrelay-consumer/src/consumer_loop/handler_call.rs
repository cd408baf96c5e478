//! One call of the service's handler, as the loop makes it: a panic is a
//! failed attempt of the batch (not the end of the loop, which serves
//! every other partition too), a call running past the handler timeout is
//! abandoned and its statement cancelled, and the SQLSTATE inside the
//! handler's error, when its type carries one, is found so that the retry
//! rules of [`crate::outage`] apply to the handler's statements as to the
//! loop's own.

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_postgres::{CancelToken, NoTls};

/// Why a handler call failed.
#[derive(Debug)]
pub(crate) enum HandlerFailure<E> {
    /// It returned this error.
    Returned(E),
    /// It panicked (the message, when the payload was text).
    Panicked(String),
    /// It ran longer than the handler timeout.
    TimedOut(Duration),
}

impl<E: fmt::Display> fmt::Display for HandlerFailure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerFailure::Returned(e) => e.fmt(f),
            HandlerFailure::Panicked(message) => write!(f, "the handler panicked: {message}"),
            HandlerFailure::TimedOut(limit) => write!(
                f,
                "the handler ran longer than the handler timeout ({limit:?}): its statement was \
                 cancelled and its connection discarded"
            ),
        }
    }
}

impl<E: 'static> HandlerFailure<E> {
    /// The SQLSTATE of the database error the handler returned, if its
    /// error type lets it be found: a `tokio_postgres::Error`, or a boxed
    /// `std::error::Error` with one in its `source()` chain (an
    /// `anyhow::Error` converts into the latter with `.into()`).
    pub(crate) fn sqlstate(&self) -> Option<String> {
        match self {
            HandlerFailure::Returned(e) => sqlstate_of(e),
            HandlerFailure::Panicked(_) | HandlerFailure::TimedOut(_) => None,
        }
    }
}

fn sqlstate_of(error: &dyn Any) -> Option<String> {
    if let Some(e) = error.downcast_ref::<tokio_postgres::Error>() {
        return e.code().map(|c| c.code().to_owned());
    }
    let boxed: &(dyn StdError + 'static) =
        if let Some(e) = error.downcast_ref::<Box<dyn StdError + Send + Sync>>() {
            e.as_ref()
        } else if let Some(e) = error.downcast_ref::<Box<dyn StdError + Send>>() {
            e.as_ref()
        } else if let Some(e) = error.downcast_ref::<Box<dyn StdError>>() {
            e.as_ref()
        } else {
            return None;
        };
    let mut next = Some(boxed);
    while let Some(e) = next {
        if let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() {
            return pg.code().map(|c| c.code().to_owned());
        }
        next = e.source();
    }
    None
}

/// Each handler call of one batch goes through here: a panic is caught,
/// and the call is bounded by the handler timeout. On a timeout the
/// running statement is cancelled (through `cancel`, which needs no TLS: a
/// cancel request is not an authenticated session) and the connection is
/// marked for discarding.
pub(crate) struct Bound<'a> {
    timeout: Option<Duration>,
    cancel: &'a CancelToken,
    timed_out: bool,
}

impl<'a> Bound<'a> {
    pub(crate) fn new(timeout: Option<Duration>, cancel: &'a CancelToken) -> Bound<'a> {
        Bound {
            timeout,
            cancel,
            timed_out: false,
        }
    }

    /// Whether a call timed out: the connection must not be reused (its
    /// statement may still be running).
    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// One handler call.
    pub(crate) async fn call<E>(
        &mut self,
        handler: impl Future<Output = Result<(), E>>,
    ) -> Result<(), HandlerFailure<E>> {
        let call = AssertUnwindSafe(handler).catch_unwind();
        let finished = match self.timeout {
            Some(limit) => tokio::time::timeout(limit, call).await.ok(),
            None => Some(call.await),
        };
        match finished {
            Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(error))) => Err(HandlerFailure::Returned(error)),
            Some(Err(panic)) => Err(HandlerFailure::Panicked(panic_message(panic.as_ref()))),
            None => {
                self.timed_out = true;
                if let Err(e) = self.cancel.cancel_query(NoTls).await {
                    tracing::warn!(
                        "cancelling the statement of a handler that timed out failed (its \
                         connection is closed instead; the server ends the statement when it \
                         notices): {e}"
                    );
                }
                Err(HandlerFailure::TimedOut(self.timeout.unwrap_or_default()))
            }
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(Box<dyn StdError + Send + Sync>);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self.0.as_ref())
        }
    }

    #[test]
    fn errors_without_a_database_error_have_no_sqlstate() {
        assert_eq!(HandlerFailure::Returned("text".to_owned()).sqlstate(), None);
        let boxed: Box<dyn StdError + Send + Sync> = "text".into();
        assert_eq!(HandlerFailure::Returned(boxed).sqlstate(), None);
        let nested: Box<dyn StdError + Send + Sync> = Box::new(Wrapper("inner".into()));
        assert_eq!(HandlerFailure::Returned(nested).sqlstate(), None);
        assert_eq!(
            HandlerFailure::<String>::Panicked("boom".into()).sqlstate(),
            None
        );
    }

    #[test]
    fn panic_payloads_become_messages() {
        assert_eq!(panic_message(&"boom"), "boom");
        assert_eq!(panic_message(&"boom".to_owned()), "boom");
        assert_eq!(panic_message(&1_u8), "a panic without a message");
    }
}
