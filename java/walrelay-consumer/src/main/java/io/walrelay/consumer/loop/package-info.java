/**
 * Internal: the inside of {@link io.walrelay.consumer.ConsumerLoop}, not an
 * API. Nothing here is meant to be used by an application, and any of it
 * may change in any release; a type is public only because the façade in
 * {@code io.walrelay.consumer} must reach it ({@link PollLoop},
 * {@link BatchLayer}, {@link Queued}, {@link Park}, {@link LoopMetrics},
 * {@link Phase}).
 *
 * <p>One concern per file, following a record:
 * <ul>
 *   <li>{@link PollLoop}: the loop's thread: poll, queue, dispatch, flow
 *       control, offsets' commits, the stop;
 *   <li>{@link Queued}, {@link PartitionState}, {@link Step}: a partition's
 *       queue and the pure decisions about it;
 *   <li>{@link InFlight}, {@link Job}: the batches handed to the workers and
 *       collected when they finish;
 *   <li>{@link Outcomes}: what a finished batch means (store, retry, stop),
 *       acting on the loop only through {@link Effects} and counting through
 *       {@link Tally};
 *   <li>{@link Offsets}, {@link StoppedPartitions}, {@link ConnectionPool}:
 *       the three objects an outcome changes ({@link LoopEffects});
 *   <li>{@link Rebalance}, {@link MarkLoader}: the rebalance callbacks;
 *   <li>{@link PhaseClock}, {@link Phase}, {@link LoopMetrics},
 *       {@link ParkedGauge}: metrics.
 * </ul>
 *
 * <p>The batch transaction, the statements and the header scan stay
 * package-private in {@code io.walrelay.consumer}; the loop reaches them
 * through {@link BatchLayer}, which the façade implements and hands in.
 */
package io.walrelay.consumer.loop;
