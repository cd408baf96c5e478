package io.walrelay.consumer;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.postgresql.core.BaseConnection;
import org.postgresql.core.TransactionState;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One batch of one partition in one transaction: lock the marks, drop what
 * they already cover, run the handler on the rest, raise the marks, commit
 * (the Rust crate's {@code apply.rs}, Python's {@code apply.py}: the same
 * statements, the same locks in the same order, the same rows).
 *
 * <p>Round trips: the lock of the marks (pgjdbc sends {@code BEGIN} with
 * it; the insert of missing rows only for sources not known to exist), the
 * handler's statements, the marks' {@code UPDATE}, {@code COMMIT}.
 */
public final class BatchApplier {
    private static final Logger LOG = LoggerFactory.getLogger("io.walrelay.consumer");

    private BatchApplier() {}

    /**
     * Applies {@code records} (of one partition, in offset order) exactly once
     * with a batch handler, on a connection you own that has no transaction
     * open; commits, or throws with everything rolled back.
     */
    public static BatchOutcome processBatch(Connection conn, Position position, List<Delivery> records,
            BatchHandler handler) throws BatchException, SQLException {
        return apply(conn, position, records, HandlerCalls.perBatch(handler, HandlerScope.DIRECT, null), null, false);
    }

    /** {@link #processBatch} with a per-record handler, called once per new record in order. */
    public static BatchOutcome processRecords(Connection conn, Position position, List<Delivery> records,
            RecordHandler handler) throws BatchException, SQLException {
        return apply(conn, position, records, HandlerCalls.perRecord(handler, HandlerScope.DIRECT, null), null, false);
    }

    /** The last record of a batch is parked instead of applied. */
    record Park(String error, int attempts) {}

    /**
     * {@link #processBatch} with the loop's extras: the last record may be
     * parked instead of applied, and {@code known} skips creating mark rows.
     */
    static BatchOutcome apply(Connection conn, Position position, List<Delivery> records, HandlerCalls calls,
            Park park, boolean known) throws BatchException, SQLException {
        boolean auto = conn.getAutoCommit();
        if (auto) {
            conn.setAutoCommit(false);
        } else if (state(conn) != TransactionState.IDLE) {
            throw new IllegalStateException("the connection must be idle to apply a batch, but its transaction "
                    + "state is " + state(conn) + ": commit or roll back what it started");
        }
        try {
            BatchOutcome outcome = transaction(conn, position, records, calls, park, known);
            conn.commit();
            return outcome;
        } catch (SQLException e) {
            rollbackQuietly(conn);
            throw new BatchException.DatabaseFailed(e);
        } catch (BatchException | RuntimeException e) {
            rollbackQuietly(conn);
            throw e;
        } finally {
            if (auto && !conn.isClosed()) {
                conn.setAutoCommit(true);
            }
        }
    }

    private static BatchOutcome transaction(Connection conn, Position position, List<Delivery> records,
            HandlerCalls calls, Park park, boolean known) throws BatchException, SQLException {
        List<RecordMeta> metas = metasOf(records);
        String[] sources = BatchPlan.sources(metas).toArray(new String[0]);
        Locked locked = lockMarks(conn, position, sources, known);
        BatchPlan plan = BatchPlan.of(locked.marks, metas);
        logGaps(position, plan);
        int parkedIndex = park != null ? records.size() - 1 : -1;
        boolean parkedIsNew = park != null && !plan.apply().isEmpty()
                && plan.apply().get(plan.apply().size() - 1) == parkedIndex;
        List<Integer> take;
        List<Delivery> fresh;
        if (parkedIndex < 0 && plan.apply().size() == records.size()) {
            // Every record is new (the plan's indexes are then 0..n-1), as under a backlog: the
            // handler gets a copy of the batch's list in one array copy, no index picked one by one.
            take = plan.apply();
            fresh = new ArrayList<>(records);
        } else {
            take = without(plan.apply(), parkedIndex);
            fresh = pick(records, take);
        }
        if (!fresh.isEmpty()) {
            runHandler(conn, position, calls, take, fresh);
        }
        if (parkedIsNew) {
            Delivery last = records.get(records.size() - 1);
            int rows = Parked.insert(conn, last, park.error(), park.attempts());
            if (rows != 1) {
                throw new BatchException.NotParked(position, last.record().offset(), last.key(), rows);
            }
        }
        if (!plan.raised().isEmpty()) {
            String after = advance(conn, position, plan.raised());
            if (!fresh.isEmpty() && locked.xact != null && !locked.xact.equals(after)) {
                throw new BatchException.HandlerEndedTransaction(position, fresh, null);
            }
        }
        Map<String, String> committed = new HashMap<>(locked.marks);
        committed.putAll(plan.raised());
        return new BatchOutcome(take.size(), plan.duplicates(), plan.gaps().size(), parkedIsNew, committed);
    }

    // The batch's per-record loops live in these small methods, not in
    // transaction(): a loop makes its method hot after a few batches, and the
    // JIT then compiles the whole method with the JDBC calls it inlines (about
    // 0.4 s of compiler time on 2 cores in a 300,000-record run, when it was
    // one method). transaction() itself runs once per batch.

    private static List<RecordMeta> metasOf(List<Delivery> records) {
        List<RecordMeta> metas = new ArrayList<>(records.size());
        for (Delivery d : records) {
            metas.add(d.meta());
        }
        return metas;
    }

    /** {@code indexes} without {@code skip} (the parked record, or -1). */
    private static List<Integer> without(List<Integer> indexes, int skip) {
        List<Integer> out = new ArrayList<>(indexes.size());
        for (int i : indexes) {
            if (i != skip) {
                out.add(i);
            }
        }
        return out;
    }

    private static List<Delivery> pick(List<Delivery> records, List<Integer> indexes) {
        List<Delivery> out = new ArrayList<>(indexes.size());
        for (int i : indexes) {
            out.add(records.get(i));
        }
        return out;
    }

    private static void runHandler(Connection conn, Position position, HandlerCalls calls, List<Integer> take,
            List<Delivery> fresh) throws BatchException, SQLException {
        try {
            calls.run(conn, fresh);
        } catch (HandlerCalls.Failed failed) {
            if (state(conn) == TransactionState.IDLE) {
                throw new BatchException.HandlerEndedTransaction(position, fresh, failed.error);
            }
            Integer index = failed.index != null && failed.index < take.size() ? take.get(failed.index) : null;
            throw new BatchException.HandlerFailed(failed.error, index);
        }
        TransactionState after = state(conn);
        if (after == TransactionState.IDLE) {
            throw new BatchException.HandlerEndedTransaction(position, fresh, null);
        }
        if (after == TransactionState.FAILED) {
            throw new BatchException.HandlerFailed(new BatchException.HandlerSwallowedError(),
                    take.size() == 1 ? take.get(0) : null);
        }
    }

    static TransactionState state(Connection conn) throws SQLException {
        return conn.unwrap(BaseConnection.class).getTransactionState();
    }

    private record Locked(Map<String, String> marks, String xact) {}

    private static Locked lockMarks(Connection conn, Position p, String[] sources, boolean known)
            throws SQLException, BatchException {
        Object[] params = {p.group(), p.topic(), p.partition(), sources};
        if (!known) {
            execute(conn, Statements.HWM_ENSURE, params);
        }
        Locked locked = lock(conn, params);
        if (locked.marks.size() < sources.length && known) {
            execute(conn, Statements.HWM_ENSURE, params);
            locked = lock(conn, params);
        }
        for (String s : sources) {
            if (!locked.marks.containsKey(s)) {
                throw new BatchException.RowVanished(s);
            }
        }
        return locked;
    }

    private static Locked lock(Connection conn, Object[] params) throws SQLException, BatchException {
        Map<String, String> marks = new LinkedHashMap<>();
        String xact = null;
        try (PreparedStatement ps = conn.prepareStatement(Statements.HWM_LOCK.jdbc())) {
            Statements.HWM_LOCK.bind(ps, params);
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    String source = rs.getString(1);
                    String text = rs.getString(2);
                    xact = rs.getString(3);
                    try {
                        marks.put(source, Keys.parseHex(text));
                    } catch (Keys.KeyFormatException e) {
                        throw new BatchException.CorruptHwm(source, text, e.getMessage());
                    }
                }
            }
        }
        return new Locked(marks, xact);
    }

    /** Raises the marks; returns the id of the transaction that did. */
    private static String advance(Connection conn, Position p, Map<String, String> raised)
            throws SQLException, BatchException {
        String[] sources = raised.keySet().toArray(new String[0]);
        String[] keys = raised.values().toArray(new String[0]);
        int rows = 0;
        String xact = null;
        try (PreparedStatement ps = conn.prepareStatement(Statements.HWM_ADVANCE.jdbc())) {
            Statements.HWM_ADVANCE.bind(ps, p.group(), p.topic(), p.partition(), sources, keys);
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    rows++;
                    xact = rs.getString(1);
                }
            }
        }
        if (rows != sources.length) {
            throw new BatchException.RowVanished(String.join(",", sources));
        }
        return xact;
    }

    static int execute(Connection conn, Statements.Sql sql, Object... params) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql.jdbc())) {
            sql.bind(ps, params);
            return ps.executeUpdate();
        }
    }

    /** Runs a statement whose rows, if any, are not wanted (e.g. {@code SELECT set_config(...)}). */
    static void run(Connection conn, Statements.Sql sql, Object... params) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql.jdbc())) {
            sql.bind(ps, params);
            ps.execute();
        }
    }

    static void rollbackQuietly(Connection conn) {
        try {
            if (!conn.isClosed()) {
                conn.rollback();
            }
        } catch (SQLException ignored) {
            // The connection is gone: nothing was committed.
        }
    }

    private static void logGaps(Position p, BatchPlan plan) {
        for (BatchPlan.Gap gap : plan.gaps()) {
            LOG.warn("gap: the record sent before this one was never processed by group {} (high-water mark {} "
                    + "< previous key {}) topic={} partition={} source={}",
                    p.group(), gap.hwm(), gap.prev(), p.topic(), p.partition(), gap.source());
        }
    }
}
