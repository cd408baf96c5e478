//! pgoutput messages as bytes, for tests that feed a decoder (or the
//! relay's event step) hand-written input: a big-endian builder that
//! spells out each field in wire order.

use bytes::Bytes;

/// Big-endian message builder.
#[derive(Default)]
pub struct B(Vec<u8>);

/// A TupleData column for the builder.
#[derive(Clone, Copy)]
pub enum Col<'a> {
    Null,
    Toast,
    Text(&'a [u8]),
    Bin(&'a [u8]),
}

impl B {
    pub fn tag(tag: u8) -> Self {
        B(vec![tag])
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn cstr(mut self, s: &[u8]) -> Self {
        self.0.extend_from_slice(s);
        self.0.push(0);
        self
    }
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Optional leading xid of streamed blocks.
    pub fn xid(self, xid: Option<u32>) -> Self {
        match xid {
            Some(x) => self.u32(x),
            None => self,
        }
    }
    pub fn tuple(mut self, cols: &[Col<'_>]) -> Self {
        self = self.i16(cols.len() as i16);
        for c in cols {
            self = match *c {
                Col::Null => self.u8(b'n'),
                Col::Toast => self.u8(b'u'),
                Col::Text(v) => self.u8(b't').i32(v.len() as i32).raw(v),
                Col::Bin(v) => self.u8(b'b').i32(v.len() as i32).raw(v),
            };
        }
        self
    }
    pub fn build(self) -> Bytes {
        Bytes::from(self.0)
    }
}
