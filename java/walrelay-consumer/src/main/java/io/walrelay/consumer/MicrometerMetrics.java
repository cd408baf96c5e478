package io.walrelay.consumer;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.DistributionSummary;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.Timer;
import io.walrelay.consumer.loop.LoopMetrics;
import io.walrelay.consumer.loop.Phase;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.ToDoubleFunction;

/**
 * The loop's metrics in a Micrometer registry, with the Rust crate's names
 * (docs/metrics.md, "Consumer metrics"): in Prometheus's format
 * {@code walrelay_consumer_records_applied_total}, {@code ..._duplicates_skipped_total},
 * {@code ..._gaps_total}, {@code ..._failed_attempts_total}, {@code ..._parked_total},
 * {@code ..._batch_records}, {@code ..._apply_seconds}, {@code ..._retries_total},
 * {@code ..._batches_total}, {@code ..._pauses_total}, {@code ..._hwm_commit_lsn},
 * {@code ..._partition_stopped}, {@code ..._parked_records}, {@code ..._lag_records} and
 * {@code ..._partition_seconds_total}. Only loaded
 * when {@link ConsumerLoop#withMeterRegistry} is called, so Micrometer is an
 * optional dependency.
 */
final class MicrometerMetrics implements LoopMetrics {
    private static final String P = "walrelay_consumer_";
    private final MeterRegistry registry;
    private final DistributionSummary batchRecords;
    private final Timer applySeconds;
    private final Counter retries;
    private final Counter batches;
    private final Counter pauses;
    private final AtomicLong parkedRecords = new AtomicLong();
    /** One counter per {@link Phase}, by ordinal. */
    private final Counter[] phases = new Counter[Phase.values().length];
    private final Map<String, AtomicLong> gauges = new ConcurrentHashMap<>();

    /** Registers the meters; the five totals read {@code c}, the loop's counters, when scraped. */
    MicrometerMetrics(MeterRegistry registry, Counters c) {
        this.registry = registry;
        counter("records_applied", "Records whose side effects were committed", c, x -> x.processed.get());
        counter("duplicates_skipped", "Deliveries skipped because the high-water mark already covered them", c,
                x -> x.duplicates.get());
        counter("gaps", "Records whose previous key (walrelay-prev or walrelay-prev-key) was above the high-water mark",
                c, x -> x.gaps.get());
        counter("failed_attempts", "Batch or record attempts that failed and were rolled back", c, x -> x.errors.get());
        counter("parked", "Records parked in walrelay_consumer_parked", c, x -> x.parked.get());
        batchRecords = DistributionSummary.builder(P + "batch_records")
                .description("Records per committed batch transaction").register(registry);
        applySeconds = Timer.builder(P + "apply")
                .description("Time from the start of a batch transaction to its commit").register(registry);
        retries = Counter.builder(P + "retries").description("Attempts retried after a handler or database failure")
                .register(registry);
        batches = Counter.builder(P + "batches").description("Batch transactions committed").register(registry);
        pauses = Counter.builder(P + "pauses").description("Times a partition was paused in Kafka").register(registry);
        Gauge.builder(P + "parked_records", parkedRecords, AtomicLong::get)
                .description("Records of the group waiting in walrelay_consumer_parked (read from the table)")
                .register(registry);
        for (Phase phase : Phase.values()) {
            phases[phase.ordinal()] = Counter.builder(P + "partition_seconds")
                    .description("Where the assigned partitions' time went, in partition-seconds")
                    .tag("phase", phase.label()).register(registry);
        }
    }

    private void counter(String name, String help, Counters c, ToDoubleFunction<Counters> f) {
        FunctionCounter.builder(P + name, c, f).description(help).register(registry);
    }

    private AtomicLong gauge(String name, String help, Tags tags) {
        return gauges.computeIfAbsent(name + tags, k -> {
            AtomicLong v = new AtomicLong();
            Gauge.builder(P + name, v, AtomicLong::get).description(help).tags(tags).register(registry);
            return v;
        });
    }

    @Override
    public void committed(String topic, int partition, int records, double seconds, BatchOutcome outcome, Counters t) {
        batchRecords.record(records);
        applySeconds.record((long) (seconds * 1e9), TimeUnit.NANOSECONDS);
        batches.increment();
        for (Map.Entry<String, String> m : outcome.marks().entrySet()) {
            long lsn = Long.parseUnsignedLong(m.getValue().substring(0, 16), 16);
            gauge("hwm_commit_lsn", "Commit LSN (high 64 bits of the key) of each high-water mark",
                    Tags.of("topic", topic, "partition", Integer.toString(partition), "source", m.getKey())).set(lsn);
        }
    }

    @Override
    public void failed(Counters t) {
        retries.increment();
    }

    @Override
    public void parked(Counters t) {}

    @Override
    public void stopped(String topic, int partition, boolean stopped) {
        gauge("partition_stopped", "1 while a partition is stopped by a poison record",
                Tags.of("topic", topic, "partition", Integer.toString(partition))).set(stopped ? 1 : 0);
    }

    @Override
    public void paused() {
        pauses.increment();
    }

    @Override
    public void parkedRecords(long rows) {
        parkedRecords.set(rows);
    }

    @Override
    public void phaseSeconds(Phase phase, double seconds) {
        phases[phase.ordinal()].increment(seconds);
    }

    @Override
    public void lag(String topic, int partition, long records) {
        gauge("lag_records", "Records after the consumer's position", Tags.of("topic", topic, "partition",
                Integer.toString(partition))).set(records);
    }
}
