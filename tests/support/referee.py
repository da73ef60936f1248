"""An independent referee for collective counts and their module attribution.

It shares nothing with hp_otel's counting: a TorchDispatchMode sees every collective op;
forward collectives count for the modules on a stack kept by its own forward hooks;
a backward collective counts for the modules recorded on the running autograd node
(`torch._C._current_autograd_node()`), which the referee tags by walking the autograd
graph — at a module's pre-hook the nodes reachable from its inputs that no one tagged
yet were made by the enclosing calls, at its post-hook those reachable from its
outputs were made by it.  hp_otel instead numbers nodes by sequence intervals.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

# The referee's own list of collective ops (namespace, op), independent of hp_otel's table.
COLLECTIVES = (
    {
        ("_c10d_functional", n)
        for n in (
            "all_reduce",
            "all_reduce_",
            "all_reduce_coalesced",
            "all_reduce_coalesced_",
            "all_gather_into_tensor",
            "all_gather_into_tensor_out",
            "all_gather_into_tensor_coalesced",
            "reduce_scatter_tensor",
            "reduce_scatter_tensor_out",
            "reduce_scatter_tensor_coalesced",
            "all_to_all_single",
            "broadcast",
            "broadcast_",
            "isend",
            "irecv",
            "batch_p2p_ops",
        )
    }
    | {
        ("c10d", n)
        for n in (
            "allreduce_",
            "allgather_",
            "_allgather_base_",
            "reduce_scatter_",
            "_reduce_scatter_base_",
            "alltoall_",
            "alltoall_base_",
            "broadcast_",
            "barrier",
            "send",
            "recv_",
            "gather_",
            "scatter_",
            "reduce_",
        )
    }
    | {("_dtensor", "shard_dim_alltoall")}
)
_TAG = "referee_stack"


def _grad_fns(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value.grad_fn] if value.grad_fn is not None else []
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _grad_fns(v)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _grad_fns(v)]
    return []


def _tag(roots: list[Any], stack: tuple[str, ...]) -> None:
    """Tag every untagged node reachable from `roots` (AccumulateGrad nodes are nobody's forward)."""
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node is None or _TAG in node.metadata or node.name().endswith("AccumulateGrad"):
            continue
        node.metadata[_TAG] = stack
        todo.extend(n for n, _ in node.next_functions)


def _node_stack() -> tuple[str, ...]:
    """The modules the running autograd node was tagged with (() outside any)."""
    node = torch._C._current_autograd_node()
    return node.metadata.get(_TAG, ()) if node is not None else ()


class Referee(TorchDispatchMode):
    """Counts collectives: totals, per op, per module and phase."""

    def __init__(self, model: nn.Module | None = None) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.module_counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.backward_nodes: list[str] = []  # the running node's name, per backward collective
        self._stack: list[str] = []
        self._recompute_depth = 0  # > 0 while a recomputed forward runs (its stack's base depth + 1)
        self._handles: list[Any] = []
        self._param_owner: dict[int, tuple[str, ...]] = {}
        self._in_step = 0  # > 0 inside Optimizer.step (the referee's own global step hooks)
        self._tracks_modules = model is not None
        if model is not None:
            for fqn, module in model.named_modules():
                if isinstance(module, torch.jit.ScriptModule):  # takes no hooks: its parent's stack holds it
                    continue
                name = fqn or "(root)"
                self._handles.append(module.register_forward_pre_hook(self._pre(name), prepend=True))
                self._handles.append(module.register_forward_hook(self._post(name), always_call=True))

    def _pre(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if not self._stack and torch._C._current_graph_task_id() != -1:
                # a forward recomputed inside backward: under the modules of the node that asked for it
                self._stack.extend(_node_stack())
                self._recompute_depth = len(self._stack) + 1
            _tag(_grad_fns(args), tuple(self._stack))
            self._stack.append(name)

        return hook

    def _post(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            _tag(_grad_fns(output), tuple(self._stack))
            if self._stack and self._stack[-1] == name:
                self._stack.pop()
            if self._recompute_depth and len(self._stack) < self._recompute_depth:
                self._stack.clear()
                self._recompute_depth = 0

        return hook

    def __enter__(self) -> Referee:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre(*_: Any) -> None:
            self._in_step += 1

        def post(*_: Any) -> None:
            self._in_step -= 1

        self._handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        return super().__enter__()

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __exit__(self, *exc: Any) -> Any:
        self.remove_hooks()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:
            return NotImplemented
        kwargs = kwargs or {}
        if (func.namespace, func._schema.name.split("::")[-1]) in COLLECTIVES:
            self._count(f"{func.namespace}.{func._schema.name.split('::')[-1]}")
        return func(*args, **kwargs)

    def _count(self, name: str) -> None:
        self.counts[name] += 1
        if self._in_step and not self._stack:  # inside Optimizer.step
            self.module_counts["(optimizer)"]["optimizer"][name] += 1
            return
        if torch._C._current_graph_task_id() == -1:
            if not self._stack and self._tracks_modules:  # outside every module, outside backward
                self.module_counts["(outside)"]["outside"][name] += 1
            for fqn in set(self._stack):
                self.module_counts[fqn]["forward"][name] += 1
            return
        if self._stack:  # a forward recomputed inside backward (activation checkpointing)
            # for the modules recomputed and those of the node that asked for it (inside their calls)
            for fqn in set(self._stack):
                self.module_counts[fqn]["recompute"][name] += 1
            return
        node = torch._C._current_autograd_node()
        self.backward_nodes.append(node.name() if node is not None else "")
        for fqn in set(_node_stack()):
            self.module_counts[fqn]["backward"][name] += 1

    def module_counts_dict(self) -> dict[str, dict[str, dict[str, int]]]:
        return {
            fqn: {phase: dict(c) for phase, c in phases.items() if c}
            for fqn, phases in self.module_counts.items()
            if any(phases.values())
        }


def fsdp_collectives_from_profile(prof: Any) -> list[tuple[str, str]]:
    """(collective name, module) for each c10d collective in a torch profile, in issue order.

    An independent witness of which module's parameters an FSDP2 collective moves: FSDP
    labels its work with `record_function("FSDP::all_gather (layers.0)")`; the module is
    the one named by the innermost FSDP all_gather / reduce label around the collective
    (no name: the root).
    """
    events = [e for e in prof.events() if e.name.startswith(("c10d::", "_c10d_functional::", "FSDP::"))]

    def inside(inner: Any, outer: Any) -> bool:
        a, b = inner.time_range, outer.time_range
        return inner is not outer and b.start <= a.start and a.end <= b.end and inner.thread == outer.thread

    # eager c10d ops FSDP issues (a functional collective runs a c10d op inside: not FSDP's)
    collectives = [e for e in events if not e.name.startswith("FSDP::")]
    outermost = [e for e in collectives if e.name.startswith("c10d::") and not any(inside(e, o) for o in collectives)]
    out = []
    for e in sorted(outermost, key=lambda e: e.time_range.start):
        labels = [
            o
            for o in events
            if o.name.startswith(("FSDP::all_gather", "FSDP::post_backward_reduce"))
            and inside(e, o)
            and not o.name.startswith("FSDP::all_gather_copy_out")
        ]
        module = ""
        if labels:
            label = max(labels, key=lambda o: o.time_range.start).name
            module = label[label.index("(") + 1 : label.index(")")] if "(" in label else "(root)"
        out.append((e.name.replace("c10d::", "c10d."), module))
    return out


def collective_counts_from_profile(prof: Any) -> Counter[str]:
    """The collective ops a torch profile saw run, by "namespace.op": an independent count of what a
    compiled graph issued (the referee's dispatch mode would make dynamo run the graph eagerly).

    Only outermost ones: a collective op running inside another (our kernel redispatching, a
    functional collective calling its c10d op) is the same collective.
    """
    names = {f"{ns}::{op}" for ns, op in COLLECTIVES}
    events = [e for e in prof.events() if e.name in names]

    def inside(inner: Any, outer: Any) -> bool:
        a, b = inner.time_range, outer.time_range
        return inner is not outer and b.start <= a.start and a.end <= b.end and inner.thread == outer.thread

    return Counter(e.name.replace("::", ".") for e in events if not any(inside(e, o) for o in events))


class CallChains:
    """The module calls open now (`stack`, innermost last) and, for each module, the calls that
    enclosed its latest call (`latest`, itself last), from this referee's own forward hooks
    (prepended, so they run before anyone else's; `always_call`, so an exception still pops)."""

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[str] = []
        self.latest: dict[str, tuple[str, ...]] = {}
        self._handles: list[Any] = []
        for fqn, module in model.named_modules():
            name = fqn or "(root)"
            self._handles.append(module.register_forward_pre_hook(self._pre(name), prepend=True))
            self._handles.append(module.register_forward_hook(self._post(name), always_call=True))

    def _pre(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self.stack.append(name)
            self.latest[name] = tuple(self.stack)

        return hook

    def _post(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.stack and self.stack[-1] == name:
                self.stack.pop()

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class FsdpReferee(TorchDispatchMode):
    """Which module's FSDP parameter group issued each eager c10d collective, and the module
    counts that gives (issue 19: an FSDP collective counts for that module and the calls
    enclosing it, in the phase it ran in).

    Independent of hp_otel: the collectives and their phase come from this dispatch mode, the
    parameter group from FSDP's own profiler labels (`fsdp_collectives_from_profile`, same issue
    order), the enclosing calls from this referee's own forward hooks.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.issued: list[tuple[str, str]] = []  # (namespace.op, phase), in issue order
        self._calls = CallChains(model)
        self.chains = self._calls.latest  # module -> the calls enclosing its latest, itself last

    def __exit__(self, *exc: Any) -> Any:
        self._calls.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:
            return NotImplemented
        op = func._schema.name.split("::")[-1]
        if func.namespace == "c10d" and ("c10d", op) in COLLECTIVES:
            self.issued.append((f"c10d.{op}", "backward" if torch._C._current_graph_task_id() != -1 else "forward"))
        return func(*args, **(kwargs or {}))

    def module_counts(self, prof: Any) -> dict[str, dict[str, dict[str, int]]]:
        """The expected counts of FSDP's collectives: for the issuing group's module and its enclosing calls."""
        labelled = fsdp_collectives_from_profile(prof)
        assert [name for name, _ in labelled] == [name for name, _ in self.issued], (labelled, self.issued)
        counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        for (name, phase), (_, module) in zip(self.issued, labelled, strict=True):
            for fqn in self.chains[module]:
                counts[fqn][phase][name] += 1
        return {fqn: {p: dict(c) for p, c in phases.items()} for fqn, phases in counts.items()}


class FsdpGroupReferee(FsdpReferee):
    """Like `FsdpReferee`, but it names the issuing parameter group itself: while entered, it wraps
    the group methods that issue the collectives (FSDP2: `FSDPParamGroup.unshard` and
    `.post_backward`, prefetches included: `FSDPParamGroup._prefetch_unshard` calls `unshard`), so
    each collective its dispatch mode sees is labelled with the innermost group method running.
    `groups`: (class, method names, the group's module) for another framework (hyper-parallel's
    `fully_shard`).  Enter it before hp_otel's window (its wrappers then sit under hp_otel's and
    are restored last).
    """

    def __init__(self, model: nn.Module, groups: Any = None) -> None:
        super().__init__(model)
        self._fqns = {id(m): fqn or "(root)" for fqn, m in model.named_modules()}
        self._group_methods = groups if groups is not None else self._fsdp2_groups()
        self._groups: list[str] = []  # the group methods running, innermost last
        self.running: list[str] = []  # the innermost module running at each collective ("" none)
        self.labels: list[str] = []  # the issuing group's module of each collective in self.issued
        self._saved: list[tuple[type, str, Any]] = []

    @staticmethod
    def _fsdp2_groups() -> Any:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        return [(FSDPParamGroup, ("unshard", "post_backward"), lambda group: group.modules[0])]

    def __enter__(self) -> Any:
        for owner, names, module_of in self._group_methods:
            for name in names:
                original = vars(owner)[name]
                self._saved.append((owner, name, original))
                setattr(owner, name, self._wrap(original, module_of))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            for owner, name, original in reversed(self._saved):
                setattr(owner, name, original)
            self._saved.clear()

    def _wrap(self, original: Any, module_of: Any) -> Any:
        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            self._groups.append(self._fqns.get(id(module_of(group)), "?"))
            try:
                return original(group, *args, **kwargs)
            finally:
                self._groups.pop()

        return wrapper

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if (
            DTensor not in types
            and func.namespace == "c10d"
            and ("c10d", func._schema.name.split("::")[-1]) in COLLECTIVES
        ):
            self.labels.append(self._groups[-1] if self._groups else "")
            self.running.append(self._calls.stack[-1] if self._calls.stack else "")
        return super().__torch_dispatch__(func, types, args, kwargs)

    def group_module_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """The expected module counts: each collective for its group's module and the calls enclosing
        that module's latest call (the referee's own forward hooks), in the phase it ran in."""
        counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        for (name, phase), module in zip(self.issued, self.labels, strict=True):
            for fqn in self.chains[module]:
                counts[fqn][phase][name] += 1
        return {fqn: {p: dict(c) for p, c in phases.items()} for fqn, phases in counts.items()}

    def running_module_counts(self) -> dict[str, dict[str, int]]:
        """Forward collectives by the innermost module running when issued (what hp_otel counted before)."""
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for (name, phase), module in zip(self.issued, self.running, strict=True):
            if phase == "forward":
                counts[module][name] += 1
        return {fqn: dict(c) for fqn, c in counts.items()}
