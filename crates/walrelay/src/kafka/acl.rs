//! The one place that turns Kafka's authorization errors into a message
//! naming the ACL that is missing and how to grant it. Every walrelay
//! client that can meet one words it here: the producer (topic metadata,
//! deliveries), the tail fence's reader, `walrelay verify` and the
//! readiness probe. The ACLs each of them needs are listed in
//! `docs/security.md#acls`, measured on Apache Kafka 4.1 by
//! `tests/kafka_security.rs`.

use rdkafka::types::RDKafkaErrorCode;

/// Where the ACLs are documented.
pub const ACL_DOC: &str = "docs/security.md#acls";

/// What an ACL is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    /// A topic, by name.
    Topic(&'a str),
    /// A consumer group, by name.
    Group(&'a str),
    /// The cluster.
    Cluster,
}

impl Resource<'_> {
    fn describe(&self) -> String {
        match self {
            Resource::Topic(t) => format!("topic \"{t}\""),
            Resource::Group(g) => format!("group \"{g}\""),
            Resource::Cluster => "the cluster".to_owned(),
        }
    }

    fn kafka_acls_arg(&self) -> String {
        match self {
            Resource::Topic(t) => format!("--topic {t}"),
            Resource::Group(g) => format!("--group {g}"),
            Resource::Cluster => "--cluster".to_owned(),
        }
    }
}

/// An ACL: an operation allowed on a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acl<'a> {
    /// `Read`, `Write`, `Describe`, `IdempotentWrite`, ...
    pub operation: &'static str,
    /// What it is allowed on.
    pub resource: Resource<'a>,
}

impl<'a> Acl<'a> {
    /// `operation` on topic `topic`.
    pub fn topic(operation: &'static str, topic: &'a str) -> Acl<'a> {
        Acl {
            operation,
            resource: Resource::Topic(topic),
        }
    }
}

/// Kafka's name of `code` if it is an authorization or authentication
/// error (what the broker answers when an ACL or the login is missing).
pub fn authorization_error(code: RDKafkaErrorCode) -> Option<&'static str> {
    Some(match code {
        RDKafkaErrorCode::TopicAuthorizationFailed => "TOPIC_AUTHORIZATION_FAILED",
        RDKafkaErrorCode::GroupAuthorizationFailed => "GROUP_AUTHORIZATION_FAILED",
        RDKafkaErrorCode::ClusterAuthorizationFailed => "CLUSTER_AUTHORIZATION_FAILED",
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
        }
        RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Authentication => {
            "SASL_AUTHENTICATION_FAILED"
        }
        _ => return None,
    })
}

/// Whether `code` means Kafka refused the principal something.
pub fn is_denied(code: RDKafkaErrorCode) -> bool {
    authorization_error(code).is_some()
}

/// What a group-less reader (the tail fence's, the source record's) makes
/// of an error its poll returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderError {
    /// librdkafka looks up the group of any consumer with a `group.id`
    /// (it assigns partitions only to one); the reader does not use it,
    /// so it needs no ACL on it: ignored.
    UnusedGroup,
    /// The principal may not read: fatal, name the ACL.
    Denied(RDKafkaErrorCode),
    /// The topic was deleted or is being recreated: fatal.
    TopicGone(RDKafkaErrorCode),
    /// Anything else: retried until the reader's deadline.
    Transient,
}

/// Classifies a reader's error `code` ([`ReaderError`]).
pub fn reader_error(code: Option<RDKafkaErrorCode>) -> ReaderError {
    match code {
        Some(RDKafkaErrorCode::GroupAuthorizationFailed) => ReaderError::UnusedGroup,
        Some(code) if is_denied(code) => ReaderError::Denied(code),
        Some(code @ RDKafkaErrorCode::UnknownTopicOrPartition) => ReaderError::TopicGone(code),
        _ => ReaderError::Transient,
    }
}

/// The message for an authorization error `code` met while `refused` was
/// attempted (e.g. `Write on topic "orders"`), whose fix is to grant
/// `needed`; `None` if `code` is no authorization error. A failed login
/// names the SASL settings instead.
pub fn denied(code: RDKafkaErrorCode, refused: &str, needed: &[Acl<'_>]) -> Option<String> {
    let name = authorization_error(code)?;
    if matches!(
        code,
        RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Authentication
    ) {
        return Some(format!(
            "Kafka refused the login ({name}) while attempting {refused}: check sasl.mechanism, \
             sasl.username and sasl.password in [kafka.properties] against the user on the \
             brokers (e.g. `kafka-configs --alter --add-config 'SCRAM-SHA-512=[password=...]' \
             --entity-type users --entity-name NAME`) ({ACL_DOC})"
        ));
    }
    let grants = needed
        .iter()
        .map(|a| format!("{} on {}", a.operation, a.resource.describe()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut command = String::from(
        "kafka-acls --bootstrap-server BROKER --command-config ADMIN.properties --add \
         --allow-principal User:NAME",
    );
    let mut last: Option<Resource<'_>> = None;
    for acl in needed {
        if last.is_some_and(|r| r != acl.resource) {
            command.push_str(" (and another command for ");
            command.push_str(&acl.resource.describe());
            command.push(')');
            break;
        }
        command.push_str(&format!(" --operation {}", acl.operation));
        last = Some(acl.resource);
    }
    if let Some(resource) = needed.first().map(|a| a.resource) {
        command.push_str(&format!(" {}", resource.kafka_acls_arg()));
    }
    Some(format!(
        "Kafka denied {refused} to this client's principal ({name}): fix: grant the principal \
         (sasl.username) {grants}, e.g. `{command}` ({ACL_DOC})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_write_names_the_acl_the_fix_and_the_doc() {
        let m = denied(
            RDKafkaErrorCode::TopicAuthorizationFailed,
            "Write on topic \"orders\"",
            &[Acl::topic("Write", "orders")],
        )
        .unwrap();
        assert!(m.contains("Kafka denied Write on topic \"orders\""), "{m}");
        assert!(m.contains("(TOPIC_AUTHORIZATION_FAILED)"), "{m}");
        assert!(
            m.contains("--add --allow-principal User:NAME --operation Write --topic orders"),
            "{m}"
        );
        assert!(m.contains("docs/security.md#acls"), "{m}");
    }

    #[test]
    fn several_acls_on_one_resource_make_one_command() {
        let m = denied(
            RDKafkaErrorCode::TopicAuthorizationFailed,
            "Describe on topic \"t\"",
            &[Acl::topic("Read", "t"), Acl::topic("Describe", "t")],
        )
        .unwrap();
        assert!(
            m.contains("--operation Read --operation Describe --topic t"),
            "{m}"
        );
        assert!(
            m.contains("Read on topic \"t\", Describe on topic \"t\""),
            "{m}"
        );
    }

    #[test]
    fn only_authorization_errors_are_explained() {
        assert!(denied(RDKafkaErrorCode::MessageTimedOut, "x", &[]).is_none());
        assert!(!is_denied(RDKafkaErrorCode::UnknownTopicOrPartition));
        for code in [
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        ] {
            assert!(is_denied(code), "{code:?}");
        }
        let login = denied(
            RDKafkaErrorCode::SaslAuthenticationFailed,
            "Write on topic \"t\"",
            &[Acl::topic("Write", "t")],
        )
        .unwrap();
        assert!(login.contains("sasl.password"), "{login}");
        assert!(!login.contains("kafka-acls"), "{login}");
    }
}
