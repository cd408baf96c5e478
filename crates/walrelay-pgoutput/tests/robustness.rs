//! Malformed input: every truncation, unknown tags, trailing bytes, absurd
//! declared lengths, and property tests that arbitrary or mutated input
//! never panics.

mod common;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use walrelay_pgoutput::*;

const KNOWN_TAGS: &[u8] = b"BCORYIUDTMSEcAbPpKr";

fn all_options() -> [DecodeOptions; 4] {
    [
        opts(false, false),
        opts(true, false),
        opts(false, true),
        opts(true, true),
    ]
}

#[test]
fn every_truncation_is_an_error() {
    for (name, buf, options) in all() {
        for len in 0..buf.len() {
            let prefix = buf.slice(..len);
            match decode_with(prefix, options) {
                Err(DecodeError::UnexpectedEof { .. } | DecodeError::MissingNul { .. }) => {}
                other => panic!("{name} truncated to {len}: {other:?}"),
            }
            // Wrong options must not panic either.
            for o in all_options() {
                let _ = decode_with(buf.slice(..len), o);
            }
        }
    }
}

#[test]
fn every_trailing_byte_is_an_error() {
    for (name, buf, options) in all() {
        for extra in [&b"\0"[..], b"xyz"] {
            let mut v = buf.to_vec();
            v.extend_from_slice(extra);
            match decode_with(Bytes::from(v), options) {
                Err(DecodeError::TrailingBytes { remaining, .. }) if remaining == extra.len() => {}
                other => panic!("{name} + {extra:?}: {other:?}"),
            }
        }
    }
}

#[test]
fn empty_buffer() {
    assert_eq!(
        decode(Bytes::new(), false),
        Err(DecodeError::UnexpectedEof {
            what: "message tag",
            needed: 1,
            remaining: 0
        })
    );
}

#[test]
fn unknown_tags() {
    for tag in 0..=u8::MAX {
        if KNOWN_TAGS.contains(&tag) {
            continue;
        }
        for buf in [vec![tag], vec![tag, 0, 0, 0, 0, 0, 0, 0, 0]] {
            for o in all_options() {
                assert_eq!(
                    decode_with(Bytes::from(buf.clone()), o),
                    Err(DecodeError::UnknownMessage(tag))
                );
            }
        }
    }
}

#[test]
fn unknown_tuple_kind_and_markers() {
    let buf = B::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'x').build();
    assert_eq!(decode(buf, false), Err(DecodeError::UnknownTupleKind(b'x')));

    let buf = B::tag(b'I').u32(1).u8(b'K').i16(0).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "insert tuple marker",
            value: i64::from(b'K')
        })
    );
    let buf = B::tag(b'U').u32(1).u8(b'X').i16(0).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "update tuple marker",
            value: i64::from(b'X')
        })
    );
    // Old tuple followed by something other than 'N'.
    let buf = B::tag(b'U').u32(1).u8(b'K').i16(0).u8(b'K').i16(0).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "update tuple marker",
            value: i64::from(b'K')
        })
    );
    let buf = B::tag(b'D').u32(1).u8(b'N').i16(0).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "delete tuple marker",
            value: i64::from(b'N')
        })
    );
}

#[test]
fn streamed_fixture_without_stream_flag_misparses_to_error() {
    // Data messages decoded with the wrong in_stream setting must fail
    // rather than silently produce garbage (for these fixtures).
    assert!(decode(insert(Some(XID)), false).is_err());
    assert!(decode(insert(None), true).is_err());
}

#[test]
fn huge_declared_counts_fail_fast() {
    // Tuple column count 32767 with a handful of bytes.
    let buf = B::tag(b'I').u32(1).u8(b'N').i16(i16::MAX).u8(b'n').build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::UnexpectedEof {
            what: "tuple column kind",
            needed: 1,
            remaining: 0
        })
    );
    // Negative counts.
    let buf = B::tag(b'I').u32(1).u8(b'N').i16(-1).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "tuple column count",
            value: -1
        })
    );
    let buf = B::tag(b'R')
        .u32(1)
        .cstr(b"s")
        .cstr(b"t")
        .u8(b'd')
        .i16(i16::MAX)
        .build();
    assert!(matches!(
        decode(buf, false),
        Err(DecodeError::UnexpectedEof {
            what: "relation column flags",
            ..
        })
    ));
    let buf = B::tag(b'R')
        .u32(1)
        .cstr(b"s")
        .cstr(b"t")
        .u8(b'd')
        .i16(-5)
        .build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "relation column count",
            value: -5
        })
    );
    // Truncate with i32::MAX relations: rejected before allocating.
    let buf = B::tag(b'T').i32(i32::MAX).u8(0).u32(1).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::UnexpectedEof {
            what: "truncate relation ids",
            needed: i32::MAX as usize * 4,
            remaining: 4
        })
    );
    let buf = B::tag(b'T').i32(-1).u8(0).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "truncate relation count",
            value: -1
        })
    );
}

#[test]
fn huge_declared_lengths_fail_fast() {
    let buf = B::tag(b'M')
        .u8(1)
        .u64(0)
        .cstr(b"p")
        .i32(i32::MAX)
        .raw(b"abc")
        .build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::UnexpectedEof {
            what: "message content",
            needed: i32::MAX as usize,
            remaining: 3
        })
    );
    let buf = B::tag(b'M').u8(1).u64(0).cstr(b"p").i32(-1).build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "message content",
            value: -1
        })
    );
    let buf = B::tag(b'I')
        .u32(1)
        .u8(b'N')
        .i16(1)
        .u8(b't')
        .i32(i32::MAX)
        .build();
    assert!(matches!(
        decode(buf, false),
        Err(DecodeError::UnexpectedEof {
            what: "text column value",
            needed,
            remaining: 0
        }) if needed == i32::MAX as usize
    ));
    let buf = B::tag(b'U')
        .u32(1)
        .u8(b'N')
        .i16(1)
        .u8(b'b')
        .i32(i32::MIN)
        .build();
    assert!(matches!(
        decode(buf, false),
        Err(DecodeError::InvalidValue {
            what: "binary column value",
            ..
        })
    ));
}

#[test]
fn missing_nul_and_invalid_utf8_names() {
    let buf = B::tag(b'O').u64(1).raw(b"no-nul").build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::MissingNul {
            what: "origin name"
        })
    );
    let buf = B::tag(b'Y').u32(1).cstr(b"ok").cstr(b"\xc3\x28").build();
    assert_eq!(
        decode(buf, false),
        Err(DecodeError::InvalidUtf8 { what: "type name" })
    );
}

/// Applies one mutation to `v`.
fn mutate(v: &mut Vec<u8>, kind: u8, pos: usize, byte: u8) {
    if v.is_empty() {
        v.push(byte);
        return;
    }
    let i = pos % v.len();
    match kind % 5 {
        0 => v[i] = byte,
        1 => v[i] ^= 1 << (byte % 8),
        2 => v.insert(i, byte),
        3 => {
            v.remove(i);
        }
        _ => v.truncate(i),
    }
}

fn exercise(buf: Bytes) {
    let mut cache = RelationCache::new();
    if let Ok(PgOutputMessage::Relation(r)) = decode(relation(None), false) {
        cache.insert(r);
    }
    for o in all_options() {
        match decode_with(buf.clone(), o) {
            Ok(PgOutputMessage::Relation(r)) => {
                cache.insert(r);
            }
            Ok(PgOutputMessage::Insert(m)) => touch_row(&cache, m.relation_id, &m.new),
            Ok(PgOutputMessage::Update(m)) => {
                touch_row(&cache, m.relation_id, &m.new);
                if let Some(old) = &m.old {
                    touch_row(&cache, m.relation_id, old.tuple());
                }
            }
            Ok(PgOutputMessage::Message(m)) => {
                let _ = m.prefix_str();
                let _ = m.content_str();
            }
            Ok(msg) => {
                let _ = format!("{msg:?}");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    let mut d = Decoder::new();
    let _ = d.decode(buf.clone());
    let _ = d.decode(buf);
}

fn touch_row(cache: &RelationCache, id: Oid, tuple: &TupleData) {
    if let Ok(row) = cache.row(id, tuple) {
        for name in ["id", "name", "payload", "note", "missing"] {
            let _ = row.get(name);
            let _ = row.text(name);
            let _ = row.bytes(name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(v in proptest::collection::vec(any::<u8>(), 0..256)) {
        exercise(Bytes::from(v));
    }

    #[test]
    fn arbitrary_bytes_with_known_tag_never_panic(
        tag in proptest::sample::select(KNOWN_TAGS),
        v in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut buf = vec![tag];
        buf.extend(v);
        exercise(Bytes::from(buf));
    }

    #[test]
    fn mutated_fixtures_never_panic(
        which in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..6),
    ) {
        let fixtures = all();
        let (_, buf, _) = &fixtures[which.index(fixtures.len())];
        let mut v = buf.to_vec();
        for (kind, pos, byte) in mutations {
            mutate(&mut v, kind, pos, byte);
        }
        exercise(Bytes::from(v));
    }
}

/// Writes every fixture to `fuzz/corpus/decode/` as a seed for cargo-fuzz.
/// Run explicitly: `cargo test -p walrelay-pgoutput --test robustness -- --ignored`.
#[test]
#[ignore = "writes files into the source tree; run to regenerate fuzz seeds"]
fn write_fuzz_seed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, buf, _) in all() {
        std::fs::write(dir.join(format!("seed-{name}")), &buf).unwrap();
    }
}

/// Replays the cargo-fuzz corpus (`fuzz/corpus/decode`) on every test run,
/// so what the fuzzer found interesting stays a regression test without a
/// nightly toolchain: each input decodes or errors, under every option set
/// and through the stateful decoder, and a decoded Insert reads as a row.
#[test]
fn every_fuzz_corpus_input_decodes_or_errors() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz corpus directory") {
        let buf = Bytes::from(std::fs::read(entry.expect("corpus entry").path()).unwrap());
        inputs += 1;
        for options in all_options() {
            if let Ok(PgOutputMessage::Relation(rel)) = decode_with(buf.clone(), options) {
                let mut cache = RelationCache::new();
                let id = rel.id;
                cache.insert(rel);
                let _ = cache.row(id, &TupleData::default());
            }
        }
        let mut decoder = Decoder::new();
        let _ = decoder.decode(buf.clone());
        let _ = decoder.decode(buf);
    }
    assert!(
        inputs >= 100,
        "only {inputs} corpus inputs in {}",
        dir.display()
    );
}
