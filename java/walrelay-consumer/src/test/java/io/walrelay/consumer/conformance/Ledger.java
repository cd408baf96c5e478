package io.walrelay.consumer.conformance;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * What the scenario's relays produced, and the last key per (source,
 * partition) of the current relay session (for the previous-key header):
 * python/tests/test_conformance.py's Ledger.
 */
final class Ledger {
    /** One record to produce. */
    static final class Planned {
        final int partition;
        final String key;
        final String prev;
        final String source;
        boolean poison;
        boolean atCommit;
        int fails;
        String headers = "full";
        String behaviour;
        int times = 1;
        Integer payloadBytes;

        Planned(int partition, String key, String prev, String source) {
            this.partition = partition;
            this.key = key;
            this.prev = prev;
            this.source = source;
        }

        byte[] payload() {
            String kind = poison ? "poison" : atCommit ? "commit-poison" : fails > 0 ? "flaky " + fails
                    : behaviour != null ? behaviour.replace('_', '-') + " " + times : "event";
            String text = kind + " " + key;
            if (payloadBytes != null) {
                text += " " + "x".repeat(Math.max(payloadBytes - text.length() - 1, 0));
            }
            return text.getBytes(StandardCharsets.UTF_8);
        }
    }

    private final Map<String, String> prev = new HashMap<>();
    private final Map<String, TreeSet<Integer>> seqs = new HashMap<>();
    final Set<String> keys = new HashSet<>();
    final Set<String> noop = new HashSet<>();

    static String key(int partition, long seq) {
        return String.format("%016x%016x", 0x100 + seq, (long) partition);
    }

    private static String sp(String source, int partition) {
        return source + "\u0000" + partition;
    }

    List<Planned> plan(String source, List<Integer> partitions, List<Integer> seqList, Integer prevSeq) {
        List<Planned> out = new ArrayList<>();
        for (int i = 0; i < seqList.size(); i++) {
            int seq = seqList.get(i);
            for (int partition : partitions) {
                String k = key(partition, seq);
                String before = prev.getOrDefault(sp(source, partition), "");
                prev.put(sp(source, partition), k);
                if (i == 0 && prevSeq != null) {
                    before = key(partition, prevSeq);
                }
                seqs.computeIfAbsent(sp(source, partition), x -> new TreeSet<>()).add(seq);
                keys.add(k);
                out.add(new Planned(partition, k, before, source));
            }
        }
        return out;
    }

    void restart(String source) {
        prev.keySet().removeIf(k -> k.startsWith(source + "\u0000"));
    }

    Integer last(String source, int partition) {
        TreeSet<Integer> s = seqs.get(sp(source, partition));
        return s == null || s.isEmpty() ? null : s.last();
    }

    List<Integer> tail(String source, int partition, int n) {
        List<Integer> all = new ArrayList<>(seqs.getOrDefault(sp(source, partition), new TreeSet<>()));
        return all.subList(Math.max(0, all.size() - n), all.size());
    }

    /** Every distinct key produced minus those left out (partition, seq pairs) and noop keys. */
    Set<String> expectedEffects(List<int[]> leftOut) {
        Set<String> out = new HashSet<>(keys);
        for (int[] ps : leftOut) {
            out.remove(key(ps[0], ps[1]));
        }
        out.removeAll(noop);
        return out;
    }
}
