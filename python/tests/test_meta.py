"""Header parsing, mirroring crates/walrelay-consumer/src/meta.rs's tests."""

import pytest

from walrelay_consumer import (
    BadKey,
    BadLsn,
    DuplicateHeader,
    EmptySource,
    MissingHeader,
    NotUtf8,
    RecordMeta,
    TwoPreviousKeys,
    is_reserved,
)

KEY = "0000000001531f10000000000153200a"
PREV = "0000000001531f100000000001532000"


def h(*pairs):
    return [(k, v.encode()) for k, v in pairs]


def test_good_headers():
    meta = RecordMeta.from_headers(
        h(
            ("trace", "x"),
            ("idempotency-key", KEY),
            ("walrelay-source", "7312/app/walrelay"),
            ("walrelay-commit-lsn", "0/1531F10"),
            ("walrelay-lsn", "0/153200A"),
            ("walrelay-prev-key", PREV),
            ("walrelay-xid", "77"),
        )
    )
    assert meta.key == KEY
    assert meta.source == "7312/app/walrelay"
    assert meta.commit_lsn == 0x01531F10
    assert meta.lsn == 0x0153200A
    assert meta.prev_key == PREV
    assert str(meta) == f"key {KEY} from 7312/app/walrelay"


def test_the_lean_set_key_source_and_the_compact_previous_key():
    meta = RecordMeta.from_headers(
        h(
            ("idempotency-key", KEY),
            ("walrelay-source", "7312/app/walrelay"),
            ("walrelay-layout", "0/4/9f86d081884c7d65"),
            ("walrelay-prev", "1531f10/1532000"),
            ("trace", "x"),
        )
    )
    assert meta.key == KEY
    assert (meta.lsn, meta.commit_lsn) == (None, None)
    assert meta.prev_key == PREV
    assert RecordMeta.from_headers(h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-prev", ""))).prev_key is None
    assert RecordMeta.from_headers(h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-prev", "1531F10/0"))).prev_key == "0000000001531f100000000000000000"
    for bad in [PREV, "1/", "/1", "1/2/3", "g/1", "10000000000000000/0", " 1/1"]:
        with pytest.raises(BadKey) as e:
            RecordMeta.from_headers(h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-prev", bad)))
        assert e.value.header == "walrelay-prev"
    with pytest.raises(TwoPreviousKeys) as two:
        RecordMeta.from_headers(
            h(
                ("idempotency-key", KEY),
                ("walrelay-source", "s"),
                ("walrelay-prev-key", PREV),
                ("walrelay-prev", "1531f10/1532000"),
            )
        )
    assert "walrelay-prev-key" in str(two.value)


def test_uppercase_keys_are_canonicalized_so_string_order_holds():
    meta = RecordMeta.from_headers(h(("idempotency-key", KEY.upper()), ("walrelay-source", "s")))
    assert meta.key == KEY
    assert meta.key > "0000000001531f0fffffffffffffffff"


@pytest.mark.parametrize("forged", ["idempotency-key", "walrelay-prev-key", "walrelay-anything"])
def test_a_reserved_header_twice_is_refused(forged):
    # A forged key after walrelay's: a consumer reading the last copy would
    # skip every later record of the partition.
    with pytest.raises(DuplicateHeader) as e:
        RecordMeta.from_headers(
            h(
                ("idempotency-key", KEY),
                ("walrelay-source", "s"),
                ("walrelay-prev-key", PREV),
                ("walrelay-anything", "x"),
                (forged, "ffffffffffffffffffffffffffffffff"),
            )
        )
    assert e.value.header == forged
    assert "more than once" in str(e.value)


def test_application_headers_may_repeat():
    RecordMeta.from_headers(
        h(("trace", "1"), ("trace", "2"), ("idempotency-key", KEY), ("walrelay-source", "s"))
    )
    assert is_reserved("walrelay-source") and is_reserved("idempotency-key")
    assert is_reserved("Walrelay-Source") and is_reserved("IDEMPOTENCY-KEY")
    assert not is_reserved("idempotency") and not is_reserved("x-walrelay-y")


def test_minimal_headers_and_empty_or_null_prev_key():
    meta = RecordMeta.from_headers(
        h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-prev-key", ""))
    )
    assert meta.prev_key is None and meta.lsn is None and meta.commit_lsn is None
    meta = RecordMeta.from_headers(
        [("idempotency-key", KEY.encode()), ("walrelay-source", b"s"), ("walrelay-prev-key", None)]
    )
    assert meta.prev_key is None


def test_missing_key():
    with pytest.raises(MissingHeader) as e:
        RecordMeta.from_headers(h(("walrelay-source", "s")))
    assert e.value.header == "idempotency-key"
    text = str(e.value)
    assert "idempotency-key" in text
    assert "not produced by walrelay" in text
    assert "stripped by a proxy" in text
    # A null value is missing too, and so is no headers at all.
    with pytest.raises(MissingHeader):
        RecordMeta.from_headers([("idempotency-key", None), ("walrelay-source", b"s")])
    with pytest.raises(MissingHeader):
        RecordMeta.from_headers(None)
    with pytest.raises(MissingHeader):
        RecordMeta.from_headers([])


def test_missing_or_empty_source():
    with pytest.raises(MissingHeader) as e:
        RecordMeta.from_headers(h(("idempotency-key", KEY)))
    assert e.value.header == "walrelay-source"
    assert "walrelay-source" in str(e.value)
    with pytest.raises(EmptySource):
        RecordMeta.from_headers(h(("idempotency-key", KEY), ("walrelay-source", "")))


def test_bad_values():
    with pytest.raises(BadKey) as e:
        RecordMeta.from_headers(h(("idempotency-key", KEY[:31] + "g"), ("walrelay-source", "s")))
    assert e.value.header == "idempotency-key"
    assert "at byte 31" in str(e.value)
    with pytest.raises(BadKey) as e:
        RecordMeta.from_headers(h(("idempotency-key", "1234"), ("walrelay-source", "s")))
    assert "got 4 bytes" in str(e.value)
    with pytest.raises(BadKey) as e:
        RecordMeta.from_headers(
            h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-prev-key", "nope"))
        )
    assert e.value.header == "walrelay-prev-key"
    with pytest.raises(BadLsn):
        RecordMeta.from_headers(h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-lsn", "12345")))
    with pytest.raises(BadLsn):
        RecordMeta.from_headers(
            h(("idempotency-key", KEY), ("walrelay-source", "s"), ("walrelay-lsn", "123456789/0"))
        )
    with pytest.raises(NotUtf8):
        RecordMeta.from_headers([("idempotency-key", b"\xff\xfe"), ("walrelay-source", b"s")])
