package io.walrelay.consumer;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;

/**
 * The consumers' SQL: the migration and one file per statement, from the
 * repository's {@code sql/} (the build copies them into the jar; nothing
 * under java/ holds a copy). The Rust crate and the Python package run the
 * same text.
 *
 * <p>The files use PostgreSQL's {@code $n} placeholders, possibly out of
 * order; {@link Sql} turns them into JDBC's {@code ?} and binds each
 * parameter where its number appears.
 */
public final class Statements {
    static final String ROOT = "/io/walrelay/consumer/sql/";

    static final Sql HWM_ENSURE = Sql.load("hwm_ensure");
    static final Sql HWM_LOCK = Sql.load("hwm_lock");
    static final Sql HWM_ADVANCE = Sql.load("hwm_advance");
    static final Sql HWM_LOAD = Sql.load("hwm_load");
    static final Sql HWM_GUARD = Sql.load("hwm_guard");
    static final Sql PARKED_INSERT = Sql.load("parked_insert");
    static final Sql PARKED_INSERT_UNKEYED = Sql.load("parked_insert_unkeyed");
    static final Sql PARKED_SAME_UNKEYED = Sql.load("parked_same_unkeyed");
    static final Sql PARKED_TAKE = Sql.load("parked_take");
    static final Sql PARKED_DELETE = Sql.load("parked_delete");
    static final Sql PARKED_FAILED_AGAIN = Sql.load("parked_failed_again");
    static final Sql PARKED_COUNT = Sql.load("parked_count");
    static final Sql STATEMENT_TIMEOUT = Sql.load("statement_timeout");

    private Statements() {}

    /** The text of a resource under the SQL root. */
    static String resource(String path) {
        try (InputStream in = Statements.class.getResourceAsStream(ROOT + path)) {
            if (in == null) {
                throw new IllegalStateException("the jar has no " + ROOT + path
                        + ": it must be built from the walrelay repository, whose sql/ the build copies in");
            }
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The migration, {@code sql/walrelay_consumer.sql}. */
    public static String migration() {
        return resource("walrelay_consumer.sql");
    }

    /** The text of a statement, {@code sql/consumer/<name>.sql}, as written there. */
    public static String text(String name) {
        return resource("consumer/" + name + ".sql");
    }

    /**
     * A statement with its {@code $n} placeholders replaced by {@code ?}.
     *
     * @param name the statement's file name without {@code .sql}
     * @param jdbc the text for JDBC
     * @param order for each {@code ?}, the number of the parameter it takes (1-based)
     */
    public record Sql(String name, String jdbc, int[] order) {
        static Sql load(String name) {
            return parse(name, text(name));
        }

        /** Replaces each {@code $n} by {@code ?} (the statements have no string literal holding a {@code $}). */
        static Sql parse(String name, String text) {
            StringBuilder out = new StringBuilder(text.length());
            List<Integer> order = new ArrayList<>();
            for (int i = 0; i < text.length(); i++) {
                char c = text.charAt(i);
                if (c == '$' && i + 1 < text.length() && Character.isDigit(text.charAt(i + 1))) {
                    int j = i + 1;
                    while (j < text.length() && Character.isDigit(text.charAt(j))) {
                        j++;
                    }
                    order.add(Integer.parseInt(text.substring(i + 1, j)));
                    out.append('?');
                    i = j - 1;
                } else {
                    out.append(c);
                }
            }
            return new Sql(name, out.toString().strip(), order.stream().mapToInt(Integer::intValue).toArray());
        }

        /** Binds {@code params} (the statement's {@code $1, $2, ...}) to {@code ps}. */
        public void bind(PreparedStatement ps, Object... params) throws SQLException {
            for (int i = 0; i < order.length; i++) {
                ps.setObject(i + 1, params[order[i] - 1]);
            }
        }
    }
}
