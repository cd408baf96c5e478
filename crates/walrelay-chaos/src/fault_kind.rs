//! The kinds of fault the harness injects, and which runs inject which:
//! shared by the schedule ([`crate::faults`]) and the three-broker
//! faults ([`crate::broker_faults`]) without either importing the other.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// `kill -9` of the relay, restarted at once.
    RelayKill9,
    /// SIGTERM: the relay drains and must exit 0; restarted.
    RelaySigterm,
    /// `pg_terminate_backend` of the slot's walsender.
    TerminateWalsender,
    /// `pg_ctl stop -m immediate`, then start: crash recovery.
    PgImmediateRestart,
    /// The proxy closes every connection and refuses new ones for longer
    /// than the producer's `message.timeout.ms`.
    BrokerRefuse,
    /// The proxy stalls every connection for longer than the timeout.
    BrokerStall,
    /// The consumer kills itself right after a database commit, before
    /// the offset commit (and the Python and the Java consumer, if any,
    /// get a plain `kill -9`).
    ConsumerKill,
    /// Three brokers: `kill -9` of the leader of a partition the relay
    /// writes to, restarted after up to 3 s.
    LeaderKill,
    /// Three brokers: each in turn stopped with a controlled shutdown and
    /// started again, the next once every replica is back in sync.
    RollingRestart,
    /// Three brokers: a partition's leader replica reassigned away and
    /// back (leadership and data move while the relay writes).
    Reassignment,
    /// Three brokers: `kill -9` of the active controller (the KRaft
    /// quorum's leader), restarted.
    ControllerRestart,
    /// Three brokers: `kill -9` of the consumers' group coordinator.
    CoordinatorKill,
    /// Three brokers: a partition leader killed, then the relay `kill -9`ed
    /// and restarted at once: its fence reads while the leadership moves.
    RelayKillInElection,
    /// Three brokers: a topic's `min.insync.replicas` raised to 3 and a
    /// follower killed, so its partitions are under min ISR (the relay
    /// stalls on them, and past `message.timeout.ms` its session fails);
    /// the broker returns after 5-40 s, then the setting goes back to 2.
    BelowMinIsr,
    /// `--pg-failover`: `kill -9` of the primary's postmaster, the
    /// failover standby promoted, the old primary rebuilt as its standby
    /// ([`crate::source::Source::fail_over`]).
    PgFailover,
}

impl FaultKind {
    /// The faults of a run on one broker (through the proxy).
    pub const ONE_BROKER: [FaultKind; 7] = [
        FaultKind::RelayKill9,
        FaultKind::RelaySigterm,
        FaultKind::TerminateWalsender,
        FaultKind::PgImmediateRestart,
        FaultKind::BrokerRefuse,
        FaultKind::BrokerStall,
        FaultKind::ConsumerKill,
    ];

    /// The faults of a run on three Apache Kafka brokers: the relay,
    /// PostgreSQL and consumer faults, and the cluster's own (no proxy:
    /// brokers die instead of connections).
    pub const THREE_BROKERS: [FaultKind; 12] = [
        FaultKind::RelayKill9,
        FaultKind::RelaySigterm,
        FaultKind::TerminateWalsender,
        FaultKind::PgImmediateRestart,
        FaultKind::ConsumerKill,
        FaultKind::LeaderKill,
        FaultKind::RollingRestart,
        FaultKind::Reassignment,
        FaultKind::ControllerRestart,
        FaultKind::CoordinatorKill,
        FaultKind::RelayKillInElection,
        FaultKind::BelowMinIsr,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            FaultKind::RelayKill9 => "relay kill -9",
            FaultKind::RelaySigterm => "relay SIGTERM (graceful)",
            FaultKind::TerminateWalsender => "walsender pg_terminate_backend",
            FaultKind::PgImmediateRestart => "PostgreSQL immediate restart",
            FaultKind::BrokerRefuse => "broker outage: connections refused",
            FaultKind::BrokerStall => "broker outage: connections stalled",
            FaultKind::ConsumerKill => "consumer killed after DB commit",
            FaultKind::LeaderKill => "broker kill -9: a partition leader",
            FaultKind::RollingRestart => "rolling restart of the brokers",
            FaultKind::Reassignment => "partition reassignment",
            FaultKind::ControllerRestart => "active controller kill -9",
            FaultKind::CoordinatorKill => "group coordinator kill -9",
            FaultKind::RelayKillInElection => "relay kill -9 in a leader election",
            FaultKind::BelowMinIsr => "a topic under min.insync.replicas",
            FaultKind::PgFailover => "PostgreSQL failover: primary kill -9, standby promoted",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}
