//! Bad input, event by event (issue #5): every kind of event walrelay
//! cannot route either stops the relay with an error that names the fix
//! (no dead-letter topic), or becomes a dead-letter record that carries
//! the original bytes, the key the event would have had and the reason
//! (`[dead_letter] topic`). Nothing is dropped silently, and nothing past
//! a bad event is confirmed before it is dealt with.
//!
//! Real PostgreSQL and Tansu; the relay in-process with its audit trace.
//! Each test shares one cluster and one broker among its cases.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use support::{
    apply_high_water_marks, check_confirmations_follow_acks, key_of, spawn_relay, Env, WAIT,
};
use tokio::sync::{mpsc, watch};
use walrelay::commands::setup;
use walrelay::config::{Config, OutboxConfig};
use walrelay::engine::key::EventKey;
use walrelay::engine::pipeline::{self, RelayError, Trace, DEAD_LETTER_HINT};
use walrelay::engine::record::Record;
use walrelay::engine::sink::{KafkaSink, Recovery, SinkError};
use walrelay::envelope;
use walrelay::kafka::properties::SinkConfig;
use walrelay::metrics::Metrics;
use walrelay_pgoutput::Lsn;
use walrelay_testkit::{await_condition, read_until_quiet, ConsumedRecord};

const DLQ: &str = "walrelay.dead-letter";
const POLL: Duration = Duration::from_millis(50);

/// Outbox tables besides `public.outbox` (tests/support): one that lacks
/// the configured `type` column, one to ALTER while the relay runs.
const TABLES: &str = "
    CREATE TABLE outbox_legacy (
        id text PRIMARY KEY, aggregatetype text, aggregateid text, payload jsonb
    );
    CREATE TABLE outbox_alter (
        id text PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb
    );
";

async fn start_env() -> Result<(Env, Config)> {
    let env = Env::start().await?;
    env.client.batch_execute(TABLES).await?;
    let mut config = env.config(&env.bootstrap());
    for table in ["public.outbox_legacy", "public.outbox_alter"] {
        config.outbox.push(OutboxConfig {
            table: table.into(),
            topic: "outbox.event.{aggregatetype}".into(),
            columns: Default::default(),
        });
    }
    config.relay.max_backoff = Duration::from_millis(100);
    setup::setup(&config).await?;
    Ok((env, config))
}

struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), RelayError>>,
    trace: mpsc::UnboundedReceiver<Trace>,
}

fn start_relay(config: Config, metrics: Option<Metrics>) -> Running {
    let (stop, stop_rx) = watch::channel(false);
    let (trace_tx, trace) = mpsc::unbounded_channel();
    let task = tokio::spawn(pipeline::run_with(config, stop_rx, Some(trace_tx), metrics));
    Running { stop, task, trace }
}

impl Running {
    fn drain_trace(&mut self) -> Vec<Trace> {
        let mut out = Vec::new();
        while let Ok(t) = self.trace.try_recv() {
            out.push(t);
        }
        out
    }

    async fn stop(mut self) -> Result<Vec<Trace>> {
        self.stop.send(true)?;
        (&mut self.task).await??;
        Ok(self.drain_trace())
    }

    /// The relay must stop by itself (a non-transient error), not loop.
    async fn stopped_with_error(mut self) -> Result<(String, Vec<Trace>)> {
        let result = tokio::time::timeout(WAIT, &mut self.task)
            .await
            .context("the relay did not stop at the bad event")??;
        let err = match result {
            Ok(()) => anyhow::bail!("the relay returned Ok instead of stopping with an error"),
            Err(e) => e,
        };
        Ok((err.to_string(), self.drain_trace()))
    }
}

/// `'\x...'::bytea` for SQL.
fn bytea(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("'\\x{hex}'::bytea")
}

/// An envelope whose header is `header` verbatim.
fn raw_envelope(header: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(header.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// The bad inputs, each as SQL that runs inside a transaction between two
/// good events, with what a dead letter of it carries and what the error
/// says without a dead-letter topic.
struct Case {
    name: &'static str,
    /// Run (and committed) before the case, while the relay runs: a row
    /// to update, a table to alter.
    prepare: String,
    /// The bad event (possibly after DDL in the same transaction).
    bad: String,
    kind: &'static str,
    /// The dead letter's value.
    value: Vec<u8>,
    /// `walrelay-dead-letter-prefix` or `walrelay-dead-letter-table`.
    origin: (&'static str, &'static str),
    /// Texts the error (and the reason header) must contain.
    says: Vec<&'static str>,
}

fn cases() -> Vec<Case> {
    let malformed = raw_envelope("{bad}", b"payload");
    let no_topic = raw_envelope(r#"{"key": "k-1"}"#, b"payload");
    // walrelay.emit refuses it, so written by hand: a forged prev-key
    // would make `walrelay verify` report a gap that never happened.
    let forged_prev = envelope::encode(
        "good",
        Some("k-forged"),
        &[("walrelay-prev-key", "0000000000000000000000000000abcd")],
        Some(b"{}"),
    );
    vec![
        Case {
            name: "reserved-header-envelope",
            prepare: String::new(),
            bad: format!(
                "SELECT pg_logical_emit_message(true, 'walrelay.v1', {})",
                bytea(&forged_prev)
            ),
            kind: "reserved-header",
            value: forged_prev,
            origin: ("walrelay-dead-letter-prefix", "walrelay.v1"),
            says: vec![
                "walrelay.emit envelope at",
                "sets the header \"walrelay-prev-key\", whose name is reserved for walrelay",
                "rename the application's header",
            ],
        },
        // A second idempotency-key: a consumer reading the last one would
        // take ffff... as its high-water mark and skip everything after.
        Case {
            name: "reserved-header-outbox",
            prepare: String::new(),
            bad: "INSERT INTO outbox VALUES ('r-1', 'order', 'k', 'T', '{}', '{\"idempotency-key\": \"ffffffffffffffffffffffffffffffff\"}')".into(),
            kind: "reserved-header",
            value: br#"{"id":"r-1","aggregatetype":"order","aggregateid":"k","type":"T","payload":"{}","headers":"{\"idempotency-key\": \"ffffffffffffffffffffffffffffffff\"}"}"#
                .to_vec(),
            origin: ("walrelay-dead-letter-table", "public.outbox"),
            says: vec![
                "outbox row in public.outbox at",
                "sets the header \"idempotency-key\", whose name is reserved for walrelay",
            ],
        },
        Case {
            name: "malformed-envelope",
            prepare: String::new(),
            bad: format!(
                "SELECT pg_logical_emit_message(true, 'walrelay.v1', {})",
                bytea(&malformed)
            ),
            kind: "malformed-envelope",
            value: malformed,
            origin: ("walrelay-dead-letter-prefix", "walrelay.v1"),
            says: vec![
                "malformed walrelay.emit envelope at",
                "envelope header is not valid JSON",
                "publish envelope messages with walrelay.emit(...) or walrelay::envelope::encode",
            ],
        },
        Case {
            name: "missing-topic",
            prepare: String::new(),
            bad: format!(
                "SELECT pg_logical_emit_message(true, 'walrelay.v1', {})",
                bytea(&no_topic)
            ),
            kind: "missing-topic",
            value: no_topic,
            origin: ("walrelay-dead-letter-prefix", "walrelay.v1"),
            says: vec![
                "malformed walrelay.emit envelope at",
                "envelope header has no \"topic\"",
            ],
        },
        Case {
            name: "unknown-prefix",
            prepare: String::new(),
            bad: "SELECT pg_logical_emit_message(true, 'mystery', 'raw \\x01 content')".into(),
            kind: "unknown-prefix",
            value: b"raw \\x01 content".to_vec(),
            origin: ("walrelay-dead-letter-prefix", "mystery"),
            says: vec![
                "logical message with prefix \"mystery\" at",
                "has no route; add a [[messages]] route for it, list it in relay.ignore_prefixes",
            ],
        },
        Case {
            name: "missing-column",
            prepare: String::new(),
            bad: "INSERT INTO outbox_legacy VALUES ('l-1', 'legacy', 'k-1', '{\"a\": 1}')".into(),
            kind: "missing-column",
            value: br#"{"id":"l-1","aggregatetype":"legacy","aggregateid":"k-1","payload":"{\"a\": 1}"}"#
                .to_vec(),
            origin: ("walrelay-dead-letter-table", "public.outbox_legacy"),
            says: vec![
                "outbox table public.outbox_legacy has no column \"type\" (configured as outbox.columns.type)",
                "fix the column mapping or the table",
            ],
        },
        Case {
            name: "null-key",
            prepare: String::new(),
            bad: "INSERT INTO outbox VALUES ('n-1', 'order', NULL, 'T', '{\"n\": 1}', NULL)".into(),
            kind: "null-column",
            value: br#"{"id":"n-1","aggregatetype":"order","aggregateid":null,"type":"T","payload":"{\"n\": 1}","headers":null}"#
                .to_vec(),
            origin: ("walrelay-dead-letter-table", "public.outbox"),
            says: vec![
                "in public.outbox: column \"aggregateid\" is NULL, but it is required (it is the record key)",
                "declare the column NOT NULL",
            ],
        },
        Case {
            name: "outbox-update",
            prepare: "INSERT INTO outbox VALUES ('u-1', 'order', 'o-u', 'T', '{\"v\": 1}', NULL)"
                .into(),
            bad: "UPDATE outbox SET payload = '{\"v\": 2}' WHERE id = 'u-1'".into(),
            kind: "outbox-update",
            value: br#"{"id":"u-1","aggregatetype":"order","aggregateid":"o-u","type":"T","payload":"{\"v\": 2}","headers":null}"#
                .to_vec(),
            origin: ("walrelay-dead-letter-table", "public.outbox"),
            says: vec![
                "UPDATE of an outbox row at",
                "in public.outbox: outbox rows are immutable events",
                "insert a new row for a new event instead of updating one",
            ],
        },
        Case {
            name: "alter-table-drop-column",
            // The relay has seen the table's old shape.
            prepare: "INSERT INTO outbox_alter VALUES ('a-0', 'altered', 'k', 'T', '{}')".into(),
            bad: "ALTER TABLE outbox_alter DROP COLUMN type;
                  INSERT INTO outbox_alter VALUES ('a-1', 'altered', 'k', '{\"d\": 1}')"
                .into(),
            kind: "missing-column",
            value: br#"{"id":"a-1","aggregatetype":"altered","aggregateid":"k","payload":"{\"d\": 1}"}"#
                .to_vec(),
            origin: ("walrelay-dead-letter-table", "public.outbox_alter"),
            says: vec![
                "outbox table public.outbox_alter has no column \"type\" (configured as outbox.columns.type)",
                "fix the column mapping or the table",
            ],
        },
        Case {
            name: "invalid-topic",
            prepare: String::new(),
            bad: "INSERT INTO outbox VALUES ('t-1', 'no such/topic', 'k', 'T', '{}', NULL)".into(),
            kind: "invalid-topic",
            value: br#"{"id":"t-1","aggregatetype":"no such/topic","aggregateid":"k","type":"T","payload":"{}","headers":null}"#
                .to_vec(),
            origin: ("walrelay-dead-letter-table", "public.outbox"),
            says: vec![
                "topic \"outbox.event.no such/topic\" from the template is not a valid Kafka topic name",
                "or change outbox[].topic",
            ],
        },
    ]
}

/// [`cases`], and the bad input that only exists with a dead-letter
/// topic: an envelope addressed to it (without one, that name is an
/// ordinary topic).
fn cases_with_a_dead_letter_topic() -> Vec<Case> {
    let to_dlq = envelope::encode(DLQ, Some("k-dlq"), &[], Some(br#"{"v": 1}"#));
    let mut cases = cases();
    cases.push(Case {
        name: "dead-letter-topic",
        prepare: String::new(),
        bad: format!(
            "SELECT pg_logical_emit_message(true, 'walrelay.v1', {})",
            bytea(&to_dlq)
        ),
        kind: "dead-letter-topic",
        value: to_dlq,
        origin: ("walrelay-dead-letter-prefix", "walrelay.v1"),
        says: vec![
            "is addressed to topic \"walrelay.dead-letter\", which is the dead-letter topic",
            "send the event to another topic, or give dead letters a topic of their own",
        ],
    });
    cases
}

/// A good event around a bad one: an envelope to topic `good`, keyed by
/// `<case>-<which>`.
fn good(case: &str, which: &str) -> String {
    format!("SELECT walrelay.emit('good', '{case}-{which}', '{{\"ok\": true}}'::jsonb)")
}

fn find<'a>(records: &'a [ConsumedRecord], topic: &str, key: &str) -> Result<&'a ConsumedRecord> {
    records
        .iter()
        .find(|r| r.topic == topic && r.key_str() == Some(key))
        .with_context(|| format!("no record {topic}/{key}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_dead_letter_topic_each_bad_input_becomes_a_dead_letter_and_the_relay_keeps_going(
) -> Result<()> {
    let (env, mut config) = start_env().await?;
    let bootstrap = env.bootstrap();
    config.dead_letter.topic = Some(DLQ.into());
    // One source name for both slots, so that a replay from the second
    // slot must produce byte-identical records.
    config.relay.source_id = Some("bad-input".into());
    let c = &env.client;
    c.batch_execute("SELECT pg_create_logical_replication_slot('replay', 'pgoutput')")
        .await?;
    let metrics = Metrics::new();
    let relay = start_relay(config.clone(), Some(metrics.clone()));

    let cases = cases_with_a_dead_letter_topic();
    for case in &cases {
        if !case.prepare.is_empty() {
            c.batch_execute(&case.prepare).await?;
        }
        c.batch_execute(&format!(
            "BEGIN; {}; {}; {}; COMMIT;",
            good(case.name, "before"),
            case.bad,
            good(case.name, "after")
        ))
        .await
        .with_context(|| case.name)?;
    }
    // ALTER TABLE ... ADD COLUMN while running: rows keep flowing.
    c.batch_execute(
        "ALTER TABLE outbox ADD COLUMN extra text;
         INSERT INTO outbox VALUES ('x-1', 'order', 'o-x', 'T', '{\"x\": 1}', NULL, 'more');",
    )
    .await?;
    // DELETE stays ignored (the cleanup pattern), and a non-transactional
    // message with an unknown prefix is dead-lettered under its own key.
    c.batch_execute(
        "DELETE FROM outbox WHERE id = 'u-1';
         SELECT pg_logical_emit_message(false, 'mystery', 'non-transactional');",
    )
    .await?;
    c.batch_execute(&good("final", "last")).await?;
    let end = env.current_wal_lsn().await?;

    // The relay kept going: the slot moves past everything.
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await
    .context("confirmed_flush_lsn must pass the dead-lettered events")?;
    let trace = relay.stop().await?;
    check_confirmations_follow_acks(&trace)?;
    let sessions = trace
        .iter()
        .filter(|t| matches!(t, Trace::SessionStarted { .. }))
        .count();
    assert_eq!(sessions, 1, "no restart: {trace:?}");

    let records = read_until_quiet(
        &bootstrap,
        &["good", DLQ, "outbox.event.order", "outbox.event.altered"],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    let (fresh, duplicates) = apply_high_water_marks(&records)?;
    assert_eq!(duplicates, 0);
    // 2 good events per case and the last one; a dead letter per case and
    // the non-transactional one; the prepared INSERTs into outbox and
    // outbox_alter, and the row after ADD COLUMN.
    let dead: Vec<&ConsumedRecord> = records.iter().filter(|r| r.topic == DLQ).collect();
    assert_eq!(dead.len(), cases.len() + 1, "{dead:#?}");
    assert_eq!(
        records.iter().filter(|r| r.topic == "good").count(),
        2 * cases.len() + 1
    );
    assert_eq!(fresh.values().map(Vec::len).sum::<usize>(), records.len());

    let source = "bad-input";
    let text = metrics.encode();
    for case in &cases {
        let before = find(&records, "good", &format!("{}-before", case.name))?;
        let after = find(&records, "good", &format!("{}-after", case.name))?;
        let d = dead
            .iter()
            .find(|r| r.value.as_deref() == Some(&case.value[..]))
            .with_context(|| format!("{}: no dead letter with the original bytes", case.name))?;
        let key = key_of(d);
        // The key the event would have had: in its transaction, between
        // its neighbours, at its reported position (raised only above the
        // previous event's).
        let (b, a) = (key_of(before), key_of(after));
        assert!(b < key && key < a, "{}: {b} < {key} < {a}", case.name);
        assert_eq!(key.high(), b.high(), "{}: same transaction", case.name);
        let lsn: Lsn = d.header_str("walrelay-lsn").context("lsn")?.parse()?;
        assert_eq!(key.low(), lsn.0.max(b.low() + 1), "{}", case.name);
        // A dead letter carries the full header set whatever
        // `relay.headers` says (the good records here carry the lean one).
        assert_eq!(before.header_str("walrelay-xid"), None, "lean by default");
        assert_eq!(
            d.header_str("walrelay-commit-lsn"),
            Some(Lsn(b.high()).to_string().as_str())
        );
        assert!(d.header_str("walrelay-xid").is_some(), "{}", case.name);
        assert!(
            d.header_str("walrelay-commit-time").is_some(),
            "{}",
            case.name
        );
        assert_eq!(d.header_str("walrelay-source"), Some(source));
        // Kafka key: the idempotency key's hex digits.
        assert_eq!(d.key_str(), Some(key.to_hex().as_str()));
        assert_eq!(
            d.header_str("walrelay-dead-letter-kind"),
            Some(case.kind),
            "{}",
            case.name
        );
        assert_eq!(
            d.header_str(case.origin.0),
            Some(case.origin.1),
            "{}",
            case.name
        );
        let reason = d
            .header_str("walrelay-dead-letter-reason")
            .context("reason")?;
        for says in &case.says {
            assert!(
                reason.contains(says),
                "{}: {reason:?} lacks {says:?}",
                case.name
            );
        }
        assert!(
            !reason.contains("[dead_letter]"),
            "a dead letter's reason need not suggest a dead-letter topic: {reason}"
        );
    }
    // The non-transactional one: no transaction headers, keyed by its end.
    let nontx = dead
        .iter()
        .find(|r| r.value_str() == Some("non-transactional"))
        .context("non-transactional dead letter")?;
    let lsn: Lsn = nontx.header_str("walrelay-lsn").context("lsn")?.parse()?;
    assert_eq!(key_of(nontx), EventKey::new(lsn.0 - 1, lsn.0 - 1));
    assert_eq!(nontx.header_str("walrelay-xid"), None);
    assert_eq!(
        nontx.header_str("walrelay-dead-letter-kind"),
        Some("unknown-prefix")
    );

    // ADD COLUMN: the row is published as usual; UPDATE published nothing
    // but its dead letter; DELETE nothing at all.
    let added = find(&records, "outbox.event.order", "o-x")?;
    assert_eq!(added.value_str(), Some("{\"x\": 1}"));
    assert_eq!(
        records
            .iter()
            .filter(|r| r.topic == "outbox.event.order")
            .count(),
        2,
        "the prepared row u-1 and the row after ADD COLUMN"
    );

    // Counted by kind.
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for case in &cases {
        *by_kind.entry(case.kind).or_default() += 1;
    }
    *by_kind.entry("unknown-prefix").or_default() += 1;
    for (kind, n) in by_kind {
        let line = format!("walrelay_dead_letter_records_total{{kind=\"{kind}\"}} {n}");
        assert!(text.contains(&line), "{line} not in {text}");
    }

    // Replaying the same WAL (from a second slot created before it all)
    // gives every record again, dead letters included, with the same key,
    // topic, partition, value and headers.
    let mut replay_config = config;
    replay_config.postgres.slot = "replay".into();
    // Same source: the tail fence would (rightly) write none of it again.
    replay_config.relay.fence = false;
    let replay = start_relay(replay_config, None);
    await_condition(WAIT, Duration::from_millis(100), || async {
        Ok(env.confirmed_flush_lsn("replay").await? >= end)
    })
    .await?;
    replay.stop().await?;
    let again = read_until_quiet(
        &bootstrap,
        &["good", DLQ, "outbox.event.order", "outbox.event.altered"],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    assert_eq!(again.len(), 2 * records.len());
    let comparable = |r: &ConsumedRecord| {
        let mut r = r.clone();
        r.offset = 0;
        r.headers
            .retain(|(k, _)| k != "walrelay-prev-key" && k != "walrelay-prev");
        // A non-transactional message has no commit time: the producer
        // stamps it (docs/relay.md). Such a record is a dead letter here,
        // with the full header set: an LSN but no commit LSN.
        if r.header("walrelay-commit-lsn").is_none() && r.header("walrelay-lsn").is_some() {
            r.timestamp_ms = None;
        }
        r
    };
    let mut copies: BTreeMap<(String, i32, EventKey), Vec<ConsumedRecord>> = BTreeMap::new();
    for r in &again {
        copies
            .entry((r.topic.clone(), r.partition, key_of(r)))
            .or_default()
            .push(comparable(r));
    }
    assert_eq!(copies.len(), records.len());
    for (id, rs) in copies {
        assert_eq!(rs.len(), 2, "{id:?}");
        assert_eq!(rs[0], rs[1], "{id:?}: a replay must give the same record");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_dead_letter_topic_each_bad_input_stops_the_relay_before_it() -> Result<()> {
    let (env, config) = start_env().await?;
    let c = &env.client;
    for (i, case) in cases().into_iter().enumerate() {
        // A slot of its own: the previous case's slot is stuck at its bad
        // event, as it should be.
        let slot = format!("bad_{i}");
        c.batch_execute(&format!(
            "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
        ))
        .await?;
        let mut config = config.clone();
        config.postgres.slot = slot.clone();
        let relay = start_relay(config, None);

        // Good events first, relayed and confirmed.
        c.batch_execute(&good(case.name, "first")).await?;
        if !case.prepare.is_empty() {
            c.batch_execute(&case.prepare).await?;
        }
        let good_end = env.current_wal_lsn().await?;
        await_condition(WAIT, POLL, || async {
            Ok(env.confirmed_flush_lsn(&slot).await? >= good_end)
        })
        .await
        .with_context(|| format!("{}: the good events are confirmed", case.name))?;

        let before_bad = env.current_wal_lsn().await?;
        c.batch_execute(&format!(
            "BEGIN; {}; {}; {}; COMMIT;",
            good(case.name, "before"),
            case.bad,
            good(case.name, "after")
        ))
        .await?;
        let (err, trace) = relay
            .stopped_with_error()
            .await
            .with_context(|| case.name)?;
        for says in &case.says {
            assert!(err.contains(says), "{}: {err:?} lacks {says:?}", case.name);
        }
        // The event's own position (a Relation message has none: 0/0).
        assert!(
            !err.contains(" at 0/0") && !err.contains("seen at 0/0"),
            "{}: {err}",
            case.name
        );
        assert!(
            err.ends_with(DEAD_LETTER_HINT),
            "{}: the error offers the dead-letter topic: {err}",
            case.name
        );
        assert!(
            err.contains("or configure [dead_letter] topic to divert such events"),
            "{err}"
        );
        // Stopped, not restarting: one session.
        assert_eq!(
            trace
                .iter()
                .filter(|t| matches!(t, Trace::SessionStarted { .. }))
                .count(),
            1,
            "{}: {trace:?}",
            case.name
        );
        check_confirmations_follow_acks(&trace)?;
        // Nothing of the bad transaction was confirmed: it is replayed
        // when the relay starts again.
        let confirmed = env.confirmed_flush_lsn(&slot).await?;
        assert!(
            confirmed <= before_bad,
            "{}: confirmed {confirmed} past the bad transaction at {before_bad}",
            case.name
        );
        // The walsender ends shortly after the relay closed its
        // connection; then the slot can go.
        await_condition(WAIT, POLL, || async {
            let active: bool = c
                .query_one(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await?
                .get(0);
            Ok(!active)
        })
        .await?;
        c.batch_execute(&format!("SELECT pg_drop_replication_slot('{slot}')"))
            .await?;
    }
    Ok(())
}

/// A record the Kafka producer refuses (`message.max.bytes`) cannot be
/// dead-lettered: its dead letter would be as large. The relay stops with
/// the record's key, topic and size and the fix, without restarting in a
/// loop and without confirming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_kafka_accepts_stops_the_relay_with_its_key_and_size() -> Result<()> {
    let (env, mut config) = start_env().await?;
    config.dead_letter.topic = Some(DLQ.into());
    config
        .kafka
        .properties
        .insert("message.max.bytes".into(), "10000".into());
    let relay = start_relay(config, None);
    let c = &env.client;
    c.batch_execute(&good("large", "first")).await?;
    let good_end = env.current_wal_lsn().await?;
    await_condition(WAIT, POLL, || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= good_end)
    })
    .await?;
    let before_bad = env.current_wal_lsn().await?;
    c.batch_execute(&format!(
        "BEGIN; {}; SELECT walrelay.emit('big', 'b-1', repeat('x', 50000)::bytea); {}; COMMIT;",
        good("large", "before"),
        good("large", "after")
    ))
    .await?;
    let (err, trace) = relay.stopped_with_error().await?;
    let big = trace
        .iter()
        .find_map(|t| match t {
            Trace::Produced { key, topic, .. } if topic == "big" => Some(*key),
            _ => None,
        })
        .context("the large record was handed to the producer")?;
    for says in [
        format!("record {big} for big partition"),
        "bytes (key, value and headers)".into(),
        "more than Kafka accepts".into(),
        "raise the topic's max.message.bytes and the producer's message.max.bytes".into(),
        "or keep events smaller".into(),
    ] {
        assert!(err.contains(&says), "{err:?} lacks {says:?}");
    }
    let size: usize = err
        .split_once(" is ")
        .and_then(|(_, rest)| rest.split_once(' '))
        .context("size")?
        .0
        .parse()?;
    assert!((50_000..51_000).contains(&size), "{err}");
    assert_eq!(
        trace
            .iter()
            .filter(|t| matches!(t, Trace::SessionStarted { .. }))
            .count(),
        1,
        "not retried: {trace:?}"
    );
    check_confirmations_follow_acks(&trace)?;
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    ensure!(
        confirmed <= before_bad,
        "confirmed {confirmed} past the large record's transaction at {before_bad}"
    );
    Ok(())
}

/// The broker's side of the same limit, in a delivery report: injected
/// with librdkafka's mock cluster (Tansu accepts any size).
#[tokio::test]
async fn a_broker_refusing_a_record_as_too_large_is_fatal_and_names_the_key() -> Result<()> {
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let cluster: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1)?;
    cluster.create_topic("big", 1, 1)?;
    let mut sink = KafkaSink::new(&SinkConfig::new(
        cluster.bootstrap_servers(),
        Default::default(),
    ))?;
    assert_eq!(sink.partitions("big").await?, 1);
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let key = EventKey::new(0x16, 0x17);
    let record = Record {
        topic: Arc::from("big"),
        key: Some(Bytes::from_static(b"k")),
        value: Some(Bytes::from(vec![b'x'; 2000])),
        headers: vec![(Arc::from("idempotency-key"), Bytes::from(key.to_hex()))],
        event_key: key,
        timestamp_ms: None,
    };
    sink.send(0, &record, 0)?;
    let delivery = tokio::time::timeout(WAIT, sink.next_delivery())
        .await
        .context("a delivery report")?;
    let err = delivery.result.expect_err("refused by the broker");
    assert!(matches!(err, SinkError::RecordTooLarge { .. }), "{err:?}");
    assert_eq!(err.recovery(), Recovery::Fatal);
    let text = err.to_string();
    for says in [
        format!("record {key} for big partition 0"),
        "is 2048 bytes".into(),
        "raise the topic's max.message.bytes".into(),
    ] {
        assert!(text.contains(&says), "{text:?} lacks {says:?}");
    }
    Ok(())
}

#[test]
fn envelope_helpers_agree() {
    // The test's hand-made envelopes use the real layout.
    let good = envelope::encode("t", None, &[], Some(b"p"));
    assert_eq!(raw_envelope(r#"{"topic":"t"}"#, b"p"), good);
}

/// `walrelay.emit` refuses walrelay's header names in the application's
/// own transaction (which then rolls back), under the same rule as the
/// relay ([`walrelay::engine::record::header::is_reserved`]), and accepts others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walrelay_emit_refuses_reserved_header_names_in_the_callers_transaction() -> Result<()> {
    let env = Env::postgres_only(Default::default()).await?;
    let config = env.config("127.0.0.1:9");
    setup::setup(&config).await?;
    let c = &env.client;
    c.batch_execute("CREATE TABLE side (n int)").await?;
    for name in [
        "walrelay-prev-key",
        "idempotency-key",
        "Idempotency-Key",
        "WALRELAY-source",
        "walrelay-anything",
        "trace",
        "x-walrelay-source",
        "idempotency-key-2",
        "walrelay",
    ] {
        let reserved = walrelay::engine::record::header::is_reserved(name);
        let sql = format!(
            "BEGIN; INSERT INTO side VALUES (1); \
             SELECT walrelay.emit('t', 'k', '{{}}'::jsonb, jsonb_build_object('{name}', 'v')); COMMIT;"
        );
        let result = c.batch_execute(&sql).await;
        if reserved {
            let err = result.expect_err(name);
            let db = err.as_db_error().context("a server error")?;
            assert_eq!(db.code().code(), "22023", "{name}: {db:?}");
            assert!(
                db.message()
                    .contains(&format!("header '{name}' is reserved for walrelay")),
                "{name}: {}",
                db.message()
            );
            assert!(db.hint().is_some_and(|h| h.contains("rename the header")));
            c.batch_execute("ROLLBACK").await?;
        } else {
            result.with_context(|| format!("{name} is an ordinary header"))?;
        }
    }
    // The refused transactions left nothing behind.
    let n: i64 = c.query_one("SELECT count(*) FROM side", &[]).await?.get(0);
    assert_eq!(
        n, 4,
        "only the transactions with ordinary headers committed"
    );
    Ok(())
}

/// 500 dead letters of one kind: the first is logged at once with its
/// details, the rest only counted (one WARN per dead letter made 122 MB of
/// log for 300,000 of them), and the count reaches the log at the end of
/// the session. Every dead letter is still in the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_dead_letters_is_logged_once_per_kind_and_interval() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    setup::setup(&env.config(&bootstrap)).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let mut relay = spawn_relay(
        &env,
        &bootstrap,
        &log,
        &["--dead-letter-topic", DLQ, "--log", "warn"],
    )?;
    let n = 500;
    env.client
        .batch_execute(&format!(
            "SELECT count(pg_logical_emit_message(true, 'mystery', 'bad ' || g)) FROM generate_series(1, {n}) g"
        ))
        .await?;
    let end = env.current_wal_lsn().await?;
    await_condition(WAIT, POLL, || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?;
    ensure!(status.success());
    ensure!(relay.wait()?.success());

    let text = std::fs::read_to_string(&log)?;
    let one_by_one = text
        .matches("event diverted to the dead-letter topic")
        .count();
    assert_eq!(one_by_one, 1, "{text}");
    assert!(
        text.contains("more events diverted to the dead-letter topic than were logged one by one")
            && text.contains(&format!("suppressed={}", n - 1)),
        "the rest is counted in the log: {text}"
    );
    let records = read_until_quiet(&bootstrap, &[DLQ], Duration::from_secs(1), WAIT).await?;
    assert_eq!(records.len(), n, "every dead letter is in the topic");
    Ok(())
}
