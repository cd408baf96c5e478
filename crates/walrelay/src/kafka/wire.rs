//! Reading Kafka protocol responses field by field, for the requests
//! walrelay sends itself ([`super::requests`], and the SASL exchange of
//! [`super::conn`]):
//! big-endian integers, unsigned varints and tagged fields, each read
//! checked against the bytes left.

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
    fn fields_are_read_in_order_and_a_short_read_is_an_error() {
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 2, 0x96, 0x01, 0, 0, 0, 9]);
        assert_eq!(r.i16(), Ok(1));
        assert_eq!(r.i32(), Ok(2));
        assert_eq!(r.uvarint(), Ok(150));
        assert!(r.count().unwrap_err().contains("9 entries"));
        assert!(r.i64().is_err());
    }
}
