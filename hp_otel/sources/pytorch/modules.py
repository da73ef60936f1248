"""Module tracking for torch `nn.Module`, forward and backward.

Forward: a pre-hook registered first (it sees the inputs before parallel-style input
hooks convert them) and a post-hook registered last with `always_call=True` (it sees
the module's final output, and runs when forward raises).  Each call is a
`ModuleCall`.

Backward, by autograd node: every autograd node gets a sequence number from a
per-thread counter when it is created, so the nodes one forward call creates are the
numbers between its pre- and post-hook (`NodeOwners`).  When backward issues a
collective, the node running it (`_compat.current_autograd_node()`) names the call
whose forward created it — that call and the calls enclosing it own the collective.
Backward spans follow the same rule: a call's span opens when the gradient of its
output arrives (its first node runs) and closes when backward work of a call outside
it starts, when a collective from outside it is issued, or when the pass ends — so
sibling modules that share an input (attention's wq/wk/wv) follow each other instead
of nesting.  Names are `named_modules()` names, the root is "(root)".
The boundaries of a top-level call are forgotten once the autograd nodes its outputs
got are gone (`NodeOwners.trim`), so a window over many steps keeps none that grow.

Depth: a window may hook only the modules down to a module depth (`hooked_within`), as
deep as what it labels: a deeper module's forward and the autograd nodes it creates then
fall inside its ancestor's call at that depth, which so owns its collectives, forward and
backward, as it would have with every module hooked.
"""

from __future__ import annotations

import bisect
import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils.hooks import RemovableHandle

from hp_otel.common import said_once
from hp_otel.record import installation
from hp_otel.record import phase as phase_of
from hp_otel.record.attribution import GroupCalls
from hp_otel.record.observer import Observer
from hp_otel.sources import module_depth
from hp_otel.sources.pytorch import _compat, compile_wrappers, fsdp
from hp_otel.sources.pytorch.fsdp import fsdp1_patches, param_group_modules, param_group_phase
from hp_otel.sources.pytorch.stand_in_params import stand_in_parameters
from hp_otel.sources.pytorch.tensors import dtype_name
from hp_otel.spans import schema
from hp_otel.spans.codec import placements_text
from hp_otel.spans.infos import ModuleCall, ModuleInfo, ParameterInfo

# True while dynamo traces our hook into a graph (torch's constant there; a cheap call eagerly).
_is_compiling: Callable[[], bool] = torch.compiler.is_compiling
_next_sequence_nr = _compat.next_sequence_nr  # this thread's next autograd node number
_current_node = _compat.current_autograd_node
_graph_task_id = _compat.current_graph_task_id  # -1 outside backward
_sequence_nr = _compat.node_sequence_nr  # an autograd node's number
_add_tensor_hook = _compat.add_tensor_hook  # `tensor.register_hook`, for a hook whose handle nobody keeps
logger = logging.getLogger("hp_otel")
_NO_SEQUENCE_NR = 2**64 - 1  # AccumulateGrad nodes: made on demand, not by a forward
# Non-reentrant checkpointing stops a recomputed forward once it has what backward needs.
_STOP_RECOMPUTATION: tuple[type[BaseException], ...] = _compat.STOP_RECOMPUTATION
# A module's forward hook dicts, written directly (None: through the public API, a RemovableHandle each).
_hook_dicts = _compat.forward_hook_dicts
_REGISTER_PRE = nn.Module.register_forward_pre_hook
_REGISTER_POST = nn.Module.register_forward_hook


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in `value` (nested lists, tuples, dicts) that will receive gradients."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _grad_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _grad_tensors(v)]
    return []


_param_cache: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, ...], tuple[ParameterInfo, ...]]] = (
    weakref.WeakKeyDictionary()
)


def parameter_infos(module: nn.Module) -> tuple[ParameterInfo, ...]:
    """The module's own parameters (not its children's); cached while its parameter objects stay the same."""
    identity = tuple(map(id, _compat.own_parameters(module)))
    cached = _param_cache.get(module)
    if cached is not None and cached[0] == identity:
        return cached[1]
    from torch.distributed.tensor import DTensor

    infos = []
    for name, param in module.named_parameters(recurse=False):
        # torch's DTensor, or another framework's (hyper-parallel) with the same `placements` property
        placements = param.placements if isinstance(param, DTensor) else getattr(param, "placements", None)
        infos.append(
            ParameterInfo(
                name=name,
                shape=tuple(param.shape),
                dtype=dtype_name(param.dtype),
                placements=placements_text(tuple(placements)) if placements is not None else "",
            )
        )
    described = tuple(infos)
    _param_cache[module] = (identity, described)
    return described


class _Alive:
    """Put in the metadata of a top-level call's output nodes: alive while any of them is."""

    __slots__ = ("__weakref__",)


_ALIVE_KEY = "hp_otel_call"  # our key in `Node.metadata`
_TRIM_EVERY = 16  # units kept before the first trim (then twice those a trim keeps, and 16 more)


class NodeOwners:
    """Which module call created each autograd node made on one thread.

    A boundary list over the thread's node sequence numbers: nodes numbered from
    `bounds[i]` on were created while `owners[i]` was the innermost call (None: no
    tracked module).  The counter only grows, so marking is an append and lookup a bisect.
    A mark with no node made since the previous one replaces it (that one covers nothing).

    Bounded in a window over many steps: each top-level call is a unit, alive while an
    autograd node of its outputs is (`close_unit`); `maybe_trim()`, at a top-level forward,
    folds the boundaries of the units whose output nodes are all gone into one "no module"
    boundary.  Those nodes' graph was run or dropped, so no lookup a backward can still make
    changes (the one exception: a backward started later from a tensor the call made but did
    not return, while none of its outputs is alive, counts outside the call).
    """

    __slots__ = ("_table", "_trim_at", "_units")

    def __init__(self) -> None:
        # (bounds, owners): replaced as one attribute, so a lookup from another thread never mixes two tables
        self._table: tuple[list[int], list[ModuleCall | None]] = ([], [])
        self._units: list[tuple[int, weakref.ref[_Alive] | None]] = []  # (first node number, keeper)
        self._trim_at = _TRIM_EVERY  # amortized: a trim walks the table

    @property
    def bounds(self) -> list[int]:
        return self._table[0]

    @property
    def owners(self) -> list[ModuleCall | None]:
        return self._table[1]

    def mark(self, call: ModuleCall | None) -> int:
        seq = _next_sequence_nr()
        bounds, owners = self._table
        if bounds and bounds[-1] == seq:  # no node since the last mark: a lookup never returns that one
            owners[-1] = call
        else:
            bounds.append(seq)
            owners.append(call)
        return seq

    def owner(self, sequence_nr: int) -> ModuleCall | None:
        bounds, owners = self._table
        i = bisect.bisect_right(bounds, sequence_nr) - 1
        return owners[i] if i >= 0 else None

    def close_unit(self, first_node: int, output: Any) -> None:
        """A top-level call (its nodes numbered from `first_node`) returned `output`: its boundaries
        are kept as long as an autograd node of its output is alive."""
        keeper: weakref.ref[_Alive] | None = None
        if _next_sequence_nr() != first_node:  # it made nodes (none: nothing to keep)
            with _compat.DisableTorchFunction():  # our own tensor reads are not the user's ops
                nodes = [t.grad_fn for t in _grad_tensors(output) if t.grad_fn is not None]
                if nodes:
                    alive = _Alive()
                    for node in nodes:
                        node.metadata[_ALIVE_KEY] = alive
                    keeper = weakref.ref(alive)
        self._units.append((first_node, keeper))

    def maybe_trim(self) -> None:
        """Trim once enough units piled up since the last trim."""
        if len(self._units) >= self._trim_at:
            self.trim()
            self._trim_at = 2 * len(self._units) + _TRIM_EVERY

    def trim(self) -> None:
        """Fold the boundaries of every unit whose output nodes are gone into one boundary owned by no module."""
        units = self._units
        dead: list[tuple[int, float]] = []  # [first node, first node of the next unit)
        live: list[tuple[int, weakref.ref[_Alive] | None]] = []
        for i, (first, keeper) in enumerate(units):
            if keeper is None or keeper() is None:
                dead.append((first, units[i + 1][0] if i + 1 < len(units) else float("inf")))
            else:
                live.append((first, keeper))
        if not dead:
            return
        bounds, owners = self._table
        new_bounds: list[int] = []
        new_owners: list[ModuleCall | None] = []
        d = 0
        for seq, call in zip(bounds, owners, strict=True):
            while d < len(dead) and seq >= dead[d][1]:
                d += 1
            if d < len(dead) and seq >= dead[d][0]:  # inside a dead unit: one "no module" boundary at its start
                if not new_owners or new_owners[-1] is not None:
                    new_bounds.append(seq)
                    new_owners.append(None)
                continue
            new_bounds.append(seq)
            new_owners.append(call)
        self._table = (new_bounds, new_owners)
        self._units = live


class _ThreadState:
    """The forward calls open on one thread and the owners of the nodes it made."""

    __slots__ = ("owners", "stack")

    def __init__(self) -> None:
        self.stack: list[tuple[ModuleCall, str, int]] = []  # (call, phase, first node number)
        self.owners = NodeOwners()


class _Copied:
    """The hook set of a `_TrackedModule` in a copy of the model (`torch.save(model)`, `pickle`,
    `copy.deepcopy`) made while its hooks are kept between windows: the hooks hold weak references and
    the window's books, which cannot and must not be copied, so the copy's hooks are no window's and
    take themselves out of the copy's module at its first call (`_TrackedModule.drop_copied`)."""

    tracker = None


_COPIED: Any = _Copied()


def _copied_tracked(fqn: str, info: ModuleInfo) -> _TrackedModule:
    tracked = _TrackedModule.__new__(_TrackedModule)
    tracked.hooks, tracked.compiled_calls, tracked.fqn, tracked.info = _COPIED, 0, fqn, info
    return tracked


class _TrackedModule:
    """Hooks for one module; they report to the hook set's tracker while a window uses it.

    Inside a compiled graph (`torch.compile`, `nn.Module.compile()`) dynamo traces the hooks:
    there they do nothing (anything more would break the graph, or fail it under
    `fullgraph=True`), and the call of the module that was compiled is noted eagerly around
    its graph instead (`_compiled_call`; for `torch.compile(model)`, by hooks on the wrapper:
    `_WrapperHooks`, the wrapper given to the window or found from the model).
    """

    __slots__ = ("compiled_calls", "fqn", "hooks", "info")

    def __init__(self, hooks: _ModuleHooks, fqn: str, module: nn.Module) -> None:
        self.hooks = hooks
        self.compiled_calls = 0  # > 0 while its compiled call, noted around the graph, runs
        self.fqn = fqn or schema.ROOT_MODULE_FQN
        self.info = ModuleInfo(
            self.fqn, fqn or type(module).__name__, type(module).__qualname__, parameter_infos(module)
        )

    def __reduce__(self) -> tuple[Callable[..., _TrackedModule], tuple[str, ModuleInfo]]:
        return _copied_tracked, (self.fqn, self.info)  # a copy's hooks remove themselves (`_Copied`)

    def __deepcopy__(self, memo: dict[int, Any]) -> _TrackedModule:
        return _copied_tracked(self.fqn, self.info)

    def drop_copied(self, module: nn.Module) -> None:
        """Take this copy's hooks (and those of a `_WrapperHooks` over it) out of `module` (`_Copied`):
        torch runs a snapshot of the hook dicts, so that is safe inside the call."""
        pre, post, always_called = (
            _hook_dicts(module) if _hook_dicts is not None else (module._forward_pre_hooks, module._forward_hooks, {})
        )
        for hooks in (pre, post):
            for key, hook in list(hooks.items()):
                owner = getattr(hook, "__self__", None)
                if owner is self or getattr(owner, "tracked", None) is self:
                    del hooks[key]
                    always_called.pop(key, None)

    def refresh(self, module: nn.Module) -> bool:
        """New parameter objects since the hooks were made (e.g. sharded later): describe them anew (True)."""
        parameters = parameter_infos(module)
        if parameters is self.info.parameters:
            return False
        self.info = ModuleInfo(self.info.fqn, self.info.span_name, self.info.module_type, parameters)
        return True

    def forward_pre(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():  # traced into a graph: first, so dynamo reads (and guards on) nothing of ours
            return
        tracker = self.hooks.tracker
        if tracker is None:  # hooks kept between windows: nothing records
            if self.hooks is _COPIED:
                self.drop_copied(module)
            return
        observer = tracker.observer
        if observer is None or not observer.accepting or self.compiled_calls:
            return  # (compiled_calls: its compiled call was noted already, and dynamo ran the hooks eagerly)
        # A forward inside backward is activation checkpointing's recomputation (record/phase.py).
        phase = phase_of.FORWARD_CALL[_graph_task_id() != -1]
        try:
            tracker.enter_call(self.info, phase)
        except Exception as exc:
            observer.on_fault("module_forward_pre", exc)
        observer.on_module_enter(self.info, phase)

    def forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        tracker = self.hooks.tracker
        if tracker is None:
            if self.hooks is _COPIED:
                self.drop_copied(module)
            return
        observer = tracker.observer
        if observer is None or not observer.accepting or self.compiled_calls:
            return
        error = sys.exc_info()[1]  # set when forward raised (always_call hooks run in its except block)
        if isinstance(error, _STOP_RECOMPUTATION):  # checkpointing ends a recompute early on purpose
            error = None
        try:
            entry = tracker.exit_call(self.info, output)
        except Exception as exc:
            observer.on_fault("module_forward_post", exc)
            entry = None
        if entry is None:  # the pre-hook could not note the call: close its span all the same
            observer.on_module_exit(self.fqn, phase_of.FORWARD_CALL[_graph_task_id() != -1], error)
            return
        call, phase, first_node = entry
        observer.on_module_exit(self.fqn, phase, error)
        if error is not None:
            return
        try:
            if tracker.backward_spans and torch.is_grad_enabled():
                # Outputs made by this call's own nodes: their gradient starts its backward
                # (a module that returns its input unchanged has no backward work of its own).
                with _compat.DisableTorchFunction():  # our reads: no user ops, no op hook or mode to pay
                    outputs = []
                    for t in _grad_tensors(output):
                        node = t.grad_fn  # read once: each read of a C++ node makes its Python object
                        if node is not None and first_node <= _sequence_nr(node) != _NO_SEQUENCE_NR:
                            outputs.append((t, node))
                    if outputs:
                        tracker.add_grad_hook(outputs, functools.partial(tracker.backward_start, call))
        except Exception as exc:
            observer.on_fault("module_forward_post", exc)


def _compiled_call(tracked: _TrackedModule, module: nn.Module, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """What stands in for a module's `nn.Module.compile()`d call: the module's own hooks run inside
    the graph (and do nothing there), so its call is noted here, eagerly, around the graph.

    The graph's collectives then count for this module and the calls enclosing it (none for
    its submodules: their hooks are in the graph too); the graph's autograd node is made
    inside the call, so its backward collectives count for the module as well.
    """

    def compiled_call(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # an enclosing compiled region inlines this call
            return compiled(*args, **kwargs)
        tracker = tracked.hooks.tracker
        if tracker is None or tracker.observer is None or not tracker.observer.accepting:
            return compiled(*args, **kwargs)
        tracked.forward_pre(module, args)
        tracked.compiled_calls += 1
        try:
            output = compiled(*args, **kwargs)
        except BaseException:
            tracked.compiled_calls -= 1
            tracked.forward_post(module, args, None)  # sees the error, as an always_call hook does
            raise
        tracked.compiled_calls -= 1
        tracked.forward_post(module, args, output)
        return output

    compiled_call.__hp_otel_compiled__ = compiled  # type: ignore[attr-defined]
    return compiled_call


class _WrapperHooks:
    """Hooks on a `torch.compile(module)` wrapper that note the module's call around the compiled region.

    The wrapper's own hooks run eagerly, before and after the region, for every class of module
    (`compile_wrappers`); the module's hooks may run inside it (a torch class's whole call is
    compiled), where they do nothing.  `compiled_calls` keeps the module's own hooks from noting
    the call again where dynamo runs them eagerly (a user class: only its `forward` is compiled).
    """

    __slots__ = ("tracked",)

    def __init__(self, tracked: _TrackedModule) -> None:
        self.tracked = tracked

    def register(self, wrapper: nn.Module) -> list[RemovableHandle]:
        return [
            wrapper.register_forward_pre_hook(self.pre, prepend=True),
            wrapper.register_forward_hook(self.post, always_call=True),
        ]

    def pre(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            return
        self.tracked.forward_pre(module, args)
        self.tracked.compiled_calls += 1

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        self.tracked.compiled_calls = max(0, self.tracked.compiled_calls - 1)
        self.tracked.forward_post(module, args, output)


_hidden: list[bool] = []


def _hide_hooks_from_dynamo() -> None:
    """Our hooks run eagerly even when torch code that dynamo skips calls them while a compiled call
    is starting (`torch.compile(model)` runs the model's own hooks so): dynamo would compile them as
    frames of their own, to nothing.  Inlined into a graph they still do nothing (`_is_compiling`)."""
    if _hidden or "torch._dynamo" not in sys.modules:  # no dynamo yet: nothing compiles
        return
    _hidden.append(True)
    for hook in (_TrackedModule.forward_pre, _TrackedModule.forward_post, _WrapperHooks.pre, _WrapperHooks.post):
        _compat.hide_from_dynamo(hook)


def _scripted(modules: list[tuple[str, nn.Module]]) -> list[str]:
    """The fqns of `torch.jit.script`ed modules: they take no Python hooks (torch raises
    "register_forward_pre_hook is not supported on ScriptModules"), so they and the modules
    inside them get none, and their collectives count for the nearest enclosing module we hook.
    Said once per process and module type, as one log line (not a traceback)."""
    scripted = [(fqn, m) for fqn, m in modules if isinstance(m, torch.jit.ScriptModule)]
    outermost = [(fqn, m) for fqn, m in scripted if not _within(fqn, [f for f, _ in scripted if f != fqn])]
    for fqn, module in outermost:
        kind = getattr(module, "original_name", "") or type(module).__qualname__
        said_once.log_once(
            __name__,
            ("scripted", kind),
            "hp_otel: module %s (%s) is a torch.jit.script module, which takes no module hooks: "
            "its collectives count for the module that calls it",
            fqn or schema.ROOT_MODULE_FQN,
            kind,
        )
    return [fqn for fqn, _ in outermost]


def _is_container(module: nn.Module) -> bool:
    """A module with no forward of its own (`ModuleList`, `ModuleDict`): never called, only its children are."""
    return type(module).forward is nn.Module.forward


def hooked_within(modules: list[tuple[str, nn.Module]], depth: int | None) -> list[tuple[str, nn.Module]]:
    """The modules (of `named_modules()`, parents first) to hook for `depth` (`module_depth.hooked_within`)."""
    return module_depth.hooked_within(modules, depth, _is_container)


def folded_compile_wrappers(modules: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """`named_modules()` with each `torch.compile(module)` wrapper in the tree (`model.layers[i] =
    torch.compile(block)`) folded into the module it wraps, under the wrapper's name: one module
    `layers.i`, not also `layers.i._orig_mod` (the same call, counted twice).  The wrapper's hooks
    note the module's call (`_outermost_wrapped`)."""
    wrappers = {fqn for fqn, module in modules if _compat.compiled_module_original(module) is not None}
    if not wrappers:
        return modules
    folded = []
    for fqn, module in modules:
        if fqn in wrappers:
            continue
        path, kept = "", []
        for part in fqn.split("."):
            if part != "_orig_mod" or path not in wrappers:
                kept.append(part)
            path = f"{path}.{part}" if path else part
        folded.append((".".join(kept), module))
    return folded


def _calls_inside_regions(
    every: list[tuple[str, nn.Module]],
    hooked: list[tuple[str, nn.Module]],
    info_of: dict[str, ModuleInfo],
    regions: list[str],
    owners: dict[int, ModuleInfo],
) -> dict[int, tuple[ModuleInfo, ...]]:
    """For each parameter of a module inside a compiled region (whose hooks run in the graph): the
    modules a call of its own would sit in below the region's root, down to its module (its hooked
    ancestor; containers are never called), so its gradient's collectives (DDP's bucket all_reduce
    in its AccumulateGrad) count for its module as in eager mode (`TorchModuleTracker.running_chain`)."""
    if not regions:
        return {}
    names = set(info_of)
    called = {fqn for fqn, module in hooked if not _is_container(module)}
    inside: dict[int, tuple[ModuleInfo, ...]] = {}
    paths: dict[str, tuple[ModuleInfo, ...]] = {}
    for fqn, module in every:
        own = _ancestor_within(fqn, names)
        region = _region_root(own, regions)
        if own == region:
            continue
        path = paths.get(own)
        if path is None:
            parts = own.split(".")
            prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
            below = [p for p in prefixes if (not region or p.startswith(f"{region}.")) and p in called]
            path = paths[own] = tuple(info_of[p] for p in below)
        if path:
            for param in _compat.own_parameters(module):
                if param is not None and owners.get(id(param)) is info_of[region]:
                    inside.setdefault(id(param), path)
    return inside


def _ancestor_within(fqn: str, hooked: set[str]) -> str:
    """The nearest of `hooked` that is `fqn` or encloses it (the root always is)."""
    while fqn and fqn not in hooked:
        fqn = fqn.rpartition(".")[0]
    return fqn


def _within(fqn: str, roots: list[str]) -> bool:
    """Whether `fqn` is one of `roots` or inside one of them ("" is the root: everything is inside)."""
    return any(not r or fqn == r or fqn.startswith(f"{r}.") for r in roots)


def _in_compiled_forward(fqn: str, inside: list[str]) -> bool:
    """Whether `fqn` is a submodule of a module whose class's forward dynamo compiled (`inside`: their
    fqns with a trailing "."; the root's is "."): its hooks would run in that graph."""
    return bool(fqn) and any(prefix == "." or fqn.startswith(prefix) for prefix in inside)


def _region_root(fqn: str, regions: list[str]) -> str:
    """The outermost of `regions` (modules whose call is noted around a compiled region) that `fqn` is
    strictly inside, else `fqn` itself."""
    outer = fqn
    for region in regions:
        if region != fqn and (not region or fqn.startswith(f"{region}.")) and len(region) < len(outer):
            outer = region
    return outer


def _outermost_wrapped(
    plain: list[tuple[str, nn.Module]], compiled: list[str], inside: list[str]
) -> list[tuple[str, list[nn.Module]]]:
    """(fqn, its `torch.compile(module)` wrappers) of each module of `plain` that has one and is not inside
    another compiled region (whose graph holds its call)."""
    found = compile_wrappers.wrappers_of(module for _fqn, module in plain)
    if not found:
        return []
    wrapped = [(fqn, found[id(module)]) for fqn, module in plain if id(module) in found]
    regions = compiled + [fqn for fqn, _wrappers in wrapped]
    return [
        (fqn, wrappers)
        for fqn, wrappers in wrapped
        if _region_root(fqn, regions) == fqn and not _in_compiled_forward(fqn, inside)
    ]


# Module and parameter registrations anywhere in the process (`setattr`, `add_module`,
# `register_module`, `register_parameter`), counted by torch's global registration hooks once a
# tree has been noted (`_watch_registrations`): a tree noted since none ran is unchanged by them.
_registrations = [0]
_watching: list[Any] = []  # the hooks' handles, once registered
# Modules whose state a window compares at most (`_SeenTree.unchanged`), in turn: the rest of a
# larger tree is compared by the next windows.
VERIFY_SLICE = 1024


def _count_registration(*_args: Any) -> None:
    _registrations[0] += 1  # (returns None: a registration hook's result would replace what is registered)


def _watch_registrations() -> bool:
    """Count registrations from now on (False where this torch has no global registration hooks)."""
    if not _watching:
        from torch.nn.modules import module as torch_module

        try:
            _watching.append(torch_module.register_module_module_registration_hook(_count_registration))
            _watching.append(torch_module.register_module_parameter_registration_hook(_count_registration))
        except AttributeError:
            _watching.append(None)
    return _watching[0] is not None


class _SeenTree:
    """The tree a hook set was made for, weakly: a window opening on the same tree takes the hooks as
    they are (kept between windows) or registers them again (taken out when the last window closed),
    without walking it (`named_modules()` and describing every module were the largest cost of opening
    a window).

    What a window pays does not grow with the tree: a module or parameter registered anywhere in the
    process (torch's global registration hooks: `setattr`, `add_module`, `register_parameter`, what
    `Sequential`/`ModuleList.append`/`ModuleDict` and `parallelize_module` use) makes the next window
    walk the tree; what bypasses them (a write into `_modules` or `_parameters` itself: `del
    model.layer`, `ModuleList.insert`, `ModuleDict.pop`, FSDP's parameter swaps) is found by comparing
    the tree's state `VERIFY_SLICE` modules a window, in turn: at once for a tree of up to 1,024
    modules, within `len(tree) / 1024` windows for a larger one (docs/how-it-works/costs.md).

    "The same" is checked on everything the hooks are made from (`_compat.tree_state`): each module's
    type, children (names and ids: `ModuleList.insert`, `Sequential` and `setattr` all write the
    `_modules` dict, which is read, so no registration hook is relied on), own parameters and compiled
    call, the modules themselves alive (so no id is reused), whether dynamo compiled each module
    type's `forward`, and the `torch.compile(model)` wrappers alive (`compile_wrappers.generation`).
    Anything else, or a `torch.jit.script` module in the tree:
    the tree is walked as before.
    """

    __slots__ = ("compiled", "cursor", "forwards", "in_graph", "modules", "registrations", "root", "state", "wrappers")

    def __init__(
        self,
        root: weakref.ref[nn.Module],
        in_graph: bool,
        modules: list[weakref.ref[nn.Module]],
        compiled: list[weakref.ref[Any]],
        forwards: list[tuple[type, Any, bool]],
        state: list[Any],
    ) -> None:
        self.root = root
        self.in_graph = in_graph
        self.modules = modules
        self.compiled = compiled  # alive while the modules hold them: their ids in `state` are theirs
        self.forwards = forwards  # (module type, its forward, whether dynamo compiled it as a frame)
        self.state = state
        self.wrappers = compile_wrappers.generation()  # the `torch.compile(module)` wrappers alive (changes: walk)
        # registrations counted when noted (None: not counted, the whole state is compared each window)
        self.registrations = _registrations[0] if _watch_registrations() else None
        self.cursor = 0  # where the next window's slice of `state` starts

    @classmethod
    def of(cls, root: nn.Module, in_graph: bool, modules: list[tuple[str, nn.Module]]) -> _SeenTree | None:
        """What the hooks were just made from; None where it cannot be told cheaply (a walk each window)."""
        if any(isinstance(module, torch.jit.ScriptModule) for _fqn, module in modules):
            return None
        try:
            refs = [weakref.ref(module) for _fqn, module in modules]
            compiled = [weakref.ref(c) for _fqn, m in modules if (c := _compat.compiled_call(m)) is not None]
        except TypeError:  # not weakly referable
            return None
        state = _compat.tree_state(refs)
        if state is None:
            return None
        kinds = dict.fromkeys(type(module) for _fqn, module in modules)
        forwards = [(kind, kind.forward, _compat.top_frame_compiled(kind.forward)) for kind in kinds]
        return cls(weakref.ref(root), in_graph, refs, compiled, forwards, state)

    def unchanged(self, root: nn.Module, in_graph: bool) -> bool:
        if self.root() is not root or self.in_graph is not in_graph:
            return False
        if compile_wrappers.generation() != self.wrappers:
            return False
        for ref in self.compiled:
            if ref() is None:
                return False
        for kind, forward, compiled in self.forwards:
            if kind.forward is not forward or _compat.top_frame_compiled(forward) is not compiled:
                return False
        if self.registrations is None or len(self.modules) <= VERIFY_SLICE:
            return _compat.tree_state(self.modules) == self.state
        if _registrations[0] != self.registrations:
            return False
        return self._slice_unchanged()

    def _slice_unchanged(self) -> bool:
        """The next `VERIFY_SLICE` modules' state as noted (wrapping around the tree)."""
        start, total = self.cursor, len(self.modules)
        end = start + VERIFY_SLICE
        self.cursor = end % total
        ranges = [(start, min(end, total))] + ([(0, end - total)] if end > total else [])
        return all(_compat.tree_state(self.modules[a:b]) == self.state[a:b] for a, b in ranges)


class _ModuleHooks:
    """Forward hooks on every module of one tree, reporting to `tracker` while a window uses them.

    One set per root is kept (`_hook_sets`): with hooks kept between windows
    (`hp_otel.install()`) the next window takes it over instead of hooking every module
    again; a window nested on the same tree gets a set of its own. Without kept hooks a
    closing window takes its hooks out but the set keeps what it described (each module's
    `_TrackedModule`, the parameter owners): the next window on the same unchanged tree
    (`_SeenTree`) only registers the hooks again, without walking and describing the tree.
    """

    def __init__(self) -> None:
        self.tracker: TorchModuleTracker | None = None
        self.param_owner: dict[int, ModuleInfo] = {}  # id(parameter) -> the module that owns it
        # id(parameter) -> the modules from below its compiled region's root down to its own (attribution)
        self.param_inside: dict[int, tuple[ModuleInfo, ...]] = {}
        self.module_info: dict[int, ModuleInfo] = {}  # id(module) -> its description
        self._tracked: list[_TrackedModule] = []
        self._structure: list[tuple[str, int]] = []
        self._handles: list[RemovableHandle] = []
        self._written: list[tuple[weakref.ref[nn.Module], int]] = []  # (module, pre-hook id; post-hook: id + 1)
        self._hooked = False  # the hooks of `_registered` are in (False: described, taken out by `remove()`)
        self._registered: list[tuple[weakref.ref[nn.Module], _TrackedModule]] = []  # what gets forward hooks
        # the `torch.compile(module)` wrappers found for modules of the tree, whose hooks note those modules' calls
        self._registered_wrappers: list[tuple[weakref.ref[nn.Module], _TrackedModule]] = []
        # (module, our stand-in for its call), weakly: a kept hook set (`hp_otel.install()`) must not keep
        # a compiled model alive (the stand-in holds the module's compiled call, and that the module)
        self._compiled: list[tuple[weakref.ref[nn.Module], weakref.ref[Callable[..., Any]]]] = []
        self._wrapper: weakref.ref[nn.Module] | None = None  # the `torch.compile(root)` wrapper hooked too (weakly)
        self._wrapper_handles: list[RemovableHandle] = []
        self._seen: _SeenTree | None = None  # the tree the hooks were made for (None: walk it at the next window)
        self.fsdp1 = False  # the tree holds an FSDP1 unit (its collectives need `fsdp1_patches`)
        self.depth: int | None = None  # the module depth hooked (`hooked_within`; None: all)

    def attach(self, root: nn.Module, wrapper: nn.Module | None = None, depth: int | None = None) -> None:
        """Hook the tree's modules down to `depth` (None: all), unless the hooks in place still match
        it (and `wrapper`, the `torch.compile(root)` the window was given, with hooks noting root's call)."""
        if depth != self.depth:
            self._detach()  # a window of another depth: hooked anew
            self.depth = depth
        self._attach_tree(root, in_graph=wrapper is not None)
        if wrapper is not (self._wrapper() if self._wrapper is not None else None):
            self._unhook_wrapper()
            if wrapper is not None and self._tracked:
                self._hook_wrapper(wrapper, self._tracked[0])

    def _hook_wrapper(self, wrapper: nn.Module, tracked: _TrackedModule) -> None:
        self._wrapper = weakref.ref(wrapper)
        self._wrapper_handles.extend(_WrapperHooks(tracked).register(wrapper))

    def _unhook_wrapper(self) -> None:
        handles, self._wrapper_handles, self._wrapper = self._wrapper_handles, [], None
        for handle in handles:
            handle.remove()

    def _attach_tree(self, root: nn.Module, in_graph: bool) -> None:
        """Hook the tree's modules (`_hook_tree`), unless it is the tree the hooks were made for (`_SeenTree`)."""
        _hide_hooks_from_dynamo()
        seen = self._seen
        if seen is not None and self._tracked and seen.unchanged(root, in_graph):
            if self._hooked or self._register_again():  # (not hooked: described by an earlier window)
                return
        if not self._hooked:  # described for a tree that has changed since: described anew
            self._detach()
        self._seen = None
        modules = self._hook_tree(root, in_graph)
        self._hooked = True
        self._seen = _SeenTree.of(root, in_graph, modules)  # the next window may take them as they are

    def _register_again(self) -> bool:
        """The hooks an earlier window made on this unchanged tree, registered again; False (nothing
        registered) if a module it described is gone."""
        registered = [(ref(), tracked, ref) for ref, tracked in self._registered]
        wrappers = [(ref(), tracked) for ref, tracked in self._registered_wrappers]
        if any(entry[0] is None for entry in registered) or any(wrapper is None for wrapper, _tracked in wrappers):
            return False
        for module, tracked, ref in registered:
            self._register(module, tracked, ref)  # type: ignore[arg-type]
        for wrapper, tracked in wrappers:
            self._handles.extend(_WrapperHooks(tracked).register(wrapper))  # type: ignore[arg-type]
        # (no compiled stand-ins to remake: a tree with compiled calls is never "unchanged" once they are
        # taken out, since `_SeenTree` noted the stand-ins, which die with the window; it is walked again)
        self._hooked = True
        return True

    def _register(self, module: nn.Module, tracked: _TrackedModule, ref: weakref.ref[nn.Module]) -> None:
        """The pre-hook first and the post-hook last (`always_call`), as `register_forward_pre_hook(prepend=True)`
        and `register_forward_hook(always_call=True)` put them: written into the module's hook dicts under ids
        taken from torch's own counter, without the RemovableHandle and weak references each registration makes
        (this runs for every module at every window); through the public API for a class that overrides it."""
        cls = type(module)
        if (
            _hook_dicts is None
            or cls.register_forward_pre_hook is not _REGISTER_PRE
            or cls.register_forward_hook is not _REGISTER_POST
        ):
            self._handles.append(module.register_forward_pre_hook(tracked.forward_pre, prepend=True))
            self._handles.append(module.register_forward_hook(tracked.forward_post, always_call=True))
            return
        pre, post, always_called = _hook_dicts(module)
        key = RemovableHandle.next_id
        RemovableHandle.next_id = key + 2
        pre[key] = tracked.forward_pre
        pre.move_to_end(key, last=False)
        post[key + 1] = tracked.forward_post
        always_called[key + 1] = True
        self._written.append((ref, key))

    def _hook_tree(self, root: nn.Module, in_graph: bool) -> list[tuple[str, nn.Module]]:
        """Hook the modules whose hooks run eagerly; those of compiled modules and of modules inside them
        would run in the graph (doing nothing there), so they get none: dynamo guards on an
        `always_call` hook's id, and a window's new hooks would then recompile the graph each window."""
        every = folded_compile_wrappers(list(root.named_modules()))
        modules = hooked_within(every, self.depth)
        scripted = _scripted(modules)
        plain = [(fqn, module) for fqn, module in modules if not _within(fqn, scripted)]
        compiled = [fqn for fqn, module in plain if _compat.compiled_call(module) is not None]
        # `torch.compile(model)` of a user class compiles model.forward: the model's own hooks run eagerly,
        # its submodules' in the graph (a class-wide sign, kept for a forward compiled without a wrapper)
        inside = [f"{fqn}." for fqn, module in plain if _compat.top_frame_compiled(type(module).forward)]
        # `torch.compile(model)`, for any class: the wrapper's hooks note the model's call; the model's run in the graph
        wrapped = [] if in_graph else _outermost_wrapped(plain, compiled, inside)
        wrapped_fqns = [fqn for fqn, _wrappers in wrapped]
        structure = [(fqn, id(module)) for fqn, module in every] + [(fqn, 0) for fqn in compiled + inside]
        if wrapped:  # (the generation: a wrapper made since, even one reusing a dead one's id)
            structure += [(f"{fqn} wrapper", id(w)) for fqn, ws in wrapped for w in ws]
            structure.append((" wrappers", compile_wrappers.generation()))
        if len(modules) < len(every):  # the parameters of the modules left unhooked, whose owner is their ancestor
            hooked = {id(module) for _fqn, module in modules}
            structure += [
                (fqn, id(param))
                for fqn, module in every
                if id(module) not in hooked
                for param in _compat.own_parameters(module)
            ]
        if in_graph:
            structure.append(("", -1))
        if self._tracked and structure == self._structure:
            changed = False
            for tracked, (_fqn, module) in zip(self._tracked, modules, strict=True):
                changed |= tracked.refresh(module)
            self._wrap_compiled(modules)  # a module may have been compiled since
            if not changed:  # the common case: same modules, same parameters
                return every
        else:
            self._detach()
            self._structure = structure
            self.fsdp1 = any(_compat.is_fsdp1_module(module) for _fqn, module in modules)
            for fqn, module in modules:
                tracked = _TrackedModule(self, fqn, module)
                self._tracked.append(tracked)
                if in_graph or _within(fqn, scripted) or _within(fqn, compiled) or _within(fqn, wrapped_fqns):
                    continue
                if _in_compiled_forward(fqn, inside):
                    continue
                ref = weakref.ref(module)
                self._register(module, tracked, ref)
                self._registered.append((ref, tracked))
            tracked_at = {fqn: tracked for tracked, (fqn, _module) in zip(self._tracked, modules, strict=True)}
            for fqn, wrappers in wrapped:
                for wrapper in wrappers:
                    self._handles.extend(_WrapperHooks(tracked_at[fqn]).register(wrapper))
                    self._registered_wrappers.append((weakref.ref(wrapper), tracked_at[fqn]))
            self._wrap_compiled(modules)
        self.param_owner = {}
        # A module deeper than the hooks is described as its hooked ancestor, one inside a compiled region as
        # the module whose call is noted around the region: its parameters' gradients (DDP's bucket all_reduce)
        # and its FSDP group's collectives count there, as its forward does.
        info_of = {fqn: tracked.info for tracked, (fqn, _module) in zip(self._tracked, modules, strict=True)}
        names = set(info_of)
        regions = compiled + wrapped_fqns + [prefix[:-1] for prefix in inside] + ([""] if in_graph else [])
        described = [(info_of[_region_root(_ancestor_within(fqn, names), regions)], module) for fqn, module in every]
        self.module_info = {id(module): info for info, module in described}
        for info, module in described:
            for param in _compat.own_parameters(module):
                if param is not None:
                    self.param_owner.setdefault(id(param), info)
        self.param_inside = _calls_inside_regions(every, modules, info_of, regions, self.param_owner)
        return every

    def _wrap_compiled(self, modules: list[tuple[str, nn.Module]]) -> None:
        """Note the calls of modules compiled with `nn.Module.compile()` around their graphs (`_compiled_call`)."""
        self._compiled = [(m, c) for m, c in self._compiled if m() is not None and c() is not None]  # gone: forget
        ours = {id(m()): c() for m, c in self._compiled}
        for tracked, (_fqn, module) in zip(self._tracked, modules, strict=True):
            if isinstance(module, torch.jit.ScriptModule):
                continue
            compiled = _compat.compiled_call(module)
            if compiled is None or compiled is ours.get(id(module)):
                continue
            call = _compiled_call(tracked, module, compiled)
            _compat.set_compiled_call(module, call)
            self._compiled.append((weakref.ref(module), weakref.ref(call)))

    def _unwrap_compiled(self) -> None:
        """Give each compiled module its own compiled call back (unless it was compiled anew since)."""
        compiled, self._compiled = self._compiled, []
        for module_ref, call_ref in reversed(compiled):
            module, call = module_ref(), call_ref()
            if module is not None and call is not None and _compat.compiled_call(module) is call:
                _compat.set_compiled_call(module, call.__hp_otel_compiled__)  # type: ignore[attr-defined]

    def remove(self) -> None:
        """Take every hook out (a window still using them removes them when it closes); what they
        describe stays, for the next window on this tree (`_register_again`)."""
        if self.tracker is None:
            if self._seen is None:  # nothing tells the next window the tree is unchanged: forget all
                self._detach()
            else:
                self._take_out()

    def _detach(self) -> None:
        self._tracked, self._structure, self._seen = [], [], None
        self._registered, self._registered_wrappers = [], []
        self._take_out()

    def _take_out(self) -> None:
        """Every hook and stand-in of ours out of the tree, exactly as it was."""
        handles, self._handles = self._handles, []
        written, self._written = self._written, []
        self._hooked = False
        try:
            self._unhook_wrapper()
            self._unwrap_compiled()
        finally:
            for handle in handles:
                handle.remove()
            for ref, key in written:
                module = ref()
                if module is not None:
                    pre, post, always_called = _hook_dicts(module)  # type: ignore[misc]
                    pre.pop(key, None)
                    post.pop(key + 1, None)
                    always_called.pop(key + 1, None)


# The hook sets kept for each root module, one per module depth hooked (weakly: a model that goes
# away takes its entry along). A set per depth: the always-on instrumentor's sampled steps hook every
# module and its counts-only steps only as deep as the metrics label, and each takes its own set over
# (the other's hooks pass calls through meanwhile) instead of hooking the tree anew each step.
_hook_sets: weakref.WeakKeyDictionary[nn.Module, dict[int | None, _ModuleHooks]] = weakref.WeakKeyDictionary()


class BackwardEndCallback:
    """Asks autograd, once per backward pass, to call `on_end()` when the pass ends.

    Used by the module tracker here and by the torch drop-in's (`hp_otel.torch`): the
    backward spans still open close then.
    """

    def __init__(self, on_end: Callable[[], None]) -> None:
        self._on_end = on_end
        self._queued = False

    def queue(self) -> None:
        """Call `on_end()` when the running backward pass ends (once, however often asked)."""
        if self._queued:
            return
        self._queued = True
        _compat.queue_backward_callback(self._run)

    def reset(self) -> None:
        """Forget a pass that never ended for us (a new window starts)."""
        self._queued = False

    def _run(self) -> None:
        self._queued = False
        self._on_end()


class TorchModuleTracker:
    """Source of module enter/exit events for one `nn.Module` tree, and of the module
    calls owning backward work (`running_chain`)."""

    def __init__(self, root: nn.Module) -> None:
        # A `torch.compile(model)` wrapper: the model is tracked, under its own names, and its call
        # is noted by hooks on the wrapper (the model's own hooks run inside the graph).
        original = _compat.compiled_module_original(root)
        self.root = original if original is not None else root
        self._wrapper = root if original is not None else None
        self.observer: Observer | None = None
        self.backward_spans = True  # grad hooks open backward spans; counting needs none
        self._hooks: _ModuleHooks | None = None
        self._fsdp1 = False  # fsdp1_patches held by this window
        # Grad hooks live on module outputs made in the step (never leaves): a single output's hook
        # goes away with the autograd graph; a multi-output call's `register_multi_grad_hook`
        # handles are removed when the backward pass ends and on detach, so they never pile up.
        self._grad_handles: list[RemovableHandle] = []
        # id(tensor) -> (weak ref, callbacks): tensors compare elementwise, so no WeakKeyDictionary
        self._tensor_callbacks: dict[int, tuple[weakref.ref[torch.Tensor], list[Any]]] = {}
        self._backward_end = BackwardEndCallback(self._at_backward_end)
        self._local = threading.local()
        self._owners_by_thread: dict[int, NodeOwners] = {}
        self._latest_owners: NodeOwners | None = None
        self._param_owner: dict[int, ModuleInfo] = {}
        self._param_inside: dict[int, tuple[ModuleInfo, ...]] = {}
        self._inside_chains: dict[tuple[ModuleInfo, ...], tuple[ModuleCall, tuple[ModuleCall, ...]]] = {}
        self._module_info: dict[int, ModuleInfo] = {}
        self._latest_call: dict[ModuleInfo, ModuleCall] = {}
        self._stand_ins_searched = False  # this window looked for stand-in parameters (`_stand_in_owner`)

    def attach(self, observer: Observer) -> None:
        self.observer = observer
        self.backward_spans = observer.spans_enabled
        self._backward_end.reset()
        self._stand_ins_searched = False
        self._local = threading.local()
        self._owners_by_thread = {}
        self._latest_owners = None
        self._latest_call = {}
        depth = observer.module_depth  # as deep as the window hooks (`CommDebugMode(module_depth=)`)
        sets = _hook_sets.get(self.root)
        if sets is None:
            sets = _hook_sets.setdefault(self.root, {})
        hooks = sets.get(depth)
        if hooks is None or hooks.tracker is not None:  # none yet, or a window outside this one uses them
            hooks = _ModuleHooks()
            sets.setdefault(depth, hooks)
        installation.claim(hooks)
        hooks.tracker = self
        self._hooks = hooks
        try:
            hooks.attach(self.root, self._wrapper, depth)
        finally:
            self._param_owner = hooks.param_owner
            self._param_inside = hooks.param_inside
            self._inside_chains = {}
            self._module_info = hooks.module_info
        if hooks.fsdp1:  # FSDP1's collectives name the unit they move (fsdp.py)
            fsdp1_patches.acquire()
            self._fsdp1 = True
        observer.set_node_attribution(self.running_chain)
        set_param_attribution = getattr(observer, "set_param_attribution", None)  # optional for observers
        if callable(set_param_attribution):
            set_param_attribution(self.param_group_chain)
        fsdp.add_namer(self.module_name)  # FSDP's collectives name the group's modules by their path here

    def detach(self) -> None:
        fsdp.remove_namer(self.module_name)
        observer, self.observer = self.observer, None
        if observer is not None:
            observer.set_node_attribution(None)
            set_param_attribution = getattr(observer, "set_param_attribution", None)
            if callable(set_param_attribution):
                set_param_attribution(None)
        if self._fsdp1:
            self._fsdp1 = False
            fsdp1_patches.release()
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.tracker = None
            if installation.keeping() and _hook_sets.get(self.root, {}).get(hooks.depth) is hooks:
                installation.linger(hooks, hooks.remove)  # the next window on this model takes them over
            else:
                hooks.remove()
        self._remove_grad_hooks()
        self._owners_by_thread = {}
        self._latest_owners = None
        self._latest_call = {}

    # --- forward calls and the nodes they create --------------------------------
    def _thread_state(self) -> _ThreadState:
        state: _ThreadState | None = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState()
            self._owners_by_thread[threading.get_ident()] = state.owners
        return state

    def enter_call(self, info: ModuleInfo, phase: str) -> None:
        state = getattr(self._local, "state", None) or self._thread_state()  # (a call only the first time)
        stack = state.stack
        if stack:
            parent: ModuleCall | None = stack[-1][0]
        elif phase == schema.PHASE_RECOMPUTE:  # recomputed inside backward: under the call whose node asked for it
            chain = self.running_chain()
            parent = chain[-1] if chain else None
        else:
            parent = None
            state.owners.maybe_trim()  # between top-level calls (never inside backward): forget dead ones
        call = ModuleCall(info, parent)
        owners = state.owners
        # owners.mark(call), inline (a call saved on every module call)
        first_node = _next_sequence_nr()
        bounds, calls = owners._table
        if bounds and bounds[-1] == first_node:
            calls[-1] = call
        else:
            bounds.append(first_node)
            calls.append(call)
        stack.append((call, phase, first_node))
        self._latest_owners = owners
        self._latest_call[info] = call

    def exit_call(self, info: ModuleInfo, output: Any = None) -> tuple[ModuleCall, str, int] | None:
        state = getattr(self._local, "state", None) or self._thread_state()  # (a call only the first time)
        stack = state.stack
        if stack and stack[-1][0].module is info:  # the common case: the innermost call returns
            entry = stack.pop()
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0].module is info:
                    entry = stack.pop(i)
                    del stack[i:]  # calls that never exited (their forward raised past them)
                    break
            else:
                return None
        owners = state.owners
        if stack:  # owners.mark(the enclosing call), inline
            seq = _next_sequence_nr()
            bounds, calls = owners._table
            if bounds and bounds[-1] == seq:
                calls[-1] = stack[-1][0]
            else:
                bounds.append(seq)
                calls.append(stack[-1][0])
        else:  # a top-level call: its boundaries live as long as its output's nodes
            owners.mark(None)
            owners.close_unit(entry[2], output)
        return entry

    def running_chain(self) -> tuple[ModuleCall, ...] | None:
        """The module calls (outermost first) whose forward created the autograd node running now.

        () in backward outside any tracked module's nodes (the loss, a final callback);
        None outside backward.  A parameter's AccumulateGrad node (and the hooks run in it)
        belongs to the latest call of the module owning the parameter.
        """
        node = _current_node()
        if node is None:
            return () if _graph_task_id() != -1 else None
        sequence_nr = _sequence_nr(node)
        if sequence_nr == _NO_SEQUENCE_NR:
            variable = getattr(node, "variable", None)
            key = id(variable)
            info = self._param_owner.get(key)
            if info is None and isinstance(variable, nn.Parameter):
                info = self._stand_in_owner(key)
            call = self._latest_call.get(info) if info is not None else None
            if call is None:
                return ()
            path = self._param_inside.get(key)
            return self._chain_inside(call, path) if path else call.chain
        owners = self._owners_by_thread.get(threading.get_ident()) or self._latest_owners
        call = owners.owner(sequence_nr) if owners is not None else None
        return call.chain if call is not None else ()

    def _stand_in_owner(self, key: int) -> ModuleInfo | None:
        """The module owning the Parameter `id() == key` that no module registers, when it stands
        behind a tensor attribute of a module of the tree (`stand_in_parameters`: replicate's local
        Parameter behind a TP module's DTensor weight).  The tree is searched once a window, at the
        first such Parameter, and what it finds kept with the other owners (for the next windows)."""
        if self._stand_ins_searched:
            return None
        self._stand_ins_searched = True
        owners = self._param_owner
        for module in self.root.modules():
            info = self._module_info.get(id(module))
            if info is not None:
                for param in stand_in_parameters(module):
                    owners.setdefault(id(param), info)
        return owners.get(key)

    def _chain_inside(self, region: ModuleCall, path: tuple[ModuleInfo, ...]) -> tuple[ModuleCall, ...]:
        """The calls of `path` (modules inside a compiled region, whose hooks ran in the graph) under the
        region's call: one chain per region call and path, so the backward spans following it stay open."""
        cached = self._inside_chains.get(path)
        if cached is not None and cached[0] is region:
            return cached[1]
        call = region
        for info in path:
            call = ModuleCall(info, call)
        self._inside_chains[path] = (region, call.chain)
        return call.chain

    def param_group_chain(self) -> GroupCalls | None:
        """The calls (outermost first) of each module whose FSDP parameter group issues the collective
        running now: its latest call, with the calls enclosing it, and the group method's phase.
        None outside FSDP's group methods, or for a group with no module in this tree; a module not
        called yet has a call of its own outside backward (a forward prefetch runs before the
        module's first call: the recorder adds the open calls enclosing it, attribution.py), none
        in backward."""
        modules = param_group_modules()
        if not modules:
            return None
        chains = []
        for module in modules:
            info = self._module_info.get(id(module))
            if info is None:
                continue
            call = self._latest_call.get(info)
            if call is not None:
                chains.append(call.chain)
            elif _graph_task_id() == -1:
                chains.append((ModuleCall(info),))
        if not chains:
            return None
        return GroupCalls(tuple(chains), param_group_phase() or schema.PHASE_FORWARD)

    def module_name(self, module: nn.Module) -> str | None:
        """`module`'s name in this window's tree (its hooked ancestor's, deeper than the hooks), None if not in it."""
        info = self._module_info.get(id(module))
        return info.fqn if info is not None else None

    def backward_start(self, call: ModuleCall) -> None:
        """The gradient of the call's output arrived: its backward work starts."""
        observer = self.observer
        if observer is None or not observer.accepting:
            return
        observer.on_backward_modules(call.chain)
        try:
            self.close_at_backward_end()
        except Exception as exc:
            observer.on_fault("module_backward_start", exc)

    def add_grad_hook(self, outputs: list[tuple[torch.Tensor, Any]], callback: Any) -> None:
        """Run `callback()` once, when the first gradient of the `outputs` tensors arrives
        (each made by this call, given with its grad_fn; the caller holds DisableTorchFunction).

        Nested modules often share an output (the root's output is fc2's output).  One
        hook per tensor runs the callbacks in reverse order of registration — outer call
        first, innermost last — so the innermost call is the one whose backward runs on,
        whatever order autograd keeps for same-tensor hooks.
        """
        if len(outputs) != 1:
            tensors = [t for t, _ in outputs]
            self._grad_handles.append(
                register_multi_grad_hook(tensors, lambda grads: self._run_safely(callback), mode="any")
            )
            return
        tensor, node = outputs[0]
        entry = self._tensor_callbacks.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            entry[1].append(callback)
            return
        if len(self._tensor_callbacks) > 1024:  # forward-only steps leave entries behind
            self._tensor_callbacks = {k: v for k, v in self._tensor_callbacks.items() if v[0]() is not None}
        callbacks = [callback]
        self._tensor_callbacks[id(tensor)] = (weakref.ref(tensor), callbacks)

        def hook(grad: Any) -> None:
            for pending in reversed(callbacks):
                self._run_safely(pending)

        _add_tensor_hook(tensor, node, hook)  # it goes with the autograd graph: no handle to keep

    def _run_safely(self, callback: Any) -> None:
        """Run one of our grad-hook callbacks; a fault is counted, never raised into autograd."""
        try:
            callback()
        except Exception as exc:
            observer = self.observer
            if observer is not None:
                observer.on_fault("module_grad_hook", exc)

    def _remove_grad_hooks(self) -> None:
        self._tensor_callbacks = {}
        handles, self._grad_handles = self._grad_handles, []
        for handle in handles:
            handle.remove()

    def close_at_backward_end(self) -> None:
        """Ask autograd to tell us when this backward pass ends (once per pass)."""
        self._backward_end.queue()

    def _at_backward_end(self) -> None:
        observer = self.observer
        if observer is not None:
            observer.on_backward_end()
            try:
                self._remove_grad_hooks()
            except Exception as exc:
                observer.on_fault("module_grad_hook_cleanup", exc)
