package io.walrelay.consumer.loop;

import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * The refusals of the loop's {@code group.instance.id} since it last joined,
 * and when to try a new consumer.
 *
 * <p>Under Kafka 4's consumer group protocol ({@code group.protocol=consumer})
 * a static member restarted after a crash is refused with
 * {@code UNRELEASED_INSTANCE_ID} while the broker still counts its
 * predecessor as alive: until the predecessor's session times out (the
 * group's {@code consumer.session.timeout.ms}, the brokers'
 * {@code group.consumer.*}, 45 s by default). The KafkaConsumer throws
 * {@code UnreleasedInstanceIdException} and never works again; the loop
 * closes it and tries a new one after a short backoff, for as long as it
 * takes, logging why (at once, then at most every {@link #LOG_EVERY_NANOS}).
 * Not thread-safe: the loop's thread only.
 */
final class Refusals {
    /** The first wait before a new consumer. */
    static final long FIRST_RETRY_MILLIS = 250;
    /**
     * The longest: a retry costs the broker a handful of small requests, and
     * the member joins at most this long after its predecessor's session ended.
     */
    static final long RETRY_CAP_MILLIS = 500;
    /** How often a refusal that goes on is logged again. */
    static final long LOG_EVERY_NANOS = TimeUnit.SECONDS.toNanos(30);

    /** What to do after a refusal: wait, and log the warning if there is one. */
    record Retry(long waitMillis, Optional<String> log) {}

    private long first;
    private int count;
    private long lastLogged;
    private boolean logged;

    /** A consumer was refused at {@code now} (System.nanoTime), {@code reason} the client's text. */
    Retry refused(long now, String instanceId, String reason) {
        if (count == 0) {
            first = now;
        }
        count++;
        long wait = Math.min(FIRST_RETRY_MILLIS << Math.min(count - 1, 8), RETRY_CAP_MILLIS);
        Optional<String> log = Optional.empty();
        if (!logged || now - lastLogged >= LOG_EVERY_NANOS) {
            logged = true;
            lastLogged = now;
            if (count == 1) {
                log = Optional.of("the broker refused group.instance.id=\"" + instanceId + "\" (" + reason
                        + "): under group.protocol=consumer an instance id stays taken until its previous member "
                        + "leaves or its session times out (a member killed without leaving holds it for the group's "
                        + "consumer.session.timeout.ms, 45 s by default). Trying a new consumer every "
                        + RETRY_CAP_MILLIS + "ms until then; to rejoin sooner, shorten the group's session timeout "
                        + "(docs/operations.md), or check that no other running instance uses this id");
            } else {
                log = Optional.of("group.instance.id=\"" + instanceId + "\" still refused after " + count
                        + " attempts over " + TimeUnit.NANOSECONDS.toSeconds(now - first) + "s (" + reason
                        + "): is another running instance using this id?");
            }
        }
        return new Retry(wait, log);
    }

    /**
     * The member got partitions at {@code now}: how long it was refused, in
     * milliseconds, if it was (and the count starts over).
     */
    Optional<Long> joined(long now) {
        if (count == 0) {
            return Optional.empty();
        }
        long waited = TimeUnit.NANOSECONDS.toMillis(now - first);
        count = 0;
        logged = false;
        return Optional.of(waited);
    }

    /** Refusals since the member last joined. */
    int count() {
        return count;
    }
}
