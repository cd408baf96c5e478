package io.walrelay.consumer.loop;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

class SourceHintTest {
    @Test
    void keepsACopyOfTheHeaderSoAHandlerWritingIntoItChangesNothing() {
        SourceHint hint = new SourceHint();
        assertNull(hint.text());
        assertNull(hint.bytes());
        String a = "7312/app/walrelay";
        byte[] header = a.getBytes(StandardCharsets.US_ASCII);
        hint.remember(a, header);
        header[0] = 'X';
        assertSame(a, hint.text());
        assertArrayEquals(a.getBytes(StandardCharsets.US_ASCII), hint.bytes());
    }

    @Test
    void theSameStringIsNotCopiedAgainAndAnotherReplacesIt() {
        SourceHint hint = new SourceHint();
        String a = "a";
        hint.remember(a, new byte[] {'a'});
        byte[] kept = hint.bytes();
        hint.remember(a, new byte[] {'a'});
        assertSame(kept, hint.bytes());
        String b = "b";
        hint.remember(b, new byte[] {'b'});
        assertSame(b, hint.text());
        assertArrayEquals(new byte[] {'b'}, hint.bytes());
    }
}
