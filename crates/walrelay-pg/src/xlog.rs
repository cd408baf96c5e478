//! The messages carried inside CopyData once replication has started.
//!
//! Server to client: XLogData (`'w'`) and the primary keepalive (`'k'`).
//! Client to server: the standby status update (`'r'`). Pure encode/decode
//! with byte-level tests; the I/O lives in [`crate::stream`].
//!
//! Times on the wire are microseconds since 2000-01-01 00:00:00 UTC.

use std::time::SystemTime;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use walrelay_pgoutput::{Lsn, PgTimestamp};

use crate::error::Error;

/// WAL data from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// Where this data starts in the WAL. For pgoutput this is the LSN of
    /// the change (see `docs/contract.md` for what it means per message).
    pub wal_start: Lsn,
    /// The server's current end of WAL.
    pub wal_end: Lsn,
    /// Server clock when the message was sent.
    pub send_time: PgTimestamp,
    /// The pgoutput message: a zero-copy slice of the read buffer.
    pub data: Bytes,
}

/// A primary keepalive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// The server's current end of WAL: everything the slot needs to send
    /// before this position has been sent.
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    /// The server asks for a status update now (it is close to
    /// `wal_sender_timeout`).
    pub reply_requested: bool,
}

/// One message of the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    XLogData(XLogData),
    Keepalive(Keepalive),
}

/// Positions reported to the server in a standby status update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StandbyStatus {
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
}

fn truncated(what: &str, len: usize) -> Error {
    Error::Protocol(format!(
        "replication message {what} is truncated ({len} bytes)"
    ))
}

/// Decode the body of a CopyData received in CopyBoth mode.
pub fn parse(mut body: Bytes) -> Result<ReplicationMessage, Error> {
    let len = body.len();
    if body.is_empty() {
        return Err(Error::Protocol(
            "empty CopyData in the replication stream".into(),
        ));
    }
    match body.get_u8() {
        b'w' => {
            if body.remaining() < 24 {
                return Err(truncated("XLogData", len));
            }
            let wal_start = Lsn(body.get_u64());
            let wal_end = Lsn(body.get_u64());
            let send_time = PgTimestamp(body.get_i64());
            Ok(ReplicationMessage::XLogData(XLogData {
                wal_start,
                wal_end,
                send_time,
                data: body,
            }))
        }
        b'k' => {
            if body.remaining() != 17 {
                return Err(truncated("primary keepalive", len));
            }
            let wal_end = Lsn(body.get_u64());
            let send_time = PgTimestamp(body.get_i64());
            let reply_requested = body.get_u8() != 0;
            Ok(ReplicationMessage::Keepalive(Keepalive {
                wal_end,
                send_time,
                reply_requested,
            }))
        }
        tag => Err(Error::Protocol(format!(
            "unknown replication message '{}' ({len} bytes)",
            char::from(tag).escape_default()
        ))),
    }
}

/// Append a whole frontend CopyData message holding a standby status update
/// to `out` (34 bytes of payload plus the 5-byte CopyData header).
pub fn encode_status_update(
    status: StandbyStatus,
    now: SystemTime,
    reply_requested: bool,
    out: &mut BytesMut,
) {
    const PAYLOAD: usize = 1 + 8 * 4 + 1;
    out.reserve(5 + PAYLOAD);
    out.put_u8(b'd');
    out.put_i32((4 + PAYLOAD) as i32);
    out.put_u8(b'r');
    out.put_u64(status.write.0);
    out.put_u64(status.flush.0);
    out.put_u64(status.apply.0);
    // A clock outside ±292,000 years of 2000 is not worth an error here.
    out.put_i64(
        PgTimestamp::from_system_time(now)
            .unwrap_or_default()
            .micros(),
    );
    out.put_u8(u8::from(reply_requested));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xlogdata_is_split_zero_copy() {
        let mut v = vec![b'w'];
        v.extend_from_slice(&0x0000_0016_B374_D848u64.to_be_bytes());
        v.extend_from_slice(&0x0000_0016_B374_D900u64.to_be_bytes());
        v.extend_from_slice(&1_000_000i64.to_be_bytes());
        v.extend_from_slice(b"Bpayload");
        let body = Bytes::from(v);
        let ReplicationMessage::XLogData(x) = parse(body.clone()).unwrap() else {
            panic!()
        };
        assert_eq!(x.wal_start.to_string(), "16/B374D848");
        assert_eq!(x.wal_end.to_string(), "16/B374D900");
        assert_eq!(x.send_time, PgTimestamp(1_000_000));
        assert_eq!(&x.data[..], b"Bpayload");
        // Same allocation: the payload points into the received buffer.
        assert_eq!(x.data.as_ptr(), body[25..].as_ptr());
    }

    #[test]
    fn keepalive_fields_and_reply_flag() {
        let mut v = vec![b'k'];
        v.extend_from_slice(&0x1_0000_0010u64.to_be_bytes());
        v.extend_from_slice(&7i64.to_be_bytes());
        v.push(1);
        assert_eq!(
            parse(Bytes::from(v)).unwrap(),
            ReplicationMessage::Keepalive(Keepalive {
                wal_end: Lsn(0x1_0000_0010),
                send_time: PgTimestamp(7),
                reply_requested: true
            })
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert!(parse(Bytes::new()).is_err());
        assert!(parse(Bytes::from_static(b"w\0\0")).is_err());
        assert!(parse(Bytes::from_static(b"k\0\0\0\0\0\0\0\0")).is_err());
        assert!(parse(Bytes::from_static(b"x")).is_err());
    }

    #[test]
    fn status_update_bytes() {
        let mut out = BytesMut::new();
        let now = PgTimestamp(0x0102_0304).to_system_time().unwrap();
        let status = StandbyStatus {
            write: Lsn(3),
            flush: Lsn(2),
            apply: Lsn(1),
        };
        encode_status_update(status, now, true, &mut out);
        let mut expected = vec![b'd', 0, 0, 0, 38, b'r'];
        expected.extend_from_slice(&3u64.to_be_bytes());
        expected.extend_from_slice(&2u64.to_be_bytes());
        expected.extend_from_slice(&1u64.to_be_bytes());
        expected.extend_from_slice(&0x0102_0304i64.to_be_bytes());
        expected.push(1);
        assert_eq!(&out[..], &expected[..]);
    }
}
