"""Span attributes encoded once and shared (spans/codec.py `SharedAttributes`): a module's, an op's
and a redistribute's attributes are made once per encoding, every span of that encoding reads them,
a span that is written on (a user's hook, an error) gets its own copy, and the local store keeps and
reads them back as that one encoding."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from benchmarks.scale import mlp_forward_events
from hp_otel import CommDebugMode
from hp_otel.spans import codec, schema
from hp_otel.spans.infos import ModuleInfo, TensorInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

_A = TensorInfo(shape=(4, 16), dtype="torch.float32", is_dtensor=True, placements=("Replicate()",), mesh_shape=(2,))
_B = TensorInfo(shape=(32, 16), dtype="torch.float32", is_dtensor=True, placements=("Shard(dim=0)",), mesh_shape=(2,))


def test_an_op_is_encoded_once_per_name_phase_and_input_infos() -> None:
    first = codec.encoded_op("linear", [_A, _B], "forward")
    assert codec.encoded_op("linear", [_A, _B], "forward") is first
    assert dict(first) == codec.encode_op("linear", [_A, _B], "forward")
    others = [
        codec.encoded_op("matmul", [_A, _B], "forward"),
        codec.encoded_op("linear", [_A, _B], "backward"),
        codec.encoded_op("linear", [_B, _A], "forward"),
    ]
    assert all(other is not first for other in others)
    assert [o[schema.OP_NAME] for o in others] == ["matmul", "linear", "linear"]
    assert others[1][schema.PHASE] == "backward" and others[2][schema.OP_INPUT_SHAPES] == (32, 16, 4, 16)
    # equal values in new objects: a new entry of the same content (the key is the infos' identity)
    copy = TensorInfo(**{**_A.__dict__})
    assert dict(codec.encoded_op("linear", [copy, _B], "forward")) == dict(first)


def test_an_ops_outputs_extend_its_shared_inputs_into_one_shared_encoding() -> None:
    inputs = codec.encoded_op("linear", [_A, _B], "forward")
    both = codec.encoded_op_outputs(inputs, [_A])
    assert codec.encoded_op_outputs(inputs, [_A]) is both
    assert dict(both) == {**codec.encode_op("linear", [_A, _B], "forward"), **codec.encode_tensor_infos([_A], "output")}
    assert both.split == (tuple(both), tuple(both.values()))
    assert schema.OP_OUTPUT_SHAPES not in inputs  # the inputs' encoding is left as it was


def test_a_redistribute_is_shared_unless_its_shape_does_not_hash() -> None:
    shared = codec.encoded_redistribute("Shard(dim=0)", "Replicate()", (8, 4), "forward")
    assert codec.encoded_redistribute("Shard(dim=0)", "Replicate()", (8, 4), "forward") is shared
    assert type(shared) is codec.SharedAttributes
    unhashable = codec.encoded_redistribute("Shard(dim=0)", "Replicate()", [8, 4], "forward")  # type: ignore[arg-type]
    assert type(unhashable) is dict and unhashable[schema.TENSOR_SHAPE] == [8, 4]


def test_a_full_cache_starts_again_and_finds_the_latest() -> None:
    infos = [TensorInfo(shape=(n,), dtype="f32") for n in range(codec._CALL_CACHE_LIMIT + 5)]
    made = [codec.encoded_op("relu", [info], "forward") for info in infos]
    assert len(codec._op_attrs) <= codec._CALL_CACHE_LIMIT
    assert codec.encoded_op("relu", [infos[-1]], "forward") is made[-1]


def _hooked_window(provider: TracerProvider | None = None, **hooks: Any) -> CommDebugMode:
    mode = CommDebugMode(tracer_provider=provider, **hooks)
    with mode:
        for _ in range(3):
            mlp_forward_events(mode.observer)
    return mode


def test_a_hook_writing_on_one_span_leaves_the_shared_encoding_and_the_other_spans_alone() -> None:
    written: list[str] = []

    def once(span: Any, info: Any) -> None:  # only the first span of each kind is written on
        if span.name not in written:
            written.append(span.name)
            span.set_attribute("user.first", True)

    mode = _hooked_window(op_hook=once, module_hook=once)
    spans = mode.get_finished_spans()
    firsts = [s for s in spans if s.attributes.get("user.first")]
    assert sorted(s.name for s in firsts) == sorted(written) and "linear" in written and len(firsts) == len(written)
    for name in written:  # the same encoding's later spans: without the hook's attribute
        rest = [s for s in spans if s.name == name and not s.attributes.get("user.first")]
        assert rest and all("user.first" not in s.attributes for s in rest)
    again = _hooked_window().get_finished_spans()  # a later window: the encodings are as they were
    assert not any("user.first" in s.attributes for s in again)


def test_spans_of_one_encoding_read_back_as_one_read_only_mapping() -> None:
    mode = _hooked_window()
    spans = mode.get_finished_spans()
    gelus = [s for s in spans if s.name == "gelu"]
    assert len(gelus) == 3
    assert gelus[0].attributes == gelus[1].attributes == gelus[2].attributes
    assert gelus[0].attributes[schema.OP_OUTPUT_SHAPES] == (4, 32)
    with pytest.raises(TypeError):
        gelus[0].attributes["user.late"] = 1  # type: ignore[index]
    # kept as the encoding's one split: no tuple of their own
    records = [r for r in mode._store._spans if r[0] == "gelu"]
    assert len({id(r[17]) for r in records}) == 1
    # an error on a module span: that span's own attributes, the error type among them
    failing = CommDebugMode()
    with failing:
        mlp_forward_events(failing.observer)
        failing.observer.on_module_enter(ModuleInfo("fc1", "fc1", "Linear"), "forward")
        failing.observer.on_module_exit("fc1", "forward", ValueError("bad"))
    fc1 = [s for s in failing.get_finished_spans() if s.attributes.get(schema.MODULE_FQN) == "fc1"]
    assert [schema.ERROR_TYPE in s.attributes for s in fc1] == [False, True]
