//! A partition's log end offset, for the fence's wait until what the
//! leader holds is readable.
//!
//! The fence reads a partition up to its high watermark. On a replicated
//! topic the leader appends a record before its followers copy it; the
//! high watermark passes it only once every in-sync replica has it. A
//! relay session that ended (a `kill -9`, a timeout) may have left
//! records appended but not yet below the high watermark: invisible to the
//! next session's fence, which would write them again, and duplicates once
//! the followers catch up (or, while the partition is under
//! `min.insync.replicas`, once it is back in sync). So the fence first
//! asks the leader for its log end offset and waits until the high
//! watermark reaches it: then everything appended before the session
//! began is either readable or gone with a truncation.
//!
//! Consumers cannot ask for the log end: ListOffsets answers them with the
//! high watermark. A request with the debugging replica id (-2) gets the
//! log end (Kafka's `Partition.fetchOffsetForTimestamp` bounds the answer
//! by the isolation level only for consumer requests) and needs only
//! Describe on the topic. librdkafka cannot send it, so walrelay sends its
//! own ListOffsets v1 to the partition's leader, on plaintext listeners
//! (as [`super::api_versions`]); elsewhere the fence does not wait, and a
//! replay after a crash may write the unreplicated tail again (duplicates,
//! never a loss).
//!
//! The encoding and decoding are pure functions ([`request`],
//! [`parse_response`]), tested byte for byte below.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::kafka_wire::Reader;

const LIST_OFFSETS: i16 = 2;
/// `ListOffsetsRequest.DEBUGGING_REPLICA_ID`: answered with the log end.
const DEBUGGING_REPLICA_ID: i32 = -2;
/// `ListOffsetsRequest.LATEST_TIMESTAMP`.
const LATEST: i64 = -1;
/// The largest response walrelay reads.
const MAX_RESPONSE: usize = 1 << 20;

/// A ListOffsets v1 request (header v1) for the log end of `partitions`
/// of `topic`, length-prefixed.
#[must_use]
pub fn request(correlation_id: i32, topic: &str, partitions: &[i32]) -> Vec<u8> {
    let mut body = Vec::with_capacity(32 + topic.len() + 12 * partitions.len());
    body.extend_from_slice(&LIST_OFFSETS.to_be_bytes());
    body.extend_from_slice(&1i16.to_be_bytes());
    body.extend_from_slice(&correlation_id.to_be_bytes());
    let client_id = b"walrelay-fence";
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.extend_from_slice(&DEBUGGING_REPLICA_ID.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes()); // one topic
    body.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
    for p in partitions {
        body.extend_from_slice(&p.to_be_bytes());
        body.extend_from_slice(&LATEST.to_be_bytes());
    }
    let mut framed = Vec::with_capacity(body.len() + 4);
    framed.extend_from_slice(&(body.len() as i32).to_be_bytes());
    framed.extend_from_slice(&body);
    framed
}

/// One partition's answer: its log end offset, or Kafka's error code.
pub type LogEnd = (i32, Result<i64, i16>);

/// A ListOffsets v1 response (without its length prefix): each
/// partition's log end offset or error code.
pub fn parse_response(bytes: &[u8], correlation_id: i32) -> Result<Vec<LogEnd>, String> {
    let mut r = Reader::new(bytes);
    let got = r.i32()?;
    if got != correlation_id {
        return Err(format!("correlation id {got}, expected {correlation_id}"));
    }
    let mut out = Vec::new();
    for _ in 0..r.count()? {
        let name_len = usize::try_from(r.i16()?).map_err(|_| "a null topic name".to_owned())?;
        r.take(name_len)?;
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

/// Asks `leader` (`host:port`, a plaintext listener) for the log end of
/// `partitions` of `topic`. Blocking, each step bounded by `timeout`.
pub fn ask(
    leader: &str,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<LogEnd>, String> {
    const CORRELATION_ID: i32 = 0x4c45_4f31;
    let addr = std::net::ToSocketAddrs::to_socket_addrs(leader)
        .map_err(|e| format!("resolving {leader}: {e}"))?
        .next()
        .ok_or_else(|| format!("{leader} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connecting to {leader}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(&request(CORRELATION_ID, topic, partitions))
        .map_err(|e| format!("sending ListOffsets to {leader}: {e}"))?;
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .map_err(|e| format!("reading ListOffsets from {leader}: {e}"))?;
    let len = i32::from_be_bytes(len);
    let len = usize::try_from(len)
        .ok()
        .filter(|n| *n <= MAX_RESPONSE)
        .ok_or_else(|| format!("a response of {len} bytes"))?;
    let mut body = vec![0; len];
    stream
        .read_exact(&mut body)
        .map_err(|e| format!("reading ListOffsets from {leader}: {e}"))?;
    parse_response(&body, CORRELATION_ID)
}

/// Kafka error codes a partition answers with while its leadership
/// moves: ask again (the leaders are looked up again).
const LEADERSHIP_MOVING: [i16; 4] = [
    6,  // NOT_LEADER_OR_FOLLOWER
    74, // FENCED_LEADER_EPOCH
    75, // UNKNOWN_LEADER_EPOCH
    78, // OFFSET_NOT_AVAILABLE
];

/// How often the high watermarks are read while waiting.
const POLL: Duration = Duration::from_millis(50);

/// A partition whose high watermark stayed below the log end its leader
/// reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    pub partition: i32,
    pub high_watermark: Option<i64>,
    pub log_end: i64,
}

/// Waits until the high watermark of every partition in `partitions`
/// reached the log end its leader reported when first asked, or
/// `deadline`. `leaders` looks up each partition's leader (`host:port`),
/// `log_end` asks a leader ([`ask`]), `high_watermark` reads a
/// partition's high watermark. A partition whose leader does not answer
/// the request (an error code other than a moving leadership, or no
/// answer at all: a broker that does not serve it) is not waited for: it
/// costs duplicates at worst, as without the wait. Returns the partitions
/// still behind at the deadline.
pub fn await_readable(
    partitions: &[i32],
    deadline: std::time::Instant,
    mut leaders: impl FnMut() -> Result<Vec<(i32, String)>, String>,
    mut log_end: impl FnMut(&str, &[i32]) -> Result<Vec<LogEnd>, String>,
    mut high_watermark: impl FnMut(i32) -> Result<i64, String>,
) -> Result<(), Vec<Behind>> {
    use std::collections::{BTreeMap, BTreeSet};
    // Per partition, the log end to reach; `None` while not yet known.
    let mut targets: BTreeMap<i32, Option<i64>> = partitions.iter().map(|&p| (p, None)).collect();
    let mut last_high: BTreeMap<i32, i64> = BTreeMap::new();
    loop {
        let unknown: BTreeSet<i32> = targets
            .iter()
            .filter(|(_, t)| t.is_none())
            .map(|(p, _)| *p)
            .collect();
        if !unknown.is_empty() {
            match leaders() {
                Ok(by_partition) => {
                    let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                    for (p, leader) in by_partition {
                        if unknown.contains(&p) {
                            by_leader.entry(leader).or_default().push(p);
                        }
                    }
                    for (leader, ps) in by_leader {
                        match log_end(&leader, &ps) {
                            Ok(answers) => {
                                for (p, answer) in answers {
                                    match answer {
                                        Ok(end) => {
                                            targets.insert(p, Some(end));
                                        }
                                        Err(code) if LEADERSHIP_MOVING.contains(&code) => {}
                                        Err(code) => {
                                            tracing::debug!(
                                                partition = p,
                                                code,
                                                "no log end from the leader: not waiting for it"
                                            );
                                            targets.remove(&p);
                                        }
                                    }
                                }
                            }
                            Err(e) => {
                                tracing::debug!(%leader, "no log end from the leader ({e}): not waiting for its partitions");
                                for p in ps {
                                    targets.remove(&p);
                                }
                            }
                        }
                    }
                }
                Err(e) => tracing::debug!("looking up the partitions' leaders: {e}"),
            }
        }
        targets.retain(|&p, target| {
            let Some(end) = *target else { return true };
            match high_watermark(p) {
                Ok(high) if high >= end => false,
                Ok(high) => {
                    last_high.insert(p, high);
                    true
                }
                Err(_) => true,
            }
        });
        if targets.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(targets
                .into_iter()
                .filter_map(|(p, end)| {
                    end.map(|log_end| Behind {
                        partition: p,
                        high_watermark: last_high.get(&p).copied(),
                        log_end,
                    })
                })
                .collect());
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_list_offsets_v1_for_the_log_end() {
        let r = request(7, "ab", &[0, 3]);
        let mut want = vec![0, 2, 0, 1, 0, 0, 0, 7, 0, 14];
        want.extend_from_slice(b"walrelay-fence");
        want.extend_from_slice(&(-2i32).to_be_bytes()); // debugging replica
        want.extend_from_slice(&[0, 0, 0, 1, 0, 2, b'a', b'b', 0, 0, 0, 2]);
        for p in [0i32, 3] {
            want.extend_from_slice(&p.to_be_bytes());
            want.extend_from_slice(&(-1i64).to_be_bytes()); // latest
        }
        assert_eq!(&r[..4], &(want.len() as i32).to_be_bytes());
        assert_eq!(&r[4..], &want[..]);
    }

    fn response(correlation: i32, partitions: &[(i32, i16, i64)]) -> Vec<u8> {
        let mut b = correlation.to_be_bytes().to_vec();
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
    fn each_partition_gets_its_log_end_or_its_error() {
        let got = parse_response(&response(7, &[(0, 0, 42), (3, 6, -1)]), 7).unwrap();
        assert_eq!(got, vec![(0, Ok(42)), (3, Err(6))]);
    }

    #[test]
    fn garbage_and_a_wrong_correlation_are_errors() {
        let ok = response(7, &[(0, 0, 42)]);
        assert!(parse_response(&ok, 8).unwrap_err().contains("correlation"));
        for cut in 4..ok.len() {
            assert!(parse_response(&ok[..cut], 7).is_err(), "cut at {cut}");
        }
        let mut huge = 7i32.to_be_bytes().to_vec();
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(parse_response(&huge, 7).unwrap_err().contains("entries"));
    }

    use std::cell::Cell;
    use std::time::Instant;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(400)
    }

    #[test]
    fn waits_until_the_high_watermark_reaches_the_log_end() {
        let high = Cell::new(5);
        let got = await_readable(
            &[0],
            soon(),
            || Ok(vec![(0, "a:1".to_owned())]),
            |_, ps| Ok(ps.iter().map(|&p| (p, Ok(8))).collect()),
            |_| {
                high.set(high.get() + 1);
                Ok(high.get())
            },
        );
        assert_eq!(got, Ok(()));
        assert_eq!(high.get(), 8, "read until it reached the log end");
    }

    #[test]
    fn a_moving_leadership_is_asked_again_and_a_refusal_is_not_waited_for() {
        let asked = Cell::new(0);
        let got = await_readable(
            &[0, 1],
            soon(),
            || Ok(vec![(0, "a:1".to_owned()), (1, "b:1".to_owned())]),
            |leader, _| {
                asked.set(asked.get() + 1);
                Ok(match (leader, asked.get()) {
                    ("a:1", n) if n <= 2 => vec![(0, Err(6))],
                    ("a:1", _) => vec![(0, Ok(3))],
                    _ => vec![(1, Err(35))],
                })
            },
            |_| Ok(3),
        );
        assert_eq!(got, Ok(()));
        assert!(asked.get() >= 3, "asked partition 0's leader again");
    }

    #[test]
    fn a_partition_still_behind_at_the_deadline_is_reported() {
        let got = await_readable(
            &[2],
            Instant::now() + Duration::from_millis(120),
            || Ok(vec![(2, "a:1".to_owned())]),
            |_, _| Ok(vec![(2, Ok(10))]),
            |_| Ok(7),
        );
        assert_eq!(
            got,
            Err(vec![Behind {
                partition: 2,
                high_watermark: Some(7),
                log_end: 10
            }])
        );
        // A broker that does not answer at all: not waited for.
        let got = await_readable(
            &[2],
            soon(),
            || Ok(vec![(2, "a:1".to_owned())]),
            |_, _| Err("connection refused".to_owned()),
            |_| Ok(0),
        );
        assert_eq!(got, Ok(()));
    }
}
