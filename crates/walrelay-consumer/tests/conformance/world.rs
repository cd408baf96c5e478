//! One scenario played against the shared PostgreSQL and broker: its
//! database, topic and group, the records its relays produce, the
//! consumers it starts and stops, and the final checks.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio_postgres::{Client, NoTls, Transaction};
use walrelay_consumer::{
    migrate, ConsumerLoop, Counters, Database, Delivery, OnPoison, PgHwmStore, RetryPolicy,
    Settings,
};
use walrelay_contract::header;
use walrelay_testkit::TestBroker;

use crate::scenario::{
    self, Count, Defaults, HandlerKind, Ledger, Poison, RedriveHandler, Scenario, Seq, Step,
};
use crate::support::{self, RunHandle};
use crate::{Shared, AWAIT, CHILD_ENV, CREATE_EFFECTS};

/// How often each flaky record (`flaky <n> <key>`) failed, per topic.
static FLAKY: Mutex<BTreeMap<(String, String), u32>> = Mutex::new(BTreeMap::new());

/// Fails on a flaky record until it has failed its `n` times.
fn flaky(d: &Delivery<'_>) -> Result<(), String> {
    let Some(rest) = d
        .payload()
        .and_then(|p| std::str::from_utf8(p).ok())
        .and_then(|p| p.strip_prefix("flaky "))
    else {
        return Ok(());
    };
    let n: u32 = rest
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("a flaky payload without its count: {rest}"))?;
    let key = d.meta.key.to_hex();
    let mut seen = FLAKY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let failed = seen
        .entry((d.position.topic.clone(), key.clone()))
        .or_insert(0);
    if *failed < n {
        *failed += 1;
        return Err(format!("flaky: failure {failed} of {n} of {key}"));
    }
    Ok(())
}

/// The handlers' side effect: one `effects` row per record, written by
/// `consumer`; while `poison_fails`, a batch with a poison record fails,
/// and one with a commit-poison record fails at its commit.
pub(crate) async fn apply(
    tx: &Transaction<'_>,
    batch: &[Delivery<'_>],
    consumer: &str,
    delay: Duration,
    poison_fails: bool,
) -> Result<(), String> {
    if poison_fails {
        if let Some(d) = batch
            .iter()
            .find(|d| d.payload().is_some_and(|p| p.starts_with(b"poison")))
        {
            return Err(format!("poison: cannot apply {}", d.meta.key.to_hex()));
        }
        for d in batch {
            flaky(d)?;
        }
        if batch
            .iter()
            .any(|d| d.payload().is_some_and(|p| p.starts_with(b"commit-poison")))
        {
            // Fine until the commit checks the deferred constraint.
            tx.execute("INSERT INTO commit_check (id) VALUES (1), (1)", &[])
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    if !delay.is_zero() {
        tx.execute("SELECT pg_sleep($1)", &[&delay.as_secs_f64()])
            .await
            .map_err(|e| e.to_string())?;
    }
    let keys: Vec<String> = batch.iter().map(|d| d.meta.key.to_hex()).collect();
    let partitions: Vec<i32> = batch.iter().map(|d| d.position.partition).collect();
    tx.execute(
        "INSERT INTO effects (event_key, partition, consumer) \
         SELECT k, p, $3 FROM unnest($1::text[], $2::int4[]) AS u(k, p)",
        &[&keys, &partitions, &consumer],
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

struct Running {
    handle: RunHandle,
    stop: watch::Sender<bool>,
}

/// One scenario's world.
struct World<'a> {
    shared: &'a Shared,
    defaults: &'a Defaults,
    group: String,
    topic: String,
    dsn: String,
    database: Database,
    client: Client,
    producer: FutureProducer,
    ledger: Ledger,
    consumers: BTreeMap<String, Running>,
    processes: BTreeMap<String, Child>,
    /// Of every in-process consumer the scenario started.
    counters: Vec<Arc<Counters>>,
    expected_parked: &'a [scenario::Parked],
}

pub(crate) async fn run(
    shared: &Shared,
    defaults: &Defaults,
    scenario: Scenario,
) -> anyhow::Result<()> {
    let name = &scenario.name;
    let dbname = format!("conformance_{name}");
    shared
        .cluster
        .client()
        .await?
        .batch_execute(&format!("CREATE DATABASE \"{dbname}\""))
        .await?;
    let config =
        shared
            .cluster
            .client_config("postgres", shared.cluster.superuser_password(), &dbname);
    let database = Database::new(config, NoTls);
    let client = database.connect().await?;
    migrate(&client).await?;
    client.batch_execute(CREATE_EFFECTS).await?;
    let topic = format!("conformance-{name}");
    let partitions = defaults.partitions;
    {
        let topic = topic.clone();
        let broker_ref: &TestBroker = &shared.broker;
        // create_topic blocks (admin client); fine on a worker thread.
        tokio::task::block_in_place(|| broker_ref.create_topic(&topic, partitions))?;
    }
    let mut world = World {
        shared,
        defaults,
        group: name.clone(),
        topic,
        dsn: shared.cluster.conninfo("postgres", &dbname),
        database,
        client,
        producer: support::producer(&shared.broker.bootstrap_servers())?,
        ledger: Ledger::default(),
        consumers: BTreeMap::new(),
        processes: BTreeMap::new(),
        counters: Vec::new(),
        expected_parked: &scenario.expect.parked,
    };
    for (i, step) in scenario.steps.iter().enumerate() {
        world
            .step(step)
            .await
            .with_context(|| format!("step {} {step:?}", i + 1))?;
    }
    ensure!(
        world.consumers.is_empty() && world.processes.is_empty(),
        "the scenario leaves consumers running: {:?} {:?} (end it with stop or kill_process)",
        world.consumers.keys().collect::<Vec<_>>(),
        world.processes.keys().collect::<Vec<_>>()
    );
    world.check(&scenario.expect).await.context("final state")
}

impl World<'_> {
    async fn step(&mut self, step: &Step) -> anyhow::Result<()> {
        match step {
            Step::Produce {
                source,
                partitions,
                seqs: [from, to],
                prev_seq,
                poison,
                poison_at_commit,
                fails,
                headers,
            } => {
                let mut planned =
                    self.ledger
                        .plan(source, partitions, *from..=*to, *prev_seq, *poison);
                for p in &mut planned {
                    p.at_commit = *poison_at_commit;
                    p.fails = *fails;
                    p.headers = *headers;
                }
                self.send(planned).await
            }
            Step::RestartRelay { source } => {
                self.ledger.restart(source);
                Ok(())
            }
            Step::ReplayLast {
                source,
                partitions,
                count,
            } => {
                for &p in partitions {
                    let seqs = self.ledger.tail(source, p, *count);
                    let planned = self.ledger.plan(source, &[p], seqs, None, false);
                    self.send(planned).await?;
                }
                Ok(())
            }
            Step::ProduceMore {
                source,
                partitions,
                count,
            } => self.produce_more(source, partitions, *count).await,
            Step::ProduceUntilAppliedBy {
                consumer,
                source,
                partitions,
                per_round,
            } => {
                for _ in 0..200 {
                    self.produce_more(source, partitions, *per_round).await?;
                    let by = self
                        .count(&format!(
                            "SELECT count(*) FROM effects WHERE consumer = '{consumer}'"
                        ))
                        .await?;
                    if by > 0 {
                        return Ok(());
                    }
                    let all = self
                        .ledger
                        .resolve(Count::All(scenario::AllTag::All), self.expected_parked);
                    self.await_counts(Some(all), None, None).await?;
                }
                bail!("consumer {consumer} applied nothing in 200 rounds")
            }
            Step::Start {
                consumer,
                handler,
                batch_delay_ms,
                max_batch_records,
            } => {
                self.start(
                    consumer,
                    *handler,
                    Duration::from_millis(*batch_delay_ms),
                    *max_batch_records,
                )
                .await
            }
            Step::Stop { consumer } => {
                let running = self
                    .consumers
                    .remove(consumer)
                    .with_context(|| format!("no running consumer {consumer}"))?;
                running.stop.send(true)?;
                tokio::time::timeout(AWAIT, running.handle)
                    .await
                    .with_context(|| {
                        format!("consumer {consumer} did not stop within {AWAIT:?}")
                    })???;
                Ok(())
            }
            Step::StartProcess {
                consumer,
                commit_interval_ms,
            } => self.start_process(consumer, *commit_interval_ms),
            Step::KillProcess { consumer } => {
                let mut child = self
                    .processes
                    .remove(consumer)
                    .with_context(|| format!("no consumer process {consumer}"))?;
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "consumer process {consumer} exited on its own before the kill: {status}"
                    );
                }
                child.start_kill()?;
                let status = child.wait().await?;
                ensure!(
                    status.signal() == Some(9),
                    "consumer process {consumer}: {status}, not killed by SIGKILL"
                );
                Ok(())
            }
            Step::Await {
                effects,
                parked,
                seen,
            } => {
                let effects = effects.map(|c| self.ledger.resolve(c, self.expected_parked));
                self.await_counts(effects, *parked, *seen).await
            }
            Step::ExpectCounters {
                processed,
                duplicates,
                gaps,
                parked,
            } => {
                let got = self.counters_sum();
                ensure!(
                    (got.processed, got.duplicates, got.gaps, got.parked)
                        == (*processed, *duplicates, *gaps, *parked),
                    "counters (processed, duplicates, gaps, parked) of the in-process consumers: \
                     expected {:?}, got {:?}",
                    (processed, duplicates, gaps, parked),
                    (got.processed, got.duplicates, got.gaps, got.parked)
                );
                Ok(())
            }
            Step::ParkRow {
                source,
                partition,
                offset,
                seq,
            } => {
                // As an earlier incarnation of the topic left it.
                self.client
                    .execute(
                        "INSERT INTO walrelay_consumer_parked (consumer_group, topic, partition, \
                         kafka_offset, idempotency_key, source, header_names, header_values, \
                         error, attempts) \
                         VALUES ($1, $2, $3, $4, $5, $6, '{}', '{}', 'an earlier incarnation', 1)",
                        &[
                            &self.group,
                            &self.topic,
                            partition,
                            offset,
                            &scenario::key(*partition, *seq),
                            source,
                        ],
                    )
                    .await?;
                Ok(())
            }
            Step::Redrive {
                handler,
                applied,
                failed,
                unusable,
            } => {
                let mut client = self.database.connect().await?;
                let broken = *handler == RedriveHandler::Broken;
                let report = walrelay_consumer::redrive(
                    &mut client,
                    &self.group,
                    async move |tx: &Transaction<'_>, d: &Delivery<'_>| {
                        apply(
                            tx,
                            std::slice::from_ref(d),
                            "redrive",
                            Duration::ZERO,
                            broken,
                        )
                        .await
                    },
                )
                .await?;
                ensure!(
                    (report.applied, report.failed, report.unusable)
                        == (*applied, *failed, *unusable),
                    "redrive (applied, failed, unusable): expected {:?}, got {:?}",
                    (applied, failed, unusable),
                    (report.applied, report.failed, report.unusable)
                );
                Ok(())
            }
        }
    }

    async fn produce_more(
        &mut self,
        source: &str,
        partitions: &[i32],
        count: i64,
    ) -> anyhow::Result<()> {
        for &p in partitions {
            let next = self.ledger.last(source, p).map_or(1, |s| s + 1);
            let planned = self
                .ledger
                .plan(source, &[p], next..next + count, None, false);
            self.send(planned).await?;
        }
        Ok(())
    }

    async fn send(&self, planned: Vec<scenario::Planned>) -> anyhow::Result<()> {
        let mut deliveries = Vec::new();
        for record in &planned {
            // The previous key as the relay's header set writes it.
            let (prev_header, prev) = match record.headers {
                scenario::HeaderSet::Full => (header::PREV_KEY, record.prev.clone()),
                scenario::HeaderSet::Lean if record.prev.is_empty() => {
                    (header::PREV, String::new())
                }
                scenario::HeaderSet::Lean => (
                    header::PREV,
                    walrelay_contract::EventKey::from_hex(&record.prev)?.to_compact(),
                ),
            };
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: header::IDEMPOTENCY_KEY,
                    value: Some(record.key.as_str()),
                })
                .insert(Header {
                    key: header::SOURCE,
                    value: Some(record.source.as_str()),
                })
                .insert(Header {
                    key: prev_header,
                    value: Some(prev.as_str()),
                });
            let payload = record.payload();
            let delivery = self
                .producer
                .send_result(
                    FutureRecord::to(&self.topic)
                        .partition(record.partition)
                        .payload(&payload)
                        .key(&record.key)
                        .headers(headers),
                )
                .map_err(|(e, _)| anyhow::anyhow!("enqueueing: {e}"))?;
            deliveries.push(delivery);
        }
        for delivery in deliveries {
            delivery
                .await?
                .map_err(|(e, _)| anyhow::anyhow!("delivery failed: {e}"))?;
        }
        Ok(())
    }

    fn settings(&self, max_batch_records: Option<usize>) -> Settings {
        let d = self.defaults;
        Settings {
            max_batch_records: max_batch_records.unwrap_or(d.max_batch_records),
            commit_interval: Duration::from_millis(d.commit_interval_ms),
            retry: RetryPolicy {
                attempts: d.retry.attempts,
                base: Duration::from_millis(d.retry.base_ms),
                cap: Duration::from_millis(d.retry.cap_ms),
            },
            on_poison: match d.on_poison {
                Poison::Park => OnPoison::Park,
                Poison::Stop => OnPoison::Stop,
            },
            ..Settings::default()
        }
    }

    async fn start(
        &mut self,
        name: &str,
        handler: HandlerKind,
        delay: Duration,
        max_batch_records: Option<usize>,
    ) -> anyhow::Result<()> {
        ensure!(
            !self.consumers.contains_key(name),
            "consumer {name} is already running"
        );
        let consumer = ConsumerLoop::new(
            support::kafka(&self.shared.broker.bootstrap_servers(), &self.group),
            &[&self.topic],
            PgHwmStore::new(),
            self.database.clone(),
        )?
        .with_settings(self.settings(max_batch_records));
        self.counters.push(consumer.counters());
        let (stop, shutdown) = watch::channel(false);
        let who = name.to_owned();
        let handle = match handler {
            HandlerKind::Batch => tokio::spawn(consumer.run_batches(
                async move |tx: &Transaction<'_>, batch: &[Delivery<'_>]| {
                    apply(tx, batch, &who, delay, true).await
                },
                shutdown,
            )),
            HandlerKind::Record => tokio::spawn(consumer.run(
                async move |tx: &Transaction<'_>, d: &Delivery<'_>| {
                    apply(tx, std::slice::from_ref(d), &who, delay, true).await
                },
                shutdown,
            )),
        };
        self.consumers
            .insert(name.to_owned(), Running { handle, stop });
        Ok(())
    }

    fn start_process(&mut self, name: &str, commit_interval_ms: u64) -> anyhow::Result<()> {
        ensure!(
            !self.processes.contains_key(name),
            "consumer process {name} is already running"
        );
        let spec = [
            self.shared.broker.bootstrap_servers().as_str(),
            &self.topic,
            &self.dsn,
            &self.group,
            name,
            &commit_interval_ms.to_string(),
        ]
        .join("\t");
        let child = Command::new(std::env::current_exe()?)
            .args(["conformance_child", "--exact", "--nocapture"])
            .env(CHILD_ENV, spec)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting this test binary as a consumer process")?;
        self.processes.insert(name.to_owned(), child);
        Ok(())
    }

    fn counters_sum(&self) -> walrelay_consumer::CountersSnapshot {
        let mut sum = walrelay_consumer::CountersSnapshot::default();
        for c in &self.counters {
            let s = c.snapshot();
            sum.processed += s.processed;
            sum.duplicates += s.duplicates;
            sum.gaps += s.gaps;
            sum.errors += s.errors;
            sum.parked += s.parked;
        }
        sum
    }

    async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(self.client.query_one(sql, &[]).await?.get(0))
    }

    /// Waits until the effects and parked rows and the records the
    /// in-process consumers saw reach the given numbers.
    async fn await_counts(
        &self,
        effects: Option<i64>,
        parked: Option<i64>,
        seen: Option<u64>,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + AWAIT;
        loop {
            let e = self.count("SELECT count(*) FROM effects").await?;
            let p = self
                .count("SELECT count(*) FROM walrelay_consumer_parked")
                .await?;
            let c = self.counters_sum();
            let s = c.processed + c.duplicates + c.parked;
            if effects.is_none_or(|n| e >= n)
                && parked.is_none_or(|n| p >= n)
                && seen.is_none_or(|n| s >= n)
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "timed out after {AWAIT:?} waiting for effects {effects:?}, parked {parked:?}, \
                     seen {seen:?}; have effects {e}, parked {p}, seen {s} ({c:?})"
                );
            }
            tokio::time::sleep(support::POLL).await;
        }
    }

    async fn check(&self, expect: &scenario::Expect) -> anyhow::Result<()> {
        let rows = self
            .client
            .query(
                "SELECT event_key, count(*) FROM effects GROUP BY event_key",
                &[],
            )
            .await?;
        let twice: Vec<(String, i64)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .filter(|(_, n)| *n > 1)
            .collect();
        ensure!(twice.is_empty(), "applied more than once: {twice:?}");
        let total = self.count("SELECT count(*) FROM effects").await?;
        let want_total = self.ledger.resolve(expect.effects, &expect.parked);
        ensure!(
            total == want_total,
            "effects rows: expected {want_total}, got {total}"
        );
        let got: BTreeSet<String> = rows.iter().map(|r| r.get(0)).collect();
        let want = self.ledger.expected_effects(&expect.parked);
        ensure!(
            got == want,
            "effects: missing {:?}, unexpected {:?}",
            want.difference(&got).collect::<Vec<_>>(),
            got.difference(&want).collect::<Vec<_>>()
        );

        let got: BTreeSet<(i32, String, String)> = self
            .client
            .query(
                "SELECT partition, source, hwm FROM walrelay_consumer_hwm \
                 WHERE consumer_group = $1 AND topic = $2",
                &[&self.group, &self.topic],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let mut want = BTreeSet::new();
        for m in &expect.marks {
            let seq = match m.seq {
                Seq::N(n) => n,
                Seq::Last(_) => self
                    .ledger
                    .last(&m.source, m.partition)
                    .with_context(|| format!("nothing produced for mark {m:?}"))?,
            };
            want.insert((
                m.partition,
                m.source.clone(),
                scenario::key(m.partition, seq),
            ));
        }
        ensure!(got == want, "marks: expected {want:?}, got {got:?}");

        let rows = self
            .client
            .query(
                "SELECT partition, idempotency_key, attempts FROM walrelay_consumer_parked \
                 ORDER BY partition, kafka_offset, id",
                &[],
            )
            .await?;
        let got: Vec<(i32, Option<String>, i32)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let want: Vec<(i32, Option<String>, Option<i32>)> = expect
            .parked
            .iter()
            .map(|p| {
                (
                    p.partition,
                    Some(scenario::key(p.partition, p.seq)),
                    p.attempts,
                )
            })
            .collect();
        let matches = got.len() == want.len()
            && got.iter().zip(&want).all(|(g, w)| {
                g.0 == w.0 && g.1 == w.1 && w.2.is_none_or(|attempts| attempts == g.2)
            });
        ensure!(
            matches,
            "parked (partition, key, attempts): expected {want:?}, got {got:?}"
        );
        Ok(())
    }
}
