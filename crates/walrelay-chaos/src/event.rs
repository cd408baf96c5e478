//! Event identities. Every event the workload writes carries its id in
//! its payload, so the checker can tell which event a Kafka record or a
//! consumer's side effect belongs to without trusting the relay's keys.
//!
//! The workload runs its units (transactions, or standalone
//! non-transactional messages) one after another on one connection, so
//! the order of ids *is* the commit order:
//!
//! * `U:I`: the `I`-th event of transaction unit `U` (published when `U`
//!   commits);
//! * `n:U:J`: the `J`-th non-transactional message written by unit `U`.
//!   It is decoded at its own WAL position: after every unit before `U`
//!   committed, and before `U`'s commit, so it sorts before `U:0`.

use std::fmt;

/// An event's identity, ordered as PostgreSQL streams it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    /// The workload unit that wrote it.
    pub unit: u64,
    /// `false` for a non-transactional message (sorts first in its unit).
    pub transactional: bool,
    /// Position within the unit (per kind).
    pub index: u32,
}

impl EventId {
    /// The `index`-th transactional event of `unit`.
    pub fn tx(unit: u64, index: u32) -> EventId {
        EventId {
            unit,
            transactional: true,
            index,
        }
    }

    /// The `index`-th non-transactional message of `unit`.
    pub fn non_tx(unit: u64, index: u32) -> EventId {
        EventId {
            unit,
            transactional: false,
            index,
        }
    }

    /// Parses `U:I` or `n:U:J`.
    pub fn parse(text: &str) -> Option<EventId> {
        let (non_tx, rest) = match text.strip_prefix("n:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (unit, index) = rest.split_once(':')?;
        let unit = unit.parse().ok()?;
        let index = index.parse().ok()?;
        Some(if non_tx {
            EventId::non_tx(unit, index)
        } else {
            EventId::tx(unit, index)
        })
    }

    /// The id of the event whose payload is `payload`: a JSON object
    /// `{"e": "<id>"}` (helper messages, outbox rows) or the id itself
    /// (raw messages).
    pub fn from_payload(payload: &[u8]) -> Option<EventId> {
        if payload.first() == Some(&b'{') {
            let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
            EventId::parse(v.get("e")?.as_str()?)
        } else {
            EventId::parse(std::str::from_utf8(payload).ok()?)
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.transactional {
            write!(f, "{}:{}", self.unit, self.index)
        } else {
            write!(f, "n:{}:{}", self.unit, self.index)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sort_in_stream_order() {
        for id in [EventId::tx(7, 3), EventId::non_tx(7, 0)] {
            assert_eq!(EventId::parse(&id.to_string()), Some(id));
        }
        assert!(EventId::tx(6, 9999) < EventId::non_tx(7, 0));
        assert!(EventId::non_tx(7, 5) < EventId::tx(7, 0));
        assert_eq!(
            EventId::from_payload(br#"{"e": "12:4"}"#),
            Some(EventId::tx(12, 4))
        );
        assert_eq!(EventId::from_payload(b"n:3:1"), Some(EventId::non_tx(3, 1)));
        assert_eq!(EventId::from_payload(b"junk"), None);
    }
}
