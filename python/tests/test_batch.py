"""The pure batch plan, mirroring crates/walrelay-consumer/src/batch.rs's tests."""

from walrelay_consumer import Gap, RecordMeta, plan
from walrelay_consumer.batch import sources


def k(n: int) -> str:
    # EventKey::new(n, 0): the high half is n.
    return f"{n:016x}" + "0" * 16


def meta(source, key, prev=None):
    return RecordMeta(key=k(key), source=source, prev_key=None if prev is None else k(prev))


def marks(**pairs):
    return {s: k(n) for s, n in pairs.items()}


def test_new_records_raise_the_running_mark():
    p = plan({}, [meta("a", 1), meta("a", 2, 1), meta("a", 3, 2)])
    assert p.apply == [0, 1, 2]
    assert p.duplicates == 0
    assert p.gaps == []
    assert p.raised == marks(a=3)


def test_replays_inside_a_batch_are_dropped():
    # A relay replay: 3, 4, 5 arrive again after 5.
    batch = [
        meta("a", 3, 2),
        meta("a", 4, 3),
        meta("a", 5, 4),
        meta("a", 3),
        meta("a", 4, 3),
        meta("a", 5, 4),
        meta("a", 6, 5),
    ]
    p = plan(marks(a=2), batch)
    assert p.apply == [0, 1, 2, 6]
    assert p.duplicates == 3
    assert p.gaps == []
    assert p.raised == marks(a=6)


def test_stored_marks_drop_old_records():
    p = plan(marks(a=2), [meta("a", 1), meta("a", 2, 1)])
    assert p.is_all_duplicates
    assert p.duplicates == 2
    assert p.raised == {}


def test_two_sources_keep_separate_marks():
    # Source b's keys are far below a's: not comparable, both new.
    batch = [meta("a", 100, 99), meta("b", 5, 4), meta("a", 101, 100), meta("b", 4), meta("b", 6, 5)]
    p = plan(marks(a=99, b=4), batch)
    assert p.apply == [0, 1, 2, 4]
    assert p.duplicates == 1
    assert p.raised == marks(a=101, b=6)


def test_gaps_are_reported_and_still_applied():
    batch = [
        meta("a", 13, 12),  # prev 12 > mark 10: 11 and 12 were never processed
        meta("a", 14, 13),
        meta("a", 16, 15),  # within the batch: 15 missing
        meta("a", 20),  # a session start (no prev): never a gap
    ]
    p = plan(marks(a=10), batch)
    assert p.apply == [0, 1, 2, 3]
    assert p.gaps == [
        Gap(index=0, source="a", hwm=k(10), prev=k(12)),
        Gap(index=2, source="a", hwm=k(14), prev=k(15)),
    ]


def test_initial_mark_is_never_a_gap():
    p = plan({}, [meta("a", 50, 49)])
    assert p.gaps == []
    assert p.apply == [0]


def test_duplicates_are_not_gaps():
    p = plan(marks(a=10), [meta("a", 9, 8)])
    assert p.gaps == []
    assert p.duplicates == 1


def test_keys_compare_as_numbers_across_the_low_half():
    # 0x...0f < 0x...10 < 0x...a0: string order on lowercase hex.
    lo = "0" * 30 + "0f"
    mid = "0" * 30 + "10"
    hi = "0" * 30 + "a0"
    p = plan({"a": mid}, [RecordMeta(key=lo, source="a"), RecordMeta(key=hi, source="a")])
    assert p.apply == [1]
    assert p.raised == {"a": hi}


def test_sources_are_distinct_and_sorted():
    assert sources([meta("b", 1), meta("a", 1), meta("b", 2)]) == ["a", "b"]
