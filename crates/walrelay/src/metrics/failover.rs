//! The gauges of [`crate::source::slot_failover`]: whether a PostgreSQL failover
//! keeps what walrelay publishes, for an alert rather than a log line
//! someone has to read.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::add;
use crate::source::slot_failover::Finding;

/// Set at every publication check.
#[derive(Clone, Default)]
pub(super) struct FailoverGauges {
    at_risk: Gauge,
    standbys_down: Gauge,
}

impl FailoverGauges {
    pub(super) fn register(r: &mut Registry) -> FailoverGauges {
        FailoverGauges {
            at_risk: add(r, "failover_at_risk", "1 while a PostgreSQL failover could contradict what walrelay published or lose the slot: a failover slot with synchronized_standby_slots empty, or a standby streaming through a physical slot the list does not name, or without a physical slot, or postgres.slot_failover on and the slot not a failover slot (walrelay status prints the RISK and its fix)", Gauge::default()),
            standbys_down: add(r, "failover_standbys_down", "Slots named in synchronized_standby_slots that no standby streams from: logical decoding waits for them, so walrelay publishes nothing newer until they are back", Gauge::default()),
        }
    }

    pub(super) fn set(&self, findings: &[Finding]) {
        self.at_risk
            .set(i64::from(findings.iter().any(Finding::is_risk)));
        let down = findings.iter().find_map(|f| match f {
            Finding::StandbysDown(names) => Some(names.len()),
            _ => None,
        });
        self.standbys_down
            .set(down.map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX)));
    }
}
