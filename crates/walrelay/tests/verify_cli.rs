//! `walrelay verify`, the real binary, against a real broker (Tansu, or
//! Apache Kafka with WALRELAY_BROKER=kafka), over hand-made walrelay-style streams produced with
//! rdkafka: a clean stream with a replayed tail, a key out of order, a gap.

use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use walrelay::commands::verify::exit;
use walrelay::engine::key::EventKey;
use walrelay::engine::record::header;
use walrelay_testkit::TestBroker;

const SOURCE: &str = "7301234567890123456/postgres/walrelay";

/// The n-th key of the hand-made key sequence.
fn key(n: u64) -> EventKey {
    EventKey::new(0x1_6B37_4800 + n * 0x100, 0x1_6B37_0000 + n)
}

/// One record to produce: partition, and `Some((key, prev))` for a
/// walrelay record (prev `None`: a session's first record) or `None` for a
/// record without walrelay headers.
type Spec = (i32, Option<(u64, Option<u64>)>);

/// A session: keys in order, prev-key chained.
fn session(partition: i32, keys: &[u64]) -> Vec<Spec> {
    let mut prev = None;
    keys.iter()
        .map(|&k| {
            let spec = (partition, Some((k, prev)));
            prev = Some(k);
            spec
        })
        .collect()
}

async fn start_broker(topic: &str) -> Result<TestBroker> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let broker = TestBroker::start()?;
        broker.create_topic(&topic, 2)?;
        Ok(broker)
    })
    .await?
}

/// Produces the records in order, each acknowledged before the next.
async fn produce(bootstrap: &str, topic: &str, specs: &[Spec]) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .create()
        .context("creating the producer")?;
    for (i, (partition, walrelay)) in specs.iter().enumerate() {
        let value = format!("value-{i}");
        let mut headers = OwnedHeaders::new();
        if let Some((k, prev)) = walrelay {
            let hex = key(*k).to_hex();
            let prev = prev.map(|p| key(p).to_hex()).unwrap_or_default();
            headers = headers
                .insert(Header {
                    key: header::IDEMPOTENCY_KEY,
                    value: Some(&hex),
                })
                .insert(Header {
                    key: header::SOURCE,
                    value: Some(SOURCE),
                })
                .insert(Header {
                    key: header::LSN,
                    value: Some("1/6B374800"),
                })
                .insert(Header {
                    key: header::PREV_KEY,
                    value: Some(&prev),
                });
        } else {
            headers = headers.insert(Header {
                key: "trace",
                value: Some("other-producer"),
            });
        }
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(*partition)
                    .key("k")
                    .payload(&value)
                    .headers(headers),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .with_context(|| format!("producing record {i} to {topic}/{partition}"))?;
    }
    Ok(())
}

/// Runs `walrelay verify` with `args`, without any PostgreSQL setting or
/// configuration file in the environment.
async fn verify(args: &[&str]) -> Result<Output> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .arg("verify")
            .args(&args)
            .env_remove("WALRELAY_POSTGRES_URL")
            .env_remove("WALRELAY_CONFIG")
            .env_remove("WALRELAY_KAFKA_BOOTSTRAP_SERVERS")
            .env("WALRELAY_LOG", "warn")
            .output()
            .context("running walrelay verify")
    })
    .await?
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(out: &Output) -> Result<Value> {
    serde_json::from_slice(&out.stdout).with_context(|| describe(out))
}

/// The one source row of a partition in the JSON document.
fn source_of(doc: &Value, partition: usize) -> &Value {
    &doc["partitions"][partition]["sources"][0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stream_with_a_replayed_tail_exits_0_and_counts_the_duplicates() -> Result<()> {
    let topic = "clean";
    let broker = start_broker(topic).await?;
    let bootstrap = broker.bootstrap_servers();
    // Partition 0: a session sends 1..=5, the relay restarts and replays
    // from 3. Partition 1: one session, plus a record from another producer.
    let mut specs = session(0, &[1, 2, 3, 4, 5]);
    specs.extend(session(1, &[10, 11]));
    specs.extend(session(0, &[3, 4, 5, 6, 7]));
    specs.push((1, None));
    specs.push((1, Some((12, Some(11)))));
    produce(&bootstrap, topic, &specs).await?;

    let out = verify(&["--bootstrap-servers", &bootstrap, "--topic", topic]).await?;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(exit::CLEAN), "{}", describe(&out));
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    // TOPIC PARTITION SOURCE RECORDS DISTINCT DUPLICATES OUT-OF-ORDER GAPS UNCHECKED
    assert!(
        rows.contains(&vec![
            "clean",
            "0",
            "..123456/postgres/walrelay",
            "10",
            "7",
            "3",
            "0",
            "0",
            "0"
        ]),
        "{text}"
    );
    assert!(
        rows.contains(&vec![
            "clean",
            "1",
            "..123456/postgres/walrelay",
            "3",
            "3",
            "0",
            "0",
            "0",
            "0"
        ]),
        "{text}"
    );
    assert!(text.contains("(no walrelay headers)"), "{text}");
    assert!(
        text.contains("OK: 14 records in 2 partitions; 3 replayed duplicates"),
        "{text}"
    );

    let out = verify(&[
        "--bootstrap-servers",
        &bootstrap,
        "--topic",
        topic,
        "--json",
        "--idle-timeout",
        "1s",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(exit::CLEAN), "{}", describe(&out));
    let doc = json(&out)?;
    assert_eq!(doc["verdict"], "clean");
    assert_eq!(doc["exit_code"], 0);
    assert_eq!(doc["stopped_by"], "idle");
    let totals = &doc["totals"];
    assert_eq!(totals["records"], 14, "{doc:#}");
    assert_eq!(totals["duplicates"], 3);
    assert_eq!(totals["distinct"], 10);
    assert_eq!(totals["out_of_order"], 0);
    assert_eq!(totals["gaps"], 0);
    assert_eq!(totals["without_headers"], 1);
    let p0 = source_of(&doc, 0);
    assert_eq!(p0["source"], SOURCE);
    assert_eq!(p0["records"], 10);
    assert_eq!(p0["distinct"], 7);
    assert_eq!(p0["high_water_mark"], key(7).to_hex());
    assert_eq!(doc["partitions"][1]["without_headers"], 1);
    assert_eq!(doc["partitions"][0]["from_offset_zero"], true);

    // Starting partition 0 in the middle of the replay: nothing is blamed on
    // what came before, and only that partition is read.
    let out = verify(&[
        "--bootstrap-servers",
        &bootstrap,
        "--from",
        "clean:0:6",
        "--json",
        "--idle-timeout",
        "1s",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(exit::CLEAN), "{}", describe(&out));
    let doc = json(&out)?;
    assert_eq!(doc["partitions"].as_array().map(Vec::len), Some(1));
    assert_eq!(doc["partitions"][0]["first_offset"], 6);
    assert_eq!(doc["totals"]["records"], 4, "{doc:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_out_of_order_exits_1_and_names_partition_and_key() -> Result<()> {
    let topic = "disorder";
    let broker = start_broker(topic).await?;
    let bootstrap = broker.bootstrap_servers();
    // Partition 1: the relay sent 1, 3, 2 (its prev-key chain is intact, so
    // this is not a gap): a high-water-mark consumer drops 2.
    let mut specs = session(0, &[1, 2, 3]);
    specs.extend(session(1, &[1, 3, 2]));
    produce(&bootstrap, topic, &specs).await?;

    let out = verify(&["--bootstrap-servers", &bootstrap, "--topic", topic]).await?;
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(exit::OUT_OF_ORDER),
        "{}",
        describe(&out)
    );
    let finding = text
        .lines()
        .find(|l| l.starts_with("out-of-order: disorder/1 "))
        .with_context(|| describe(&out))?;
    assert!(
        finding.contains(&format!("offset 2: key {}", key(2).to_hex())),
        "{finding}"
    );
    assert!(finding.contains(&key(3).to_hex()), "{finding}");
    assert!(
        text.contains("FAIL: 1 key out of order in disorder/1"),
        "{text}"
    );

    let out = verify(&[
        "--bootstrap-servers",
        &bootstrap,
        "--topic",
        topic,
        "--json",
        "--idle-timeout",
        "1s",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(exit::OUT_OF_ORDER));
    let doc = json(&out)?;
    assert_eq!(doc["verdict"], "out_of_order");
    assert_eq!(doc["totals"]["out_of_order"], 1);
    assert_eq!(source_of(&doc, 0)["out_of_order"], 0);
    let p1 = source_of(&doc, 1);
    assert_eq!(p1["out_of_order"], 1);
    assert_eq!(p1["findings"][0]["kind"], "out_of_order");
    assert_eq!(p1["findings"][0]["key"], key(2).to_hex());
    assert_eq!(p1["findings"][0]["offset"], 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_named_by_prev_key_exits_3() -> Result<()> {
    let topic = "holes";
    let broker = start_broker(topic).await?;
    let bootstrap = broker.bootstrap_servers();
    // Partition 0: 4 says the relay sent 3 before it; 3 never arrived.
    let specs = vec![
        (0, Some((1, None))),
        (0, Some((2, Some(1)))),
        (0, Some((4, Some(3)))),
        (0, Some((5, Some(4)))),
        (1, Some((6, None))),
    ];
    produce(&bootstrap, topic, &specs).await?;

    let out = verify(&[
        "--bootstrap-servers",
        &bootstrap,
        "--topic",
        topic,
        "--idle-timeout",
        "1s",
    ])
    .await?;
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(exit::GAPS), "{}", describe(&out));
    assert!(
        text.contains(&format!(
            "gap: holes/0 source ..123456/postgres/walrelay offset 2: key {} follows prev-key {}",
            key(4).to_hex(),
            key(3).to_hex()
        )),
        "{text}"
    );
    assert!(text.contains("FAIL: 1 gap in holes/0"), "{text}");

    let out = verify(&[
        "--bootstrap-servers",
        &bootstrap,
        "--topic",
        topic,
        "--json",
        "--idle-timeout",
        "1s",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(exit::GAPS));
    let doc = json(&out)?;
    assert_eq!(doc["verdict"], "gaps");
    assert_eq!(doc["totals"]["gaps"], 1);
    assert_eq!(doc["totals"]["out_of_order"], 0);
    let p0 = source_of(&doc, 0);
    assert_eq!(p0["gaps"], 1);
    assert_eq!(p0["findings"][0]["kind"], "gap");
    assert_eq!(p0["findings"][0]["prev_key"], key(3).to_hex());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_connection_errors_have_their_own_codes() -> Result<()> {
    // No --topic and no --from: clap's usage error.
    let out = verify(&["--bootstrap-servers", "127.0.0.1:1"]).await?;
    assert_eq!(out.status.code(), Some(exit::USAGE), "{}", describe(&out));

    // Nothing listens: metadata cannot be fetched within --timeout.
    let started = std::time::Instant::now();
    let out = verify(&[
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--timeout",
        "2s",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(exit::ERROR), "{}", describe(&out));
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );

    // A topic that does not exist.
    let broker = start_broker("exists").await?;
    let out = verify(&[
        "--bootstrap-servers",
        &broker.bootstrap_servers(),
        "--topic",
        "missing",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(exit::ERROR), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"missing\" does not exist"),
        "{}",
        describe(&out)
    );
    Ok(())
}
