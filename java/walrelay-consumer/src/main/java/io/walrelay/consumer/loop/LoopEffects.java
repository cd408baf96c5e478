package io.walrelay.consumer.loop;

import org.apache.kafka.common.TopicPartition;

/**
 * The loop's {@link Effects}: each one goes straight to the object that
 * owns it, so following an outcome never goes back through {@link PollLoop}.
 */
record LoopEffects(Offsets offsets, StoppedPartitions stopped, ConnectionPool pool) implements Effects {
    @Override
    public void storeOffset(TopicPartition tp, long offset) {
        offsets.store(tp, offset);
    }

    @Override
    public void stopPartition(TopicPartition tp, PartitionState p, String error) {
        stopped.stop(tp, p, error);
    }

    @Override
    public void replaceConnections() {
        pool.closeAll();
    }
}
