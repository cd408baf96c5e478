package io.walrelay.consumer.loop;

import org.apache.kafka.common.TopicPartition;

/**
 * What a batch's outcome may change outside its own partition's state: the
 * narrow way {@link Outcomes} acts on the loop (the loop hands it
 * {@link LoopEffects}; a test hands it a fake). Counting goes to
 * {@link Tally}. Called on the loop's thread only.
 */
interface Effects {
    /** The partition's records up to {@code offset} are done: its Kafka offset moves past it at the next commit. */
    void storeOffset(TopicPartition tp, long offset);

    /** Nothing more of the partition is applied or committed until a restart; {@code error} says why. */
    void stopPartition(TopicPartition tp, PartitionState p, String error);

    /** The database went away: every connection is replaced (in use ones when given back). */
    void replaceConnections();
}
