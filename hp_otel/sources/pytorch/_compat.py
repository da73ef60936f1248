"""torch's private API, in one place: every `torch._*` symbol, private torch module and
private attribute of a torch object that hp_otel uses is named here and nowhere else.

Why: these are not covered by torch's compatibility promise, so a torch upgrade may move or
remove any of them.  `SYMBOLS` lists each one (where torch keeps it, what hp_otel uses it
for, what happens without it); the repository's test suite (not shipped) probes every entry on
the installed torch, so an upgrade that removes one fails there, with the symbol's name,
and not deep inside a hook.  Checked on torch 2.13.

Rules:
- what a hook calls per event is resolved once, at import, and handed out as torch's own
  object (the C function, the class): callers bind it to a module global as before, so no
  Python call layer is added per event;
- heavy or optional modules (dynamo, FSDP2, ModTracker, DTensor's internals) are only
  looked up when asked, by the functions below;
- a symbol this torch lacks resolves to its documented fallback where there is one, else
  to a stand-in that raises `TorchCompatError` naming it when used (a callable when
  called, a class when instantiated): the hooks count that as a fault, training goes on.
  `missing()` says which entries did not resolve.

Public torch API (`torch.distributed.tensor.DTensor`, `Shard`, `parallelize_module`, ...)
is imported directly where it is used, not through here.
"""

from __future__ import annotations

import importlib
import inspect
import operator
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

CALLABLE, CLASS, MODULE, ATTRIBUTE = "callable", "class", "module", "attribute"
_NO_FALLBACK: Any = object()


class TorchCompatError(ImportError):
    """This torch lacks a private symbol hp_otel needs; the message names it and what it is for.

    An ImportError: what `from torch.x import _y` raised before, so callers that already
    catch that keep working."""


@dataclass(frozen=True)
class Symbol:
    """One private torch symbol: where torch keeps it, what hp_otel uses it for, what it does without it."""

    name: str  # the name in this module
    module: str  # the torch module that holds it ("torch._C")
    attribute: str  # dotted path inside that module ("" for the module itself)
    kind: str  # CALLABLE, CLASS, MODULE, or ATTRIBUTE: `member` of the objects `sample()` makes
    purpose: str
    fallback: str = ""  # what hp_otel does without it ("": a TorchCompatError when used)
    member: str = ""  # ATTRIBUTE: the private attribute of an instance ("_spec")
    sample: Callable[[], Any] | None = None  # ATTRIBUTE: an object that must have `member` (default: the owner)
    fallback_value: Any = _NO_FALLBACK  # what `resolve` gives without it (default: a stand-in that raises)

    @property
    def path(self) -> str:
        owner = f"{self.module}.{self.attribute}" if self.attribute else self.module
        return f"{owner}.{self.member}" if self.member else owner


_missing: dict[str, TorchCompatError] = {}


def _lookup(symbol: Symbol) -> Any:
    """Import the symbol's module and walk its attribute path (and check `member`); TorchCompatError if
    any step is missing."""
    try:
        value: Any = importlib.import_module(symbol.module)
        for part in filter(None, symbol.attribute.split(".")):
            value = getattr(value, part)
        if symbol.member:
            getattr(symbol.sample() if symbol.sample is not None else value, symbol.member)
    except Exception as exc:  # ImportError, AttributeError, or a module failing to import here
        raise TorchCompatError(
            f"torch {torch.__version__} has no {symbol.path} ({type(exc).__name__}: {exc}); "
            f"hp_otel uses it for: {symbol.purpose}" + (f"; without it: {symbol.fallback}" if symbol.fallback else "")
        ) from exc
    return value


def _stand_in(symbol: Symbol, error: TorchCompatError) -> Any:
    """What a missing symbol without a fallback resolves to: it raises `error` when used."""

    def raise_error(*_args: Any, **_kwargs: Any) -> Any:
        raise error

    if symbol.kind == CLASS:  # subclassing still works (hp_otel's modules import); instantiating raises
        return type(symbol.name, (), {"__init__": raise_error, "__hp_otel_missing__": error})
    raise_error.__hp_otel_missing__ = error  # type: ignore[attr-defined]
    raise_error.__name__ = symbol.name
    return raise_error


def resolve(name: str) -> Any:
    """The symbol `name` of `SYMBOLS` on this torch, else its fallback, else a stand-in that raises."""
    symbol = SYMBOLS[name]
    try:
        value = _lookup(symbol)
    except TorchCompatError as error:
        _missing[name] = error
        if symbol.fallback_value is not _NO_FALLBACK:
            return symbol.fallback_value
        return _stand_in(symbol, error)
    _missing.pop(name, None)
    return value


def require(name: str) -> Any:
    """The symbol `name` on this torch, or TorchCompatError (for callers with a fallback of their own)."""
    return _lookup(SYMBOLS[name])


def missing() -> dict[str, str]:
    """Entries that did not resolve on this torch so far -> why (their fallback or stand-in is in use)."""
    return {name: str(error) for name, error in _missing.items()}


def is_missing(value: Any) -> bool:
    """Whether `value` is the stand-in of a symbol this torch lacks."""
    return getattr(value, "__hp_otel_missing__", None) is not None


def _loaded(module: str) -> ModuleType | None:
    """`module` if something imported it already (we never import it for the user), else None."""
    return sys.modules.get(module)


def _graph_node() -> Any:
    return torch.ones(1, requires_grad=True).mul(2).grad_fn


def _an_op() -> Any:
    return torch.ops.aten.add.Tensor


class _NoInstances:
    """Stands for a class this torch lacks: nothing is an instance of it."""


# Every DTensor module that imports `redistribute_local_tensor` by name (the redistribute wrapper patches each).
REDISTRIBUTE_MODULES = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
)
REDISTRIBUTE_FUNCTION = "redistribute_local_tensor"
# The dicts `nn.Module.register_forward_pre_hook` and `register_forward_hook(always_call=True)` fill.
FORWARD_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called")

# Every private symbol, one row each: its name here, where torch keeps it, what it is, what hp_otel uses
# it for, what hp_otel does without it. What a hook calls per event is bound below, once.
# fmt: off
_TABLE: tuple[Symbol, ...] = (
    # autograd: phase, node ownership, backward end (hot: torch's own callables)
    Symbol(
        "current_graph_task_id", "torch._C", "_current_graph_task_id", CALLABLE,
        "the running backward pass's id, -1 outside backward: the phase of a collective, module call or recomputation",
    ),
    Symbol(
        "current_autograd_node", "torch._C", "_current_autograd_node", CALLABLE,
        "the autograd node running now: which module call's forward created the backward work",
    ),
    Symbol(
        "next_sequence_nr", "torch._C", "_autograd._get_sequence_nr", CALLABLE,
        "this thread's next autograd node number: the nodes a forward call creates are the numbers it spans",
    ),
    Symbol(
        "node_sequence_nr", "torch.autograd.graph", "Node", ATTRIBUTE,
        "an autograd node's sequence number: which forward call created it", member="_sequence_nr", sample=_graph_node,
    ),
    Symbol(
        "queue_backward_callback", "torch.autograd", "Variable._execution_engine.queue_callback", CALLABLE,
        "run a callback when the current backward pass ends (closes backward spans)",
    ),
    Symbol(
        "tensor_hook_dict", "torch", "Tensor", ATTRIBUTE,
        "a module output's grad hook goes straight into the dict `Tensor.register_hook` fills (one hook per module "
        "call: without that method's Python checks and a RemovableHandle nobody keeps)",
        fallback="each grad hook is registered through `Tensor.register_hook`", fallback_value=None,
        member="_backward_hooks", sample=lambda: torch.ones(1, requires_grad=True).mul(2),
    ),
    Symbol(
        "node_register_hook_dict", "torch.autograd.graph", "Node", ATTRIBUTE,
        "hands a tensor's grad hook dict to the node that makes its gradient, as `Tensor.register_hook` does",
        fallback="each grad hook is registered through `Tensor.register_hook`", fallback_value=None,
        member="_register_hook_dict", sample=_graph_node,
    ),
    Symbol(
        "DisableTorchFunction", "torch._C", "DisableTorchFunction", CLASS,
        "hp_otel's own tensor calls (registering grad hooks) are not reported as the user's ops",
    ),
    Symbol(
        "DisableTorchFunctionSubclass", "torch._C", "DisableTorchFunctionSubclass", CLASS,
        "the DTensor op hook reads its own tensors' shapes and dtypes without re-entering itself",
    ),
    Symbol(
        "disabled_torch_function_impl", "torch._C", "_disabled_torch_function_impl", CALLABLE,
        "DTensor's own `__torch_function__`: the op hook runs each op through it, exactly as DTensor does",
        fallback="op spans come from a TorchFunctionMode over every torch call (slower, same spans)",
        fallback_value=None,
    ),
    Symbol(
        "StopRecomputationError", "torch.utils.checkpoint", "_StopRecomputationError", CLASS,
        "non-reentrant checkpointing ends a recomputed forward early on purpose: not an error of the module",
        fallback="no exception is treated so (such a recomputation would end its span with an error)",
        fallback_value=None,
    ),
    Symbol(
        "own_parameters", "torch.nn", "Module", ATTRIBUTE,
        "a module's own parameters as objects, without its children's",
        member="_parameters", sample=lambda: torch.nn.Linear(1, 1),
    ),
    *(
        Symbol(
            f"forward_hook_dict:{member}", "torch.nn", "Module", ATTRIBUTE,
            "a window's forward hooks go straight into the dicts `register_forward_pre_hook` and "
            "`register_forward_hook(always_call=True)` fill, without a RemovableHandle each (a module's hooks "
            "are registered and removed every window)",
            fallback="each hook is registered through the public API, with its RemovableHandle",
            fallback_value=None, member=member, sample=lambda: torch.nn.Linear(1, 1),
        )
        for member in FORWARD_HOOK_DICTS
    ),
    # compiled modules: where a compiled call leaves eager Python
    Symbol(
        "compiled_call_impl", "torch.nn", "Module", ATTRIBUTE,
        "`nn.Module.compile()` keeps the compiled call here; its hooks run inside the graph, so the call is "
        "noted around it", fallback="a compiled module's collectives count for the modules enclosing it",
        member="_compiled_call_impl", sample=lambda: torch.nn.Linear(1, 1),
    ),
    Symbol(
        "child_modules", "torch.nn", "Module", ATTRIBUTE,
        "a module's children, the dict `named_modules()` walks: a kept hook set tells an unchanged tree from a "
        "changed one without walking it", fallback="the tree is walked at every window (as a changed one)",
        member="_modules", sample=lambda: torch.nn.Linear(1, 1),
    ),
    Symbol(
        "OptimizedModule", "torch._dynamo.eval_frame", "OptimizedModule", CLASS,
        "`torch.compile(model)`'s wrapper: a window on it tracks the model it wraps, under the model's names; "
        "a window on the model notes its call on the wrapper's hooks (`compile_wrappers` lists the instances)",
        fallback="the wrapper is tracked as it is (names start with `_orig_mod.`)",
    ),
    # the dispatcher: Python kernels on collective ops, op records
    Symbol(
        "DispatchKey", "torch._C", "DispatchKey", CLASS, "the BackendSelect key the collective kernels sit on, Meta",
    ),
    Symbol(
        "DispatchKeySet", "torch._C", "DispatchKeySet", CLASS,
        "the key set a kernel gets (`with_keyset=True`) and redispatches below itself (`remove`)",
        fallback="kernels are not available: collectives are seen by the dispatch mode",
    ),
    Symbol(
        "dispatch_has_kernel_for_dispatch_key", "torch._C", "_dispatch_has_kernel_for_dispatch_key", CALLABLE,
        "never replace a BackendSelect kernel someone else registered",
        fallback="kernels are not available: collectives are seen by the dispatch mode",
    ),
    Symbol(
        "redispatch_boxed", "torch._ops", "OpOverload", ATTRIBUTE,
        "a kernel goes on to the keys below it, releasing the GIL while the backend runs",
        member="_handle", sample=_an_op,
    ),
    Symbol(
        "op_schema", "torch._ops", "OpOverload", ATTRIBUTE,
        "an op's schema: its qualified name and argument names", member="_schema", sample=_an_op,
    ),
    Symbol(
        "overload_name", "torch._ops", "OpOverload", ATTRIBUTE,
        "an op overload's name ('default', 'Tensor'), to register a kernel for it", member="_overloadname",
        sample=_an_op,
    ),
    Symbol(
        "overload_packet", "torch._ops", "OpOverload", ATTRIBUTE,
        "an op overload's packet: the key torch's CommDebugMode counts under", member="_overloadpacket", sample=_an_op,
    ),
    Symbol(
        "OpOverload", "torch._ops", "OpOverload", CLASS, "the type of `torch.ops.<ns>.<op>.<overload>`",
    ),
    Symbol(
        "HigherOrderOperator", "torch._ops", "HigherOrderOperator", CLASS,
        "the drop-in's dispatch mode runs higher-order operators through, as torch's does",
    ),
    Symbol(
        "dispatch_library", "torch._C", "_dispatch_library", CALLABLE,
        "the dispatcher's own library object (what `torch.library.Library` wraps): registering the kernels on it "
        "takes half the time, and `reset()` takes them out again, so each window can register and unregister them",
        fallback="kernels are not available: collectives are seen by the dispatch mode",
    ),
    Symbol(
        "WAIT_TENSOR", "torch", "ops._c10d_functional.wait_tensor.default", ATTRIBUTE,
        "the op that waits for a functional collective: when it completes",
    ),
    Symbol(
        "TorchDispatchMode", "torch.utils._python_dispatch", "TorchDispatchMode", CLASS,
        "the fallback collective hook and the drop-in's op records are dispatch modes",
    ),
    Symbol(
        "detect_fake_mode", "torch._guards", "detect_fake_mode", CALLABLE,
        "the drop-in does not list ops on fake tensors (torch.compile tracing), as torch's does not",
    ),
    Symbol(
        "tree_flatten", "torch.utils._pytree", "tree_flatten", CALLABLE,
        "the drop-in finds a module's input tensors in any nesting, as torch's ModTracker does",
    ),
    # dynamo (imported only when asked: importing it takes long)
    Symbol(
        "set_code_exec_strategy", "torch._dynamo.eval_frame", "set_code_exec_strategy", CALLABLE,
        "mark a kernel's code to be skipped by dynamo, recursively, at no cost per call",
        fallback="torch.compiler.disable(fn, recursive=True): a wrapper that costs every call",
    ),
    Symbol(
        "FrameExecStrategy", "torch._dynamo.eval_frame", "FrameExecStrategy", CLASS,
        "the strategy `set_code_exec_strategy` takes", fallback="as for set_code_exec_strategy",
    ),
    Symbol(
        "FrameAction", "torch._dynamo.eval_frame", "FrameAction", CLASS,
        "SKIP, for this frame and the frames it calls", fallback="as for set_code_exec_strategy",
    ),
    Symbol(
        "dynamo_tls", "torch._dynamo.eval_frame", "dynamo_tls", ATTRIBUTE,
        "dynamo's record of the frames it ran eagerly under a dispatch mode (`skip_reasons`): the graph-mode warning",
        fallback="no warning that compiled code ran eagerly", member="skip_reasons",
    ),
    Symbol(
        "cache_entries", "torch._dynamo.eval_frame", "_debug_get_cache_entry_list", CALLABLE,
        "whether dynamo compiled a module class's forward (`torch.compile(model.forward)`, no wrapper to find): "
        "its submodules' hooks then run in the graph",
        fallback="no module counts as compiled so: a window recompiles such a graph (its hooks' ids are guarded)",
    ),
    # torch.distributed: Work, process groups, functional collectives, DTensor, FSDP2
    Symbol(
        "unbox_work", "torch._C._distributed_c10d", "Work.unbox", CALLABLE,
        "an eager c10d op returns its Work boxed as a TorchScript object: unbox it to ask when it is done",
    ),
    Symbol(
        "FakeWork", "torch._C._distributed_c10d", "FakeWork", CLASS,
        "the fake process group's Work never reports completion: the watchdog treats it as done",
        fallback="no Work is treated as fake",
        fallback_value=_NoInstances,
    ),
    Symbol(
        "resolve_process_group", "torch.distributed.distributed_c10d", "_resolve_process_group", CALLABLE,
        "functional collectives name their group by string: its size and ranks",
    ),
    Symbol(
        "AsyncCollectiveTensor", "torch.distributed._functional_collectives", "AsyncCollectiveTensor", CLASS,
        "an op that reads one waits for its collective inside: when that collective completes",
        fallback="no such tensors: functional collectives complete at their wait_tensor",
        fallback_value=_NoInstances,
    ),
    Symbol(
        "dtensor_spec", "torch.distributed.tensor", "DTensor", ATTRIBUTE,
        "a DTensor's spec (shape, placements, mesh): hashed once, shared by every step's infos", member="_spec",
    ),
    *(
        Symbol(
            f"redistribute_local_tensor:{module}", module, REDISTRIBUTE_FUNCTION, CALLABLE,
            "every redistribute of a DTensor goes through it (redistribute spans)",
        )
        for module in REDISTRIBUTE_MODULES
    ),
    Symbol(
        "FSDPParamGroup", "torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup", CLASS,
        "FSDP2 issues a parameter group's collectives in its `unshard` and `post_backward`: which module they move",
        fallback="collectives carry no FSDP parameter module",
    ),
    Symbol(
        "FSDP1RuntimeUtils", "torch.distributed.fsdp._runtime_utils", "", MODULE,
        "FSDP1 issues a flat parameter's all-gather in `_unshard(state, handle)` and its gradient reduction in "
        "`_reduce_grad(state, handle)` / `_reduce_grad_no_shard`: which FSDP unit they move",
        fallback="FSDP1's collectives count for the running module (with use_orig_params=True: backward for none)",
    ),
    Symbol(
        "ModTracker", "torch.distributed._tools.mod_tracker", "ModTracker", CLASS,
        "the drop-in's module tracker is torch's, with its fqn scheme and parents",
    ),
    Symbol(
        "storage_key", "torch", "UntypedStorage", ATTRIBUTE,
        "a functional collective's output is matched with its wait by storage, as torch's own work registry does",
        member="_cdata",
    ),
    # process exit
    Symbol(
        "c10d_world", "torch.distributed.distributed_c10d", "_world", ATTRIBUTE,
        "which process groups are still live (`pg_map`): a destroyed group pinned by a default argument is let go "
        "at exit",
        fallback="nothing is released at exit", member="pg_map",
    ),
    # the benchmarks (python -m benchmarks, from a checkout) and the tests
    Symbol(
        "FakeProcessGroup", "torch._C._distributed_c10d", "FakeProcessGroup._create_internal", CALLABLE,
        "the benchmarks run a 2-rank world in one process whose collectives return at once",
    ),
    Symbol(
        "DebugMode", "torch.utils._debug_mode", "DebugMode", CLASS,
        "the benchmarks compare with torch's DebugMode", fallback="that benchmark variant is skipped",
    ),
)
# fmt: on
SYMBOLS: Mapping[str, Symbol] = MappingProxyType({symbol.name: symbol for symbol in _TABLE})


# --- autograd: phase, node ownership, backward end (hot: torch's own callables) ------------

current_graph_task_id: Callable[[], int] = resolve("current_graph_task_id")
current_autograd_node: Callable[[], Any] = resolve("current_autograd_node")
next_sequence_nr: Callable[[], int] = resolve("next_sequence_nr")
# `node_sequence_nr(node)` is `node._sequence_nr()`, called from C (no Python frame per node).
node_sequence_nr: Callable[[Any], int] = operator.methodcaller("_sequence_nr")
queue_backward_callback: Callable[[Callable[[], None]], None] = resolve("queue_backward_callback")
DisableTorchFunction: type = resolve("DisableTorchFunction")
DisableTorchFunctionSubclass: type = resolve("DisableTorchFunctionSubclass")
disabled_torch_function_impl: Callable[..., Any] = resolve("disabled_torch_function_impl")
_stop_recomputation = resolve("StopRecomputationError")
# The exception types that end a recomputation on purpose (() without torch's).
STOP_RECOMPUTATION: tuple[type[BaseException], ...] = (
    (_stop_recomputation,) if isinstance(_stop_recomputation, type) else ()
)

_TENSOR_HOOK_DICTS = all(resolve(name) is not None for name in ("tensor_hook_dict", "node_register_hook_dict"))


def _add_to_hook_dict(tensor: torch.Tensor, grad_fn: Any, hook: Callable[[Any], Any]) -> None:
    """`tensor.register_hook(hook)` for a tensor made by `grad_fn` (its current grad_fn), handle not kept.

    The same dict, node registration and hook id as torch's method, so the hook runs where that
    method's would, in order with the user's hooks on the tensor; only its Python checks are left
    out (the caller holds DisableTorchFunction and the tensor requires grad)."""
    hooks = tensor._backward_hooks
    if hooks is None:
        hooks = tensor._backward_hooks = OrderedDict()
        grad_fn._register_hook_dict(tensor)
    key = RemovableHandle.next_id  # a user's later handle gets another id: its remove() leaves ours
    RemovableHandle.next_id = key + 1
    hooks[key] = hook


def _register_hook(tensor: torch.Tensor, grad_fn: Any, hook: Callable[[Any], Any]) -> None:
    tensor.register_hook(hook)


# `add_tensor_hook(tensor, grad_fn, hook)`: a grad hook on a non-leaf tensor whose handle nobody keeps.
add_tensor_hook: Callable[[torch.Tensor, Any, Callable[[Any], Any]], None] = (
    _add_to_hook_dict if _TENSOR_HOOK_DICTS else _register_hook
)


def own_parameters(module: torch.nn.Module) -> Iterable[Any]:
    """The module's own parameters (None for an empty slot), without walking children (`module._parameters`)."""
    return module._parameters.values()


# `forward_hook_dicts(module)`: its (pre-hooks, hooks, always-called hook ids) dicts (attrgetter: no Python
# frame); None where this torch lacks one of them (hooks are then registered through the public API).
forward_hook_dicts: Callable[[Any], tuple[Any, Any, Any]] | None = (
    operator.attrgetter(*FORWARD_HOOK_DICTS)
    if all(resolve(f"forward_hook_dict:{member}") is not None for member in FORWARD_HOOK_DICTS)
    else None
)


# --- compiled modules: where a compiled call leaves eager Python ------------------------------

_COMPILED_CALL = "_compiled_call_impl"


def compiled_call(module: torch.nn.Module) -> Any:
    """What `nn.Module.compile()` put on this module (`module._compiled_call_impl`), None if not compiled so."""
    return vars(module).get(_COMPILED_CALL)


def tree_state(modules: Iterable[Callable[[], torch.nn.Module | None]]) -> list[Any] | None:
    """Everything a module tree's hooks are made from, module by module (`modules`: weak references, in
    `named_modules()` order): its type, the id of its compiled call, its children's names and ids (the
    `_modules` dict that `ModuleList.insert`, `Sequential` and `setattr` all write), its own parameters'
    names and ids.  None if a module is gone or lacks those dicts.

    Two equal lists, the modules alive in both: `named_modules()` of the first module yields the same
    modules under the same names (by induction over the children), with the same parameters and
    compiled calls (a caller keeps the compiled calls alive or weakly referenced, so an id is not reused)."""
    state: list[Any] = []
    append = state.append
    try:
        for ref in modules:
            module = ref()
            if module is None:
                return None
            attrs = module.__dict__
            children = attrs["_modules"]
            params = attrs["_parameters"]
            compiled = attrs.get(_COMPILED_CALL)
            append((
                type(module),
                id(compiled) if compiled is not None else 0,
                tuple(children),
                tuple(map(id, children.values())),
                tuple(params),
                tuple(map(id, params.values())),
            ))  # fmt: skip
    except (KeyError, AttributeError, TypeError):
        return None
    return state


def set_compiled_call(module: torch.nn.Module, call: Any) -> None:
    """Put `call` where `nn.Module.__call__` looks for the module's compiled call (bypassing `Module.__setattr__`)."""
    object.__setattr__(module, _COMPILED_CALL, call)


def loaded_compiled_module_class() -> type | None:
    """`torch.compile(model)`'s wrapper class if dynamo is imported, else None (never imports it)."""
    symbol = SYMBOLS["OptimizedModule"]
    wrapper = getattr(_loaded(symbol.module), symbol.attribute, None)
    return wrapper if isinstance(wrapper, type) else None


def compiled_module_original(module: torch.nn.Module) -> torch.nn.Module | None:
    """The model a `torch.compile(model)` wrapper wraps (`_orig_mod`), None for any other module
    (never imports dynamo: a wrapper exists only once it is imported)."""
    wrapper = loaded_compiled_module_class()
    if wrapper is None or not isinstance(module, wrapper):
        return None
    original = vars(module).get("_modules", {}).get("_orig_mod")
    return original if isinstance(original, torch.nn.Module) else None


# --- the dispatcher: Python kernels on collective ops, op records ----------------------------

DispatchKey: Any = resolve("DispatchKey")
DispatchKeySet: Any = resolve("DispatchKeySet")
dispatch_has_kernel_for_dispatch_key: Callable[[str, str], bool] = resolve("dispatch_has_kernel_for_dispatch_key")


def redispatch_boxed(op: Any) -> Callable[..., Any]:
    """`op._handle.redispatch_boxed`: call `op` from the given key set on (the kernels bind it once per op)."""
    return op._handle.redispatch_boxed  # type: ignore[no-any-return]


# `op_schema(op)` is `op._schema` (attrgetter: no Python frame).
op_schema: Callable[[Any], Any] = operator.attrgetter("_schema")
overload_name: Callable[[Any], str] = operator.attrgetter("_overloadname")
overload_packet: Callable[[Any], Any] = operator.attrgetter("_overloadpacket")
OpOverload: Any = resolve("OpOverload")
HigherOrderOperator: Any = resolve("HigherOrderOperator")
dispatch_library: Callable[..., Any] = resolve("dispatch_library")
WAIT_TENSOR: Any = resolve("WAIT_TENSOR")
TorchDispatchMode: Any = resolve("TorchDispatchMode")
detect_fake_mode: Callable[..., Any] = resolve("detect_fake_mode")
tree_flatten: Callable[[Any], tuple[list[Any], Any]] = resolve("tree_flatten")


# --- dynamo (imported only when asked: importing it takes long) -----------------------------


def hide_from_dynamo(fn: Any) -> Any:
    """`fn`, never compiled by dynamo nor anything it calls (our kernels run inside compiled graphs).

    Marks its code skipped (no cost per call); without that on this torch, the public
    `torch.compiler.disable` wrapper (a cost on every call); without dynamo, `fn` itself."""
    try:
        strategy = require("FrameExecStrategy")
        action = require("FrameAction")
        require("set_code_exec_strategy")(fn.__code__, strategy(action.SKIP, action.SKIP))
        return fn
    except Exception:  # another torch: the public way
        pass
    try:
        return torch.compiler.disable(fn, recursive=True)
    except Exception:  # no dynamo in this build: nothing to hide from
        return fn


def top_frame_compiled(fn: Any) -> bool:
    """Whether dynamo has compiled `fn`'s code as a frame of its own (`torch.compile(model)` compiles
    the model's `forward`); False if dynamo is not imported (then nothing is compiled)."""
    eval_frame = _loaded(SYMBOLS["cache_entries"].module)
    entries = getattr(eval_frame, "_debug_get_cache_entry_list", None)
    code = getattr(fn, "__code__", None)
    if entries is None or code is None:
        return False
    try:
        return bool(entries(code))
    except Exception:
        return False


def loaded_dynamo_tls() -> Any:
    """dynamo's thread-local state if dynamo is imported and keeps `skip_reasons`, else None (never imports it)."""
    symbol = SYMBOLS["dynamo_tls"]
    eval_frame = _loaded(symbol.module)
    tls = getattr(eval_frame, symbol.attribute, None)
    return tls if tls is not None and hasattr(tls, symbol.member) else None


class SkipReasons:
    """dynamo's record of the frames it ran eagerly under a dispatch mode, read and put back through the
    member name its `SYMBOLS` entry declares: the graph-mode watch touches no private name itself."""

    __slots__ = ("_member", "_tls")

    def __init__(self, tls: Any) -> None:
        self._tls, self._member = tls, SYMBOLS["dynamo_tls"].member

    def get(self) -> Any:
        return getattr(self._tls, self._member)

    def set(self, reasons: Any) -> None:
        setattr(self._tls, self._member, reasons)


def loaded_skip_reasons() -> SkipReasons | None:
    """The accessor of dynamo's `skip_reasons` when dynamo is already imported (never imports it), else None."""
    tls = loaded_dynamo_tls()
    return None if tls is None else SkipReasons(tls)


# --- torch.distributed: Work, process groups, functional collectives, DTensor, FSDP2 ----------

unbox_work: Callable[[Any], Any] = resolve("unbox_work")
FakeWork: type = resolve("FakeWork")
resolve_process_group: Callable[[str], Any] = resolve("resolve_process_group")
AsyncCollectiveTensor: type = resolve("AsyncCollectiveTensor")
# `dtensor_spec(t)` is `t._spec` (attrgetter: no Python frame per tensor).
dtensor_spec: Callable[[Any], Any] = operator.attrgetter("_spec")


_redistribute_checked = False


def redistribute_modules() -> list[ModuleType]:
    """The DTensor modules that hold `redistribute_local_tensor` (imported: DTensor is); checked
    once per process, as every window asks."""
    global _redistribute_checked
    if not _redistribute_checked:
        for module in REDISTRIBUTE_MODULES:
            require(f"redistribute_local_tensor:{module}")
        _redistribute_checked = True
    return [sys.modules[name] for name in REDISTRIBUTE_MODULES]


FSDP_GROUP_METHODS = ("unshard", "post_backward")  # where FSDP2 issues every collective of a parameter group


def loaded_fsdp_param_group() -> type | None:
    """FSDP2's parameter group class if FSDP2 is imported (nobody uses it otherwise), else None."""
    group = getattr(_loaded(SYMBOLS["FSDPParamGroup"].module), "FSDPParamGroup", None)
    return group if isinstance(group, type) else None


def fsdp_module_fqn(group: Any) -> str:
    """The fqn of the module a parameter group belongs to (`group._module_fqn`; "" if it has none)."""
    return getattr(group, "_module_fqn", "") or ""


FSDP1_HANDLE_FUNCTIONS = ("_unshard", "_reduce_grad", "_reduce_grad_no_shard")  # each takes (state, handle, ...)


def loaded_fsdp1_runtime() -> ModuleType | None:
    """FSDP1's runtime module if FSDP1 is imported (nobody uses it otherwise), else None."""
    return _loaded(SYMBOLS["FSDP1RuntimeUtils"].module)


def is_fsdp1_module(module: Any) -> bool:
    """True for an FSDP1 unit (`FullyShardedDataParallel`; False when FSDP1 is not imported)."""
    fsdp = getattr(_loaded("torch.distributed.fsdp.fully_sharded_data_parallel"), "FullyShardedDataParallel", None)
    return isinstance(fsdp, type) and isinstance(module, fsdp)


def fsdp1_handle_module(handle: Any) -> Any:
    """The module an FSDP1 flat-parameter handle shards (`handle._fully_sharded_module`; None if unknown)."""
    return getattr(handle, "_fully_sharded_module", None)


def fsdp_group_modules(group: Any) -> tuple[Any, ...]:
    """The modules `fully_shard` was applied to for this parameter group (`group.modules`; () if unknown)."""
    modules = getattr(group, "modules", ())
    return tuple(modules) if isinstance(modules, (tuple, list)) else ()


# ModTracker's private methods the drop-in overrides or calls (probed by the tests).
MOD_TRACKER_MEMBERS = (
    "_get_append_fn",
    "_get_pop_fn",
    "_fw_pre_hook",
    "_fw_post_hook",
    "_get_mod_name",
    "_active_module_cnt",
)


def mod_tracker_class() -> type:
    """torch's `ModTracker` (imported when the drop-in is)."""
    tracker: type = resolve("ModTracker")
    return tracker


def mod_tracker_markers_take_module(tracker: type) -> bool:
    """torch 2.13's ModTracker markers take a weakref to the module first; older releases do not."""
    try:
        return "w_mod" in inspect.signature(tracker._get_append_fn).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False


def storage_key(tensor: torch.Tensor) -> int:
    """What identifies the tensor's storage (shared by its views): `untyped_storage()._cdata`."""
    return tensor.untyped_storage()._cdata  # type: ignore[no-any-return]


# --- process exit -----------------------------------------------------------------------------


def live_process_groups() -> set[int]:
    """ids of the process groups torch.distributed still has (none if torch has no `_world.pg_map`)."""
    try:
        world = require("c10d_world")
    except TorchCompatError:
        return set()
    return {id(group) for group in world.pg_map}


# --- the benchmarks -------------------------------------------------------------------------


def register_fake_backend() -> None:
    """Register torch's fake process group as backend "fake" without torch.testing (which the
    shipped CLI must not import): `init_process_group("fake", store=dist.HashStore(), ...)` then works."""
    import torch.distributed as dist

    create = require("FakeProcessGroup")

    def make(common_opts: Any, backend_opts: Any) -> Any:
        return create(common_opts.group_rank, common_opts.group_size, backend_opts)

    dist.Backend.register_backend("fake", make, extended_api=True, devices=["cpu", "cuda"])


def debug_mode_class() -> type:
    """torch's `DebugMode` (TorchCompatError if this torch has none)."""
    mode: type = require("DebugMode")
    return mode
