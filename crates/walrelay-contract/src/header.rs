//! Header names walrelay sets on every record, and the rule that reserves
//! them: the part of a record's layout that every consumer reads.

/// The 128-bit idempotency key as 32 lowercase hex digits.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Where the key sequence comes from: keys of different sources are not
/// comparable (default `<system identifier>/<database>/<slot>`).
pub const SOURCE: &str = "walrelay-source";
/// Start LSN of the transaction's commit record (absent for
/// non-transactional messages).
pub const COMMIT_LSN: &str = "walrelay-commit-lsn";
/// The LSN the server reported for the event.
pub const LSN: &str = "walrelay-lsn";
/// Transaction id (absent for non-transactional messages).
pub const XID: &str = "walrelay-xid";
/// Commit time, RFC 3339 UTC with microseconds (absent for
/// non-transactional messages).
pub const COMMIT_TIME: &str = "walrelay-commit-time";
/// The key of the record this session sent before to the same topic
/// and partition; for the first one of a session, the partition's fence
/// key (the last key of this source the relay's tail fence found in the
/// partition), or empty without one. A consumer whose high-water mark is
/// below it has missed something (gap detection). Unlike everything else
/// in a record it depends on the session, not only on the WAL.
pub const PREV_KEY: &str = "walrelay-prev-key";
/// The same key as [`PREV_KEY`] in the compact form `HIGH/LOW`
/// (`EventKey::from_compact`), written by the lean header set (the
/// default) instead of `walrelay-prev-key`: 13 + about 21 bytes instead of
/// 17 + 32. A record carries one of the two, never both.
pub const PREV: &str = "walrelay-prev";
/// How the record was routed: `<partitions>/<fingerprint>`, the partition
/// count of its topic and a fingerprint of the relay's routing
/// configuration. The relay's tail fence trusts a partition's last record
/// only if it was routed as the current session routes.
pub const LAYOUT: &str = "walrelay-layout";

/// On a dead-letter record: why the event could not be routed (the
/// error's text, which names the fix).
pub const DEAD_LETTER_REASON: &str = "walrelay-dead-letter-reason";
/// On a dead-letter record: a stable, machine-readable kind of problem
/// (`malformed-envelope`, `missing-topic`, `unknown-prefix`, ...; see
/// `walrelay::engine::route::RouteError::kind`), for filtering and alerting.
pub const DEAD_LETTER_KIND: &str = "walrelay-dead-letter-kind";
/// On a dead-letter record of a logical message: its prefix.
pub const DEAD_LETTER_PREFIX: &str = "walrelay-dead-letter-prefix";
/// On a dead-letter record of an outbox row: `schema.table`.
pub const DEAD_LETTER_TABLE: &str = "walrelay-dead-letter-table";

/// Every header whose name starts with this belongs to walrelay.
pub const RESERVED_PREFIX: &str = "walrelay-";

/// Whether a header name is walrelay's: `idempotency-key` and every
/// `walrelay-*`, in any letter case. Such a header can never come from
/// an application (an envelope's or an outbox row's headers, refused
/// by the router and by `walrelay.emit`): a copy next to walrelay's
/// would let a consumer or `walrelay verify` take a forged key as a
/// high-water mark, or report a gap that never happened. Any letter
/// case, because some consumers compare header names that way.
///
/// The one definition of the rule in Rust: the router, `walrelay
/// verify` and the consumer library use it; `sql/walrelay.sql` repeats
/// it for `walrelay.emit` (a test keeps the two in step).
#[inline]
pub fn is_reserved(name: &str) -> bool {
    let prefix = RESERVED_PREFIX.len();
    name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
        || (name.len() >= prefix
            && name.as_bytes()[..prefix].eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_idempotency_key_and_every_walrelay_header_in_any_case() {
        for name in [
            "idempotency-key",
            "Idempotency-Key",
            "walrelay-prev-key",
            "walrelay-source",
            "WALRELAY-anything",
            "walrelay-",
            DEAD_LETTER_KIND,
        ] {
            assert!(is_reserved(name), "{name}");
        }
        for name in [
            "",
            "idempotency",
            "idempotency-key2",
            "walrelay",
            "x-walrelay-source",
            "trace",
            "walrelay_source",
            "wälrelay-x",
        ] {
            assert!(!is_reserved(name), "{name}");
        }
    }
}
