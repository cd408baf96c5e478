//! One workload's drains: its slots and backlog, a warm-up drain not
//! counted, then per repeat every walrelay row (in [`drain_order`]), the
//! decode and produce limits, and after them Debezium and the polling
//! relay. Each drain itself is [`crate::drain`]'s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use walrelay_testkit::Variant;

use crate::debezium;
use crate::drain::{self, DrainRun, ScratchFile};
use crate::env::BenchEnv;
use crate::kafka::{self, RecordShape};
use crate::polling::{PollingOptions, PollingRelay};
use crate::procstat;
use crate::runs::{Results, Tool, ToolRun};
use crate::workload::{self, Kind, Workload};

/// How long one drain may take.
const TIMEOUT: Duration = Duration::from_secs(900);

/// What every workload's drains share.
pub(crate) struct DrainOptions<'a> {
    pub repeats: u32,
    /// The backlog's first sequence number.
    pub first_seq: u64,
    pub bins: Binaries<'a>,
    /// `--walrelay-arg`.
    pub walrelay_args: &'a [String],
    /// `--kafka-property`.
    pub kafka_properties: &'a [(String, String)],
    pub polling: PollingOptions,
    /// Scratch space (pg_recvlogical output, walrelay config and logs).
    pub scratch: &'a Path,
}

/// One walrelay drained ([`Binaries::walrelays`]).
type WalrelayRun<'a> = (Tool, &'static str, bool, &'a Path, &'static [&'static str]);

/// The binaries a drain runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binaries<'a> {
    pub walrelay: &'a Path,
    /// `--baseline-bin`.
    pub baseline: Option<&'a Path>,
    /// Whether the reference tools (decode and produce limits, the
    /// polling relay) drain too.
    pub references: bool,
    /// The Python relay's interpreter (the project's virtualenv, with
    /// psycopg2 and confluent-kafka): it drains with the references.
    pub python: Option<&'a Path>,
    /// Debezium's variants drained (none: `--no-debezium`).
    pub debezium: &'a [Variant],
    /// Whether Debezium's workers are restarted after their drains.
    pub debezium_restart: bool,
}

impl<'a> Binaries<'a> {
    /// Each walrelay drained: its tool, slot and topic tag, whether its
    /// fence is on, its binary and its extra arguments.
    fn walrelays(&self) -> Vec<WalrelayRun<'a>> {
        let mut v = vec![
            (Tool::Walrelay, "wr", true, self.walrelay, &[][..]),
            (Tool::WalrelayNoFence, "wn", false, self.walrelay, &[][..]),
            (
                Tool::WalrelayFullHeaders,
                "wf",
                true,
                self.walrelay,
                &["--headers", "full"][..],
            ),
        ];
        if let Some(b) = self.baseline {
            v.push((Tool::WalrelayBaseline, "wb", true, b, &[][..]));
        }
        v
    }
}

/// A workload's backlog, written once and drained by every tool.
struct Backlog<'a> {
    w: &'a Workload,
    /// Where the backlog ends: each drain runs until its slot confirmed it.
    end: u64,
    end_text: String,
    /// The broker's idle CPU per second, subtracted from each run's.
    broker_idle: f64,
    bootstrap: String,
}

impl Backlog<'_> {
    fn slot(&self, tool: &str, r: u32) -> String {
        format!("{tool}_{}_{r}", self.w.id.replace('-', "_"))
    }
}

/// Drains `w`'s backlog with every tool, `o.repeats` times each.
pub(crate) async fn drain_workload(
    env: &mut BenchEnv,
    w: &Workload,
    o: &DrainOptions<'_>,
    results: &mut Results,
) -> Result<()> {
    tracing::info!("workload {} ({} events)", w.id, w.events);
    let backlog = write_backlog(env, w, o, results).await?;
    warm_up_drain(env, &backlog, o).await?;
    let walrelays = o.bins.walrelays();
    // Drains speed up over a workload's first minutes (see `drain_order`):
    // the references go after walrelay's drains in even repeats and before
    // them in odd ones, so that no side always drains on the warmer broker.
    for r in 0..o.repeats {
        let references_first = r % 2 == 1;
        if o.bins.references && references_first {
            reference_drains(env, &backlog, o, r, results).await?;
        }
        walrelay_drains(env, &backlog, o, r, results).await?;
        if o.bins.references && !references_first {
            reference_drains(env, &backlog, o, r, results).await?;
        }
    }
    for r in 0..o.repeats {
        for (_, name, _, _, _) in &walrelays {
            env.drop_slot(&backlog.slot(name, r)).await?;
        }
        if o.bins.references {
            env.drop_slot(&backlog.slot("rl", r)).await?;
        }
        if o.bins.python.is_some() {
            env.drop_slot(&backlog.slot("py", r)).await?;
        }
    }
    // Debezium after every other drain of the backlog: its restart commits
    // one more event, which no other tool's drain may see.
    if !o.bins.debezium.is_empty() {
        // walrelay's start and restart beside Debezium's, where those run.
        let walrelay_start = debezium::WalrelayStart {
            bin: o.bins.walrelay.to_path_buf(),
            scratch: o.scratch.to_path_buf(),
        };
        debezium::drain_workload(
            env,
            w,
            o.repeats,
            o.first_seq,
            o.bins.debezium,
            o.bins.debezium_restart,
            Some(&walrelay_start),
            backlog.broker_idle,
            results,
        )
        .await?;
    }
    if w.kind == Kind::Outbox && o.bins.references {
        polling_drains(env, &backlog, o, results).await?;
    }
    Ok(())
}

/// A fresh, warmed-up broker, every tool's slot, and the backlog.
async fn write_backlog<'a>(
    env: &mut BenchEnv,
    w: &'a Workload,
    o: &DrainOptions<'_>,
    results: &mut Results,
) -> Result<Backlog<'a>> {
    env.fresh_broker().await?;
    warm_up_broker(env, w).await?;
    // The broker's own idle CPU, subtracted from every run's below (a
    // moment after the warm-up, whose last requests it may still finish).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let broker_idle = env
        .broker_idle_cpu_per_s(Duration::from_secs(3))
        .await
        .unwrap_or(0.0);
    results.notes.push(format!(
        "{}: the broker's idle CPU, {:.3} s per s, is subtracted from its CPU per event",
        w.id, broker_idle
    ));
    env.client
        .batch_execute("TRUNCATE bench_outbox, bench_outbox_copy")
        .await?;
    let mut backlog = Backlog {
        w,
        end: 0,
        end_text: String::new(),
        broker_idle,
        bootstrap: env.bootstrap(),
    };
    if !o.bins.debezium.is_empty() {
        // Before the slots and the backlog (see the debezium module).
        debezium::ensure_publication(env).await?;
    }
    // The warm-up drain's slot (see below).
    env.create_slot(&backlog.slot("warmup", 0)).await?;
    for r in 0..o.repeats {
        for (_, name, _, _, _) in &o.bins.walrelays() {
            env.create_slot(&backlog.slot(name, r)).await?;
        }
        if o.bins.references {
            env.create_slot(&backlog.slot("rl", r)).await?;
        }
        if o.bins.python.is_some() {
            env.create_slot(&backlog.slot("py", r)).await?;
        }
        for v in o.bins.debezium {
            env.create_slot(&debezium::slot(*v, &w.id, r)).await?;
        }
    }
    let took = workload::generate_backlog(&env.client, w, o.first_seq).await?;
    (backlog.end, backlog.end_text) = env.current_lsn().await?;
    tracing::info!(
        "  backlog written in {:.1} s, ends at {}",
        took.as_secs_f64(),
        backlog.end_text
    );
    if w.kind == Kind::Outbox {
        env.client
            .batch_execute("INSERT INTO bench_outbox_copy SELECT * FROM bench_outbox")
            .await?;
    }
    Ok(backlog)
}

/// A warm-up drain of the whole backlog, not counted: the first drain
/// after the backlog was written ran up to a third slower than the next
/// ones (the server's checkpoint after the bulk write, the broker's JIT),
/// a penalty on whichever row drained first (see [`drain_order`]).
async fn warm_up_drain(env: &BenchEnv, b: &Backlog<'_>, o: &DrainOptions<'_>) -> Result<()> {
    let w = b.w;
    let (_, name, fence, bin, extra) = o.bins.walrelays()[0];
    let topic = format!("bench.{}.warmup", w.id);
    let slot = b.slot("warmup", 0);
    let (config, args) = prepare_walrelay(env, o, &slot, &topic, fence, extra)?;
    let log = o
        .scratch
        .join(format!("walrelay-{}-{name}-warmup.log", w.id));
    let d = drain::walrelay(env, bin, &args, &config, &slot, b.end, &log, TIMEOUT).await?;
    tracing::info!(
        "  warm-up drain (not counted): {:.0} events/s",
        w.events as f64 / d.seconds
    );
    env.drop_slot(&slot).await
}

/// Repeat `r` of walrelay with its tail fence (the default), without it,
/// with the full header set, and the baseline binary if any, in the order
/// [`drain_order`] gives (each compared pair adjacent, which of the two
/// goes first alternating).
async fn walrelay_drains(
    env: &BenchEnv,
    b: &Backlog<'_>,
    o: &DrainOptions<'_>,
    r: u32,
    results: &mut Results,
) -> Result<()> {
    let w = b.w;
    let walrelays = o.bins.walrelays();
    for i in drain_order(walrelays.len(), r) {
        let (tool, name, fence, walrelay_bin, extra) = walrelays[i];
        let topic = format!("bench.{}.{name}{r}", w.id);
        let slot = b.slot(name, r);
        let (config, args) = prepare_walrelay(env, o, &slot, &topic, fence, extra)?;
        let log = o.scratch.join(format!("walrelay-{}-{name}-{r}.log", w.id));
        let broker_cpu = env.broker_cpu_window();
        let mut d = drain::walrelay(
            env,
            walrelay_bin,
            &args,
            &config,
            &slot,
            b.end,
            &log,
            TIMEOUT,
        )
        .await?;
        d.broker_cpu_seconds = broker_cpu.finish(env, b.broker_idle);
        d.kafka_bytes = env.topic_log_bytes(&topic);
        let (bootstrap, t, n) = (b.bootstrap.clone(), topic.clone(), w.events);
        let counted = tokio::task::spawn_blocking(move || {
            kafka::count_records(
                &bootstrap,
                &t,
                n,
                Duration::from_secs(15),
                Duration::from_secs(300),
            )
        })
        .await??;
        if counted.records > w.events {
            bail!(
                "walrelay: {} records in {topic}, {} expected",
                counted.records,
                w.events
            );
        }
        if counted.records < w.events {
            // The drain itself is proven by the confirmed position
            // (walrelay confirms only what Kafka acknowledged); reading
            // the topic back is a cross-check, and Tansu's memory
            // storage can stall serving a topic of a million records.
            let note = format!(
                "{} repeat {r} ({}): read back {} of {} records from walrelay's topic before the reader went quiet (a cross-check only; the drain is confirmed by the slot position)",
                w.id,
                tool.label(),
                counted.records,
                w.events
            );
            tracing::warn!("{note}");
            results.notes.push(note);
        }
        record(results, w, tool, r, d, Some(counted));
    }
    Ok(())
}

/// Repeat `r` of the decode limit (`pg_recvlogical`), the Python relay
/// (when its virtualenv is there) and the produce limit with each
/// relay's records (the plain rdkafka producer).
async fn reference_drains(
    env: &BenchEnv,
    b: &Backlog<'_>,
    o: &DrainOptions<'_>,
    r: u32,
    results: &mut Results,
) -> Result<()> {
    let w = b.w;
    let file = ScratchFile(o.scratch.join(format!("recv-{}-{r}.out", w.id)));
    let d = drain::pg_recvlogical(env, &b.slot("rl", r), &b.end_text, &file.0, TIMEOUT).await?;
    drop(file);
    record(results, w, Tool::PgRecvlogical, r, d, None);

    if let Some(python) = o.bins.python {
        let topic = format!("bench.{}.py{r}", w.id);
        env.create_topic(&topic)?;
        let log = o.scratch.join(format!("python-relay-{}-{r}.log", w.id));
        let broker_cpu = env.broker_cpu_window();
        let mut d =
            drain::python_relay(env, python, &b.slot("py", r), b.end, &topic, &log, TIMEOUT)
                .await?;
        d.broker_cpu_seconds = broker_cpu.finish(env, b.broker_idle);
        d.kafka_bytes = env.topic_log_bytes(&topic);
        record(results, w, Tool::PythonRelay, r, d, None);
    }
    for (tool, shape, tag) in [
        (Tool::Producer, RecordShape::Walrelay, "producer"),
        (
            Tool::ProducerOneHeader,
            RecordShape::OneHeader,
            "producer1h",
        ),
    ] {
        let topic = format!("bench.{}.{tag}{r}", w.id);
        env.create_topic(&topic)?;
        let (bootstrap, t, wl) = (b.bootstrap.clone(), topic.clone(), w.clone());
        let db = env.db_cpu_window()?;
        let broker_cpu = env.broker_cpu_window();
        let p =
            tokio::task::spawn_blocking(move || kafka::produce_limit(&bootstrap, &t, &wl, shape))
                .await??;
        let d = DrainRun {
            seconds: p.seconds,
            cpu_seconds: p.cpu_seconds,
            db_cpu_seconds: db.finish().await?,
            broker_cpu_seconds: broker_cpu.finish(env, b.broker_idle),
            kafka_bytes: env.topic_log_bytes(&topic),
            ..Default::default()
        };
        record(results, w, tool, r, d, None);
    }
    Ok(())
}

/// Every repeat of the polling outbox relay, each on the backlog copied
/// back into the outbox.
async fn polling_drains(
    env: &BenchEnv,
    b: &Backlog<'_>,
    o: &DrainOptions<'_>,
    results: &mut Results,
) -> Result<()> {
    let w = b.w;
    for r in 0..o.repeats {
        if r > 0 {
            env.client
                .batch_execute("INSERT INTO bench_outbox SELECT * FROM bench_outbox_copy")
                .await?;
        }
        env.client
            .batch_execute("VACUUM ANALYZE bench_outbox")
            .await?;
        let topic = format!("bench.{}.poll{r}", w.id);
        env.create_topic(&topic)?;
        let mut relay =
            PollingRelay::new(env.new_client().await?, &b.bootstrap, &topic, o.polling)?;
        let db = env.db_cpu_window()?;
        let cpu0 = procstat::self_cpu_seconds()?;
        let t0 = std::time::Instant::now();
        let n = relay.drain().await?;
        let seconds = t0.elapsed().as_secs_f64();
        if n != w.events {
            bail!("polling relay relayed {n} rows, {} expected", w.events);
        }
        let d = DrainRun {
            seconds,
            cpu_seconds: procstat::self_cpu_seconds()? - cpu0,
            db_cpu_seconds: db.finish().await?,
            ..Default::default()
        };
        record(results, w, Tool::Polling, r, d, None);
    }
    Ok(())
}

/// One drain's row of the report, and its log line.
fn record(
    results: &mut Results,
    w: &Workload,
    tool: Tool,
    r: u32,
    d: DrainRun,
    n: Option<kafka::Counted>,
) {
    tracing::info!(
        "  {} #{r}: {:.0} events/s, cpu {:.2} s, db cpu {:.2} s{}",
        tool_name(tool),
        w.events as f64 / d.seconds,
        d.cpu_seconds,
        d.db_cpu_seconds,
        d.peak_rss_bytes
            .map(|b| format!(", peak rss {:.1} MB", b as f64 / 1e6))
            .unwrap_or_default()
    );
    results.drain.push(ToolRun {
        tool,
        workload: w.id.clone(),
        repeat: r,
        events: w.events,
        seconds: d.seconds,
        events_per_s: w.events as f64 / d.seconds,
        cpu_seconds: d.cpu_seconds,
        db_cpu_seconds: Some(d.db_cpu_seconds),
        peak_rss_bytes: d.peak_rss_bytes,
        records_in_broker: n.map(|n| n.records),
        broker_cpu_seconds: d.broker_cpu_seconds,
        kafka_bytes: d.kafka_bytes,
        walrelay_header_bytes: n.map(|n| n.walrelay_header_bytes),
        fence: d.fence,
        startup: None,
        duplicates: None,
    });
}

/// Sends a fresh broker records like `w`'s (up to 100,000, with the plain
/// producer) before anything is measured on it, so that the first run of a
/// workload does not pay for the broker's start (a JVM compiles its produce
/// path in the first seconds: a few thousand events would otherwise show
/// ten times the broker CPU per event of the runs after them).
pub(crate) async fn warm_up_broker(env: &BenchEnv, w: &Workload) -> Result<()> {
    let topic = "bench.warm-up";
    env.create_topic(topic)?;
    let warm = Workload {
        events: w.events.min(100_000),
        ..w.clone()
    };
    let b = env.bootstrap();
    tokio::task::spawn_blocking(move || {
        kafka::produce_limit(&b, topic, &warm, RecordShape::Walrelay)
    })
    .await??;
    Ok(())
}

/// Creates a walrelay drain's topic and writes its configuration (slot,
/// topic, fence, the bench's producer properties): the configuration's
/// path and the binary's arguments (the bench's, then the row's own).
fn prepare_walrelay(
    env: &BenchEnv,
    o: &DrainOptions<'_>,
    slot: &str,
    topic: &str,
    fence: bool,
    extra: &[&str],
) -> Result<(PathBuf, Vec<String>)> {
    env.create_topic(topic)?;
    let config = o.scratch.join("walrelay.toml");
    drain::write_walrelay_config(&config, env, slot, topic, topic, o.kafka_properties, fence)?;
    let args = o
        .walrelay_args
        .iter()
        .cloned()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect();
    Ok((config, args))
}

/// The order of repeat `r`'s walrelay drains, as indices into
/// [`Binaries::walrelays`] (0 this build, 1 fence off, 2 full header set,
/// 3 the baseline binary if any).
///
/// Drains speed up over a workload's first minute or two (the fresh
/// broker's JIT, the server after the bulk write), so a ratio between two
/// drains is biased towards the later one. An A/A run (the baseline the
/// same binary) showed 0.89x with the old rotation of all four, which
/// never put the baseline first in three repeats. So the pairs the report
/// compares (this build against fence off, and against the baseline) run
/// back to back with this build in the middle, in alternating direction;
/// the full header set, compared on bytes rather than speed, runs last.
fn drain_order(len: usize, r: u32) -> Vec<usize> {
    let mut core: Vec<usize> = [1, 0, 3].into_iter().filter(|&i| i < len).collect();
    if r % 2 == 1 {
        core.reverse();
    }
    core.extend((2..3).filter(|&i| i < len));
    core
}

fn tool_name(t: Tool) -> &'static str {
    match t {
        Tool::Walrelay => "walrelay",
        Tool::WalrelayNoFence => "walrelay (fence off)",
        Tool::WalrelayFullHeaders => "walrelay (full header set)",
        Tool::WalrelayBaseline => "walrelay (baseline binary)",
        Tool::PgRecvlogical => "pg_recvlogical",
        Tool::Producer => "rdkafka producer",
        Tool::ProducerOneHeader => "rdkafka producer, one header",
        Tool::PythonRelay => "Python relay",
        Tool::Polling => "polling relay",
        Tool::Debezium => "Debezium (defaults)",
        Tool::DebeziumTuned => "Debezium (tuned)",
    }
}

#[cfg(test)]
mod tests {
    use super::drain_order;

    #[test]
    fn compared_drains_run_back_to_back_in_alternating_direction() {
        // Without a baseline: fence off and this build adjacent, swapping
        // who goes first; the full header set last.
        assert_eq!(drain_order(3, 0), vec![1, 0, 2]);
        assert_eq!(drain_order(3, 1), vec![0, 1, 2]);
        // With one: this build between its two comparisons.
        assert_eq!(drain_order(4, 0), vec![1, 0, 3, 2]);
        assert_eq!(drain_order(4, 1), vec![3, 0, 1, 2]);
        assert_eq!(drain_order(4, 2), vec![1, 0, 3, 2]);
        for r in 0..4 {
            let mut o = drain_order(4, r);
            o.sort_unstable();
            assert_eq!(o, vec![0, 1, 2, 3], "every run once");
        }
    }
}
