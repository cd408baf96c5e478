package io.walrelay.consumer.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.walrelay.consumer.BatchApplier;
import io.walrelay.consumer.BatchException;
import io.walrelay.consumer.BatchHandler;
import io.walrelay.consumer.BatchOutcome;
import io.walrelay.consumer.Delivery;
import io.walrelay.consumer.Migration;
import io.walrelay.consumer.Position;
import io.walrelay.consumer.RecordMeta;
import io.walrelay.consumer.conformance.TestPostgres;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * A JdbcTemplate handler in the batch's transaction, against a real
 * throwaway PostgreSQL: through {@link SpringTransactionScope} (what
 * {@link WalrelayConsumer} installs on its loop) the handler's
 * {@code JdbcTemplate} and {@code TransactionTemplate} join the batch's
 * connection and transaction, so the handler's rows and the raised mark
 * commit together, and roll back together when the handler throws or marks
 * the transaction rollback-only.
 */
@Tag("integration")
class SpringTransactionScopeTest {
    private static final String SOURCE = "test/db/slot";
    private static final Position POSITION = new Position("spring", "orders", 0);
    private static TestPostgres pg;
    private PGSimpleDataSource ds;
    private JdbcTemplate jdbc;
    private SpringTransactionScope scope;

    @BeforeAll
    static void startPostgres() throws Exception {
        pg = new TestPostgres();
    }

    @AfterAll
    static void stopPostgres() {
        if (pg != null) {
            pg.close();
        }
    }

    @BeforeEach
    void freshDatabase() throws Exception {
        ds = TestPostgres.dataSource(pg.createDatabase());
        try (Connection c = ds.getConnection()) {
            Migration.migrate(c);
        }
        jdbc = new JdbcTemplate(ds);
        jdbc.execute("CREATE TABLE effects (key text NOT NULL, payload text NOT NULL)");
        scope = new SpringTransactionScope(ds);
    }

    /** Records at offsets {@code from..from+n-1}, keys equal to their offsets + 1. */
    private static List<Delivery> records(long from, int n) {
        List<Delivery> out = new ArrayList<>();
        for (long o = from; o < from + n; o++) {
            String key = String.format("%032x", o + 1);
            byte[] value = ("event " + o).getBytes(StandardCharsets.UTF_8);
            out.add(new Delivery(new ConsumerRecord<>(POSITION.topic(), POSITION.partition(), o, null, value),
                    new RecordMeta(key, SOURCE, null, null, null), POSITION));
        }
        return out;
    }

    /** Runs {@code body} in the scope, as the loop does, after checking JdbcTemplate gets the batch's connection. */
    private BatchHandler inScope(BatchHandler body) {
        return (conn, batch) -> scope.run(conn, () -> {
            assertSame(conn, DataSourceUtils.getConnection(ds), "Spring sees the batch's connection");
            body.apply(conn, batch);
        });
    }

    private final BatchHandler insertAll = (conn, batch) -> {
        for (Delivery d : batch) {
            jdbc.update("INSERT INTO effects (key, payload) VALUES (?, ?)", d.key(),
                    new String(d.payload(), StandardCharsets.UTF_8));
        }
    };

    private BatchOutcome apply(List<Delivery> batch, BatchHandler handler) throws Exception {
        try (Connection conn = ds.getConnection()) {
            return BatchApplier.processBatch(conn, POSITION, batch, handler);
        }
    }

    private int effects() {
        return jdbc.queryForObject("SELECT count(*) FROM effects", Integer.class);
    }

    private String mark() {
        List<String> marks = jdbc.queryForList("SELECT hwm FROM walrelay_consumer_hwm WHERE consumer_group = ? "
                + "AND topic = ? AND partition = ? AND source = ?", String.class, POSITION.group(), POSITION.topic(),
                POSITION.partition(), SOURCE);
        return marks.isEmpty() ? null : marks.get(0);
    }

    @Test
    void handlerRowsAndTheMarkCommitTogether() throws Exception {
        BatchOutcome first = apply(records(0, 3), inScope(insertAll));
        assertEquals(3, first.applied());
        assertEquals(3, effects());
        assertEquals(String.format("%032x", 3), mark());

        // Redelivered with one new record: the mark drops the three applied.
        BatchOutcome again = apply(records(0, 4), inScope(insertAll));
        assertEquals(1, again.applied());
        assertEquals(3, again.duplicates());
        assertEquals(4, effects());
        assertEquals(String.format("%032x", 4), mark());
    }

    @Test
    void aThrowingHandlerRollsBackItsRowsAndTheMark() throws Exception {
        apply(records(0, 2), inScope(insertAll));
        BatchHandler failing = inScope((conn, batch) -> {
            insertAll.apply(conn, batch);
            throw new IllegalStateException("the handler failed after its inserts");
        });
        assertThrows(BatchException.class, () -> apply(records(2, 3), failing));
        assertEquals(2, effects(), "the failed batch's rows rolled back");
        assertEquals(String.format("%032x", 2), mark(), "the mark rolled back with them");

        // Retried with a handler that succeeds: applied once.
        assertEquals(3, apply(records(2, 3), inScope(insertAll)).applied());
        assertEquals(5, effects());
        assertEquals(String.format("%032x", 5), mark());
    }

    @Test
    void aJoinedTransactionMarkedRollbackOnlyRollsBackTheBatch() throws Exception {
        TransactionTemplate tx = new TransactionTemplate(new DataSourceTransactionManager(ds));
        BatchHandler rollbackOnly = inScope((conn, batch) -> tx.executeWithoutResult(status -> {
            try {
                insertAll.apply(conn, batch);
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
            status.setRollbackOnly();
        }));
        assertThrows(BatchException.class, () -> apply(records(0, 2), rollbackOnly));
        assertEquals(0, effects());
        String mark = mark();
        assertTrue(mark == null || mark.equals("0".repeat(32)), "no mark raised: " + mark);
    }
}
