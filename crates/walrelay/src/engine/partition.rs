//! Deterministic partitioning, compatible with Kafka's Java client.
//!
//! A replayed event must land in the same partition as its first copy, or
//! the consumer's per-partition high-water mark cannot recognise it. So the
//! partition is a pure function of the record: of its key when it has one
//! (the same function as the Java client's default partitioner, so records
//! produced by walrelay and by Java producers with the same key share a
//! partition), and of the WAL position otherwise, by one of two rules
//! ([`KeylessPlacement`]) — never random, never by the producer's own
//! round-robin or sticky choice.

use crate::config::KeylessPlacement;
use crate::engine::key::EventKey;

/// Kafka's `Utils.murmur2`: 32-bit MurmurHash2 with seed `0x9747b28c`,
/// reading little-endian 4-byte chunks, as the Java client computes it
/// (returned as Java's signed `int`).
#[must_use]
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java uses the `int` length; truncation matches it for any array Java
    // could hold.
    let mut h: u32 = SEED ^ (data.len() as u32);

    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }

    // The Java `switch` falls through from 3 to 2 to 1.
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&first) = tail.first() {
        h ^= u32::from(first);
        h = h.wrapping_mul(M);
    }

    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    // Reinterpret the bits as Java's signed int.
    h as i32
}

/// Partition of a keyed record: `toPositive(murmur2(key)) % partitions`,
/// exactly what Kafka's Java default partitioner does for a record with a
/// key.
///
/// # Panics
///
/// If `partitions` is 0 (a topic always has at least one partition).
#[must_use]
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    // Java's `Utils.toPositive`: clear the sign bit (not `abs`).
    let positive = murmur2(key) & 0x7fff_ffff;
    u32::try_from(positive).unwrap_or_default() % partitions
}

/// log2 of the WAL range [`KeylessPlacement::WalRange`] places by: 1 MiB,
/// a few thousand one-event transactions. Large enough that the producer
/// fills whole batches for one partition while a backlog drains, small
/// enough that a live stream of a few thousand transactions a second moves
/// on to the next partition within a second or so.
pub const WAL_RANGE_BITS: u32 = 20;

/// Partition of a keyless record, from the high 64 bits of its event key
/// (the commit record's LSN for a transactional event, `L - 1` for a
/// non-transactional message) and nothing else:
///
/// - By [`KeylessPlacement::WalRange`], the number of the 1 MiB range of WAL
///   that position falls in ([`WAL_RANGE_BITS`]), modulo the partition
///   count, so the partitions take turns, one range each. A run of
///   consecutive transactions shares a partition, which lets the producer
///   batch one-event transactions the way a sticky partitioner does.
/// - By [`KeylessPlacement::Commit`], murmur2 (as in [`partition_for_key`])
///   of the position's big-endian 8 bytes, each transaction on its own
///   (what releases before `wal-range` did).
///
/// Why not the producer's own choice for keyless records (random,
/// round-robin or sticky): those depend on timing and on the producer
/// instance, so a replayed event could land in a different partition than
/// its first copy, where the consumer's high-water mark would not recognise
/// it as a duplicate. Both rules read the WAL only, so the partition is the
/// same on every replay under the same rule, and every event of one
/// transaction shares it: a whole keyless transaction lands in one
/// partition, in order.
///
/// # Panics
///
/// If `partitions` is 0.
#[must_use]
pub fn partition_for_keyless(event_key: EventKey, partitions: u32, rule: KeylessPlacement) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    let position = event_key.high();
    match rule {
        KeylessPlacement::WalRange => {
            let range = position >> WAL_RANGE_BITS;
            u32::try_from(range % u64::from(partitions)).expect("below a u32 partition count")
        }
        KeylessPlacement::Commit => partition_for_key(&position.to_be_bytes(), partitions),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values from Apache Kafka's `UtilsTest.testMurmur2`
    /// (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
    const KAFKA_VECTORS: &[(&[u8], i32)] = &[
        (b"21", -973_932_308),
        (b"foobar", -790_332_482),
        (b"a-little-bit-long-string", -985_981_536),
        (b"a-little-bit-longer-string", -1_486_304_829),
        (
            b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        ),
        (b"abc", 479_470_107),
    ];

    /// Values other projects' tests quote as produced by Kafka's
    /// implementation (Akka's `Murmur2Spec`); they cover tails of 1, 2, 3
    /// bytes and one exact chunk.
    const MORE_VECTORS: &[(&[u8], i32)] = &[
        (b"1", -1_993_445_489),
        (b"12", 126_087_238),
        (b"123", -267_702_483),
        (b"1234", -1_614_185_708),
        (b"12345", -1_188_365_604),
    ];

    #[test]
    fn murmur2_matches_kafka_vectors() {
        for &(data, expected) in KAFKA_VECTORS.iter().chain(MORE_VECTORS) {
            assert_eq!(
                murmur2(data),
                expected,
                "murmur2({:?})",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn partition_for_key_uses_to_positive() {
        for &(data, hash) in KAFKA_VECTORS.iter().chain(MORE_VECTORS) {
            for partitions in [1u32, 2, 3, 6, 12, 100, 1000] {
                let expected = ((hash & 0x7fff_ffff) as u32) % partitions;
                assert_eq!(partition_for_key(data, partitions), expected);
            }
        }
        // -973932308 & 0x7fffffff = 1173551340.
        assert_eq!(partition_for_key(b"21", 1_000_000_000), 173_551_340);
    }

    #[test]
    fn one_partition_is_always_zero() {
        assert_eq!(partition_for_key(b"", 1), 0);
        assert_eq!(partition_for_key(b"foobar", 1), 0);
        for rule in [KeylessPlacement::WalRange, KeylessPlacement::Commit] {
            assert_eq!(partition_for_keyless(EventKey(u128::MAX), 1, rule), 0);
            assert_eq!(partition_for_keyless(EventKey(0), 1, rule), 0);
        }
    }

    #[test]
    #[should_panic(expected = "at least one partition")]
    fn zero_partitions_panics() {
        let _ = partition_for_key(b"x", 0);
    }

    #[test]
    fn keyless_uses_the_high_half_only() {
        let final_lsn = 0x16_B374_D848u64;
        let partitions = 12;
        let expected = partition_for_key(&final_lsn.to_be_bytes(), partitions);
        // Every event of the transaction: same partition.
        let range = ((final_lsn >> WAL_RANGE_BITS) % 12) as u32;
        for low in [0u64, 1, 0x16_B374_D000, u64::MAX] {
            let key = EventKey::new(final_lsn, low);
            assert_eq!(
                partition_for_keyless(key, partitions, KeylessPlacement::Commit),
                expected
            );
            assert_eq!(
                partition_for_keyless(key, partitions, KeylessPlacement::WalRange),
                range
            );
        }
    }

    #[test]
    fn wal_ranges_keep_runs_of_transactions_together_and_take_turns() {
        let placed = |lsn: u64| {
            partition_for_keyless(EventKey::new(lsn, lsn), 4, KeylessPlacement::WalRange)
        };
        let mib = 1u64 << 20;
        // Every position of one range, first byte to last: one partition.
        let base = 0x5_0000_0000u64;
        let first = placed(base);
        for lsn in [base + 1, base + 0x28, base + mib / 2, base + mib - 1] {
            assert_eq!(placed(lsn), first, "{lsn:x}");
        }
        // The next ranges: the next partitions, in turn.
        let turns: Vec<u32> = (0..8).map(|r| placed(base + r * mib)).collect();
        let expected: Vec<u32> = (0..8).map(|r| (first + r as u32) % 4).collect();
        assert_eq!(turns, expected);
        // 10,000 one-event transactions of ~300 bytes of WAL: runs of a
        // few thousand, every partition used.
        let partitions: Vec<u32> = (0..10_000u64).map(|i| placed(base + i * 304)).collect();
        let runs = 1 + partitions.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(runs, 3, "{runs} runs");
        // The same transactions by commit: a new partition nearly every time.
        let by_commit: Vec<u32> = (0..10_000u64)
            .map(|i| {
                partition_for_keyless(
                    EventKey::new(base + i * 304, 0),
                    4,
                    KeylessPlacement::Commit,
                )
            })
            .collect();
        let changes = by_commit.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(changes > 6_000, "{changes}");
    }

    #[test]
    fn deterministic() {
        let keys: Vec<EventKey> = (0..200u64)
            .map(|i| EventKey::new(0x1_0000_0000 + i * 0x28, i))
            .collect();
        for rule in [KeylessPlacement::WalRange, KeylessPlacement::Commit] {
            let place = |k: &EventKey| partition_for_keyless(*k, 7, rule);
            let first: Vec<u32> = keys.iter().map(place).collect();
            let again: Vec<u32> = keys.iter().map(place).collect();
            assert_eq!(first, again);
            assert!(first.iter().all(|&p| p < 7));
        }
        // Keyless traffic spreads over partitions rather than piling up.
        let spread = |step: u64| -> std::collections::HashSet<u32> {
            (0..200u64)
                .map(|i| EventKey::new(0x1_0000_0000 + i * step, i))
                .map(|k| partition_for_keyless(k, 7, KeylessPlacement::WalRange))
                .collect()
        };
        assert_eq!(spread(1 << 20).len(), 7);
        assert_eq!(murmur2(b"foobar"), murmur2(b"foobar"));
    }

    #[test]
    fn empty_input() {
        // h = seed ^ 0, no chunk, no tail: only the final mixing.
        let mut h: u32 = 0x9747_b28c;
        h ^= h >> 13;
        h = h.wrapping_mul(0x5bd1_e995);
        h ^= h >> 15;
        assert_eq!(murmur2(b""), h as i32);
    }
}
