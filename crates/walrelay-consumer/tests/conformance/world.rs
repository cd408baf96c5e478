//! One scenario played against the shared PostgreSQL and broker: its
//! database, topic and group, the records its relays produce, the
//! consumers it starts and stops, and the final checks.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio_postgres::{Client, NoTls, Transaction};
use walrelay_consumer::{
    migrate, ConsumerLoop, Counters, Database, Delivery, GroupProtocol, LoopError, LoopMetrics,
    OnPoison, PgHwmStore, RetryPolicy, Settings,
};
use walrelay_contract::header;
use walrelay_testkit::TestBroker;

use crate::handler::apply;
use crate::scenario::{
    self, Behaviour, Count, Defaults, HandlerKind, Ledger, Poison, RedriveHandler, Scenario, Seq,
    Step, Unapplied,
};
use crate::support::{self, RunHandle};
use crate::{Shared, AWAIT, CHILD_ENV, CREATE_EFFECTS};

struct Running {
    handle: RunHandle,
    stop: watch::Sender<bool>,
}

/// One scenario's world.
struct World<'a> {
    shared: &'a Shared,
    defaults: &'a Defaults,
    protocol: GroupProtocol,
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
    metrics: Vec<LoopMetrics>,
    expected_parked: &'a [scenario::Parked],
    not_applied: &'a [Unapplied],
}

/// How a consumer of a `start` step runs.
struct StartOptions {
    handler: HandlerKind,
    delay: Duration,
    max_batch_records: Option<usize>,
    max_batch_bytes: Option<usize>,
    handler_timeout: Option<Duration>,
    on_poison: Option<Poison>,
}

pub(crate) async fn run(
    shared: &Shared,
    defaults: &Defaults,
    scenario: Scenario,
    protocol: GroupProtocol,
) -> anyhow::Result<()> {
    // Under the consumer protocol in groups, topics and databases of their
    // own, so that both protocols can play on the same broker and cluster.
    let name = &match protocol {
        GroupProtocol::Classic => scenario.name.clone(),
        GroupProtocol::Consumer => format!("{}_consumer", scenario.name),
    };
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
        protocol,
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
        metrics: Vec::new(),
        expected_parked: &scenario.expect.parked,
        not_applied: &scenario.expect.not_applied,
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
                behaviour,
                times,
                payload_bytes,
            } => {
                let mut planned =
                    self.ledger
                        .plan(source, partitions, *from..=*to, *prev_seq, *poison);
                for p in &mut planned {
                    p.at_commit = *poison_at_commit;
                    p.fails = *fails;
                    p.headers = *headers;
                    p.behaviour = behaviour.map(|b| (b, *times));
                    p.payload_bytes = *payload_bytes;
                    if *behaviour == Some(Behaviour::Noop) {
                        self.ledger.noop.insert(p.key.clone());
                    }
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
                    let all = self.ledger.resolve(
                        Count::All(scenario::AllTag::All),
                        self.expected_parked,
                        self.not_applied,
                    );
                    self.await_counts(Some(all), None, None, None).await?;
                }
                bail!("consumer {consumer} applied nothing in 200 rounds")
            }
            Step::Start {
                consumer,
                handler,
                batch_delay_ms,
                max_batch_records,
                max_batch_bytes,
                handler_timeout_ms,
                on_poison,
            } => {
                let options = StartOptions {
                    handler: *handler,
                    delay: Duration::from_millis(*batch_delay_ms),
                    max_batch_records: *max_batch_records,
                    max_batch_bytes: *max_batch_bytes,
                    handler_timeout: handler_timeout_ms.map(Duration::from_millis),
                    on_poison: *on_poison,
                };
                self.start(consumer, options).await
            }
            Step::Stop { consumer, stopped } => {
                let running = self
                    .consumers
                    .remove(consumer)
                    .with_context(|| format!("no running consumer {consumer}"))?;
                running.stop.send(true)?;
                let ended = tokio::time::timeout(AWAIT, running.handle)
                    .await
                    .with_context(|| {
                        format!("consumer {consumer} did not stop within {AWAIT:?}")
                    })??;
                check_stopped(consumer, ended, stopped)
            }
            Step::StartProcess {
                consumer,
                commit_interval_ms,
                instance_id,
            } => self.start_process(consumer, *commit_interval_ms, instance_id.as_deref()),
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
                stopped,
                within_ms,
            } => {
                let effects = effects.map(|c| {
                    self.ledger
                        .resolve(c, self.expected_parked, self.not_applied)
                });
                let wait = within_ms.map_or(AWAIT, Duration::from_millis);
                let began = std::time::Instant::now();
                let counts = self.await_counts(effects, *parked, *seen, *stopped);
                tokio::time::timeout(wait, counts)
                    .await
                    .with_context(|| format!("not reached within {wait:?}"))??;
                if within_ms.is_some() {
                    // The measured time, for docs/operations.md's numbers.
                    eprintln!(
                        "scenario {}: reached after {} ms (within {wait:?})",
                        self.group,
                        began.elapsed().as_millis()
                    );
                }
                Ok(())
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

    fn settings(&self, options: &StartOptions) -> Settings {
        let d = self.defaults;
        Settings {
            max_batch_records: options.max_batch_records.unwrap_or(d.max_batch_records),
            max_batch_bytes: options
                .max_batch_bytes
                .unwrap_or(Settings::default().max_batch_bytes),
            commit_interval: Duration::from_millis(d.commit_interval_ms),
            retry: RetryPolicy {
                attempts: d.retry.attempts,
                base: Duration::from_millis(d.retry.base_ms),
                cap: Duration::from_millis(d.retry.cap_ms),
            },
            on_poison: match options.on_poison.unwrap_or(d.on_poison) {
                Poison::Park => OnPoison::Park,
                Poison::Stop => OnPoison::Stop,
            },
            ..Settings::default()
        }
    }

    async fn start(&mut self, name: &str, options: StartOptions) -> anyhow::Result<()> {
        ensure!(
            !self.consumers.contains_key(name),
            "consumer {name} is already running"
        );
        let consumer = ConsumerLoop::new(
            self.shared.consumer_kafka(&self.group, self.protocol),
            &[&self.topic],
            PgHwmStore::new(),
            self.database.clone(),
        )?
        .with_settings(self.settings(&options));
        let consumer = match options.handler_timeout {
            Some(timeout) => consumer.with_handler_timeout(timeout),
            None => consumer,
        };
        self.counters.push(consumer.counters());
        self.metrics.push(consumer.metrics());
        let delay = options.delay;
        let (stop, shutdown) = watch::channel(false);
        let who = name.to_owned();
        let handle = match options.handler {
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

    fn start_process(
        &mut self,
        name: &str,
        commit_interval_ms: u64,
        instance_id: Option<&str>,
    ) -> anyhow::Result<()> {
        ensure!(
            !self.processes.contains_key(name),
            "consumer process {name} is already running"
        );
        let spec = [
            self.shared.consumer_bootstrap().as_str(),
            &self.topic,
            &self.dsn,
            &self.group,
            name,
            &commit_interval_ms.to_string(),
            instance_id.unwrap_or(""),
            support::protocol_name(self.protocol),
        ]
        .join("\t");
        let child = Command::new(std::env::current_exe()?)
            .args(["conformance_child", "--exact", "--nocapture"])
            .env(CHILD_ENV, spec)
            .env(crate::CHILD_LOGIN_ENV, self.shared.login_lines())
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

    /// The partitions the in-process consumers report stopped.
    fn stopped_partitions(&self) -> anyhow::Result<u64> {
        let mut registry = prometheus_client::registry::Registry::default();
        for m in &self.metrics {
            m.register(&mut registry);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(text
            .lines()
            .filter(|l| l.contains("partition_stopped{") && l.ends_with(" 1"))
            .count() as u64)
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
        stopped: Option<u64>,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + AWAIT;
        loop {
            let e = self.count("SELECT count(*) FROM effects").await?;
            let p = self
                .count("SELECT count(*) FROM walrelay_consumer_parked")
                .await?;
            let c = self.counters_sum();
            let s = c.processed + c.duplicates + c.parked;
            let st = self.stopped_partitions()?;
            if effects.is_none_or(|n| e >= n)
                && parked.is_none_or(|n| p >= n)
                && seen.is_none_or(|n| s >= n)
                && stopped.is_none_or(|n| st >= n)
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "timed out after {AWAIT:?} waiting for effects {effects:?}, parked {parked:?}, \
                     seen {seen:?}, stopped {stopped:?}; have effects {e}, parked {p}, seen {s}, \
                     stopped {st} ({c:?})"
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
        let want_total = self
            .ledger
            .resolve(expect.effects, &expect.parked, &expect.not_applied);
        ensure!(
            total == want_total,
            "effects rows: expected {want_total}, got {total}"
        );
        let got: BTreeSet<String> = rows.iter().map(|r| r.get(0)).collect();
        let want = self
            .ledger
            .expected_effects(&expect.parked, &expect.not_applied);
        ensure!(
            got == want,
            "effects: missing {:?}, unexpected {:?}",
            want.difference(&got).collect::<Vec<_>>(),
            got.difference(&want).collect::<Vec<_>>()
        );

        if let Some(marks) = &expect.marks {
            self.check_marks(marks).await?;
        }
        self.check_parked(&expect.parked).await
    }

    async fn check_marks(&self, marks: &[scenario::Mark]) -> anyhow::Result<()> {
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
        for m in marks {
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
        Ok(())
    }

    async fn check_parked(&self, parked: &[scenario::Parked]) -> anyhow::Result<()> {
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
        let want: Vec<(i32, Option<String>, Option<i32>)> = parked
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

/// A stopped loop's outcome against a `stop` step's `stopped`.
fn check_stopped(
    consumer: &str,
    ended: Result<(), LoopError>,
    want: &[scenario::Stopped],
) -> anyhow::Result<()> {
    let got = match ended {
        Ok(()) => Vec::new(),
        Err(LoopError::Stopped(stopped)) => stopped,
        Err(e) => return Err(e.into()),
    };
    let mut partitions: Vec<i32> = got.iter().map(|s| s.partition).collect();
    partitions.sort_unstable();
    let mut wanted: Vec<i32> = want.iter().map(|s| s.partition).collect();
    wanted.sort_unstable();
    ensure!(
        partitions == wanted,
        "consumer {consumer}: stopped partitions {partitions:?}, expected {wanted:?}: {got:?}"
    );
    for w in want {
        let error = got
            .iter()
            .find(|s| s.partition == w.partition)
            .map(|s| s.error.as_str())
            .unwrap_or_default();
        ensure!(
            error.contains(&w.error_contains),
            "consumer {consumer}: partition {} stopped with {error:?}, which lacks {:?}",
            w.partition,
            w.error_contains
        );
    }
    Ok(())
}
