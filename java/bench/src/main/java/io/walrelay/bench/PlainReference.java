package io.walrelay.bench;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The bench's Java reference peers, written as a skilled Java team writes them
 * on plain kafka-clients and JDBC, with no walrelay code: one poll loop per
 * partition (each its own consumer in the group and its own connection, so
 * partitions are fetched and applied in parallel, as the library does), up to
 * 500 records per poll ({@code max.poll.records}), each poll's records applied
 * in one transaction, offsets committed asynchronously after the database
 * commit, at most every second (and synchronously at the stop).
 *
 * <p>{@code careful}: the inbox table, the ids in one multi-row
 * {@code INSERT ... ON CONFLICT DO NOTHING RETURNING}, the effects of the new
 * ids in one multi-row insert. {@code limit}: the same effects insert with no
 * deduplication at all (the best plain loop: the library's limit).
 */
final class PlainReference {
    static final String INBOX = "INSERT INTO inbox (event_id) SELECT * FROM unnest(?::text[]) "
            + "ON CONFLICT DO NOTHING RETURNING event_id";
    static final int BATCH = 500;
    static final long COMMIT_INTERVAL_NS = Duration.ofSeconds(1).toNanos();

    private final Map<String, Object> kafka;
    private final String topic;
    private final String url;
    private final boolean careful;
    private final int loops;
    private final AtomicLong processed = new AtomicLong();
    private final List<KafkaConsumer<byte[], byte[]>> consumers = new CopyOnWriteArrayList<>();
    private volatile boolean stopping;

    PlainReference(Map<String, Object> kafka, String topic, String url, boolean careful, int loops) {
        this.kafka = new HashMap<>(kafka);
        this.kafka.put("enable.auto.commit", "false");
        this.kafka.put("max.poll.records", String.valueOf(BATCH));
        this.topic = topic;
        this.url = url;
        this.careful = careful;
        this.loops = Math.max(1, loops);
    }

    /** Runs {@code loops} loops on threads of their own until SIGTERM. */
    void run() throws Exception {
        BenchConsumer.reporter(processed::get);
        BenchConsumer.onSigterm(() -> {
            stopping = true;
            consumers.forEach(KafkaConsumer::wakeup);
        });
        List<Thread> threads = new ArrayList<>();
        List<Throwable> failed = new CopyOnWriteArrayList<>();
        for (int i = 0; i < loops; i++) {
            Thread t = new Thread(() -> {
                try {
                    loop();
                } catch (Throwable e) {
                    failed.add(e);
                    stopping = true;
                    consumers.forEach(KafkaConsumer::wakeup);
                }
            }, "plain-loop-" + i);
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            t.join();
        }
        if (!failed.isEmpty()) {
            failed.get(0).printStackTrace();
            System.exit(1);
        }
        BenchConsumer.stopped(processed.get());
    }

    /** One loop: its own consumer in the group, its own connection. */
    private void loop() throws Exception {
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(kafka, new ByteArrayDeserializer(),
                new ByteArrayDeserializer());
                Connection conn = BenchConsumer.dataSource(url).getConnection()) {
            consumers.add(consumer);
            if (stopping) {
                return;
            }
            conn.setAutoCommit(false);
            consumer.subscribe(List.of(topic));
            Map<TopicPartition, OffsetAndMetadata> pending = new HashMap<>();
            long lastCommit = System.nanoTime();
            try {
                while (!stopping) {
                    ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                    if (!records.isEmpty()) {
                        BenchConsumer.first();
                        apply(conn, records);
                        for (TopicPartition tp : records.partitions()) {
                            List<ConsumerRecord<byte[], byte[]>> of = records.records(tp);
                            pending.put(tp, new OffsetAndMetadata(of.get(of.size() - 1).offset() + 1));
                        }
                        processed.addAndGet(records.count());
                    }
                    if (!pending.isEmpty() && System.nanoTime() - lastCommit >= COMMIT_INTERVAL_NS) {
                        consumer.commitAsync(new HashMap<>(pending), null);
                        pending.clear();
                        lastCommit = System.nanoTime();
                    }
                }
            } catch (WakeupException e) {
                // SIGTERM: stop below.
            }
            if (!pending.isEmpty()) {
                try {
                    consumer.commitSync(pending);
                } catch (WakeupException e) {
                    // SIGTERM's wakeup came while this loop was applying, not
                    // polling: it fires at the next blocking call, this one,
                    // and is then cleared.
                    consumer.commitSync(pending);
                }
            }
        }
    }

    /** One poll's records in one transaction. */
    private void apply(Connection conn, ConsumerRecords<byte[], byte[]> records) throws Exception {
        int n = records.count();
        List<String> ids = new ArrayList<>(n);
        List<byte[]> values = new ArrayList<>(n);
        for (ConsumerRecord<byte[], byte[]> r : records) {
            ids.add(idempotencyKey(r));
            values.add(r.value());
        }
        Set<String> fresh = careful ? insertInbox(conn, ids) : null;
        List<String> keepIds = new ArrayList<>(n);
        List<String> keepPayloads = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            if (fresh == null || fresh.contains(ids.get(i))) {
                keepIds.add(ids.get(i));
                byte[] v = values.get(i);
                keepPayloads.add(v == null ? "" : new String(v, StandardCharsets.UTF_8));
            }
        }
        BenchConsumer.insertEffects(conn, keepIds.toArray(new String[0]), keepPayloads.toArray(new String[0]));
        conn.commit();
    }

    private static Set<String> insertInbox(Connection conn, List<String> ids) throws Exception {
        Set<String> fresh = new HashSet<>(ids.size() * 2);
        try (PreparedStatement ps = conn.prepareStatement(INBOX)) {
            ps.setArray(1, conn.createArrayOf("text", ids.toArray()));
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    fresh.add(rs.getString(1));
                }
            }
        }
        return fresh;
    }

    private static String idempotencyKey(ConsumerRecord<byte[], byte[]> r) {
        Header h = r.headers().lastHeader("idempotency-key");
        if (h == null) {
            throw new IllegalStateException("a record without idempotency-key at offset " + r.offset());
        }
        return new String(h.value(), StandardCharsets.UTF_8);
    }
}
