//! The slot's WAL retention as PostgreSQL reports it (`wal_status`,
//! `safe_wal_size` of `pg_replication_slots`), read at every publication
//! check: the alert before PostgreSQL invalidates the slot, rather than a
//! `walrelay status` someone has to run.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::{add, add_in};

/// The values of `wal_status` (PostgreSQL 13 and later), each a series of
/// `walrelay_slot_wal_status` from the start.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

/// The slot's retention at the last check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotWal {
    /// `wal_status`.
    pub status: String,
    /// `safe_wal_size` in bytes (`None`: unlimited, `max_slot_wal_keep_size = -1`).
    pub safe_wal_size: Option<i64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

/// Set at every publication check.
#[derive(Clone)]
pub(super) struct SlotGauges {
    wal_status: Family<StatusLabels, Gauge>,
    /// Labels-free; empty (no sample) while unlimited or unknown.
    safe_wal_size: Family<Vec<(String, String)>, Gauge>,
}

impl SlotGauges {
    pub(super) fn register(r: &mut Registry) -> SlotGauges {
        let wal_status = add(r, "slot_wal_status", "1 for the slot's wal_status in pg_replication_slots at the last publication check (reserved, extended, unreserved, lost), 0 for the others", Family::<StatusLabels, Gauge>::default());
        for status in WAL_STATUSES {
            drop(wal_status.get_or_create(&StatusLabels {
                status: status.to_owned(),
            }));
        }
        let safe_wal_size = add_in(r, "slot_safe_wal_size", Unit::Bytes, "WAL that can still be written before the slot is in danger of being invalidated (safe_wal_size of pg_replication_slots, at the last publication check); absent while max_slot_wal_keep_size is unlimited", Family::<Vec<(String, String)>, Gauge>::default());
        SlotGauges {
            wal_status,
            safe_wal_size,
        }
    }

    pub(super) fn set(&self, slot: Option<&SlotWal>) {
        let current = slot.map(|s| s.status.as_str());
        for status in WAL_STATUSES {
            self.wal_status
                .get_or_create(&StatusLabels {
                    status: status.to_owned(),
                })
                .set(i64::from(current == Some(status)));
        }
        match slot.and_then(|s| s.safe_wal_size) {
            Some(bytes) => {
                self.safe_wal_size.get_or_create(&Vec::new()).set(bytes);
            }
            None => self.safe_wal_size.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::{Metrics, SlotWal};

    fn line<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
    }

    #[test]
    fn the_current_status_is_1_and_safe_wal_size_only_while_limited() {
        let m = Metrics::new();
        let text = m.encode();
        for status in super::WAL_STATUSES {
            let name = format!("walrelay_slot_wal_status{{status=\"{status}\"}}");
            assert_eq!(line(&text, &name), Some(&*format!("{name} 0")), "{text}");
        }
        assert!(
            !text.contains("walrelay_slot_safe_wal_size_bytes "),
            "{text}"
        );
        m.set_slot_wal(Some(&SlotWal {
            status: "unreserved".into(),
            safe_wal_size: Some(1024),
        }));
        let text = m.encode();
        let unreserved = "walrelay_slot_wal_status{status=\"unreserved\"}";
        assert_eq!(line(&text, unreserved), Some(&*format!("{unreserved} 1")));
        let reserved = "walrelay_slot_wal_status{status=\"reserved\"}";
        assert_eq!(line(&text, reserved), Some(&*format!("{reserved} 0")));
        assert!(
            text.lines().any(|l| l.starts_with("walrelay_slot_safe_wal_size_bytes")
                && l.ends_with(" 1024")),
            "{text}"
        );
        m.set_slot_wal(None);
        let text = m.encode();
        assert_eq!(line(&text, unreserved), Some(&*format!("{unreserved} 0")));
        assert!(
            !text.contains("walrelay_slot_safe_wal_size_bytes{"),
            "{text}"
        );
        assert!(
            !text.contains("walrelay_slot_safe_wal_size_bytes "),
            "{text}"
        );
    }
}
