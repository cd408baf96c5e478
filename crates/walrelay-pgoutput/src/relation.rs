//! Relation cache and by-name row access.
//!
//! Insert/Update/Delete carry only a relation oid and positional column
//! values; the column names and types come from the Relation message that
//! PostgreSQL sends before a table's first change in a session and again
//! whenever its definition changes. [`RelationCache`] keeps the latest one
//! per oid (a newer Relation replaces the older, so `ALTER TABLE` is picked
//! up), and [`Row`] pairs a tuple with its relation so values can be read by
//! column name.
//!
//! Name lookups use a per-relation index of column positions sorted by name,
//! built once when the Relation is inserted: lookups are `O(log n)` without
//! copying any column names.

use std::collections::HashMap;

use crate::message::{Oid, Relation, RelationColumn};
use crate::tuple::{ColumnValue, TupleData};
use bytes::Bytes;

/// A cached relation plus its name index.
#[derive(Debug, Clone)]
struct Entry {
    relation: Relation,
    /// Column positions sorted by column name.
    by_name: Vec<usize>,
}

impl Entry {
    fn new(relation: Relation) -> Self {
        let mut by_name: Vec<usize> = (0..relation.columns.len()).collect();
        by_name.sort_by(|&a, &b| relation.columns[a].name.cmp(&relation.columns[b].name));
        Entry { relation, by_name }
    }

    fn position(&self, name: &str) -> Option<usize> {
        let cols = &self.relation.columns;
        self.by_name
            .binary_search_by(|&i| cols[i].name.as_str().cmp(name))
            .ok()
            .map(|k| self.by_name[k])
    }
}

/// Why a tuple could not be paired with a relation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// No Relation message with this oid has been seen.
    #[error("unknown relation id {0}: no Relation message received for it")]
    UnknownRelation(Oid),
    /// The tuple's column count differs from the relation's.
    #[error("tuple has {actual} columns but relation {relation_id} has {expected}")]
    ColumnCountMismatch {
        /// The relation oid.
        relation_id: Oid,
        /// Columns in the Relation message.
        expected: usize,
        /// Columns in the tuple.
        actual: usize,
    },
}

/// Why a column value could not be read from a [`Row`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnError {
    /// The relation has no column with this name.
    #[error("no column named {0:?}")]
    NoSuchColumn(String),
    /// The value is an unchanged TOAST value whose content was not sent.
    #[error("column {0:?} is an unchanged TOAST value; its content was not sent")]
    UnchangedToast(String),
    /// `text` was asked for a column sent in binary format.
    #[error("column {0:?} was sent in binary format, not text")]
    NotText(String),
    /// A text value is not valid UTF-8.
    #[error("column {0:?} is not valid UTF-8")]
    InvalidUtf8(String),
}

/// The latest Relation message per relation oid.
#[derive(Debug, Clone, Default)]
pub struct RelationCache {
    entries: HashMap<Oid, Entry>,
}

impl RelationCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `relation`, replacing (and returning) any earlier version.
    pub fn insert(&mut self, relation: Relation) -> Option<Relation> {
        self.entries
            .insert(relation.id, Entry::new(relation))
            .map(|e| e.relation)
    }

    /// The latest Relation for `id`.
    #[must_use]
    pub fn get(&self, id: Oid) -> Option<&Relation> {
        self.entries.get(&id).map(|e| &e.relation)
    }

    /// Removes and returns the Relation for `id`.
    pub fn remove(&mut self, id: Oid) -> Option<Relation> {
        self.entries.remove(&id).map(|e| e.relation)
    }

    /// Number of cached relations.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` if nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets everything, e.g. on reconnect (PostgreSQL resends Relations
    /// in every new session).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Pairs `tuple` with the relation `relation_id` for by-name access.
    pub fn row<'a>(&'a self, relation_id: Oid, tuple: &'a TupleData) -> Result<Row<'a>, RowError> {
        let entry = self
            .entries
            .get(&relation_id)
            .ok_or(RowError::UnknownRelation(relation_id))?;
        let expected = entry.relation.columns.len();
        let actual = tuple.columns.len();
        if expected != actual {
            return Err(RowError::ColumnCountMismatch {
                relation_id,
                expected,
                actual,
            });
        }
        Ok(Row { entry, tuple })
    }
}

/// A tuple viewed through its relation: values by column name.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    entry: &'a Entry,
    tuple: &'a TupleData,
}

impl<'a> Row<'a> {
    /// The relation this row belongs to.
    #[must_use]
    pub fn relation(&self) -> &'a Relation {
        &self.entry.relation
    }

    /// The raw value of column `name`, or `None` if there is no such column.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&'a ColumnValue> {
        // `row()` checked that both have the same length.
        self.entry
            .position(name)
            .and_then(|i| self.tuple.columns.get(i))
    }

    fn value(&self, name: &str) -> Result<&'a ColumnValue, ColumnError> {
        self.get(name)
            .ok_or_else(|| ColumnError::NoSuchColumn(name.to_owned()))
    }

    /// A text-format value as `&str` (validated, not copied); `None` for
    /// NULL. Errors for a missing column, an unchanged TOAST value, a
    /// binary-format value or invalid UTF-8.
    pub fn text(&self, name: &str) -> Result<Option<&'a str>, ColumnError> {
        match self.value(name)? {
            ColumnValue::Null => Ok(None),
            ColumnValue::Text(b) => std::str::from_utf8(b)
                .map(Some)
                .map_err(|_| ColumnError::InvalidUtf8(name.to_owned())),
            ColumnValue::Binary(_) => Err(ColumnError::NotText(name.to_owned())),
            ColumnValue::UnchangedToast => Err(ColumnError::UnchangedToast(name.to_owned())),
        }
    }

    /// The raw value bytes, text or binary format; `None` for NULL. Errors
    /// for a missing column or an unchanged TOAST value.
    pub fn bytes(&self, name: &str) -> Result<Option<&'a Bytes>, ColumnError> {
        let index = self
            .entry
            .position(name)
            .ok_or_else(|| ColumnError::NoSuchColumn(name.to_owned()))?;
        self.bytes_at(index)
    }

    /// The raw value bytes of the column at `index` in the relation (a
    /// position found once per Relation, so a row costs no name lookup),
    /// text or binary format; `None` for NULL. Errors for a position past
    /// the relation's columns or an unchanged TOAST value.
    pub fn bytes_at(&self, index: usize) -> Result<Option<&'a Bytes>, ColumnError> {
        let Some(value) = self.tuple.columns.get(index) else {
            return Err(ColumnError::NoSuchColumn(format!("#{index}")));
        };
        match value {
            ColumnValue::Null => Ok(None),
            ColumnValue::Text(b) | ColumnValue::Binary(b) => Ok(Some(b)),
            ColumnValue::UnchangedToast => Err(ColumnError::UnchangedToast(
                self.entry.relation.columns[index].name.clone(),
            )),
        }
    }

    /// Columns and values in relation order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a RelationColumn, &'a ColumnValue)> + 'a {
        self.entry
            .relation
            .columns
            .iter()
            .zip(self.tuple.columns.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ReplicaIdentity;

    fn col(name: &str, key: bool) -> RelationColumn {
        RelationColumn {
            flags: u8::from(key),
            name: name.to_owned(),
            type_oid: 25,
            type_modifier: -1,
        }
    }

    fn relation(id: Oid, cols: &[&str]) -> Relation {
        Relation {
            xid: None,
            id,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: cols
                .iter()
                .enumerate()
                .map(|(i, c)| col(c, i == 0))
                .collect(),
        }
    }

    fn tuple(values: Vec<ColumnValue>) -> TupleData {
        TupleData { columns: values }
    }

    #[test]
    fn row_by_name() {
        let mut cache = RelationCache::new();
        assert!(cache
            .insert(relation(7, &["id", "name", "data", "blob", "big"]))
            .is_none());
        let t = tuple(vec![
            ColumnValue::Text(Bytes::from_static(b"1")),
            ColumnValue::Null,
            ColumnValue::Text(Bytes::from_static(b"\xff")),
            ColumnValue::Binary(Bytes::from_static(b"\x00\x01")),
            ColumnValue::UnchangedToast,
        ]);
        let row = cache.row(7, &t).unwrap();
        assert_eq!(row.relation().id, 7);
        assert_eq!(row.text("id"), Ok(Some("1")));
        assert_eq!(row.text("name"), Ok(None));
        assert_eq!(
            row.text("data"),
            Err(ColumnError::InvalidUtf8("data".into()))
        );
        assert_eq!(row.text("blob"), Err(ColumnError::NotText("blob".into())));
        assert_eq!(
            row.text("big"),
            Err(ColumnError::UnchangedToast("big".into()))
        );
        assert_eq!(
            row.text("nope"),
            Err(ColumnError::NoSuchColumn("nope".into()))
        );
        assert_eq!(
            row.bytes("blob").unwrap().map(|b| &b[..]),
            Some(&b"\x00\x01"[..])
        );
        assert_eq!(
            row.bytes("data").unwrap().map(|b| &b[..]),
            Some(&b"\xff"[..])
        );
        assert_eq!(row.bytes("name"), Ok(None));
        assert_eq!(
            row.bytes("big"),
            Err(ColumnError::UnchangedToast("big".into()))
        );
        // By position: the same values and errors, names from the relation.
        assert_eq!(
            row.bytes_at(3).unwrap().map(|b| &b[..]),
            Some(&b"\x00\x01"[..])
        );
        assert_eq!(row.bytes_at(1), Ok(None));
        assert_eq!(
            row.bytes_at(4),
            Err(ColumnError::UnchangedToast("big".into()))
        );
        assert_eq!(row.bytes_at(5), Err(ColumnError::NoSuchColumn("#5".into())));
        assert_eq!(row.get("name"), Some(&ColumnValue::Null));
        assert_eq!(row.get("missing"), None);
        let names: Vec<_> = row.iter().map(|(c, _)| c.name.as_str()).collect();
        assert_eq!(names, ["id", "name", "data", "blob", "big"]);
        assert!(row.iter().next().unwrap().0.is_key());
    }

    #[test]
    fn row_errors() {
        let mut cache = RelationCache::new();
        let t = tuple(vec![ColumnValue::Null]);
        assert_eq!(cache.row(1, &t).unwrap_err(), RowError::UnknownRelation(1));
        cache.insert(relation(1, &["a", "b"]));
        assert_eq!(
            cache.row(1, &t).unwrap_err(),
            RowError::ColumnCountMismatch {
                relation_id: 1,
                expected: 2,
                actual: 1
            }
        );
    }

    #[test]
    fn newer_relation_replaces_older() {
        let mut cache = RelationCache::new();
        cache.insert(relation(1, &["a"]));
        let old = cache.insert(relation(1, &["b", "a"])).unwrap();
        assert_eq!(old.columns.len(), 1);
        assert_eq!(cache.len(), 1);
        let t = tuple(vec![
            ColumnValue::Text(Bytes::from_static(b"B")),
            ColumnValue::Text(Bytes::from_static(b"A")),
        ]);
        let row = cache.row(1, &t).unwrap();
        assert_eq!(row.text("a"), Ok(Some("A")));
        assert_eq!(row.text("b"), Ok(Some("B")));
        assert!(cache.remove(1).is_some());
        assert!(cache.is_empty());
        cache.insert(relation(2, &[]));
        cache.clear();
        assert!(cache.get(2).is_none());
    }

    #[test]
    fn many_columns_lookup() {
        let names: Vec<String> = (0..200).map(|i| format!("c{i:03}")).rev().collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut cache = RelationCache::new();
        cache.insert(relation(9, &refs));
        let t = tuple(
            names
                .iter()
                .map(|n| ColumnValue::Text(Bytes::from(n.clone())))
                .collect(),
        );
        let row = cache.row(9, &t).unwrap();
        for n in &names {
            assert_eq!(row.text(n), Ok(Some(n.as_str())));
        }
    }
}
