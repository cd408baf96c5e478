//! Wire framing of the PostgreSQL frontend/backend protocol (v3).
//!
//! Every backend message is `tag: u8, len: i32 (including itself), body`.
//! This module only cuts the byte stream into [`RawFrame`]s; what a frame
//! means is decided in [`crate::backend`]. Keeping the split means the
//! decoding is pure and testable byte by byte, and the I/O part stays small
//! enough to reason about cancellation.
//!
//! ## Limits
//! The declared length is checked against a configured maximum *before* any
//! buffer grows, so a corrupt or hostile length field is an error rather
//! than a multi-gigabyte allocation.
//!
//! ## Cancellation
//! [`FrameReader::read_frame`] is cancel-safe: bytes read from the socket are
//! moved into the reader's own buffer by `read_buf` before any await point
//! that could be cancelled, so dropping the future (e.g. when another branch
//! of a `tokio::select!` wins) loses nothing; calling it again continues
//! where it stopped.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::Error;

/// Default upper bound for one backend message. A logical message or a row
/// can legitimately be large (a 5 MB `pg_logical_emit_message` content is
/// ordinary; Postgres caps a single datum at 1 GB), so the default is
/// generous but finite.
pub const DEFAULT_MAX_FRAME_LEN: usize = 256 * 1024 * 1024;

/// Size of the header: one tag byte and a four-byte length.
const HEADER_LEN: usize = 5;

/// One backend message, not yet interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Message type byte, e.g. `b'd'` for CopyData.
    pub tag: u8,
    /// Message body after the length field. A zero-copy slice of the read
    /// buffer.
    pub body: Bytes,
}

/// What the header of the next frame in `buf` says, if it is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub tag: u8,
    /// Body length (the wire length minus the four length bytes).
    pub body_len: usize,
}

/// Parse the header at the front of `buf` (pure; used by the reader and by
/// tests). `Ok(None)` means more bytes are needed.
pub(crate) fn parse_header(buf: &[u8], max_frame_len: usize) -> Result<Option<Header>, Error> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let tag = buf[0];
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(Error::Protocol(format!(
            "backend message '{}' declares an invalid length {len}",
            char::from(tag).escape_default()
        )));
    }
    let body_len = len as usize - 4;
    if body_len > max_frame_len {
        return Err(Error::FrameTooLarge {
            tag,
            len: body_len,
            limit: max_frame_len,
        });
    }
    Ok(Some(Header { tag, body_len }))
}

/// Cut a complete frame off the front of `buf`, if there is one.
pub(crate) fn split_frame(
    buf: &mut BytesMut,
    max_frame_len: usize,
) -> Result<Option<RawFrame>, Error> {
    let Some(header) = parse_header(buf, max_frame_len)? else {
        return Ok(None);
    };
    if buf.len() < HEADER_LEN + header.body_len {
        // Reserve the rest of this frame up front so a large CopyData is
        // read with few reallocations; the length was checked above.
        buf.reserve(HEADER_LEN + header.body_len - buf.len());
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let body = buf.split_to(header.body_len).freeze();
    Ok(Some(RawFrame {
        tag: header.tag,
        body,
    }))
}

/// Reads [`RawFrame`]s from a byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    max_frame_len: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R, max_frame_len: usize) -> Self {
        FrameReader {
            io,
            buf: BytesMut::with_capacity(64 * 1024),
            max_frame_len,
        }
    }

    /// Next frame, or `Ok(None)` on a clean end of stream between frames.
    /// Cancel-safe (see the module docs).
    pub async fn read_frame(&mut self) -> Result<Option<RawFrame>, Error> {
        loop {
            if let Some(frame) = split_frame(&mut self.buf, self.max_frame_len)? {
                return Ok(Some(frame));
            }
            if self.buf.capacity() - self.buf.len() < 8 * 1024 {
                self.buf.reserve(64 * 1024);
            }
            let n = self
                .io
                .read_buf(&mut self.buf)
                .await
                .map_err(Error::io("reading from the server"))?;
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(Error::Protocol(format!(
                    "the server closed the connection in the middle of a message ({} bytes buffered)",
                    self.buf.len()
                )));
            }
        }
    }

    /// The next frame if it is already complete in the buffer, without
    /// reading the socket. Lets a caller take everything one read brought
    /// in one go instead of waking up once per frame.
    pub fn try_frame(&mut self) -> Result<Option<RawFrame>, Error> {
        split_frame(&mut self.buf, self.max_frame_len)
    }

    /// Bytes already read but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.io
    }

    pub fn into_parts(self) -> (R, BytesMut) {
        (self.io, self.buf)
    }

    pub fn from_parts(io: R, buf: BytesMut, max_frame_len: usize) -> Self {
        FrameReader {
            io,
            buf,
            max_frame_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn header_needs_five_bytes() {
        assert_eq!(parse_header(b"d\0\0\0", 100).unwrap(), None);
        assert_eq!(
            parse_header(b"d\0\0\0\x09", 100).unwrap(),
            Some(Header {
                tag: b'd',
                body_len: 5
            })
        );
    }

    #[test]
    fn negative_or_short_length_is_an_error() {
        assert!(matches!(
            parse_header(b"d\xff\xff\xff\xff", 100),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            parse_header(b"d\0\0\0\x03", 100),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn oversized_frame_is_rejected_before_allocation() {
        let mut buf = BytesMut::from(&b"d\x7f\xff\xff\xff"[..]);
        let err = split_frame(&mut buf, 1024).unwrap_err();
        assert!(
            matches!(
                err,
                Error::FrameTooLarge {
                    tag: b'd',
                    limit: 1024,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(buf.capacity() < 1 << 20);
    }

    #[test]
    fn splits_consecutive_frames_and_waits_for_partial_ones() {
        let mut bytes = frame(b'Z', b"I");
        bytes.extend(frame(b'd', b"hello"));
        let partial = frame(b'C', b"DONE\0");
        bytes.extend_from_slice(&partial[..3]);
        let mut buf = BytesMut::from(&bytes[..]);
        let f1 = split_frame(&mut buf, 100).unwrap().unwrap();
        assert_eq!((f1.tag, &f1.body[..]), (b'Z', &b"I"[..]));
        let f2 = split_frame(&mut buf, 100).unwrap().unwrap();
        assert_eq!((f2.tag, &f2.body[..]), (b'd', &b"hello"[..]));
        assert_eq!(split_frame(&mut buf, 100).unwrap(), None);
        buf.extend_from_slice(&partial[3..]);
        let f3 = split_frame(&mut buf, 100).unwrap().unwrap();
        assert_eq!((f3.tag, &f3.body[..]), (b'C', &b"DONE\0"[..]));
        assert!(buf.is_empty());
    }

    #[tokio::test]
    async fn reader_survives_byte_by_byte_delivery_and_reports_eof() {
        let mut bytes = frame(b'd', b"abc");
        bytes.extend(frame(b'c', b""));
        let io = tokio_test_reader(bytes);
        let mut reader = FrameReader::new(io, 100);
        assert_eq!(
            reader.read_frame().await.unwrap().unwrap().body,
            Bytes::from_static(b"abc")
        );
        assert_eq!(reader.read_frame().await.unwrap().unwrap().tag, b'c');
        assert_eq!(reader.read_frame().await.unwrap(), None);
    }

    #[tokio::test]
    async fn try_frame_takes_only_what_is_buffered() {
        let mut bytes = frame(b'd', b"one");
        bytes.extend(frame(b'd', b"two"));
        bytes.extend(&frame(b'd', b"three")[..4]);
        let mut reader = FrameReader::new(&bytes[..], 100);
        assert_eq!(reader.try_frame().unwrap(), None, "nothing read yet");
        assert_eq!(
            reader.read_frame().await.unwrap().unwrap().body,
            Bytes::from_static(b"one")
        );
        assert_eq!(
            reader.try_frame().unwrap().unwrap().body,
            Bytes::from_static(b"two")
        );
        assert_eq!(reader.try_frame().unwrap(), None, "third frame incomplete");
        assert_eq!(reader.buffered(), 4);
    }

    #[tokio::test]
    async fn eof_inside_a_frame_is_an_error() {
        let bytes = frame(b'd', b"abcdef")[..6].to_vec();
        let mut reader = FrameReader::new(tokio_test_reader(bytes), 100);
        assert!(matches!(reader.read_frame().await, Err(Error::Protocol(_))));
    }

    /// A reader that hands out one byte per read, to exercise reassembly.
    fn tokio_test_reader(bytes: Vec<u8>) -> impl AsyncRead + Unpin {
        struct OneByte(std::collections::VecDeque<u8>);
        impl AsyncRead for OneByte {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                if let Some(b) = self.0.pop_front() {
                    buf.put_slice(&[b]);
                }
                std::task::Poll::Ready(Ok(()))
            }
        }
        OneByte(bytes.into())
    }
}
