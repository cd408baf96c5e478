package io.walrelay.consumer.spring;

import io.walrelay.consumer.HandlerScope;
import java.sql.Connection;
import javax.sql.DataSource;
import org.springframework.jdbc.datasource.ConnectionHolder;
import org.springframework.transaction.support.TransactionSynchronizationManager;

/**
 * Runs each handler call inside the batch's transaction as Spring sees it:
 * the batch's connection is bound to {@code dataSource} for the call, so
 * {@code JdbcTemplate}, {@code DataSourceUtils.getConnection} and
 * {@code @Transactional} methods (propagation REQUIRED, MANDATORY,
 * SUPPORTS) of the application's {@code DataSourceTransactionManager} join
 * it instead of opening their own. The library commits it, with the marks.
 *
 * <p>A participating {@code @Transactional} method that failed marks the
 * transaction rollback-only: the batch then fails (a failed attempt), as in
 * Spring. {@code REQUIRES_NEW} opens a transaction of its own, outside the
 * batch: its effects are not exactly once.
 */
public final class SpringTransactionScope implements HandlerScope {
    private final DataSource dataSource;

    /** @param dataSource the application's DataSource, the one the loop takes its connections from */
    public SpringTransactionScope(DataSource dataSource) {
        this.dataSource = dataSource;
    }

    @Override
    public void run(Connection conn, Call call) throws Exception {
        if (TransactionSynchronizationManager.hasResource(dataSource)) {
            throw new IllegalStateException("a Spring transaction is already bound to this thread's DataSource: "
                    + "the walrelay loop's worker threads run the batch's own transaction");
        }
        ConnectionHolder holder = new BatchHolder(conn);
        holder.setSynchronizedWithTransaction(true);
        TransactionSynchronizationManager.bindResource(dataSource, holder);
        TransactionSynchronizationManager.setActualTransactionActive(true);
        try {
            call.run();
        } finally {
            TransactionSynchronizationManager.setActualTransactionActive(false);
            TransactionSynchronizationManager.unbindResource(dataSource);
        }
        if (holder.isRollbackOnly()) {
            throw new IllegalStateException("a @Transactional method of the handler marked the batch's transaction "
                    + "rollback-only (it failed inside): the batch is rolled back and retried");
        }
    }

    /** The batch's connection, held as an active transaction (what Spring's own holder says inside one). */
    private static final class BatchHolder extends ConnectionHolder {
        BatchHolder(Connection conn) {
            super(conn);
            setTransactionActive(true);
        }
    }
}
