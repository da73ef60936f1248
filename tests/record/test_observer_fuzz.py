"""Property-based fuzzing of the observer interface (hypothesis).

Random event sequences — exits without enters, unbalanced stacks, collectives outside
any op, parents that exit before their children (MindSpore's backward hooks), windows
that raise, backward module chains moving in any order (node attribution), async
collectives completed late, twice or never — fed to a mode with deferred and with live spans.  Whatever the sequence:
the recorder never raises or faults, every span is ended, every parent exists, there
are no cycles, the table and the JSON dump render at every level, and the counts equal
the number of collective events.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider

from hp_otel import CommDebugMode
from hp_otel.render.json_dump import build_json_dump
from hp_otel.render.levels import NOISE_LEVELS
from hp_otel.spans.infos import CollectiveInfo, ModuleCall, ModuleInfo, ParameterInfo, TensorInfo
from hp_otel.testing import assert_collective_counts, collective_counts, span_outline

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

FQNS = ("(root)", "fc1", "fc2", "block.attn")
OPS = ("linear", "gelu", "matmul")
PHASES = ("forward", "backward")
COLLECTIVES = (
    CollectiveInfo(
        "_c10d_functional.all_reduce", "all_reduce", 2, "g0", (0, 1), (4, 16), (4, 16), "torch.float32", 256
    ),
    CollectiveInfo("c10d.allgather_", "all_gather", 4, "g1", (0, 1, 2, 3), (2, 8), (8, 8), "torch.bfloat16", 32),
    CollectiveInfo("c10d.barrier", "barrier", 2),
)
TENSOR = TensorInfo((4, 16), "torch.float32", True, ("Shard(dim=0)",), (2,))
# Module calls for backward by autograd node: a root call, two children, one reused (a second call).
_ROOT_CALL = ModuleCall(ModuleInfo("(root)", "MLP", "MLP"))
_CALLS = (
    _ROOT_CALL,
    ModuleCall(ModuleInfo("fc1", "fc1", "Linear"), _ROOT_CALL),
    ModuleCall(ModuleInfo("fc2", "fc2", "Linear"), _ROOT_CALL),
    ModuleCall(ModuleInfo("fc2", "fc2", "Linear"), _ROOT_CALL),
)
CHAINS = ((), *(call.chain for call in _CALLS))

events = st.one_of(
    st.tuples(st.just("module_enter"), st.sampled_from(FQNS), st.sampled_from(PHASES)),
    st.tuples(st.just("module_exit"), st.sampled_from(FQNS), st.sampled_from(PHASES), st.booleans()),
    st.tuples(st.just("op_enter"), st.sampled_from(OPS)),
    st.tuples(st.just("op_exit"), st.sampled_from(OPS), st.booleans()),
    st.tuples(st.just("redistribute_enter")),
    st.tuples(st.just("redistribute_exit"), st.booleans()),
    st.tuples(st.just("collective"), st.sampled_from(COLLECTIVES), st.sampled_from((None, *PHASES)), st.booleans()),
    st.tuples(st.just("backward_end")),
    st.tuples(st.just("backward_modules"), st.sampled_from(CHAINS)),
    st.tuples(st.just("running_node"), st.sampled_from((None, *CHAINS))),  # what node attribution answers
    st.tuples(st.just("async_collective"), st.sampled_from(COLLECTIVES), st.sampled_from((None, *PHASES))),
    st.tuples(st.just("complete"), st.integers(0, 5), st.sampled_from(("wait", "work"))),
)


def _feed(observer, sequence) -> int:
    """Feed events; returns how many collective events were fed."""
    collectives = 0
    clock = 1_000
    running: list = [None]
    observer.set_node_attribution(lambda: running[0])
    tokens: list = []
    for event in sequence:
        kind = event[0]
        if kind == "module_enter":
            observer.on_module_enter(
                ModuleInfo(event[1], event[1], "Linear", (ParameterInfo("weight", (2, 2), "torch.float32"),)), event[2]
            )
        elif kind == "module_exit":
            observer.on_module_exit(event[1], event[2], RuntimeError("boom") if event[3] else None)
        elif kind == "op_enter":
            observer.on_op_enter(event[1], [TENSOR])
        elif kind == "op_exit":
            observer.on_op_exit(event[1], [TENSOR], ValueError("op failed") if event[2] else None)
        elif kind == "redistribute_enter":
            observer.on_redistribute_enter("Partial(sum)", "Replicate()", (4, 16))
        elif kind == "redistribute_exit":
            observer.on_redistribute_exit(KeyError("r") if event[1] else None)
        elif kind == "collective":
            clock += 10
            observer.on_collective(event[1], clock, clock + 5, RuntimeError("c") if event[3] else None, event[2])
            collectives += 1
        elif kind == "backward_modules":
            observer.on_backward_modules(event[1])
        elif kind == "running_node":
            running[0] = event[1]
        elif kind == "async_collective":
            clock += 10
            tokens.append(observer.on_collective(event[1], clock, clock + 5, None, event[2], awaits_completion=True))
            collectives += 1
        elif kind == "complete":
            clock += 10
            if tokens:
                observer.on_collective_complete(tokens[event[1] % len(tokens)], clock, event[2])
        else:
            observer.on_backward_end()
    return collectives


def _check_spans(mode: CommDebugMode, fed: int) -> None:
    spans = mode.get_finished_spans()
    assert mode.get_callback_error_counts() == {}
    assert all(span.end_time is not None and span.end_time >= span.start_time for span in spans)
    by_id = {span.context.span_id: span for span in spans}
    assert len(by_id) == len(spans)
    for span in spans:  # every parent exists (the window has no parent span here) and no cycles
        seen = set()
        node = span
        while node.parent is not None:
            assert node.parent.span_id in by_id, f"{node.name} has a missing parent"
            assert node.context.span_id not in seen, "cycle"
            seen.add(node.context.span_id)
            node = by_id[node.parent.span_id]
    assert mode.get_total_counts() == fed
    assert sum(collective_counts(spans).values()) == fed  # one span per collective event
    assert_collective_counts(spans, mode.get_comm_counts())
    for level in NOISE_LEVELS:
        table = mode.generate_comm_debug_tracing_table(level) if level < 2 else _table_quiet(mode, level)
        assert isinstance(table, str) and table
        dump = build_json_dump(spans, level, mode.get_comm_counts(), mode.get_comm_module_counts(), 0)
        assert json.loads(json.dumps(dump))["total_counts"] == fed
    span_outline(mode)


def _table_quiet(mode: CommDebugMode, level: int) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no module= here: levels 2-3 warn
        return mode.generate_comm_debug_tracing_table(level)


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.lists(events, max_size=60), st.booleans(), st.booleans())
def test_random_event_sequences_keep_every_invariant(sequence, live: bool, raise_in_window: bool) -> None:
    mode = CommDebugMode(tracer_provider=TracerProvider(), live_spans=live)
    before = otel_context.get_current()
    fed = 0
    try:
        with mode:
            fed = _feed(mode.observer, sequence)
            if raise_in_window:
                raise LookupError("user code")
    except LookupError:
        assert raise_in_window
    assert otel_context.get_current() == before  # live spans leave the OTel context as they found it
    _check_spans(mode, fed)


@_SETTINGS
@given(st.lists(events, max_size=40), st.lists(events, max_size=40))
def test_nested_windows_split_events_exactly(outer_events, inner_events) -> None:
    with CommDebugMode() as outer:
        fed_outer = _feed(outer.observer, outer_events)
        with CommDebugMode() as inner:
            fed_inner = _feed(inner.observer, inner_events)
            _feed(outer.observer, inner_events)  # the suspended outer ignores these
    _check_spans(inner, fed_inner)
    _check_spans(outer, fed_outer)


@settings(max_examples=40, deadline=None)
@given(st.lists(events, max_size=40), st.integers(min_value=0, max_value=8))
def test_retention_cap_keeps_counts_exact(sequence, cap: int) -> None:
    with CommDebugMode(max_spans=cap) as mode:
        fed = _feed(mode.observer, sequence)
    spans = mode.get_finished_spans()
    assert len(spans) <= cap
    assert mode.get_total_counts() == fed
    assert len(spans) + mode.get_dropped_record_count() >= fed  # every span is kept or counted as dropped
    mode.generate_comm_debug_tracing_table(1)


@settings(max_examples=30, deadline=None)
@given(st.lists(events, max_size=40))
def test_streamed_json_file_matches_the_dump(tmp_path_factory, sequence) -> None:
    with CommDebugMode() as mode:
        _feed(mode.observer, sequence)
    path = tmp_path_factory.mktemp("fuzz") / "dump.json"
    spans = mode.get_finished_spans()
    for level in NOISE_LEVELS:  # the streaming writer is byte-identical to json.dump(indent=2) of the dump
        dump = build_json_dump(spans, level, mode.get_comm_counts(), mode.get_comm_module_counts(), 0)
        mode.generate_json_dump(path, noise_level=level)
        assert path.read_text() == json.dumps(dump, indent=2)
