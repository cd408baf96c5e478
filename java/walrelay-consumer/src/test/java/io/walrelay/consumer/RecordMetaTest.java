package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.junit.jupiter.api.Test;

/** The same cases as the Rust crate's meta.rs tests. */
class RecordMetaTest {
    static final String KEY = "0000000001531f10000000000153200a";
    static final String PREV = "0000000001531f100000000001532000";

    static List<Header> h(String... pairs) {
        List<Header> out = new ArrayList<>();
        for (int i = 0; i < pairs.length; i += 2) {
            out.add(new RecordHeader(pairs[i], pairs[i + 1] == null ? null : pairs[i + 1].getBytes(StandardCharsets.UTF_8)));
        }
        return out;
    }

    @Test
    void goodHeaders() throws Exception {
        RecordMeta m = RecordMeta.fromHeaders(h("trace", "x", "idempotency-key", KEY, "walrelay-source", "7312/app/walrelay",
                "walrelay-commit-lsn", "0/1531F10", "walrelay-lsn", "0/153200A", "walrelay-prev-key", PREV,
                "walrelay-xid", "77"));
        assertEquals(KEY, m.key());
        assertEquals("7312/app/walrelay", m.source());
        assertEquals(0x01531f10L, m.commitLsn());
        assertEquals(0x0153200aL, m.lsn());
        assertEquals(PREV, m.prevKey());
        assertEquals("key " + KEY + " from 7312/app/walrelay", m.toString());
    }

    @Test
    void theLeanSetAndTheCompactPreviousKey() throws Exception {
        RecordMeta m = RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s",
                "walrelay-layout", "0/4/9f86d081884c7d65", "walrelay-prev", "1531f10/1532000"));
        assertEquals(PREV, m.prevKey());
        assertNull(m.lsn());
        assertNull(RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s", "walrelay-prev", "")).prevKey());
        MetaException bad = assertThrows(MetaException.class,
                () -> RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s", "walrelay-prev", PREV)));
        assertEquals(MetaException.Kind.BAD_KEY, bad.kind());
        MetaException both = assertThrows(MetaException.class, () -> RecordMeta.fromHeaders(h("idempotency-key", KEY,
                "walrelay-source", "s", "walrelay-prev-key", PREV, "walrelay-prev", "1531f10/1532000")));
        assertEquals(MetaException.Kind.TWO_PREVIOUS_KEYS, both.kind());
    }

    @Test
    void uppercaseKeysAreCanonicalized() throws Exception {
        RecordMeta m = RecordMeta.fromHeaders(h("idempotency-key", KEY.toUpperCase(), "walrelay-source", "s"));
        assertEquals(KEY, m.key());
        assertNull(m.prevKey());
    }

    @Test
    void aReservedHeaderTwiceIsRefused() {
        MetaException e = assertThrows(MetaException.class, () -> RecordMeta.fromHeaders(h("idempotency-key", KEY,
                "walrelay-source", "s", "idempotency-key", "ffffffffffffffffffffffffffffffff")));
        assertEquals(MetaException.Kind.DUPLICATE_HEADER, e.kind());
        assertThrows(MetaException.class, () -> RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s",
                "walrelay-anything", "1", "walrelay-anything", "2")));
        // The names walrelay writes are found by a bit each, the rest in a list: both refuse twice.
        for (String n : List.of("walrelay-layout", "walrelay-xid", "walrelay-commit-time", "walrelay-lsn",
                "Walrelay-Layout")) {
            assertEquals(MetaException.Kind.DUPLICATE_HEADER,
                    kind(h("idempotency-key", KEY, "walrelay-source", "s", n, "0/1", n, "0/1")), n);
        }
        // Names in another case are different names, as in the Rust crate.
        assertTrue(ok(h("idempotency-key", KEY, "walrelay-source", "s", "walrelay-layout", "1", "Walrelay-Layout", "1")));
        // Application headers may repeat.
        assertTrue(ok(h("idempotency-key", KEY, "walrelay-source", "s", "trace", "1", "trace", "2")));
    }

    @Test
    void theSourceHintIsReusedOnlyForTheSameText() throws Exception {
        String hint = new String("7312/app/walrelay");
        RecordMeta same = RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", "7312/app/walrelay")), hint);
        assertTrue(same.source() == hint, "the partition's source string is reused");
        RecordMeta other = RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", "7312/app/walrelaz")), hint);
        assertEquals("7312/app/walrelaz", other.source());
        assertEquals(MetaException.Kind.EMPTY_SOURCE, assertThrows(MetaException.class,
                () -> RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", "")), "")).kind());
        assertEquals(MetaException.Kind.MISSING_HEADER, assertThrows(MetaException.class,
                () -> RecordMeta.of(scan(h("idempotency-key", KEY)), hint)).kind());
    }

    @Test
    void theHintsBytesDecideWhetherItsTextIsReused() throws Exception {
        String hint = new String("7312/app/walrelay");
        byte[] bytes = hint.getBytes(StandardCharsets.UTF_8);
        RecordMeta same = RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", "7312/app/walrelay")), hint,
                bytes);
        assertTrue(same.source() == hint, "the partition's source string is reused");
        RecordMeta other = RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", "7312/app/walrelaz")), hint,
                bytes);
        assertEquals("7312/app/walrelaz", other.source());
        String accented = "7312/app/réplica";
        RecordMeta utf8 = RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", accented)), accented,
                accented.getBytes(StandardCharsets.UTF_8));
        assertTrue(utf8.source() == accented, "a UTF-8 source is reused too");
        assertEquals(MetaException.Kind.MISSING_HEADER, assertThrows(MetaException.class,
                () -> RecordMeta.of(scan(h("idempotency-key", KEY, "walrelay-source", null)), hint, bytes)).kind());
    }

    @Test
    void theRelaysFormAndTheOthersGiveTheSameMeta() throws Exception {
        RecordMeta lean = RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s",
                "walrelay-prev", "1531f10/1532000"));
        RecordMeta other = RecordMeta.fromHeaders(h("idempotency-key", KEY.toUpperCase(), "walrelay-source", "s",
                "walrelay-prev", "1531F10/1532000"));
        assertEquals(lean, other);
        assertEquals(PREV, RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s",
                "walrelay-prev-key", PREV.toUpperCase())).prevKey());
        assertEquals(MetaException.Kind.BAD_KEY, kind(h("idempotency-key", KEY, "walrelay-source", "s",
                "walrelay-prev", "1531f10/153200g")));
        assertEquals(MetaException.Kind.BAD_KEY, kind(h("idempotency-key", KEY, "walrelay-source", "s",
                "walrelay-prev-key", PREV.substring(1))));
        assertNull(RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s", "walrelay-prev", null))
                .prevKey());
        assertNull(RecordMeta.fromHeaders(h("idempotency-key", KEY, "walrelay-source", "s", "walrelay-prev-key", ""))
                .prevKey());
    }

    @Test
    void theScanCountsEveryHeadersBytesAndKeepsTheFirstRefusal() {
        HeaderScan s = scan(h("idempotency-key", KEY, "trace", "abc", "idempotency-key", KEY, "walrelay-source", "s",
                "x", null));
        assertEquals(15 + 32 + 5 + 3 + 15 + 32 + 15 + 1 + 1, s.bytes);
        assertEquals(MetaException.Kind.DUPLICATE_HEADER, s.error.kind());
        for (String n : List.of("idempotency-key", "walrelay-source", "walrelay-lsn", "walrelay-commit-lsn",
                "walrelay-prev-key", "walrelay-prev", "walrelay-xid", "walrelay-commit-time", "walrelay-layout")) {
            assertTrue(HeaderScan.knownBit(n) != 0, n);
        }
        for (String n : List.of("walrelay-lsx", "Walrelay-Source", "walrelay-prev-kez", "x", "")) {
            assertEquals(0, HeaderScan.knownBit(n), n);
        }
    }

    static HeaderScan scan(List<Header> headers) {
        return HeaderScan.of(headers);
    }

    @Test
    void keysInEveryForm() throws Exception {
        assertTrue(KEY == Keys.parseHex(KEY), "a lowercase key is returned as it is");
        assertEquals(KEY, Keys.parseHex(KEY.toUpperCase()));
        assertEquals(PREV, Keys.fromCompact("1531F10/1532000"));
        assertEquals("00000000000000000000000000000001", Keys.fromCompact("0/1"));
        assertEquals("ffffffffffffffffffffffffffffffff", Keys.fromCompact("ffffffffffffffff/FFFFFFFFFFFFFFFF"));
        for (String bad : List.of("1531f10", "/1", "1/", "1/g", "11111111111111111/1", "1/+1", "1/ 1")) {
            assertThrows(Keys.KeyFormatException.class, () -> Keys.fromCompact(bad), bad);
        }
        for (String bad : List.of(KEY.substring(1), KEY + "0", KEY.replace('a', 'G'), KEY.replace('a', '\uff10'))) {
            assertThrows(Keys.KeyFormatException.class, () -> Keys.parseHex(bad), bad);
        }
    }

    @Test
    void missingAndMalformed() {
        assertEquals(MetaException.Kind.MISSING_HEADER, kind(h("walrelay-source", "s")));
        assertEquals(MetaException.Kind.MISSING_HEADER, kind(h("idempotency-key", KEY)));
        assertEquals(MetaException.Kind.MISSING_HEADER, kind(h("idempotency-key", null, "walrelay-source", "s")));
        assertEquals(MetaException.Kind.EMPTY_SOURCE, kind(h("idempotency-key", KEY, "walrelay-source", "")));
        assertEquals(MetaException.Kind.BAD_KEY, kind(h("idempotency-key", "xyz", "walrelay-source", "s")));
        assertEquals(MetaException.Kind.BAD_KEY, kind(h("idempotency-key", KEY.replace('a', 'g'), "walrelay-source", "s")));
        assertEquals(MetaException.Kind.BAD_LSN, kind(h("idempotency-key", KEY, "walrelay-source", "s", "walrelay-lsn", "12")));
        List<Header> notUtf8 = h("idempotency-key", KEY);
        notUtf8.add(new RecordHeader("walrelay-source", new byte[] {(byte) 0xff}));
        assertEquals(MetaException.Kind.NOT_UTF8, kind(notUtf8));
    }

    @Test
    void reservedNames() {
        for (String n : List.of("idempotency-key", "Idempotency-Key", "walrelay-prev-key", "WALRELAY-anything", "walrelay-")) {
            assertTrue(Headers.isReserved(n), n);
        }
        for (String n : List.of("", "idempotency", "idempotency-key2", "walrelay", "x-walrelay-source", "walrelay_source")) {
            assertFalse(Headers.isReserved(n), n);
        }
    }

    private static boolean ok(List<Header> headers) {
        try {
            RecordMeta.fromHeaders(headers);
            return true;
        } catch (MetaException e) {
            return false;
        }
    }

    private static MetaException.Kind kind(List<Header> headers) {
        return assertThrows(MetaException.class, () -> RecordMeta.fromHeaders(headers)).kind();
    }
}
