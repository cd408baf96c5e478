package io.walrelay.consumer;

import java.sql.Connection;
import java.util.List;

/**
 * Applies the new records of a batch (in order, duplicates dropped) inside
 * the batch's transaction on {@code conn}, which also raises the marks. It
 * must do all its database work through {@code conn} and must not commit or
 * roll back; an exception rolls everything back.
 */
@FunctionalInterface
public interface BatchHandler {
    void apply(Connection conn, List<Delivery> batch) throws Exception;
}
