//! Whether a record the fence can read was acknowledged: the fence's
//! durability rule, decided per topic from the broker's behaviour and the
//! topic's settings (pure; [`super::settings`] reads them).
//!
//! The fence skips what it reads below the high watermark. That is sound
//! only if a readable record is one the broker acknowledged (and so keeps
//! under `acks=all`): walrelay confirms past a skipped record as if its own
//! produce had been acknowledged. Kafka before 3.7 advances the high
//! watermark once every replica in the in-sync set has a record, even
//! while the set is smaller than `min.insync.replicas`: a record appended
//! while the set was full, whose set then shrank, becomes readable while
//! its producer gets `NOT_ENOUGH_REPLICAS_AFTER_APPEND` (no
//! acknowledgement), held by fewer replicas than an acknowledged one.
//! Skipping it and confirming past it would leave the event to those few
//! replicas. Kafka 3.7 made the high watermark wait while the partition is
//! under its minimum in-sync set ("strict min ISR", KAFKA-15583, the base
//! of KIP-966's Eligible Leader Replicas; measured on 4.1.1 with ELR off as
//! well as on).
//!
//! A readable record was acknowledged when
//!
//! - the topic has **one replica**: the in-sync set never shrinks below
//!   the leader, so a record is appended only when the set is large enough
//!   (else `NOT_ENOUGH_REPLICAS` before the append) and the request
//!   succeeds as soon as the high watermark passes it;
//! - **`min.insync.replicas` is at most 1**: the in-sync set is never
//!   smaller than that, so the high watermark passing a record completes
//!   its request with success;
//! - the brokers hold the high watermark under min ISR (**Kafka 3.7 or
//!   later**, [`crate::kafka::requests::api_versions`]).
//!
//! Everywhere else (a replicated topic with `min.insync.replicas` of 2 or
//! more on an older or unidentified broker, or where walrelay could not
//! read the settings) the topic is left unfenced: its replay is written
//! again, a duplicate rather than a loss.

use std::fmt;

use crate::kafka::requests::api_versions::StrictMinIsr;

/// What the broker reports of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSettings {
    /// The largest replica count of its partitions (from metadata).
    pub replication_factor: u32,
    /// `min.insync.replicas`, or why it is unknown (DescribeConfigs
    /// denied or failed).
    pub min_insync_replicas: Result<u32, String>,
    /// `unclean.leader.election.enable`, if read.
    pub unclean_leader_election: Option<bool>,
    /// Whether the brokers hold the high watermark under min ISR.
    pub strict_min_isr: StrictMinIsr,
}

/// Why a readable record of a topic may not have been acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotProvenAcked {
    /// Replicated, `min.insync.replicas` >= 2, brokers older than 3.7 (or
    /// not identified).
    HighWatermarkUnderMinIsr {
        replication_factor: u32,
        min_insync_replicas: u32,
        strict_min_isr: StrictMinIsr,
    },
    /// Replicated and `min.insync.replicas` unknown.
    SettingsUnknown {
        replication_factor: u32,
        why: String,
    },
}

impl fmt::Display for NotProvenAcked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotProvenAcked::HighWatermarkUnderMinIsr {
                replication_factor,
                min_insync_replicas,
                strict_min_isr,
            } => write!(
                f,
                "with {replication_factor} replicas and min.insync.replicas={min_insync_replicas}, on brokers that hold the high \
                 watermark under min ISR: {strict_min_isr}; older brokers let a record become readable while fewer than \
                 {min_insync_replicas} replicas are in sync, although it was never acknowledged \
                 (NOT_ENOUGH_REPLICAS_AFTER_APPEND), and skipping it could lose it; to fence this topic, run Kafka 3.7 or \
                 later (KAFKA-15583) and let walrelay reach every broker as its Kafka client does (a WARN line says why it \
                 could not) (docs/contract.md, \"Visible is not durable\")"
            ),
            NotProvenAcked::SettingsUnknown {
                replication_factor,
                why,
            } => write!(
                f,
                "the topic has {replication_factor} replicas and walrelay could not read its min.insync.replicas ({why}), so it \
                 cannot tell whether a record the fence reads was acknowledged; grant the relay's principal DescribeConfigs on \
                 the topic (docs/security.md#acls)"
            ),
        }
    }
}

/// The fence's durability rule: `Ok` when every record the fence can read
/// in this topic was acknowledged ([module docs](self)).
pub fn readable_implies_acked(settings: &TopicSettings) -> Result<(), NotProvenAcked> {
    if settings.replication_factor <= 1 {
        return Ok(());
    }
    match &settings.min_insync_replicas {
        Ok(min) if *min <= 1 => Ok(()),
        Ok(_) if settings.strict_min_isr == StrictMinIsr::Yes => Ok(()),
        Ok(min) => Err(NotProvenAcked::HighWatermarkUnderMinIsr {
            replication_factor: settings.replication_factor,
            min_insync_replicas: *min,
            strict_min_isr: settings.strict_min_isr,
        }),
        Err(why) => Err(NotProvenAcked::SettingsUnknown {
            replication_factor: settings.replication_factor,
            why: why.clone(),
        }),
    }
}

/// Settings under which Kafka may lose a record it acknowledged, whatever
/// walrelay does: worth a WARN once per topic and session, with the fix.
pub fn acknowledged_may_be_lost(settings: &TopicSettings) -> Vec<String> {
    let mut found = Vec::new();
    let rf = settings.replication_factor;
    if rf >= 2 {
        if let Ok(min) = settings.min_insync_replicas {
            if min <= 1 {
                found.push(format!(
                    "min.insync.replicas={min} with {rf} replicas: Kafka acknowledges a record held by the leader alone, \
                     and loses it with that broker; set min.insync.replicas=2 (with 3 replicas)"
                ));
            } else if min >= rf {
                found.push(format!(
                    "min.insync.replicas={min} with {rf} replicas: one broker down stops every write to the topic; \
                     set min.insync.replicas to at most {} (2 with 3 replicas)",
                    rf - 1
                ));
            }
        }
    }
    if settings.unclean_leader_election == Some(true) {
        found.push(
            "unclean.leader.election.enable=true: a replica that missed acknowledged records can become leader and \
             they are gone; set it to false (Kafka's default)"
                .to_owned(),
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(rf: u32, min: Result<u32, &str>, strict: StrictMinIsr) -> TopicSettings {
        TopicSettings {
            replication_factor: rf,
            min_insync_replicas: min.map_err(str::to_owned),
            unclean_leader_election: Some(false),
            strict_min_isr: strict,
        }
    }

    const ALL: [StrictMinIsr; 3] = [StrictMinIsr::Yes, StrictMinIsr::No, StrictMinIsr::Unknown];

    #[test]
    fn one_replica_is_always_fenced_even_unread() {
        for strict in ALL {
            assert_eq!(readable_implies_acked(&settings(1, Ok(1), strict)), Ok(()));
            assert_eq!(readable_implies_acked(&settings(1, Ok(2), strict)), Ok(()));
            assert_eq!(
                readable_implies_acked(&settings(1, Err("denied"), strict)),
                Ok(())
            );
        }
    }

    #[test]
    fn min_isr_of_one_is_fenced_on_any_broker() {
        for strict in ALL {
            assert_eq!(readable_implies_acked(&settings(3, Ok(1), strict)), Ok(()));
        }
    }

    #[test]
    fn replicated_with_min_isr_two_needs_a_strict_high_watermark() {
        assert_eq!(
            readable_implies_acked(&settings(3, Ok(2), StrictMinIsr::Yes)),
            Ok(())
        );
        for strict in [StrictMinIsr::No, StrictMinIsr::Unknown] {
            let err = readable_implies_acked(&settings(3, Ok(2), strict)).unwrap_err();
            assert_eq!(
                err,
                NotProvenAcked::HighWatermarkUnderMinIsr {
                    replication_factor: 3,
                    min_insync_replicas: 2,
                    strict_min_isr: strict
                }
            );
            let text = err.to_string();
            assert!(text.contains("Kafka 3.7 or later"), "{text}");
            assert!(text.contains("NOT_ENOUGH_REPLICAS_AFTER_APPEND"), "{text}");
        }
    }

    #[test]
    fn unknown_settings_of_a_replicated_topic_are_not_trusted_on_any_broker() {
        for strict in ALL {
            let err =
                readable_implies_acked(&settings(3, Err("TOPIC_AUTHORIZATION_FAILED"), strict))
                    .unwrap_err();
            let text = err.to_string();
            assert!(text.contains("DescribeConfigs"), "{text}");
            assert!(text.contains("TOPIC_AUTHORIZATION_FAILED"), "{text}");
        }
    }

    #[test]
    fn settings_that_lose_acknowledged_records_are_named_with_the_fix() {
        assert!(acknowledged_may_be_lost(&settings(3, Ok(2), StrictMinIsr::Yes)).is_empty());
        assert!(acknowledged_may_be_lost(&settings(1, Ok(1), StrictMinIsr::No)).is_empty());
        let one = acknowledged_may_be_lost(&settings(3, Ok(1), StrictMinIsr::No));
        assert_eq!(one.len(), 1);
        assert!(one[0].contains("set min.insync.replicas=2"), "{one:?}");
        let all = acknowledged_may_be_lost(&settings(3, Ok(3), StrictMinIsr::No));
        assert!(all[0].contains("stops every write"), "{all:?}");
        let mut unclean = settings(3, Ok(2), StrictMinIsr::Yes);
        unclean.unclean_leader_election = Some(true);
        let w = acknowledged_may_be_lost(&unclean);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("unclean.leader.election.enable"), "{w:?}");
    }
}
