"""NCCL-tests' sizes and bus factors, against numbers worked out by hand (doc/PERFORMANCE.md of nccl-tests)."""

from __future__ import annotations

import pytest

from hp_otel.spans import schema
from hp_otel.spans.bandwidth import Bandwidth, bandwidth, bandwidth_attributes, bus_factor, format_rate

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

US = 1000  # ns


@pytest.mark.parametrize(
    ("op", "nbytes", "n", "expected"),
    [
        # all_reduce of 1000 B on 4 ranks in 1 µs: S = 1000 B, algbw = 1 GB/s, busbw = 2*3/4 = 1.5 GB/s
        ("all_reduce", 1000, 4, Bandwidth(1000, 1e9, 1.5e9)),
        # all_gather of a 1000 B shard on 4 ranks: S = output = 4000 B, busbw = 3/4 of 4 GB/s
        ("all_gather", 1000, 4, Bandwidth(4000, 4e9, 3e9)),
        # reduce_scatter of a 4000 B input on 4 ranks: S = the input, 3/4
        ("reduce_scatter", 4000, 4, Bandwidth(4000, 4e9, 3e9)),
        ("all_to_all", 4000, 4, Bandwidth(4000, 4e9, 3e9)),
        ("gather", 1000, 4, Bandwidth(4000, 4e9, 3e9)),
        ("broadcast", 1000, 8, Bandwidth(1000, 1e9, 1e9)),
        ("reduce", 1000, 8, Bandwidth(1000, 1e9, 1e9)),
        ("send", 1000, 2, Bandwidth(1000, 1e9, 1e9)),
        ("recv", 1000, 2, Bandwidth(1000, 1e9, 1e9)),
        ("p2p", 1000, 2, Bandwidth(1000, 1e9, 1e9)),
        # one rank: no bus traffic (nccl-tests prints 0 too), algbw still S/t
        ("all_reduce", 1000, 1, Bandwidth(1000, 1e9, 0.0)),
    ],
)
def test_size_and_factor_per_op(op: str, nbytes: int, n: int, expected: Bandwidth) -> None:
    got = bandwidth(op, nbytes, n, 1 * US)
    assert got is not None
    assert got.size == expected.size
    assert got.algbw == pytest.approx(expected.algbw, rel=1e-12)
    assert got.busbw == pytest.approx(expected.busbw, rel=1e-12)


@pytest.mark.parametrize(
    ("op", "nbytes", "n", "duration_ns"),
    [("barrier", 0, 4, US), ("scatter", 1000, 4, US), ("all_reduce", 0, 4, US), ("all_reduce", 10, 4, 0),
     ("all_reduce", 10, 0, US), ("unknown", 10, 4, US)],
)  # fmt: skip
def test_no_bandwidth_where_it_means_nothing(op: str, nbytes: int, n: int, duration_ns: int) -> None:
    assert bandwidth(op, nbytes, n, duration_ns) is None
    assert bandwidth_attributes(op, nbytes, n, duration_ns) == {}


def test_attributes_and_factors() -> None:
    assert bandwidth_attributes("all_gather", 256, 2, 2 * US) == {
        schema.COLLECTIVE_BW_BYTES: 512,
        schema.COLLECTIVE_ALGBW: 256e6,  # 512 B / 2 µs
        schema.COLLECTIVE_BUSBW: 128e6,  # (2-1)/2
    }
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("barrier", 8) == 0.0


def test_rates_print_in_decimal_units() -> None:
    assert format_rate(1.5e9) == "1.5 GB/s"
    assert format_rate(256e6) == "256 MB/s"
    assert format_rate(2.5e12) == "2.5 TB/s"
    assert format_rate(12.0) == "12 B/s"
