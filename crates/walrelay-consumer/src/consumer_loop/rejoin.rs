//! A consumer that librdkafka declared dead (a *fatal* error), and when
//! the loop makes a new one.
//!
//! Under Kafka 4's consumer group protocol a static member
//! (`group.instance.id`) restarted after a crash is refused with
//! `UNRELEASED_INSTANCE_ID` while the broker still counts its predecessor
//! as alive: until the predecessor's session times out (the group's
//! `consumer.session.timeout.ms`, the brokers' `group.consumer.*`, 45 s by
//! default). librdkafka makes that refusal fatal: the consumer never works
//! again. The loop then closes it and tries a new one after a short
//! backoff ([`Refusals`]), for as long as it takes, logging why (at once,
//! then at most every [`LOG_EVERY`]). Any other fatal error ends the loop
//! ([`crate::LoopError::Fatal`]): under the classic protocol that is a
//! static member fenced by a newer one with its instance id, which must not
//! fence it back.

use std::time::{Duration, Instant};

use rdkafka::error::RDKafkaErrorCode;

/// The first wait before a new consumer.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest: a retry costs the broker a handful of small requests, and
/// the member joins at most this long after its predecessor's session
/// ended.
pub(crate) const RETRY_CAP: Duration = Duration::from_millis(500);
/// How often a refusal that goes on is logged again.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(30);

/// A fatal error of the loop's consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fatal {
    /// `UNRELEASED_INSTANCE_ID`: the instance id is still held by a member
    /// the broker thinks alive. A new consumer is tried.
    InstanceIdInUse { reason: String },
    /// Anything else: the loop ends with it.
    Other {
        code: RDKafkaErrorCode,
        reason: String,
    },
}

impl Fatal {
    /// From librdkafka's fatal error (`rd_kafka_fatal_error`).
    pub(crate) fn of(code: RDKafkaErrorCode, reason: String) -> Fatal {
        match code {
            RDKafkaErrorCode::UnreleasedInstanceId => Fatal::InstanceIdInUse { reason },
            code => Fatal::Other { code, reason },
        }
    }
}

/// Whether a librdkafka log line is its report of the refusal (facility
/// `FATAL`, logged at every attempt), which the loop logs itself.
pub(crate) fn is_refusal_log(fac: &str, message: &str) -> bool {
    fac == "FATAL" && message.contains("instance ID is still used")
}

/// The refusals of one instance id since it last joined: when to try
/// again, and what to log.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    /// The first refusal in a row, and how many since.
    since: Option<(Instant, u32)>,
    last_logged: Option<Instant>,
}

/// What to do after a refusal.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Retry {
    /// How long to wait before the next consumer.
    pub(crate) wait: Duration,
    /// A warning to log now, if any.
    pub(crate) log: Option<String>,
}

impl Refusals {
    /// A consumer was refused at `now` (`reason`: librdkafka's text).
    pub(crate) fn refused(&mut self, now: Instant, instance_id: &str, reason: &str) -> Retry {
        let (first, n) = match self.since {
            Some((first, n)) => (first, n + 1),
            None => (now, 1),
        };
        self.since = Some((first, n));
        let wait = FIRST_RETRY
            .checked_mul(1 << (n - 1).min(8))
            .unwrap_or(RETRY_CAP)
            .min(RETRY_CAP);
        let due = self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        let log = due.then(|| {
            self.last_logged = Some(now);
            if n == 1 {
                format!(
                    "the broker refused group.instance.id={instance_id:?} ({reason}): under \
                     group.protocol=consumer an instance id stays taken until its previous \
                     member leaves or its session times out (a member killed without leaving \
                     holds it for the group's consumer.session.timeout.ms, 45 s by default). \
                     Trying a new consumer every {}ms until then; to rejoin sooner, shorten \
                     the group's session timeout (docs/operations.md), or check that no other \
                     running instance uses this id",
                    RETRY_CAP.as_millis()
                )
            } else {
                format!(
                    "group.instance.id={instance_id:?} still refused after {n} attempts over \
                     {:.0}s ({reason}): is another running instance using this id?",
                    now.duration_since(first).as_secs_f64()
                )
            }
        });
        Retry { wait, log }
    }

    /// The member got partitions at `now`: how long it was refused, if it
    /// was (and the count starts over).
    pub(crate) fn joined(&mut self, now: Instant) -> Option<(Duration, u32)> {
        self.last_logged = None;
        self.since
            .take()
            .map(|(first, n)| (now.duration_since(first), n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreleased_instance_id_is_retried() {
        assert!(matches!(
            Fatal::of(RDKafkaErrorCode::UnreleasedInstanceId, "r".into()),
            Fatal::InstanceIdInUse { .. }
        ));
        assert!(matches!(
            Fatal::of(RDKafkaErrorCode::FencedInstanceId, "r".into()),
            Fatal::Other {
                code: RDKafkaErrorCode::FencedInstanceId,
                ..
            }
        ));
    }

    #[test]
    fn librdkafkas_own_report_of_the_refusal_is_recognized() {
        // As librdkafka 2.12.1 logs it (facility FATAL, level emergency).
        assert!(is_refusal_log(
            "FATAL",
            "[thrd:main]: Fatal error: Broker: The instance ID is still used by another member \
             in the consumer group: ConsumerGroupHeartbeat fatal error: Broker: The instance ID \
             is still used by another member in the consumer group"
        ));
        assert!(!is_refusal_log(
            "FATAL",
            "[thrd:main]: Fatal error: Broker: Static consumer fenced by other consumer with same \
             group.instance.id"
        ));
    }

    #[test]
    fn retries_back_off_to_the_cap_and_warnings_are_rate_limited() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        let first = r.refused(t0, "m-1", "in use");
        assert_eq!(first.wait, FIRST_RETRY);
        let text = first.log.expect("the first refusal is logged");
        assert!(
            text.contains("m-1") && text.contains("consumer.session.timeout.ms"),
            "{text}"
        );
        let second = r.refused(t0 + Duration::from_secs(1), "m-1", "in use");
        assert_eq!(second.wait, RETRY_CAP);
        assert_eq!(second.log, None);
        let later = r.refused(t0 + LOG_EVERY + Duration::from_secs(1), "m-1", "in use");
        assert_eq!(later.wait, RETRY_CAP);
        let text = later.log.expect("logged again after LOG_EVERY");
        assert!(text.contains("3 attempts over 31s"), "{text}");
    }

    #[test]
    fn joining_reports_the_wait_and_starts_over() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        assert_eq!(r.joined(t0), None);
        r.refused(t0, "m", "x");
        r.refused(t0 + Duration::from_millis(300), "m", "x");
        assert_eq!(
            r.joined(t0 + Duration::from_secs(2)),
            Some((Duration::from_secs(2), 2))
        );
        let again = r.refused(t0 + Duration::from_secs(3), "m", "x");
        assert_eq!(again.wait, FIRST_RETRY);
        assert!(
            again.log.is_some(),
            "a new run of refusals is logged at once"
        );
    }
}
