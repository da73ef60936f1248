"""Whatever module runs: torch's module bookkeeping, re-entry safe, reported as hp_otel spans.

A `ModTracker` (torch's own: same fqn scheme `MLPModule.net2`, same `parents`, same
`is_bw`) with the dictionaries torch's CommDebugMode keeps on its
`advanced_module_tracker` (`module_helper_dict`, `module_parameters_dict`,
`module_parents_dict`, `parent_dict`, `sharding_dict`, `name`), filled the way torch
fills them.  Two differences, both fixes: the forward hook that makes the parent
current again is not added to the module on every
call, it is added once per module and window (torch's leaks hooks and raises
IndexError when a module runs twice in one window), and a module run twice is listed
once as its parent's child.

Every forward and backward module boundary also goes to hp_otel's observer, so the
same window's OTel spans nest collectives under torch-named modules.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_pre_hook,
)

from hp_otel.record.observer import Observer
from hp_otel.sources.pytorch import _compat
from hp_otel.sources.pytorch.modules import BackwardEndCallback
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

GLOBAL = "Global"
ModTracker = _compat.mod_tracker_class()  # torch's, private: its members we override are in _compat
tree_flatten = _compat.tree_flatten
# torch 2.13's ModTracker markers take a weakref to the module first; older releases do not
_MARKERS_TAKE_MODULE = _compat.mod_tracker_markers_take_module(ModTracker)


def _marker_args(module_ref: Any, name: str, is_bw: bool) -> tuple[Any, ...]:
    return (module_ref, name, is_bw) if _MARKERS_TAKE_MODULE else (name, is_bw)


def _module_type(module: torch.nn.Module) -> str:
    """torch's spelling: `str(type(m))` without angle brackets ("class 'torch.nn...Linear'")."""
    return str(type(module)).replace("<", "").replace(">", "")


def _grad_inputs(value: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(value)
    return [a for a in flat if isinstance(a, torch.Tensor) and a.requires_grad]


class CompatModuleTracker(ModTracker):  # type: ignore[misc,valid-type]
    """torch's `_CommModeModuleTracker` contract; `observer` receives module spans while set."""

    def __init__(self) -> None:
        super().__init__()
        self.module_helper_dict: dict[str, dict[str, Any]] = {}
        self.module_parameters_dict: dict[str, dict[str, Any]] = {}
        self.module_parents_dict: dict[str, set[str]] = {}
        self.register_forward_hook_handles: dict[str, Any] = {}  # torch's attribute; always empty here
        self.parent_dict: dict[str, list[str]] = {}
        self.parent_list: list[str] = []
        self.sharding_dict: dict[str, Any] = {}
        self.activation_checkpointing = False
        self.name = ""
        self.observer: Observer | None = None
        self._pushed: list[bool] = []  # per running forward: did its pre-hook push parent_list
        self._infos: weakref.WeakKeyDictionary[torch.nn.Module, ModuleInfo] = weakref.WeakKeyDictionary()
        self._backward_end = BackwardEndCallback(self._at_backward_end)
        self._module_hooks: dict[int, tuple[weakref.ref[torch.nn.Module], Any]] = {}

    # --- hp_otel spans ------------------------------------------------------------
    def _info(self, module: torch.nn.Module | None, name: str) -> ModuleInfo:
        from hp_otel.sources.pytorch.modules import parameter_infos

        info = self._infos.get(module) if module is not None else None
        if info is None or info.fqn != name:
            params = parameter_infos(module) if module is not None else ()
            qualname = type(module).__qualname__ if module is not None else ""
            info = ModuleInfo(name, name, qualname, params)
            if module is not None:
                self._infos[module] = info
        return info

    def _report(self, module: torch.nn.Module | None, name: str, phase: str, enter: bool) -> None:
        observer = self.observer
        if observer is None or not observer.accepting:
            return
        try:
            if enter:
                observer.on_module_enter(self._info(module, name), phase)
                if phase == schema.PHASE_BACKWARD:
                    self._backward_end.queue()
            else:
                observer.on_module_exit(name, phase)
        except Exception as exc:
            observer.on_fault("compat_module_report", exc)

    def _at_backward_end(self) -> None:
        observer = self.observer
        if observer is not None:
            observer.on_backward_end()

    # ModTracker builds its backward markers with these: report them as backward spans too.
    # torch 2.13 passes (weakref to module, name, is_bw); older releases (name, is_bw).
    def _get_append_fn(self, *args):  # type: ignore[no-untyped-def]
        append = super()._get_append_fn(*args)
        if not args[-1]:
            return append
        module_ref, name = (args[0] if len(args) == 3 else None), args[-2]

        def append_and_report(*grads: Any) -> None:
            try:  # runs inside autograd: ModTracker's own checks must not fail the backward
                append(*grads)
            except Exception as exc:
                self._fault("compat_module_backward_start", exc)
            self._report(module_ref() if module_ref is not None else None, name, schema.PHASE_BACKWARD, enter=True)

        return append_and_report

    def _get_pop_fn(self, *args):  # type: ignore[no-untyped-def]
        pop = super()._get_pop_fn(*args)
        if not args[-1]:
            return pop
        module_ref, name = (args[0] if len(args) == 3 else None), args[-2]

        def pop_and_report(*grads: Any) -> None:
            try:
                pop(*grads)
            except Exception as exc:
                self._fault("compat_module_backward_done", exc)
            self._report(module_ref() if module_ref is not None else None, name, schema.PHASE_BACKWARD, enter=False)

        return pop_and_report

    # --- torch's bookkeeping ---------------------------------------------------------
    def _fault(self, where: str, exc: Exception) -> None:
        observer = self.observer
        if observer is not None:
            observer.on_fault(where, exc)

    def _fw_pre_hook(self, mod, input):  # type: ignore[no-untyped-def]
        try:
            self._enter_forward(mod, input)
        except Exception as exc:  # our bookkeeping failed: the user's forward goes on
            self._fault("compat_module_forward_pre", exc)

    def _enter_forward(self, mod: torch.nn.Module, input: Any) -> None:
        """Before a forward: this module is current; note its type, depth, parameters and parent."""
        self.activation_checkpointing = self.is_bw  # a forward inside backward is a recompute
        self.name = self._get_mod_name(mod)
        w_mod = weakref.ref(mod)
        self._get_append_fn(*_marker_args(w_mod, self.name, False))()
        tensors = _grad_inputs(input)
        if not self.is_bw and tensors:
            register_multi_grad_hook(tensors, self._get_pop_fn(*_marker_args(w_mod, self.name, True)))
        pushed = not self.activation_checkpointing
        self._hook_module_once(mod)
        self._pushed.append(pushed)
        if pushed:
            self._note_module(mod, self.name)
        self._report(mod, self.name, schema.PHASE_FORWARD, enter=True)

    def _note_module(self, mod: torch.nn.Module, name: str) -> None:
        from torch.distributed.tensor import DTensor

        helper = self.module_helper_dict.setdefault(name, {})
        helper["module_type"] = _module_type(mod)
        helper["depth"] = len(self.parents) - 1
        for param_name, param in mod.named_parameters(recurse=False):
            self.module_parameters_dict.setdefault(name, {})[param_name] = param.data
            if isinstance(param.data, DTensor):
                self.sharding_dict[f"{name}.{param_name}"] = param.data.placements
                helper.setdefault("parameters", {})[param_name] = str(param.data.placements)
        if name not in self.module_parents_dict:
            self.module_parents_dict[name] = copy.deepcopy(self.parents)
        children = self.parent_dict.setdefault(self.parent_list[-1], [])
        if name not in children:
            children.append(name)
        self.parent_list.append(name)

    def _fw_post_hook(self, mod, input, output):  # type: ignore[no-untyped-def]
        try:
            super()._fw_post_hook(mod, input, output)  # parents, and the backward marker on the outputs
        except Exception as exc:  # e.g. a forward that began before the window: parents never had it
            self._fault("compat_module_forward_post", exc)

    def _fw_set_module_hook(self, mod, input, output):  # type: ignore[no-untyped-def]
        try:
            self._exit_forward(mod)
        except Exception as exc:
            self._fault("compat_module_forward_done", exc)

    def _exit_forward(self, mod: torch.nn.Module) -> None:
        """After a module's forward and its own forward hooks (a parallel style's output
        redistribution belongs to the module, as in torch): the parent is current again."""
        name = self._get_mod_name(mod)
        pushed = self._pushed.pop() if self._pushed else False
        self.activation_checkpointing = self.is_bw
        if pushed and not self.activation_checkpointing and len(self.parent_list) > 1:
            self.parent_list.pop()
            self.name = self.parent_list[-1]
        self._report(mod, name, schema.PHASE_FORWARD, enter=False)

    def _hook_module_once(self, mod: torch.nn.Module) -> None:
        """One forward hook per module and window, after the module's own hooks (torch adds
        one per call, which leaks and pops too often when a module runs twice)."""
        key = id(mod)
        entry = self._module_hooks.get(key)
        if entry is not None and entry[0]() is mod:
            return
        handle = mod.register_forward_hook(self._fw_set_module_hook, always_call=True)
        self._module_hooks[key] = (weakref.ref(mod), handle)

    def _bw_hook(self, mod, output):  # type: ignore[no-untyped-def]
        """A module's backward starts: it is the current module (torch's rule: until the next one)."""
        try:
            self.activation_checkpointing = False
            self.name = self._get_mod_name(mod)
        except Exception as exc:
            self._fault("compat_module_backward_pre", exc)

    # --- window ---------------------------------------------------------------------
    def __enter__(self):  # type: ignore[no-untyped-def]
        self.activation_checkpointing = False
        self.module_parameters_dict.clear()
        self.sharding_dict.clear()
        self.parent_dict.clear()
        self.parent_list = [GLOBAL]
        self.module_helper_dict.clear()
        self.module_helper_dict[GLOBAL] = {"depth": 0}
        self.module_parents_dict.clear()
        self.module_parents_dict[GLOBAL] = set()
        self.register_forward_hook_handles.clear()
        self.parents = {GLOBAL}
        self._active_module_cnt = {}
        self._pushed = []
        self._backward_end.reset()
        self.name = GLOBAL
        self._fw_pre_handle = register_module_forward_pre_hook(self._fw_pre_hook)
        self._fw_post_handle = register_module_forward_hook(self._fw_post_hook, always_call=True)
        self._bw_handle = register_module_full_backward_pre_hook(self._bw_hook)
        return self

    def __exit__(self, *args: Any) -> None:
        handles = [getattr(self, n, None) for n in ("_fw_pre_handle", "_fw_post_handle", "_bw_handle")]
        handles += [handle for _, handle in self._module_hooks.values()]
        self._module_hooks = {}
        for handle in handles:  # every one goes, even if removing another failed
            try:
                if handle is not None:
                    handle.remove()
            except Exception:  # pragma: no cover - RemovableHandle.remove does not raise
                pass

    # torch's debugging helpers (its spelling)
    def print_paramater_info(self) -> None:
        print(self.module_parameters_dict)

    def print_sharding_info(self) -> None:
        for key, value in self.sharding_dict.items():
            print(key + ": " + str(value))
