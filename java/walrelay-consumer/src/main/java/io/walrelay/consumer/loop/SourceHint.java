package io.walrelay.consumer.loop;

import java.util.Arrays;

/**
 * The source the last record of a partition named, as text and as its
 * header's bytes, for {@link BatchLayer#read} of the next one: a partition's
 * records nearly always name the same source, so the next one's header is
 * compared with these bytes (one array comparison) and the text is shared
 * (one string per partition, its hash computed once for the lookups every
 * batch makes by source). Only the loop's thread touches it. Public only
 * for {@link BatchLayer}.
 */
public final class SourceHint {
    private String text;
    private byte[] bytes;

    /** The last source's text, or null before the first record with a meta. */
    public String text() {
        return text;
    }

    /** Its header's bytes (a copy: a handler may write into a record's header values), or null. */
    public byte[] bytes() {
        return bytes;
    }

    /** Remembers {@code text}, named by the header bytes {@code header}, unless it is the one remembered. */
    public void remember(String text, byte[] header) {
        if (text != this.text) {
            this.text = text;
            this.bytes = header == null ? null : Arrays.copyOf(header, header.length);
        }
    }
}
