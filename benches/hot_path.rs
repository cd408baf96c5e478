//! Per-event cost of walrelay's hot path: pgoutput decoding, key
//! derivation, envelope parsing, record building, partitioning and the
//! checkpoint tracker.
//!
//! Run with `cargo bench --bench hot_path` (see `docs/benchmarks.md`).
//! Criterion times every case; afterwards each case runs again, outside
//! criterion's timing loop, under a counting global allocator, and a table
//! of ns/event, allocations/event and bytes/event is printed.
//!
//! Under `cargo test --all-targets` (criterion's test mode) every case runs
//! once and the table is not printed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use walrelay::config::{Config, KeylessPlacement};
use walrelay::engine::checkpoint::CheckpointTracker;
use walrelay::engine::key::{EventKey, KeyAssigner};
use walrelay::engine::partition::{partition_for_key, partition_for_keyless};
use walrelay::engine::route::{MessageRoute, Router, TxInfo};
use walrelay::envelope;
use walrelay_pgoutput::{
    Decoder, Insert, Lsn, Message, PgOutputMessage, PgTimestamp, RelationCache,
};

// ---------------------------------------------------------------------------
// Counting allocator
// ---------------------------------------------------------------------------

/// Allocation calls (`alloc`, `alloc_zeroed`, `realloc`) since start.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes requested by those calls (`realloc` counts its new size).
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);

/// `System`, plus two counters.
struct CountingAllocator;

fn count(bytes: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

// SAFETY: every method forwards its arguments unchanged to `System` and
// returns `System`'s result, so `System` upholds the `GlobalAlloc` contract.
// The only addition is bumping two atomic counters, which neither allocates
// nor touches the memory handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocation_counters() -> (u64, u64) {
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        ALLOCATED_BYTES.load(Ordering::Relaxed),
    )
}

// ---------------------------------------------------------------------------
// Input bytes (same layouts as crates/walrelay-pgoutput/tests/common)
// ---------------------------------------------------------------------------

/// Big-endian pgoutput message builder.
struct Wire(Vec<u8>);

impl Wire {
    fn tag(tag: u8) -> Self {
        Wire(vec![tag])
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn cstr(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// TupleData with text columns only.
    fn text_tuple(mut self, cols: &[&[u8]]) -> Self {
        self = self.i16(i16::try_from(cols.len()).expect("few columns"));
        for col in cols {
            let len = i32::try_from(col.len()).expect("small column");
            self = self.u8(b't').i32(len).raw(col);
        }
        self
    }
    fn build(self) -> Bytes {
        Bytes::from(self.0)
    }
}

const LSN: u64 = 0x16_B374_D848;
const XID: u32 = 7_654_321;
const TS: i64 = 777_888_999_000_123; // microseconds since 2000-01-01
const OUTBOX_REL: u32 = 16_384;
const TEXT_OID: u32 = 25;
const JSONB_OID: u32 = 3802;
const RAW_PREFIX: &str = "app.events";

/// Transactional logical message (`M`).
fn message_bytes(prefix: &str, content: &[u8]) -> Bytes {
    Wire::tag(b'M')
        .u8(1)
        .u64(LSN)
        .cstr(prefix)
        .i32(i32::try_from(content.len()).expect("small content"))
        .raw(content)
        .build()
}

/// Relation (`R`) of `public.outbox` with Debezium's outbox columns.
fn outbox_relation_bytes() -> Bytes {
    let columns: [(&str, u32, u8); 5] = [
        ("id", TEXT_OID, 1),
        ("aggregatetype", TEXT_OID, 0),
        ("aggregateid", TEXT_OID, 0),
        ("type", TEXT_OID, 0),
        ("payload", JSONB_OID, 0),
    ];
    let mut wire = Wire::tag(b'R')
        .u32(OUTBOX_REL)
        .cstr("public")
        .cstr("outbox")
        .u8(b'd')
        .i16(5);
    for (name, oid, flags) in columns {
        wire = wire.u8(flags).cstr(name).u32(oid).i32(-1);
    }
    wire.build()
}

const OUTBOX_ROW: [&[u8]; 5] = [
    b"3f2504e0-4f89-11d3-9a0c-0305e82c3301",
    b"invoice",
    b"invoice-7",
    b"InvoiceIssued",
    br#"{"invoice": "invoice-7", "customer": "customer-42", "total": 30, "currency": "EUR"}"#,
];

/// Insert (`I`) of one outbox row, 5 text columns.
fn outbox_insert_bytes() -> Bytes {
    Wire::tag(b'I')
        .u32(OUTBOX_REL)
        .u8(b'N')
        .text_tuple(&OUTBOX_ROW)
        .build()
}

/// `len` bytes of JSON-ish text.
fn payload(len: usize) -> Vec<u8> {
    let mut p = br#"{"order": 1, "note": ""#.to_vec();
    while p.len() < len - 2 {
        p.push(b'a' + (p.len() % 26) as u8);
    }
    p.extend_from_slice(b"\"}");
    p
}

/// Envelope content as `walrelay.emit` writes it.
fn envelope_content(payload_len: usize) -> Bytes {
    Bytes::from(envelope::encode(
        "orders",
        Some("customer-42"),
        &[("trace-id", "4bf92f3577b34da6")],
        Some(&payload(payload_len)),
    ))
}

fn decode_message(decoder: &mut Decoder, buf: &Bytes) -> Message {
    match decoder.decode(buf.clone()) {
        Ok(PgOutputMessage::Message(m)) => m,
        other => panic!("expected a Message, got {other:?}"),
    }
}

fn decode_insert(decoder: &mut Decoder, buf: &Bytes) -> Insert {
    match decoder.decode(buf.clone()) {
        Ok(PgOutputMessage::Insert(i)) => i,
        other => panic!("expected an Insert, got {other:?}"),
    }
}

fn outbox_cache() -> RelationCache {
    let mut cache = RelationCache::new();
    match Decoder::new().decode(outbox_relation_bytes()) {
        Ok(PgOutputMessage::Relation(r)) => cache.insert(r),
        other => panic!("expected a Relation, got {other:?}"),
    };
    cache
}

fn router() -> Router {
    let toml = format!(
        "[[messages]]\nprefix = \"{RAW_PREFIX}\"\ntopic = \"app-events\"\n\n\
         [[outbox]]\ntable = \"public.outbox\"\n"
    );
    let config = Config::from_toml(&toml, "bench.toml").expect("bench config parses");
    Router::new(&config, "7312345678901234567/app/walrelay")
}

fn tx_info() -> TxInfo {
    TxInfo::new(Lsn(LSN + 0x1000), XID, PgTimestamp(TS))
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// One line of the final table.
struct Row {
    name: String,
    ns_per_event: f64,
    allocations_per_event: f64,
    bytes_per_event: f64,
}

struct Bench {
    criterion: Criterion,
    /// `cargo bench` (not `cargo test`, `--test` or `--list`).
    full: bool,
    rows: Vec<Row>,
}

impl Bench {
    /// Benchmarks `f`, one call of which handles `events` events: criterion
    /// first, then the counted and timed runs for the table.
    fn case<R>(&mut self, group: &str, name: &str, events: u64, mut f: impl FnMut() -> R) {
        let mut g = self.criterion.benchmark_group(group);
        g.throughput(Throughput::Elements(events));
        g.bench_function(name, |b| b.iter(&mut f));
        g.finish();

        // Warm up: first calls may fill caches or grow buffers once.
        let warm_up = if self.full { 100 } else { 1 };
        for _ in 0..warm_up {
            black_box(f());
        }

        // Allocations, counted outside any timing.
        let iterations: u64 = if self.full { 1_000 } else { 1 };
        let (allocs_before, bytes_before) = allocation_counters();
        for _ in 0..iterations {
            black_box(f());
        }
        let (allocs_after, bytes_after) = allocation_counters();
        let per_event = (iterations * events) as f64;

        // A plain timed loop (~0.3 s), for the table only.
        let budget = if self.full {
            Duration::from_millis(300)
        } else {
            Duration::ZERO
        };
        let mut timed_iterations: u64 = 0;
        let started = Instant::now();
        loop {
            for _ in 0..64 {
                black_box(f());
            }
            timed_iterations += 64;
            if started.elapsed() >= budget {
                break;
            }
        }
        let elapsed = started.elapsed();

        self.rows.push(Row {
            name: format!("{group}/{name}"),
            ns_per_event: elapsed.as_nanos() as f64 / (timed_iterations * events) as f64,
            allocations_per_event: (allocs_after - allocs_before) as f64 / per_event,
            bytes_per_event: (bytes_after - bytes_before) as f64 / per_event,
        });
    }

    fn print_table(&self) {
        if !self.full {
            println!(
                "hot_path: {} cases ran once (test mode); `cargo bench --bench hot_path` \
                 prints the per-event table",
                self.rows.len()
            );
            return;
        }
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
        println!();
        println!("Per event (timed loop ~0.3 s; allocations counted over 1000 calls):");
        println!();
        println!(
            "| {:width$} | {:>9} | {:>13} | {:>11} |",
            "benchmark", "ns/event", "allocs/event", "bytes/event"
        );
        println!(
            "|-{:-<width$}-|-{:->9}:|-{:->13}:|-{:->11}:|",
            "", "", "", ""
        );
        for r in &self.rows {
            println!(
                "| {:width$} | {:>9.1} | {:>13.2} | {:>11.1} |",
                r.name, r.ns_per_event, r.allocations_per_event, r.bytes_per_event
            );
        }
    }
}

/// Criterion's own rule: benchmark only for `--bench` without `--test`
/// (cargo test passes neither) and not for `--list`.
fn is_full_run() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    has("--bench") && !has("--test") && !has("--list")
}

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

fn pgoutput(bench: &mut Bench) {
    let message = message_bytes(RAW_PREFIX, &payload(200));
    let mut decoder = Decoder::new();
    bench.case("pgoutput", "decode_message_200b", 1, || {
        decode_message(&mut decoder, &message)
    });

    let insert = outbox_insert_bytes();
    let mut decoder = Decoder::new();
    bench.case("pgoutput", "decode_insert_5_text_cols", 1, || {
        decode_insert(&mut decoder, &insert)
    });

    let cache = outbox_cache();
    let decoded = decode_insert(&mut Decoder::new(), &insert);
    let names = ["id", "aggregatetype", "aggregateid", "type", "payload"];
    bench.case("pgoutput", "row_read_5_cols_by_name", 1, || {
        let row = cache.row(OUTBOX_REL, &decoded.new).expect("known relation");
        let mut total = 0;
        for name in names {
            total += row.text(name).expect("text").map_or(0, str::len);
        }
        total
    });
}

fn keys(bench: &mut Bench) {
    let mut assigner = KeyAssigner::new();
    let mut final_lsn = LSN;
    bench.case("key", "assign_tx_100_events", 100, || {
        final_lsn += 1 << 20;
        assigner.begin(Lsn(final_lsn)).expect("begin");
        let mut last = EventKey::MIN;
        for i in 0..100 {
            last = assigner
                .event(Lsn(final_lsn - 0x10_000 + i * 64))
                .expect("event");
        }
        assigner
            .commit(Lsn(final_lsn), Lsn(final_lsn + 56))
            .expect("commit");
        last
    });

    let key = EventKey::new(LSN, LSN - 0x400);
    bench.case("key", "write_hex", 1, || {
        let mut buf = [0u8; 32];
        black_box(key).write_hex(&mut buf).as_bytes()[31]
    });
}

fn envelopes(bench: &mut Bench) {
    let small = envelope_content(200);
    bench.case("envelope", "parse_200b", 1, || {
        envelope::parse(&small).expect("valid envelope")
    });
    let large = envelope_content(4096);
    bench.case("envelope", "parse_4kb", 1, || {
        envelope::parse(&large).expect("valid envelope")
    });
}

fn records(bench: &mut Bench) {
    let tx = tx_info();
    let key = EventKey::new(LSN + 0x1000, LSN);

    let raw = decode_message(
        &mut Decoder::new(),
        &message_bytes(RAW_PREFIX, &payload(200)),
    );
    let mut router_raw = router();
    bench.case("route", "raw_message_record_200b", 1, || {
        let route = router_raw.classify_message(&raw).expect("routed");
        assert!(matches!(route, MessageRoute::Raw(_)));
        router_raw
            .message_record(&route, Some(&tx), key, &raw)
            .expect("record")
    });

    let env = decode_message(
        &mut Decoder::new(),
        &message_bytes(envelope::PREFIX, &envelope_content(200)),
    );
    let mut router_env = router();
    bench.case("route", "envelope_message_record_200b", 1, || {
        let route = router_env.classify_message(&env).expect("routed");
        router_env
            .message_record(&route, Some(&tx), key, &env)
            .expect("record")
    });

    let cache = outbox_cache();
    let insert = decode_insert(&mut Decoder::new(), &outbox_insert_bytes());
    let router_outbox = router();
    let at = router_outbox
        .check_relation(cache.get(OUTBOX_REL).expect("known relation"), Lsn(LSN))
        .expect("an outbox table");
    bench.case("route", "outbox_record", 1, || {
        let row = cache.row(OUTBOX_REL, &insert.new).expect("known relation");
        router_outbox
            .outbox_record(&tx, key, Lsn(LSN), &row, &at)
            .expect("record")
    });

    bench.case("partition", "for_key", 1, || {
        partition_for_key(black_box(b"customer-42"), 12)
    });
    bench.case("partition", "for_keyless", 1, || {
        partition_for_keyless(black_box(key), 12, KeylessPlacement::WalRange)
    });
}

fn checkpoints(bench: &mut Bench) {
    let mut tracker = CheckpointTracker::new();
    let mut end_lsn = LSN;
    bench.case("checkpoint", "tx_100_events", 100, || {
        let first = tracker.register_event(300);
        for _ in 1..100 {
            tracker.register_event(300);
        }
        end_lsn += 1 << 16;
        tracker.commit(Lsn(end_lsn));
        for seq in first..first + 100 {
            tracker.ack(seq).expect("ack");
        }
        tracker.poll_confirm().expect("confirmable")
    });

    let mut tracker = CheckpointTracker::new();
    let mut end_lsn = LSN;
    bench.case("checkpoint", "tx_1_event", 1, || {
        let seq = tracker.register_event(300);
        end_lsn += 1 << 8;
        tracker.commit(Lsn(end_lsn));
        tracker.ack(seq).expect("ack");
        tracker.poll_confirm().expect("confirmable")
    });
}

fn main() {
    let full = is_full_run();
    let criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let mut bench = Bench {
        criterion,
        full,
        rows: Vec::new(),
    };
    pgoutput(&mut bench);
    keys(&mut bench);
    envelopes(&mut bench);
    records(&mut bench);
    checkpoints(&mut bench);
    bench.criterion.final_summary();
    bench.print_table();
}
