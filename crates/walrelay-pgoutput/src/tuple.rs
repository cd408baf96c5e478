//! TupleData: the row images inside Insert, Update and Delete.
//!
//! Column values are kept as slices of the input buffer in whichever format
//! the publisher chose (text unless the subscription asked for `binary`), so
//! a row can be forwarded or re-encoded without copying every value first.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::reader::Reader;

/// One column of a [`TupleData`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// `'n'`: SQL NULL (also used for non-key columns of a key-only old
    /// tuple).
    Null,
    /// `'u'`: an unchanged TOASTed value whose content PostgreSQL did not
    /// send; the consumer must keep the previous value.
    UnchangedToast,
    /// `'t'`: the value in the type's text output format.
    Text(Bytes),
    /// `'b'`: the value in the type's binary send format.
    Binary(Bytes),
}

impl ColumnValue {
    /// `true` for [`ColumnValue::Null`].
    #[must_use]
    pub fn is_null(&self) -> bool {
        matches!(self, ColumnValue::Null)
    }

    /// The raw value bytes for `Text` and `Binary`, `None` otherwise.
    #[must_use]
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            ColumnValue::Text(b) | ColumnValue::Binary(b) => Some(b),
            ColumnValue::Null | ColumnValue::UnchangedToast => None,
        }
    }
}

/// A row image: one [`ColumnValue`] per column of the relation, in the
/// column order of the matching Relation message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData {
    /// The columns, in relation column order.
    pub columns: Vec<ColumnValue>,
}

impl TupleData {
    /// Decodes `Int16 ncols` followed by `ncols` column entries.
    pub(crate) fn decode(r: &mut Reader) -> Result<TupleData, DecodeError> {
        let n = r.i16("tuple column count")?;
        let n = Reader::count(n.into(), "tuple column count")?;
        // Every column takes at least one byte, so never reserve more slots
        // than there are bytes left: a bogus count of 32767 in a 10-byte
        // message must not allocate 32767 entries.
        let mut columns = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            let value = match r.u8("tuple column kind")? {
                b'n' => ColumnValue::Null,
                b'u' => ColumnValue::UnchangedToast,
                b't' => ColumnValue::Text(r.len_prefixed("text column value")?),
                b'b' => ColumnValue::Binary(r.len_prefixed("binary column value")?),
                other => return Err(DecodeError::UnknownTupleKind(other)),
            };
            columns.push(value);
        }
        Ok(TupleData { columns })
    }
}

/// The old row image of an Update or Delete.
///
/// Which one PostgreSQL sends depends on the table's `REPLICA IDENTITY`:
/// `Key` carries only the replica-identity columns (other columns are
/// `Null`), `Full` carries the entire old row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `'K'`: replica identity key columns only.
    Key(TupleData),
    /// `'O'`: the full old row (`REPLICA IDENTITY FULL`).
    Full(TupleData),
}

impl OldTuple {
    /// The tuple, whichever kind it is.
    #[must_use]
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }

    /// `true` for [`OldTuple::Key`].
    #[must_use]
    pub fn is_key(&self) -> bool {
        matches!(self, OldTuple::Key(_))
    }
}
