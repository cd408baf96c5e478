package io.walrelay.consumer;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;

/**
 * Creates (or upgrades) the consumers' tables: {@code walrelay_consumer_hwm}
 * and {@code walrelay_consumer_parked}, from {@code sql/walrelay_consumer.sql},
 * the migration the Rust crate and the Python package apply too.
 */
public final class Migration {
    private Migration() {}

    /** Applies the migration; idempotent, safe on every start. Commits if the connection is not in autocommit. */
    public static void migrate(Connection conn) throws SQLException {
        boolean auto = conn.getAutoCommit();
        try (Statement st = conn.createStatement()) {
            st.execute(Statements.migration());
            if (!auto) {
                conn.commit();
            }
        } catch (SQLException e) {
            if (!auto) {
                conn.rollback();
            }
            throw e;
        }
    }
}
