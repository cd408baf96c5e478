//! A partition's log end offset and high watermark, as its leader holds
//! them: walrelay's own ListOffsets, for the tail fence's wait until what
//! the leader holds is readable ([`super::readable`], which says why).
//!
//! Consumers cannot ask for the log end: ListOffsets answers them with the
//! high watermark. A request with the debugging replica id (-2) gets the
//! log end (Kafka's `Partition.fetchOffsetForTimestamp` bounds the answer
//! by the isolation level only for consumer requests) and needs only
//! Describe on the topic. librdkafka cannot send it, so walrelay sends its
//! own ListOffsets v2 to the partition's leader, over a connection made
//! as the producer's are ([`crate::kafka::conn`]: TLS, SASL). The high
//! watermark comes from the same leader, asked as a consumer with
//! `read_uncommitted`: the fence's reader runs `read_committed`, whose
//! watermark is the last stable offset, which another producer's open
//! transaction holds back however well replicated the partition is.
//!
//! The encoding and decoding are pure functions ([`request`],
//! [`parse_response`]), tested byte for byte below.

use std::collections::BTreeMap;

use crate::kafka::conn::Connection;
use crate::kafka::wire::{Reader, Request};
use crate::kafka::RequestError;

const LIST_OFFSETS: i16 = 2;
/// `ListOffsetsRequest.DEBUGGING_REPLICA_ID`: answered with the log end.
pub const DEBUGGING_REPLICA_ID: i32 = -2;
/// `ListOffsetsRequest.CONSUMER_REPLICA_ID`: answered with the high
/// watermark under `read_uncommitted`.
pub const CONSUMER_REPLICA_ID: i32 = -1;
/// `ListOffsetsRequest.LATEST_TIMESTAMP`.
const LATEST: i64 = -1;
/// `IsolationLevel.READ_UNCOMMITTED`.
const READ_UNCOMMITTED: u8 = 0;

/// A ListOffsets v2 request (header v1) for the latest offset of
/// `partitions` of `topic` as `replica_id` sees it (`read_uncommitted`),
/// length-prefixed.
#[must_use]
pub fn request(correlation_id: i32, replica_id: i32, topic: &str, partitions: &[i32]) -> Vec<u8> {
    let mut request = Request::new(LIST_OFFSETS, 2, correlation_id, "walrelay-fence");
    request.i32(replica_id).u8(READ_UNCOMMITTED);
    request.count(1).string(topic).count(partitions.len());
    for &p in partitions {
        request.i32(p).i64(LATEST);
    }
    request.framed()
}

/// One partition's answer: an offset, or Kafka's error code.
pub type Answer = (i32, Result<i64, i16>);

/// A ListOffsets v2 response (without its length prefix): each
/// partition's offset or error code.
pub fn parse_response(bytes: &[u8], correlation_id: i32) -> Result<Vec<Answer>, RequestError> {
    read_response(bytes, correlation_id).map_err(RequestError::Response)
}

fn read_response(bytes: &[u8], correlation_id: i32) -> Result<Vec<Answer>, String> {
    let mut r = Reader::new(bytes);
    let got = r.i32()?;
    if got != correlation_id {
        return Err(format!("correlation id {got}, expected {correlation_id}"));
    }
    let _throttle_ms = r.i32()?;
    let mut out = Vec::new();
    for _ in 0..r.count()? {
        r.string()?;
        for _ in 0..r.count()? {
            let partition = r.i32()?;
            let error = r.i16()?;
            let _timestamp = r.i64()?;
            let offset = r.i64()?;
            out.push((partition, if error == 0 { Ok(offset) } else { Err(error) }));
        }
    }
    Ok(out)
}

/// What a leader holds of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    pub log_end: i64,
    pub high_watermark: i64,
}

/// One partition's offsets, or Kafka's error code.
pub type PartitionOffsets = (i32, Result<Offsets, i16>);

/// Asks the leader on `connection` for the log end and the high
/// watermark of `partitions` of `topic` (two requests).
pub fn ask(
    connection: &mut Connection,
    topic: &str,
    partitions: &[i32],
) -> Result<Vec<PartitionOffsets>, RequestError> {
    let mut one = |correlation_id: i32, replica_id: i32| {
        let answer =
            connection.round_trip(&request(correlation_id, replica_id, topic, partitions))?;
        parse_response(&answer, correlation_id)
    };
    let ends = one(0x4c45_4f32, DEBUGGING_REPLICA_ID)?;
    let highs: BTreeMap<i32, Result<i64, i16>> =
        one(0x4857_4d32, CONSUMER_REPLICA_ID)?.into_iter().collect();
    Ok(ends
        .into_iter()
        .map(|(p, end)| {
            let high = highs
                .get(&p)
                .copied()
                .unwrap_or(Err(UNKNOWN_TOPIC_OR_PARTITION));
            (
                p,
                end.and_then(|log_end| {
                    high.map(|high_watermark| Offsets {
                        log_end,
                        high_watermark,
                    })
                }),
            )
        })
        .collect())
}

/// `UNKNOWN_TOPIC_OR_PARTITION`: a partition the second answer left out.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_list_offsets_v2_for_the_latest_offset_read_uncommitted() {
        let r = request(7, DEBUGGING_REPLICA_ID, "ab", &[0, 3]);
        let mut want = vec![0, 2, 0, 2, 0, 0, 0, 7, 0, 14];
        want.extend_from_slice(b"walrelay-fence");
        want.extend_from_slice(&(-2i32).to_be_bytes()); // debugging replica
        want.push(0); // read_uncommitted
        want.extend_from_slice(&[0, 0, 0, 1, 0, 2, b'a', b'b', 0, 0, 0, 2]);
        for p in [0i32, 3] {
            want.extend_from_slice(&p.to_be_bytes());
            want.extend_from_slice(&(-1i64).to_be_bytes()); // latest
        }
        assert_eq!(&r[..4], &(want.len() as i32).to_be_bytes());
        assert_eq!(&r[4..], &want[..]);
        let consumer = request(7, CONSUMER_REPLICA_ID, "ab", &[0, 3]);
        assert_eq!(&consumer[28..32], &(-1i32).to_be_bytes());
    }

    fn response(correlation: i32, partitions: &[(i32, i16, i64)]) -> Vec<u8> {
        let mut b = correlation.to_be_bytes().to_vec();
        b.extend_from_slice(&[0, 0, 0, 0]); // throttle
        b.extend_from_slice(&[0, 0, 0, 1, 0, 2, b'a', b'b']);
        b.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
        for (p, error, offset) in partitions {
            b.extend_from_slice(&p.to_be_bytes());
            b.extend_from_slice(&error.to_be_bytes());
            b.extend_from_slice(&(-1i64).to_be_bytes());
            b.extend_from_slice(&offset.to_be_bytes());
        }
        b
    }

    #[test]
    fn each_partition_gets_its_offset_or_its_error() {
        let got = parse_response(&response(7, &[(0, 0, 42), (3, 6, -1)]), 7).unwrap();
        assert_eq!(got, vec![(0, Ok(42)), (3, Err(6))]);
    }

    #[test]
    fn garbage_and_a_wrong_correlation_are_errors() {
        let ok = response(7, &[(0, 0, 42)]);
        assert!(parse_response(&ok, 8)
            .unwrap_err()
            .to_string()
            .contains("correlation"));
        for cut in 4..ok.len() {
            assert!(parse_response(&ok[..cut], 7).is_err(), "cut at {cut}");
        }
        let mut huge = 7i32.to_be_bytes().to_vec();
        huge.extend_from_slice(&[0, 0, 0, 0]);
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(parse_response(&huge, 7)
            .unwrap_err()
            .to_string()
            .contains("entries"));
    }
}
