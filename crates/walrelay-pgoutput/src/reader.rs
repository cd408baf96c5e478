//! A bounds-checked cursor over one message buffer.
//!
//! All length and range checks of the decoder live here, in one place, so
//! the message decoders can be written as a straight list of fields without
//! any indexing that could panic. Variable-length fields are returned as
//! [`Bytes::slice`]s of the input: column values and message payloads are
//! the bulk of the replication stream, and slicing shares the buffer
//! instead of copying it.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::lsn::Lsn;

pub(crate) struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Fails with `UnexpectedEof` unless `needed` more bytes are available.
    pub(crate) fn ensure(&self, needed: usize, what: &'static str) -> Result<(), DecodeError> {
        let remaining = self.remaining();
        if needed > remaining {
            return Err(DecodeError::UnexpectedEof {
                what,
                needed,
                remaining,
            });
        }
        Ok(())
    }

    /// The next `n` bytes as a zero-copy slice.
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        self.ensure(n, what)?;
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        self.ensure(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    /// An `Int32` that PostgreSQL treats as unsigned (xids, oids).
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn lsn(&mut self, what: &'static str) -> Result<Lsn, DecodeError> {
        Ok(Lsn(u64::from_be_bytes(self.array(what)?)))
    }

    /// A `Byte1` that must be 0 or 1.
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidValue {
                what,
                value: other.into(),
            }),
        }
    }

    /// An `Int32` length followed by that many bytes. Negative lengths are
    /// rejected, and the length is checked against the buffer before
    /// anything is sliced, so a huge declared length fails immediately.
    pub(crate) fn len_prefixed(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let len = self.i32(what)?;
        let len = usize::try_from(len).map_err(|_| DecodeError::InvalidValue {
            what,
            value: len.into(),
        })?;
        self.take(len, what)
    }

    /// A count (`Int16` or `Int32`) that must not be negative.
    pub(crate) fn count(value: i64, what: &'static str) -> Result<usize, DecodeError> {
        usize::try_from(value).map_err(|_| DecodeError::InvalidValue { what, value })
    }

    /// A NUL-terminated string, without its NUL, as a zero-copy slice.
    pub(crate) fn cstr(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let rest = &self.buf[self.pos..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { what })?;
        let out = self.buf.slice(self.pos..self.pos + nul);
        self.pos += nul + 1;
        Ok(out)
    }

    /// A NUL-terminated string that must be UTF-8, copied into a `String`
    /// (used only for rare, small names).
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let raw = self.cstr(what)?;
        std::str::from_utf8(&raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { what })
    }

    /// Asserts the whole buffer was consumed.
    pub(crate) fn finish(&self, message: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            remaining => Err(DecodeError::TrailingBytes { message, remaining }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_and_slices() {
        let buf = Bytes::from_static(b"\x00\x01\xff\xff\xff\xfeab\0\x00\x00\x00\x02xy");
        let mut r = Reader::new(buf.clone());
        assert_eq!(r.i16("a").unwrap(), 1);
        assert_eq!(r.i32("b").unwrap(), -2);
        let s = r.cstr("c").unwrap();
        assert_eq!(&s[..], b"ab");
        // Zero-copy: the slice points into the original buffer.
        assert_eq!(s.as_ptr(), buf[6..].as_ptr());
        assert_eq!(&r.len_prefixed("d").unwrap()[..], b"xy");
        r.finish("test").unwrap();
    }

    #[test]
    fn errors() {
        let mut r = Reader::new(Bytes::from_static(b"\x80\x00\x00\x00"));
        assert_eq!(
            r.len_prefixed("len"),
            Err(DecodeError::InvalidValue {
                what: "len",
                value: i64::from(i32::MIN)
            })
        );
        let mut r = Reader::new(Bytes::from_static(b"\x7f\xff\xff\xff"));
        assert_eq!(
            r.len_prefixed("len"),
            Err(DecodeError::UnexpectedEof {
                what: "len",
                needed: i32::MAX as usize,
                remaining: 0
            })
        );
        let mut r = Reader::new(Bytes::from_static(b"abc"));
        assert_eq!(r.cstr("s"), Err(DecodeError::MissingNul { what: "s" }));
        let mut r = Reader::new(Bytes::from_static(b"\xff\0"));
        assert_eq!(r.string("s"), Err(DecodeError::InvalidUtf8 { what: "s" }));
        let mut r = Reader::new(Bytes::from_static(b"\x02"));
        assert_eq!(
            r.bool("flag"),
            Err(DecodeError::InvalidValue {
                what: "flag",
                value: 2
            })
        );
        let r = Reader::new(Bytes::from_static(b"x"));
        assert_eq!(
            r.finish("M"),
            Err(DecodeError::TrailingBytes {
                message: "M",
                remaining: 1
            })
        );
    }
}
