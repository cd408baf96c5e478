//! What the consumer loop says when Kafka refuses its principal something:
//! the ACL that is missing and how to grant it. A consumer needs Read on
//! each topic it subscribes to (which implies the Describe its metadata
//! requests need) and Read on its group (joining, committing offsets,
//! fetching them), nothing else; `docs/security.md#acls` lists them.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Where the ACLs are documented.
pub const ACL_DOC: &str = "docs/security.md#acls";

/// The message for `error` if it is an authorization or authentication
/// error of a consumer of `topics` in `group`; `None` otherwise.
pub fn explain(error: &KafkaError, topics: &[String], group: &str) -> Option<String> {
    let code = error.rdkafka_error_code()?;
    let grant = |name: &str, refused: &str, resource_arg: String| {
        format!(
            "Kafka denied {refused} to this consumer's principal ({name}): fix: grant the \
             principal (sasl.username) that ACL, e.g. `kafka-acls --bootstrap-server BROKER \
             --command-config ADMIN.properties --add --allow-principal User:NAME --operation \
             Read {resource_arg}` ({ACL_DOC})"
        )
    };
    match code {
        RDKafkaErrorCode::TopicAuthorizationFailed => {
            let refused = topics
                .iter()
                .map(|t| format!("Read on topic \"{t}\""))
                .collect::<Vec<_>>()
                .join(" or ");
            let args = topics
                .iter()
                .map(|t| format!("--topic {t}"))
                .collect::<Vec<_>>()
                .join(" ");
            Some(grant("TOPIC_AUTHORIZATION_FAILED", &refused, args))
        }
        RDKafkaErrorCode::GroupAuthorizationFailed => Some(grant(
            "GROUP_AUTHORIZATION_FAILED",
            &format!("Read on group \"{group}\""),
            format!("--group {group}"),
        )),
        RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Authentication => {
            Some(format!(
                "Kafka refused the consumer's login (SASL_AUTHENTICATION_FAILED): check \
                 sasl.mechanism, sasl.username and sasl.password against the user on the \
                 brokers ({ACL_DOC}): {error}"
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_topic_and_group_name_the_acl_and_the_fix() {
        let topics = vec!["orders".to_owned()];
        let topic = explain(
            &KafkaError::MessageConsumption(RDKafkaErrorCode::TopicAuthorizationFailed),
            &topics,
            "billing",
        )
        .unwrap();
        assert!(
            topic.contains("Kafka denied Read on topic \"orders\""),
            "{topic}"
        );
        assert!(topic.contains("(TOPIC_AUTHORIZATION_FAILED)"), "{topic}");
        assert!(
            topic.contains("--operation Read --topic orders`"),
            "{topic}"
        );
        assert!(topic.contains(ACL_DOC), "{topic}");
        let group = explain(
            &KafkaError::MessageConsumption(RDKafkaErrorCode::GroupAuthorizationFailed),
            &topics,
            "billing",
        )
        .unwrap();
        assert!(group.contains("Read on group \"billing\""), "{group}");
        assert!(
            group.contains("--operation Read --group billing`"),
            "{group}"
        );
        assert!(explain(
            &KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure),
            &topics,
            "billing"
        )
        .is_none());
    }
}
