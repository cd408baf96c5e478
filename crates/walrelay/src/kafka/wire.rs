//! The Kafka protocol's framing, for the requests walrelay sends itself
//! ([`super::requests`], and the SASL exchange of [`super::conn`]):
//! [`Request`] writes a request (its header, the fields in order, the
//! length prefix), [`Reader`] reads a response field by field (big-endian
//! integers, unsigned varints and tagged fields, each read checked against
//! the bytes left).

/// One request being written: a request header v1 (api key, version,
/// correlation id, client id) first, then the caller's fields; a header v2
/// adds [`Request::no_tags`] right after [`Request::new`]. [`Request::framed`]
/// puts the length in front.
#[derive(Debug)]
pub struct Request {
    /// Four bytes for the length, then the header and the fields.
    bytes: Vec<u8>,
}

impl Request {
    #[must_use]
    pub fn new(api_key: i16, version: i16, correlation_id: i32, client_id: &str) -> Request {
        let mut request = Request {
            bytes: Vec::with_capacity(64),
        };
        request.bytes.extend_from_slice(&[0; 4]);
        request.i16(api_key).i16(version).i32(correlation_id);
        request.string(client_id);
        request
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }

    pub fn i16(&mut self, v: i16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A count of array entries (int32).
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.i32(i32::try_from(n).unwrap_or(i32::MAX))
    }

    /// A string with an int16 length.
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.i16(i16::try_from(s.len()).unwrap_or(i16::MAX));
        self.bytes.extend_from_slice(s.as_bytes());
        self
    }

    /// Bytes with an int32 length.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.count(b.len());
        self.bytes.extend_from_slice(b);
        self
    }

    pub fn uvarint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.bytes.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.u8(v as u8)
    }

    /// A compact string: its length + 1 as an unsigned varint.
    pub fn compact_string(&mut self, s: &str) -> &mut Self {
        self.uvarint(s.len() as u64 + 1);
        self.bytes.extend_from_slice(s.as_bytes());
        self
    }

    /// An empty set of tagged fields.
    pub fn no_tags(&mut self) -> &mut Self {
        self.u8(0)
    }

    /// The request with its length in front, ready to send.
    #[must_use]
    pub fn framed(mut self) -> Vec<u8> {
        let len = i32::try_from(self.bytes.len() - 4).unwrap_or(i32::MAX);
        self.bytes[..4].copy_from_slice(&len.to_be_bytes());
        self.bytes
    }
}

/// Reads a response's fields in order.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!(
                "the response ended early (wanted {n} more bytes, {} left)",
                self.bytes.len()
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// An `int32` array length; bounded by the bytes left (each entry
    /// takes at least one), so garbage cannot make a caller allocate.
    pub fn count(&mut self) -> Result<usize, String> {
        let n = self.i32()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.bytes.len())
            .ok_or_else(|| format!("an array of {n} entries"))
    }

    /// A nullable `string` (an `int16` length, -1 for null).
    pub fn nullable_string(&mut self) -> Result<Option<String>, String> {
        let n = self.i16()?;
        if n < 0 {
            return Ok(None);
        }
        let raw = self.take(usize::try_from(n).unwrap_or_default())?;
        String::from_utf8(raw.to_vec())
            .map(Some)
            .map_err(|_| "a string that is not UTF-8".to_owned())
    }

    /// A `string` that may not be null.
    pub fn string(&mut self) -> Result<String, String> {
        self.nullable_string()?
            .ok_or_else(|| "a null string where one is required".to_owned())
    }

    /// `bytes` (an `int32` length; -1, null, reads as empty).
    pub fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(&[]);
        }
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub fn uvarint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint longer than 64 bits".to_owned())
    }

    pub fn skip_tags(&mut self) -> Result<(), String> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let _tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|e| e.to_string())?;
            self.take(size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_its_length_then_header_v1_then_the_fields() {
        let mut r = Request::new(36, 1, 7, "wr");
        r.i32(2)
            .string("ab")
            .uvarint(150)
            .compact_string("x")
            .no_tags();
        let bytes = r.framed();
        assert_eq!(
            bytes,
            [
                0, 0, 0, 25, // length of what follows
                0, 36, 0, 1, 0, 0, 0, 7, 0, 2, b'w', b'r', // header v1
                0, 0, 0, 2, 0, 2, b'a', b'b', 0x96, 0x01, 2, b'x', 0,
            ]
        );
        let mut read = Reader::new(&bytes[4..]);
        assert_eq!(read.i16(), Ok(36));
        assert_eq!(read.i16(), Ok(1));
        assert_eq!(read.i32(), Ok(7));
        assert_eq!(read.string(), Ok("wr".to_owned()));
    }

    #[test]
    fn fields_are_read_in_order_and_a_short_read_is_an_error() {
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 2, 0x96, 0x01, 0, 0, 0, 9]);
        assert_eq!(r.i16(), Ok(1));
        assert_eq!(r.i32(), Ok(2));
        assert_eq!(r.uvarint(), Ok(150));
        assert!(r.count().unwrap_err().contains("9 entries"));
        assert!(r.i64().is_err());
    }
}
