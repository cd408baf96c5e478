package io.walrelay.consumer;

import java.util.Map;

/**
 * What a committed batch did.
 *
 * @param applied records whose side effects were committed
 * @param duplicates records dropped because the marks already covered them
 * @param gaps gaps found from the previous-key header
 * @param parked whether the batch's last record was parked instead of applied
 * @param marks the committed marks of the batch's sources
 */
public record BatchOutcome(int applied, int duplicates, int gaps, boolean parked, Map<String, String> marks) {}
