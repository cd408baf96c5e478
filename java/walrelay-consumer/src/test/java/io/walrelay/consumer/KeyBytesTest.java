package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.nio.charset.StandardCharsets;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The byte fast path answers only for the relay's own form, and then as the
 * general path ({@link Keys}) does; everything else is left to that path.
 */
class KeyBytesTest {
    private static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void lowercaseKeysAsTheGeneralPathReadsThem() throws Exception {
        for (String key : List.of(RecordMetaTest.KEY, Keys.INITIAL, "ffffffffffffffffffffffffffffffff",
                "0123456789abcdef0123456789abcdef")) {
            assertEquals(Keys.parseHex(key), KeyBytes.hex(b(key)), key);
        }
    }

    @Test
    void everyOtherKeyIsLeftToTheGeneralPath() {
        String k = RecordMetaTest.KEY;
        for (String other : List.of(k.toUpperCase(), k.substring(1), k + "0", "", k.replace('a', 'g'),
                k.replace('a', '/'), k.replace('a', ':'), k.replace('0', '\u00e9').substring(0, 32))) {
            assertNull(KeyBytes.hex(b(other)), other);
        }
        assertNull(KeyBytes.hex(null));
        byte[] high = b(k);
        high[5] = (byte) ('0' | 0x80);
        assertNull(KeyBytes.hex(high), "a byte that is a digit only in its low seven bits");
    }

    @Test
    void compactKeysAsTheGeneralPathReadsThem() throws Exception {
        for (String compact : List.of("1531f10/1532000", "0/1", "ffffffffffffffff/ffffffffffffffff",
                "16b374d848/16b374d800", "0000000000000001/0")) {
            assertEquals(Keys.fromCompact(compact), KeyBytes.compact(b(compact)), compact);
        }
    }

    @Test
    void everyOtherCompactKeyIsLeftToTheGeneralPath() {
        for (String other : List.of("1531F10/1532000", "1531f10", "/1", "1/", "/", "1/g", "11111111111111111/1",
                "1/11111111111111111", "1/+1", "1/ 1", "1//1", "1/1/1", "", "\u00e91/1")) {
            assertNull(KeyBytes.compact(b(other)), other);
        }
        assertNull(KeyBytes.compact(null));
    }
}
