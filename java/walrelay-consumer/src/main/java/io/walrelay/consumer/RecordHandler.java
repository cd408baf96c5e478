package io.walrelay.consumer;

import java.sql.Connection;

/** Applies one new record inside its batch's transaction (see {@link BatchHandler}). */
@FunctionalInterface
public interface RecordHandler {
    void apply(Connection conn, Delivery delivery) throws Exception;
}
