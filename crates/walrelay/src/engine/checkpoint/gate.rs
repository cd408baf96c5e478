//! The relay's confirmation rule: what the session reports to PostgreSQL,
//! given what Kafka acknowledged.
//!
//! [`CheckpointTracker`](super::CheckpointTracker) says which LSN Kafka's
//! acknowledgements cover. Two holds of the relay cap it before it becomes
//! the slot's confirmed flush LSN:
//!
//! - the **vouched** position, the server's WAL position sampled by the
//!   last clean publication check: WAL written after a publication change
//!   that no check has seen yet may lack rows pgoutput skipped, so nothing
//!   above it is confirmed, keepalives included;
//! - the **placement's hold**: while a replay has not reproduced the
//!   fence's tail (or the event the source record names), what it skipped
//!   must stay in the slot in case the fence was wrong, so nothing at all
//!   is confirmed.
//!
//! And a confirmation only moves forward. Pure: the session feeds it and
//! sends what it returns.

use walrelay_pgoutput::Lsn;

/// The confirmed and vouched positions of one session, and the rule that
/// moves the first (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfirmGate {
    confirmed: Lsn,
    vouched: Lsn,
}

impl ConfirmGate {
    /// A session starting at the slot's confirmed position, with the
    /// position its start-up publication check vouched for.
    pub fn new(confirmed: Lsn, vouched: Lsn) -> Self {
        ConfirmGate { confirmed, vouched }
    }

    /// What was last confirmed (the slot's position at the start).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The highest position a clean publication check vouched for.
    pub fn vouched(&self) -> Lsn {
        self.vouched
    }

    /// A clean publication check sampled the server's WAL at `lsn`. An older
    /// sample (checks may report out of order) changes nothing.
    pub fn vouch(&mut self, lsn: Lsn) {
        self.vouched = self.vouched.max(lsn);
    }

    /// The position to confirm now, if it moved: what Kafka's
    /// acknowledgements cover (`acked`, the tracker's confirmable LSN)
    /// capped at the vouched position, nothing while the placement holds.
    pub fn advance(&mut self, acked: Option<Lsn>, placement_holds: bool) -> Option<Lsn> {
        if placement_holds {
            return None;
        }
        let lsn = acked?.min(self.vouched);
        (lsn > self.confirmed).then(|| {
            self.confirmed = lsn;
            lsn
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(n: u64) -> Lsn {
        Lsn(n)
    }

    #[test]
    fn confirms_what_kafka_acknowledged_up_to_the_vouched_position() {
        let mut gate = ConfirmGate::new(lsn(100), lsn(500));
        assert_eq!(gate.advance(Some(lsn(300)), false), Some(lsn(300)));
        assert_eq!(gate.confirmed(), lsn(300));
        // Acknowledged past the last clean check: capped at it.
        assert_eq!(gate.advance(Some(lsn(900)), false), Some(lsn(500)));
        assert_eq!(gate.confirmed(), lsn(500));
        // Nothing new until a check vouches for more.
        assert_eq!(gate.advance(Some(lsn(900)), false), None);
        gate.vouch(lsn(1000));
        assert_eq!(gate.advance(Some(lsn(900)), false), Some(lsn(900)));
    }

    #[test]
    fn nothing_while_the_placement_holds_then_everything_acknowledged() {
        let mut gate = ConfirmGate::new(lsn(100), lsn(1000));
        assert_eq!(gate.advance(Some(lsn(400)), true), None);
        assert_eq!(gate.advance(Some(lsn(600)), true), None);
        assert_eq!(gate.confirmed(), lsn(100));
        assert_eq!(gate.advance(Some(lsn(600)), false), Some(lsn(600)));
    }

    #[test]
    fn never_moves_back_and_ignores_older_checks() {
        let mut gate = ConfirmGate::new(lsn(500), lsn(800));
        // The tracker starts at the slot's position: nothing to report.
        assert_eq!(gate.advance(Some(lsn(500)), false), None);
        assert_eq!(gate.advance(Some(lsn(300)), false), None);
        assert_eq!(gate.advance(None, false), None);
        gate.vouch(lsn(600));
        assert_eq!(gate.vouched(), lsn(800));
        assert_eq!(gate.confirmed(), lsn(500));
    }

    #[test]
    fn a_vouched_position_below_the_slot_confirms_nothing() {
        // A session whose start-up check sampled the WAL before the slot's
        // position (a slot created ahead of the check) waits for the next.
        let mut gate = ConfirmGate::new(lsn(500), lsn(400));
        assert_eq!(gate.advance(Some(lsn(700)), false), None);
        gate.vouch(lsn(650));
        assert_eq!(gate.advance(Some(lsn(700)), false), Some(lsn(650)));
    }
}
