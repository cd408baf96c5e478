//! Reading topic metadata: what a broker's metadata answer says of one
//! topic. The one reading of it, for the sink's partition count and
//! `walrelay verify`'s partition list.

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::metadata::Metadata;

/// What a metadata answer says of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicMetadata {
    /// The topic's partition ids, in the broker's order.
    Partitions(Vec<i32>),
    /// Not there yet: missing, being auto-created, or listed without
    /// partitions. Asking again may help; `why` says which.
    NotYet { why: String },
    /// The broker refused to describe the topic (e.g. not authorized).
    Failed(RDKafkaErrorCode),
}

/// `topic` in `metadata`.
pub fn topic_metadata(metadata: &Metadata, topic: &str) -> TopicMetadata {
    match metadata.topics().iter().find(|t| t.name() == topic) {
        None => classify_topic(None),
        Some(t) => {
            let ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            classify_topic(Some((t.error().map(RDKafkaErrorCode::from), ids)))
        }
    }
}

/// [`topic_metadata`] on plain values: `None` when the answer does not
/// list the topic, else its error code and partition ids.
fn classify_topic(found: Option<(Option<RDKafkaErrorCode>, Vec<i32>)>) -> TopicMetadata {
    match found {
        None => TopicMetadata::NotYet {
            why: "the topic does not exist (the broker's metadata does not list it)".to_owned(),
        },
        Some((None, ids)) if ids.is_empty() => TopicMetadata::NotYet {
            why: "the topic has no partitions".to_owned(),
        },
        Some((None, ids)) => TopicMetadata::Partitions(ids),
        Some((
            Some(
                code @ (RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::LeaderNotAvailable),
            ),
            _,
        )) => TopicMetadata::NotYet {
            why: code.to_string(),
        },
        Some((Some(code), _)) => TopicMetadata::Failed(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_metadata_tells_partitions_from_not_yet_and_failures() {
        assert_eq!(
            classify_topic(Some((None, vec![0, 1, 2]))),
            TopicMetadata::Partitions(vec![0, 1, 2])
        );
        assert!(matches!(classify_topic(None), TopicMetadata::NotYet { .. }));
        assert!(matches!(
            classify_topic(Some((None, vec![]))),
            TopicMetadata::NotYet { .. }
        ));
        for code in [
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::LeaderNotAvailable,
        ] {
            assert!(matches!(
                classify_topic(Some((Some(code), vec![0]))),
                TopicMetadata::NotYet { .. }
            ));
        }
        assert_eq!(
            classify_topic(Some((
                Some(RDKafkaErrorCode::TopicAuthorizationFailed),
                vec![]
            ))),
            TopicMetadata::Failed(RDKafkaErrorCode::TopicAuthorizationFailed)
        );
    }
}
