package io.walrelay.consumer;

/**
 * What the loop reports to a metrics system ({@link MicrometerMetrics}, with
 * the Rust crate's names, when Micrometer is on the classpath). Called on
 * the loop's thread.
 */
interface LoopMetrics {
    /** A batch of {@code records} committed in {@code seconds}. */
    void committed(String topic, int partition, int records, double seconds, BatchOutcome outcome, Counters totals);

    /** A batch failed and will be retried (or the partition stopped). */
    void failed(Counters totals);

    /** A record without walrelay headers was parked. */
    void parked(Counters totals);

    /** A partition was stopped (1) or is no longer (0). */
    void stopped(String topic, int partition, boolean stopped);

    /** A partition was paused. */
    void paused();

    /** The group's rows in walrelay_consumer_parked. */
    void parkedRecords(long rows);

    /** {@code seconds} partition-seconds spent in {@code phase}. */
    void phaseSeconds(Phase phase, double seconds);

    /** Records after the consumer's position in a partition (from the consumer's fetch metadata). */
    void lag(String topic, int partition, long records);

    /** Nothing. */
    LoopMetrics NONE = new LoopMetrics() {
        @Override
        public void committed(String t, int p, int r, double s, BatchOutcome o, Counters c) {}

        @Override
        public void failed(Counters c) {}

        @Override
        public void parked(Counters c) {}

        @Override
        public void stopped(String t, int p, boolean s) {}

        @Override
        public void paused() {}

        @Override
        public void parkedRecords(long rows) {}

        @Override
        public void phaseSeconds(Phase phase, double seconds) {}

        @Override
        public void lag(String topic, int partition, long records) {}
    };
}
