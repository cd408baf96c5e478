//! Fuzz target: any byte string, decoded under every option combination,
//! must yield a value or a typed error — never a panic, hang or huge
//! allocation. Decoded rows are also read through a `RelationCache` primed
//! with a fixed Relation, so the by-name row view is exercised too.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walrelay_pgoutput::{
    decode_with, DecodeOptions, Decoder, Oid, PgOutputMessage, Relation, RelationCache,
    RelationColumn, ReplicaIdentity, TupleData,
};

const COLUMNS: [&str; 4] = ["id", "name", "payload", "note"];

fn fixed_relation() -> Relation {
    Relation {
        xid: None,
        id: 16_384,
        namespace: "public".into(),
        name: "users".into(),
        replica_identity: ReplicaIdentity::Full,
        columns: COLUMNS
            .iter()
            .enumerate()
            .map(|(i, name)| RelationColumn {
                flags: u8::from(i == 0),
                name: (*name).into(),
                type_oid: 25,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn read_row(cache: &RelationCache, id: Oid, tuple: &TupleData) {
    if let Ok(row) = cache.row(id, tuple) {
        for name in COLUMNS.iter().copied().chain(["missing"]) {
            let _ = row.get(name);
            let _ = row.text(name);
            let _ = row.bytes(name);
        }
        for (col, value) in row.iter() {
            let _ = (col.is_key(), value.is_null());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let mut cache = RelationCache::new();
    cache.insert(fixed_relation());
    for in_stream in [false, true] {
        for parallel_streaming in [false, true] {
            let options = DecodeOptions {
                in_stream,
                parallel_streaming,
            };
            match decode_with(buf.clone(), options) {
                Ok(PgOutputMessage::Relation(rel)) => {
                    // A fuzzed Relation replaces the fixed one, as a real
                    // ALTER TABLE would; then read rows through it.
                    let id = rel.id;
                    cache.insert(rel);
                    let empty = TupleData::default();
                    read_row(&cache, id, &empty);
                    cache.insert(fixed_relation());
                }
                Ok(PgOutputMessage::Insert(m)) => read_row(&cache, m.relation_id, &m.new),
                Ok(PgOutputMessage::Update(m)) => {
                    read_row(&cache, m.relation_id, &m.new);
                    if let Some(old) = &m.old {
                        read_row(&cache, m.relation_id, old.tuple());
                    }
                }
                Ok(PgOutputMessage::Delete(m)) => read_row(&cache, m.relation_id, m.old.tuple()),
                Ok(PgOutputMessage::Message(m)) => {
                    let _ = (m.prefix_str(), m.content_str(), m.transactional());
                }
                Ok(PgOutputMessage::Begin(m)) => {
                    let _ = (m.timestamp.to_system_time(), m.final_lsn.to_string());
                }
                Ok(other) => {
                    let _ = other.kind();
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }
    // The stateful decoder on the same bytes twice (e.g. Stream Start twice).
    let mut decoder = Decoder::new();
    let _ = decoder.decode(buf.clone());
    let _ = decoder.decode(buf);
});
