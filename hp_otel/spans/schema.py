"""Every span, attribute and metric name hp_otel emits, in one place.

Renderers read spans back through these names only, so a table can be rebuilt from
spans saved to a file or pulled from a trace backend.  The schema table in docs/reference/schema.md
mirrors this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

# code_attributes: stable since semantic conventions 1.33 (opentelemetry-semantic-conventions 0.54b0);
# the lowest SDK accepted (1.42, pyproject.toml) brings 0.63b0
from opentelemetry.semconv.attributes import code_attributes, error_attributes

INSTRUMENTATION_NAME: Final = "hp_otel"
# Every name hp_otel defines starts with this: the package's import name, unambiguous where `hp.` (before
# 0.2.0) was two letters anyone could use (docs/reference/schema.md, "Names").
PREFIX: Final = "hp_otel."
# The instrumentation scope's schema URL: the semantic-conventions release the standard names
# used here follow (error.type, host.name, process.pid, service.*, and code.file.path /
# code.line.number / code.function.name: renamed from code.filepath / code.lineno / code.function in
# 1.30, stable with code.function.name fully qualified in 1.33.0, which is why we claim that one).
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.33.0"

# --- what a span is -------------------------------------------------------
CALL_KIND: Final = f"{PREFIX}call.kind"
KIND_MODULE: Final = "module"
KIND_OP: Final = "op"
KIND_COLLECTIVE: Final = "collective"
KIND_REDISTRIBUTE: Final = "redistribute"
CALL_KINDS: Final = (KIND_MODULE, KIND_OP, KIND_COLLECTIVE, KIND_REDISTRIBUTE)

# Opt-in (CommDebugMode(stack=...)): the user's frames issuing a collective or redistribute,
# innermost first, each "file:line:module.function" (library frames dropped, at most the depth asked).
# A string array, not OTel's `code.stacktrace`: that is one string in the runtime's own traceback
# format (outermost first, source lines, every frame); this one is filtered, cut and listable.
CALL_STACK: Final = f"{PREFIX}call.stack"
# The innermost of those frames also in OTel's stable code attributes (what backends link to source);
# the function is fully qualified ("pkg.module.Class.method"), as semconv 1.33+ defines it.
CODE_FILE_PATH: Final = code_attributes.CODE_FILE_PATH
CODE_LINE_NUMBER: Final = code_attributes.CODE_LINE_NUMBER
CODE_FUNCTION_NAME: Final = code_attributes.CODE_FUNCTION_NAME

PHASE: Final = f"{PREFIX}phase"
PHASE_FORWARD: Final = "forward"
PHASE_BACKWARD: Final = "backward"
# A forward that runs again inside backward (activation checkpointing recomputes it).
PHASE_RECOMPUTE: Final = "recompute"
# Inside `Optimizer.step` (torch's global optimizer step hooks): its span is a module span of
# the pseudo-module OPTIMIZER_FQN, its collectives count there.
PHASE_OPTIMIZER: Final = "optimizer"
# Outside every module and outside backward while modules are tracked (the loss, gradient
# clipping, a framework's glue): its collectives count for the pseudo-module OUTSIDE_FQN.
PHASE_OUTSIDE: Final = "outside"
PHASES: Final = (PHASE_FORWARD, PHASE_BACKWARD, PHASE_RECOMPUTE, PHASE_OPTIMIZER, PHASE_OUTSIDE)
OPTIMIZER_FQN: Final = "(optimizer)"  # the optimizer step's key in module counts, spans and tables
OUTSIDE_FQN: Final = "(outside)"  # the key in module counts of what ran outside every module

# --- module spans ---------------------------------------------------------
MODULE_FQN: Final = f"{PREFIX}module.fqn"
MODULE_TYPE: Final = f"{PREFIX}module.type"
# Parallel arrays, index i = parameter i of this module (not of its children).
MODULE_PARAM_NAMES: Final = f"{PREFIX}module.param.names"
MODULE_PARAM_SHAPES: Final = f"{PREFIX}module.param.shapes"
MODULE_PARAM_DTYPES: Final = f"{PREFIX}module.param.dtypes"
MODULE_PARAM_PLACEMENTS: Final = f"{PREFIX}module.param.placements"
ROOT_MODULE_FQN: Final = "(root)"  # the root module's fqn in spans, counts and tables

# --- op spans: inputs and outputs as parallel arrays, index i = tensor i ---
# Shapes are int arrays, as on collective spans; an attribute cannot hold an array per tensor, so
# the dims of every tensor follow each other and `*_ndims` says how many are each tensor's
# (`input_shapes` (4, 16, 32, 16, 32) with `input_ndims` (2, 2, 1): shapes (4, 16), (32, 16), (32,);
# 0 for a scalar). Files of earlier hp_otel versions wrote one "4,16" string per tensor and no ndims.
OP_NAME: Final = f"{PREFIX}op.name"
OP_INPUT_SHAPES: Final = f"{PREFIX}op.input.shapes"  # int[]: every input's dims, one tensor after the other
OP_INPUT_NDIMS: Final = f"{PREFIX}op.input.ndims"  # int[]: dims per input (the number of inputs is its length)
OP_INPUT_DTYPES: Final = f"{PREFIX}op.input.dtypes"  # "torch.float32"
OP_INPUT_IS_DTENSOR: Final = f"{PREFIX}op.input.is_dtensor"
OP_INPUT_PLACEMENTS: Final = f"{PREFIX}op.input.placements"  # "Shard(dim=0)", mesh dims joined by ";"
OP_INPUT_MESH_SHAPES: Final = f"{PREFIX}op.input.mesh.shapes"  # int[]: each input's mesh shape, one after the other
OP_INPUT_MESH_NDIMS: Final = f"{PREFIX}op.input.mesh.ndims"  # int[]: mesh dims per input; 0 for a plain tensor
OP_OUTPUT_SHAPES: Final = f"{PREFIX}op.output.shapes"
OP_OUTPUT_NDIMS: Final = f"{PREFIX}op.output.ndims"
OP_OUTPUT_DTYPES: Final = f"{PREFIX}op.output.dtypes"
OP_OUTPUT_IS_DTENSOR: Final = f"{PREFIX}op.output.is_dtensor"
OP_OUTPUT_PLACEMENTS: Final = f"{PREFIX}op.output.placements"
OP_OUTPUT_MESH_SHAPES: Final = f"{PREFIX}op.output.mesh.shapes"
OP_OUTPUT_MESH_NDIMS: Final = f"{PREFIX}op.output.mesh.ndims"

# --- collective spans -----------------------------------------------------
COLLECTIVE_NAME: Final = f"{PREFIX}collective.name"  # as the framework calls it
COLLECTIVE_OP: Final = f"{PREFIX}collective.op"  # normalised, see NORMALISED_OPS
# The communication library the group runs on, as the framework names it: nccl, gloo, hccl, mccl,
# fake, mpi, ucc, ... (lowercase, a handful of values).  Semconv registers no attribute for it (no
# collective-communication conventions exist); `db.system.name` / `rpc.system.name` are the pattern
# followed: a well-known lowercase name of the system, on spans and metrics alike.  Ours, under
# hp_otel.collective.system.name (before 0.2.0 hp.collective.backend, as torch's `dist.get_backend` names it).
COLLECTIVE_BACKEND: Final = f"{PREFIX}collective.system.name"
COLLECTIVE_GROUP_SIZE: Final = f"{PREFIX}collective.group.size"
# A process group is described once (spans/groups.py): every collective span carries its group's id
# (the same on every rank: derived from its name and members) and size; the group's name, members and
# mesh dimension are on the first span of that group in each window (a file holds them in its table).
COLLECTIVE_GROUP_ID: Final = f"{PREFIX}collective.group.id"
COLLECTIVE_GROUP: Final = (
    f"{PREFIX}collective.group.name"  # the group's name (torch's group_name), with its description
)
COLLECTIVE_GROUP_MEMBERS: Final = (
    f"{PREFIX}collective.group.members"  # global ranks as strided runs: "0-4095", "3-4091:8"
)
COLLECTIVE_GROUP_MESH_DIM: Final = (
    f"{PREFIX}collective.group.mesh_dim"  # a DeviceMesh group's dimension: "tp", "dp_shard"
)
# Files of earlier hp_otel versions: every collective span carried its group's members as an int array
# (read only, so under its old name).
COLLECTIVE_GROUP_RANKS: Final = "hp.collective.group_ranks"
COLLECTIVE_INPUT_SHAPE: Final = f"{PREFIX}collective.input.shape"
COLLECTIVE_OUTPUT_SHAPE: Final = f"{PREFIX}collective.output.shape"
COLLECTIVE_DTYPE: Final = f"{PREFIX}collective.dtype"
COLLECTIVE_BYTES: Final = f"{PREFIX}collective.input.size"
COLLECTIVE_REDUCE_OP: Final = f"{PREFIX}collective.reduce.op"
COLLECTIVE_ASYNC: Final = f"{PREFIX}collective.async"
COLLECTIVE_PEERS: Final = f"{PREFIX}collective.peers"  # point-to-point: global rank of the peer(s)
COLLECTIVE_TAGS: Final = f"{PREFIX}collective.tags"  # point-to-point: tag(s)
COLLECTIVE_PARAM_MODULE: Final = f"{PREFIX}collective.param.module"  # FSDP: whose parameters it moves
# all_to_all with explicit split sizes (dim-0 rows sent to / received from each peer, in group order):
# int arrays, kept only for groups of at most SPLIT_SIZES_MAX ranks (an attribute per call must not grow
# with the group; torch.profiler cuts its own at 30).  Kineto's "In split size" / "Out split size".
COLLECTIVE_INPUT_SPLIT_SIZES: Final = f"{PREFIX}collective.input.split_sizes"
COLLECTIVE_OUTPUT_SPLIT_SIZES: Final = f"{PREFIX}collective.output.split_sizes"
SPLIT_SIZES_MAX: Final = 64
# True on torch's fake process group only (absent elsewhere): the call returned at once, so the span's
# duration is the host's dispatch; no bandwidth is set and it is left out of the exposure figures.
BACKEND_FAKE: Final = "fake"  # hp_otel.collective.system.name of torch's fake process group: returns at once, untimed
# FSDP in backward: the module whose backward work was running when the collective was issued
# (a prefetch from the next layer's pre-backward hook; "" from the root's final callback).  The
# collective itself counts, and nests, under the module whose parameter group issued it; the
# attribute is set only when the issuer differs from that module.
COLLECTIVE_ISSUED_BY: Final = f"{PREFIX}collective.issued_by"
# Where a collective span ends: the call returned (sync), the functional collective's
# wait_tensor ran, the c10d Work completed, or only the launch was seen.
COLLECTIVE_COMPLETION: Final = f"{PREFIX}collective.completion"
COMPLETION_CALL: Final = "call"
COMPLETION_WAIT: Final = "wait"
COMPLETION_WORK: Final = "work"
COMPLETION_LAUNCH: Final = "launch"
# CUDA: the span's duration is the device time between CUDA events recorded around it (read without a sync).
COMPLETION_DEVICE: Final = "device"
# Async collectives (completion wait/work/device/launch): how long the issuing call itself took on the host,
# and how long a thread then waited for it (wait_tensor, Work.wait), that wait ending at or after its
# completion; both in seconds (doubles).  What the exposed-communication figures are computed from
# (spans/exposure.py).
COLLECTIVE_CALL_DURATION: Final = f"{PREFIX}collective.call.duration"
COLLECTIVE_WAIT_DURATION: Final = f"{PREFIX}collective.wait.duration"
# Matching the same collective across ranks (rank_compare.py, `hp-otel ranks`).
COLLECTIVE_SEQ: Final = f"{PREFIX}collective.seq"  # index among this rank's collectives on the group, per window
COLLECTIVE_WINDOW: Final = f"{PREFIX}collective.window"  # what the seq counts within: "step 3" or "window 0"
COLLECTIVE_MODULE: Final = f"{PREFIX}collective.module"  # innermost module open when it was issued ("" if none)
COLLECTIVE_MATCH_ID: Final = f"{PREFIX}collective.match.id"  # same on every rank for the same collective (hex)
COLLECTIVE_IN_FLIGHT: Final = f"{PREFIX}collective.in_flight"  # issued, not completed when the file was written
WATCHDOG_EVENT: Final = f"{PREFIX}watchdog.dump"  # span event: the watchdog wrote the spans so far
WATCHDOG_PATH: Final = f"{PREFIX}watchdog.path"
WATCHDOG_WAITED_S: Final = f"{PREFIX}watchdog.wait.duration"  # s

NORMALISED_OPS: Final = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "barrier",
    "send",
    "recv",
    "p2p",  # a batch of sends and receives (functional batch_p2p_ops)
    "gather",
    "scatter",
    "reduce",
)

# --- redistribute spans ---------------------------------------------------
REDISTRIBUTE_SRC_PLACEMENTS: Final = f"{PREFIX}redistribute.src.placements"
REDISTRIBUTE_DST_PLACEMENTS: Final = f"{PREFIX}redistribute.dst.placements"
TENSOR_SHAPE: Final = f"{PREFIX}tensor.shape"
REDISTRIBUTE_SPAN_NAME: Final = "redistribute"

# --- resource -------------------------------------------------------------
RESOURCE_RANK: Final = f"{PREFIX}rank"
RESOURCE_LOCAL_RANK: Final = f"{PREFIX}local_rank"
RESOURCE_WORLD_SIZE: Final = f"{PREFIX}world.size"
RESOURCE_RUN_ID: Final = f"{PREFIX}run.id"

# --- metrics --------------------------------------------------------------
METRIC_CALLS: Final = f"{PREFIX}collective.calls"
METRIC_CALLS_UNIT: Final = "{call}"
METRIC_BYTES: Final = f"{PREFIX}collective.input.size"
METRIC_BYTES_UNIT: Final = "By"
METRIC_DURATION: Final = f"{PREFIX}collective.duration"
METRIC_DURATION_UNIT: Final = "s"
# 1 µs .. 10 s, roughly three buckets a decade.
DURATION_BUCKETS_S: Final = (
    1e-6, 2.5e-6, 5e-6,
    1e-5, 2.5e-5, 5e-5,
    1e-4, 2.5e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3,
    1e-2, 2.5e-2, 5e-2,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# Exposed communication per window (spans/exposure.py): the time collectives of a (phase, module) were in
# flight (union of their [issue, completion]), and the part of it the window's thread spent waiting on
# communication.  overlap fraction = overlapped / (exposed + overlapped).
# Attributes: COLLECTIVE_STATE, PHASE, MODULE_FQN (issuing module).
# One counter, as semconv models a time with a state attribute (`process.cpu.time` by `cpu.mode`): the states
# are disjoint and add up to the time in flight.  Before 0.2.0, two counters: hp.collective.time (the whole) and
# hp.collective.exposed (the exposed part).
METRIC_COMM_TIME: Final = f"{PREFIX}collective.time"
COLLECTIVE_STATE: Final = f"{PREFIX}collective.state"  # on METRIC_COMM_TIME only
STATE_EXPOSED: Final = "exposed"  # the window's thread spent it in or waiting for a collective
STATE_OVERLAPPED: Final = "overlapped"  # the rest of the time in flight: hidden behind other work
COLLECTIVE_STATES: Final = (STATE_EXPOSED, STATE_OVERLAPPED)
METRIC_COMM_TIME_UNIT: Final = "s"
METRIC_CALLBACK_ERRORS: Final = f"{PREFIX}callback.errors"
METRIC_CALLBACK_ERRORS_UNIT: Final = "{error}"
CALLBACK_NAME: Final = f"{PREFIX}callback.name"
# OTel's semantic convention for failed operations: the exception's class, on the span and on the
# collective metrics of failed calls only (absent when the call succeeded).
ERROR_TYPE: Final = error_attributes.ERROR_TYPE
# Metric attributes: bounded cardinality only (no shapes, no ranks); `error.type` follows when a call failed.
# One series' values are a `codec.MetricKey`; `codec.metric_attributes` names them with these keys.
METRIC_ATTRIBUTE_KEYS: Final = (
    COLLECTIVE_NAME,
    COLLECTIVE_OP,
    COLLECTIVE_BACKEND,
    COLLECTIVE_GROUP_SIZE,
    COLLECTIVE_DTYPE,
    PHASE,
    MODULE_FQN,
)

# --- steps: one trace per step across ranks (steps.py) ---------------------
STEP: Final = f"{PREFIX}step"  # the step number (or debug window name) every rank shares
# The steps' root-span tracer's scope attribute: a scope of its own, so its id generator is ours alone.
STEP_ROOT_SCOPE_ATTRIBUTE: Final = f"{PREFIX}step_root.ids"
# A trace list (MLflow, Jaeger, Tempo) names each trace by its root span, so the step's root says
# which step ("step 12"; one per step, emitted by rank 0, id derived from run id + step) and each
# rank's child which rank ("rank 3"). Why a name per step is kept to these two: docs/reference/schema.md.
# Files of hp_otel before 0.2.0 named them "step" and "rank_step" (LEGACY_*): readers take both.
LEGACY_STEP_ROOT_SPAN_NAME: Final = "step"
LEGACY_RANK_STEP_SPAN_NAME: Final = "rank_step"


def step_span_name(step: int | str) -> str:
    """The step root span's name: `step 12` (a named window: `step warmup`)."""
    return f"step {step}"


def rank_step_span_name(rank: int) -> str:
    """A rank's span in a step: `rank 3`."""
    return f"rank {rank}"


def is_rank_step_span(name: str, attributes: Mapping[str, Any]) -> bool:
    """A rank's span of a step, as named now (`rank 3`: it alone has both hp_otel.step and hp_otel.rank) or before."""
    return name == LEGACY_RANK_STEP_SPAN_NAME or (STEP in attributes and RESOURCE_RANK in attributes)


def module_span_name(name: str, phase: str) -> str:
    """A module span's name: the module's path, and after it the phase when that is not forward
    (`layers.3.mlp backward`, `layers.3.mlp recompute`): a trace list tells a module's forward from its
    backward by name, at most a few names a module (PHASES)."""
    return name if phase in (PHASE_FORWARD, PHASE_OPTIMIZER, PHASE_OUTSIDE) else f"{name} {phase}"


# --- bandwidth (NCCL-tests' definitions, see hp_otel.spans.bandwidth and docs/bandwidth.md) ---
# On a collective span that completed (not for a launch-only async span, nor barriers or empty calls):
COLLECTIVE_ALGBW: Final = f"{PREFIX}collective.algbw"  # bytes/s: the NCCL-tests size S over the span's duration
COLLECTIVE_BUSBW: Final = f"{PREFIX}collective.busbw"  # bytes/s: algbw times the op's bus factor
COLLECTIVE_BW_BYTES: Final = f"{PREFIX}collective.bw.size"  # the size S the bandwidths use (bytes)
METRIC_BUSBW: Final = f"{PREFIX}collective.busbw"
METRIC_BUSBW_UNIT: Final = "By/s"
# 1 MB/s .. 10 TB/s, three buckets a decade (PCIe/NVLink/IB live in 1e9..1e12).
BUSBW_BUCKETS: Final = (*(m * 10.0**e for e in range(6, 13) for m in (1.0, 2.5, 5.0)), 1e13)

# --- live staleness gauges (hp_otel.record.liveness) ------------------------
METRIC_IN_FLIGHT: Final = f"{PREFIX}collective.in_flight.count"
METRIC_IN_FLIGHT_UNIT: Final = "{call}"
METRIC_SINCE_COMPLETION: Final = f"{PREFIX}collective.since_last_completion"
METRIC_SINCE_COMPLETION_UNIT: Final = "s"
METRIC_OLDEST_IN_FLIGHT: Final = f"{PREFIX}collective.oldest_in_flight.age"
METRIC_OLDEST_IN_FLIGHT_UNIT: Final = "s"


# --- names of earlier releases ----------------------------------------------------------------
# What files of hp_otel before 0.2.0 called an attribute, metric or resource key: old name -> new name.  The
# single source of the migration table in docs/reference/schema.md (tests/docs checks the table against it).
# Every reader of files takes both for one release through `normalise_attributes` alone: the spans-file
# readers (spans/otlp_json.py, analysis/rank_input.py), the collectives file (spans/collectives_file.py) and
# the snapshot comparison (testing/snapshots.py) call it on each span's and resource's attributes.
LEGACY_PREFIX: Final = "hp."
RENAMED: Final[Mapping[str, str]] = MappingProxyType(
    {
        "hp.call.kind": CALL_KIND,
        "hp.call.stack": CALL_STACK,
        "hp.phase": PHASE,
        "hp.module.fqn": MODULE_FQN,
        "hp.module.type": MODULE_TYPE,
        "hp.module.param_names": MODULE_PARAM_NAMES,
        "hp.module.param_shapes": MODULE_PARAM_SHAPES,
        "hp.module.param_dtypes": MODULE_PARAM_DTYPES,
        "hp.module.param_placements": MODULE_PARAM_PLACEMENTS,
        "hp.op.name": OP_NAME,
        "hp.collective.name": COLLECTIVE_NAME,
        "hp.collective.op": COLLECTIVE_OP,
        "hp.collective.backend": COLLECTIVE_BACKEND,
        "hp.collective.group_size": COLLECTIVE_GROUP_SIZE,
        "hp.collective.group_id": COLLECTIVE_GROUP_ID,
        "hp.collective.group": COLLECTIVE_GROUP,
        "hp.collective.group_members": COLLECTIVE_GROUP_MEMBERS,
        "hp.collective.group_mesh_dim": COLLECTIVE_GROUP_MESH_DIM,
        "hp.collective.input_shape": COLLECTIVE_INPUT_SHAPE,
        "hp.collective.output_shape": COLLECTIVE_OUTPUT_SHAPE,
        "hp.collective.dtype": COLLECTIVE_DTYPE,
        "hp.collective.bytes": COLLECTIVE_BYTES,
        "hp.collective.reduce_op": COLLECTIVE_REDUCE_OP,
        "hp.collective.async": COLLECTIVE_ASYNC,
        "hp.collective.peers": COLLECTIVE_PEERS,
        "hp.collective.tags": COLLECTIVE_TAGS,
        "hp.collective.param_module": COLLECTIVE_PARAM_MODULE,
        "hp.collective.input_split_sizes": COLLECTIVE_INPUT_SPLIT_SIZES,
        "hp.collective.output_split_sizes": COLLECTIVE_OUTPUT_SPLIT_SIZES,
        "hp.collective.issued_by": COLLECTIVE_ISSUED_BY,
        "hp.collective.completion": COLLECTIVE_COMPLETION,
        "hp.collective.call.duration": COLLECTIVE_CALL_DURATION,
        "hp.collective.wait.duration": COLLECTIVE_WAIT_DURATION,
        "hp.collective.seq": COLLECTIVE_SEQ,
        "hp.collective.window": COLLECTIVE_WINDOW,
        "hp.collective.module": COLLECTIVE_MODULE,
        "hp.collective.match.id": COLLECTIVE_MATCH_ID,
        "hp.collective.in_flight": COLLECTIVE_IN_FLIGHT,
        "hp.watchdog.dump": WATCHDOG_EVENT,
        "hp.watchdog.path": WATCHDOG_PATH,
        "hp.watchdog.wait.duration": WATCHDOG_WAITED_S,
        "hp.redistribute.src_placements": REDISTRIBUTE_SRC_PLACEMENTS,
        "hp.redistribute.dst_placements": REDISTRIBUTE_DST_PLACEMENTS,
        "hp.tensor.shape": TENSOR_SHAPE,
        "hp.rank": RESOURCE_RANK,
        "hp.local_rank": RESOURCE_LOCAL_RANK,
        "hp.world_size": RESOURCE_WORLD_SIZE,
        "hp.run.id": RESOURCE_RUN_ID,
        "hp.collective.calls": METRIC_CALLS,
        "hp.collective.duration": METRIC_DURATION,
        "hp.collective.time": METRIC_COMM_TIME,
        "hp.collective.exposed": METRIC_COMM_TIME,  # with COLLECTIVE_STATE = exposed
        "hp.callback.errors": METRIC_CALLBACK_ERRORS,
        "hp.callback": CALLBACK_NAME,
        "hp.step": STEP,
        "hp.step_root.ids": STEP_ROOT_SCOPE_ATTRIBUTE,
        "hp.collective.algbw": COLLECTIVE_ALGBW,
        "hp.collective.busbw": COLLECTIVE_BUSBW,
        "hp.collective.bw.size": COLLECTIVE_BW_BYTES,
        "hp.collective.in_flight.count": METRIC_IN_FLIGHT,
        "hp.collective.since_last_completion": METRIC_SINCE_COMPLETION,
        "hp.collective.oldest_in_flight.age": METRIC_OLDEST_IN_FLIGHT,
        "hp.op.input_shapes": OP_INPUT_SHAPES,
        "hp.op.input_ndims": OP_INPUT_NDIMS,
        "hp.op.input_dtypes": OP_INPUT_DTYPES,
        "hp.op.input_is_dtensor": OP_INPUT_IS_DTENSOR,
        "hp.op.input_placements": OP_INPUT_PLACEMENTS,
        "hp.op.input_mesh_shapes": OP_INPUT_MESH_SHAPES,
        "hp.op.input_mesh_ndims": OP_INPUT_MESH_NDIMS,
        "hp.op.output_shapes": OP_OUTPUT_SHAPES,
        "hp.op.output_ndims": OP_OUTPUT_NDIMS,
        "hp.op.output_dtypes": OP_OUTPUT_DTYPES,
        "hp.op.output_is_dtensor": OP_OUTPUT_IS_DTENSOR,
        "hp.op.output_placements": OP_OUTPUT_PLACEMENTS,
        "hp.op.output_mesh_shapes": OP_OUTPUT_MESH_SHAPES,
        "hp.op.output_mesh_ndims": OP_OUTPUT_MESH_NDIMS,
        # renamed earlier (units out of the name: durations in seconds)
        "hp.collective.call_ns": COLLECTIVE_CALL_DURATION,
        "hp.collective.waited_ns": COLLECTIVE_WAIT_DURATION,
        "hp.collective.match_id": COLLECTIVE_MATCH_ID,
        "hp.collective.bw_bytes": COLLECTIVE_BW_BYTES,
        "hp.watchdog.waited_s": WATCHDOG_WAITED_S,
    }
)


def _ns_to_s(value: Any) -> Any:
    return value / 1e9 if isinstance(value, int) and not isinstance(value, bool) else value


# The old names whose values change too (int nanoseconds -> double seconds).
_CONVERSIONS: Final[Mapping[str, Any]] = MappingProxyType(
    {"hp.collective.call_ns": _ns_to_s, "hp.collective.waited_ns": _ns_to_s}
)
# old name -> (new name, the value's conversion or None)
LEGACY_ATTRIBUTES: Final[Mapping[str, tuple[str, Any]]] = MappingProxyType(
    {old: (new, _CONVERSIONS.get(old)) for old, new in RENAMED.items()}
)
_LEGACY_KEYS: Final = frozenset(RENAMED)


def normalise_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """A file's span or resource attributes under today's names (the same dict when it has no old name; a new
    name already there wins over its old one)."""
    if _LEGACY_KEYS.isdisjoint(attributes):
        return attributes
    renamed = dict(attributes)
    for old in _LEGACY_KEYS.intersection(attributes):
        new, convert = LEGACY_ATTRIBUTES[old]
        value = renamed.pop(old)
        renamed.setdefault(new, convert(value) if convert else value)
    return renamed


def normalise_name(name: str) -> str:
    """One attribute or metric name under today's name (itself when it is not an old one)."""
    return RENAMED.get(name, name)
