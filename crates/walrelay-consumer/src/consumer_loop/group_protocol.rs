//! Which consumer group protocol the loop's consumer speaks, and the client
//! settings Kafka 4's `consumer` protocol (KIP-848) does not take.
//!
//! The loop leaves `group.protocol` to the caller: librdkafka's default,
//! `classic`, works with every broker and lets a restarted static member
//! take its partitions back at once. With `group.protocol=consumer` the
//! session timeout and the heartbeat interval are the group's (broker side)
//! and the assignor is the broker's: librdkafka refuses a consumer that sets
//! them. The loop refuses such a configuration itself, naming what to set
//! instead.

use rdkafka::ClientConfig;

use super::ConfigError;

/// Client settings refused with `group.protocol=consumer`, and what to do
/// instead.
const REFUSED: &[(&str, &str)] = &[
    (
        "session.timeout.ms",
        "the session timeout is the group's under this protocol: set the group's \
         consumer.session.timeout.ms (kafka-configs --entity-type groups), or the brokers' \
         group.consumer.session.timeout.ms, and remove session.timeout.ms",
    ),
    (
        "heartbeat.interval.ms",
        "the heartbeat interval is the group's under this protocol: set the group's \
         consumer.heartbeat.interval.ms, or the brokers' group.consumer.heartbeat.interval.ms, \
         and remove heartbeat.interval.ms",
    ),
    (
        "partition.assignment.strategy",
        "the broker assigns the partitions under this protocol: remove it, and set \
         group.remote.assignor (uniform or range) if you need another assignor than the \
         broker's default",
    ),
    (
        "group.protocol.type",
        "it belongs to the classic protocol: remove it",
    ),
];

/// The consumer group protocol of a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol (librdkafka's default): rebalances run by the
    /// group's members, the session timeout is the client's.
    Classic,
    /// Kafka 4's consumer protocol (KIP-848): the broker assigns, the
    /// session timeout and heartbeat interval are the group's.
    Consumer,
}

impl GroupProtocol {
    /// The protocol `kafka` asks for (`group.protocol`, `classic` when
    /// unset), refusing the client settings the consumer protocol does not
    /// take.
    pub fn of(kafka: &ClientConfig) -> Result<GroupProtocol, ConfigError> {
        let protocol = match kafka.get("group.protocol") {
            None => return Ok(GroupProtocol::Classic),
            Some(p) if p.eq_ignore_ascii_case("classic") => return Ok(GroupProtocol::Classic),
            Some(p) if p.eq_ignore_ascii_case("consumer") => GroupProtocol::Consumer,
            // librdkafka names the valid values when it refuses it.
            Some(_) => return Ok(GroupProtocol::Classic),
        };
        for &(key, fix) in REFUSED {
            if kafka.get(key).is_some() {
                return Err(ConfigError::NotWithConsumerProtocol { key, fix });
            }
        }
        Ok(protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in pairs {
            c.set(*k, *v);
        }
        c
    }

    #[test]
    fn classic_is_the_default_and_takes_the_client_session_settings() {
        assert_eq!(
            GroupProtocol::of(&config(&[("session.timeout.ms", "6000")])).unwrap(),
            GroupProtocol::Classic
        );
        assert_eq!(
            GroupProtocol::of(&config(&[
                ("group.protocol", "classic"),
                ("heartbeat.interval.ms", "1000")
            ]))
            .unwrap(),
            GroupProtocol::Classic
        );
    }

    #[test]
    fn the_consumer_protocol_refuses_each_client_side_group_setting_naming_the_fix() {
        for (key, fix) in [
            ("session.timeout.ms", "consumer.session.timeout.ms"),
            ("heartbeat.interval.ms", "consumer.heartbeat.interval.ms"),
            ("partition.assignment.strategy", "group.remote.assignor"),
            ("group.protocol.type", "remove it"),
        ] {
            let e = GroupProtocol::of(&config(&[("group.protocol", "consumer"), (key, "1")]))
                .unwrap_err();
            let text = e.to_string();
            assert!(text.contains(key), "{text}");
            assert!(text.contains("group.protocol=consumer"), "{text}");
            assert!(text.contains(fix), "{text}");
        }
    }

    #[test]
    fn the_consumer_protocol_without_them_is_taken() {
        assert_eq!(
            GroupProtocol::of(&config(&[
                ("group.protocol", "CONSUMER"),
                ("group.instance.id", "a")
            ]))
            .unwrap(),
            GroupProtocol::Consumer
        );
    }
}
