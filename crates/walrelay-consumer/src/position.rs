//! Where a record was consumed and the high-water mark kept there: the
//! plain types that name a mark ([`Position`] and a source), its value
//! before anything was processed ([`INITIAL_HWM`]) and a stored one
//! ([`HwmRow`]).
//!
//! A leaf: it imports nothing of the crate. Every other module names
//! positions and marks (the handlers' [`crate::Delivery`], the batch
//! decision, the batch transaction, the store, the dead-letter table, the
//! loop), so keeping these types apart from the store is what lets the
//! store depend on the batch transaction and never the reverse. The store
//! re-exports them, so their public paths (`walrelay_consumer::Position`,
//! `walrelay_consumer::store::Position`, ...) are unchanged.

use walrelay_contract::EventKey;

/// The high-water mark of a row that has seen nothing yet: 32 zeros, below
/// every key walrelay issues.
pub const INITIAL_HWM: EventKey = EventKey::MIN;

/// Where a record was consumed: the consumer group and the topic partition.
/// Together with the record's source it names one high-water mark.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// The consumer group (`group.id`), or any name that identifies one
    /// logical consumer whose side effects the marks protect.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
}

impl Position {
    /// A position from its parts.
    pub fn new(group: impl Into<String>, topic: impl Into<String>, partition: i32) -> Position {
        Position {
            group: group.into(),
            topic: topic.into(),
            partition,
        }
    }
}

/// One stored high-water mark.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HwmRow {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Source (`walrelay-source`).
    pub source: String,
    /// The mark: the highest key processed.
    pub hwm: EventKey,
}
