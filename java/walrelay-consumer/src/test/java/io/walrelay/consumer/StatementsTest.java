package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/** The jar's SQL is the repository's sql/, byte for byte, and its placeholders map right. */
class StatementsTest {
    @Test
    void theStatementsAreTheRepositorysOwn() throws Exception {
        Path sql = Path.of(System.getProperty("walrelay.repo", "../..")).resolve("sql");
        assertEquals(Files.readString(sql.resolve("walrelay_consumer.sql")), Statements.migration());
        int n = 0;
        try (Stream<Path> files = Files.list(sql.resolve("consumer"))) {
            for (Path f : (Iterable<Path>) files.filter(p -> p.toString().endsWith(".sql"))::iterator) {
                String name = f.getFileName().toString().replace(".sql", "");
                assertEquals(Files.readString(f), Statements.text(name), name);
                n++;
            }
        }
        assertTrue(n >= 13, "statements found: " + n);
    }

    @Test
    void placeholdersOutOfOrder() {
        Statements.Sql load = Statements.HWM_LOAD;
        assertArrayEquals(new int[] {2, 3, 1}, load.order());
        assertFalse(load.jdbc().contains("$"));
        assertArrayEquals(new int[] {5, 6, 7, 8, 1, 2, 3, 4}, Statements.PARKED_SAME_UNKEYED.order());
        assertEquals("SELECT ?::int + ?", Statements.Sql.parse("x", "SELECT $2::int + $1\n").jdbc());
    }
}
