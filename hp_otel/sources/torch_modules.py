"""Module tracking for torch `nn.Module`, forward and backward.

Forward: a pre-hook registered first (it sees the inputs before parallel-style input
hooks convert them) and a post-hook registered last with `always_call=True` (it sees
the module's final output, and runs when forward raises).  Backward: the post-hook
puts a grad hook on the outputs (the module's backward starts when their gradients
arrive) and the pre-hook one on the inputs (it ends when the input gradients are
done); spans left open — inputs that need no gradient — close when the autograd pass
ends.  Names are `named_modules()` names, the root is "(root)".
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils.hooks import RemovableHandle

from hp_otel import schema as s
from hp_otel.infos import ModuleInfo, ParameterInfo
from hp_otel.observer import Observer
from hp_otel.sources.torch_tensors import dtype_name, placements_str


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
    identity = tuple(map(id, module._parameters.values()))
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
                placements=placements_str(tuple(placements)) if placements is not None else "",
            )
        )
    _param_cache[module] = (identity, tuple(infos))
    return tuple(infos)


class _TrackedModule:
    """Hooks for one module; they report to the observer only while the tracker is installed."""

    def __init__(self, tracker: TorchModuleTracker, fqn: str, module: nn.Module) -> None:
        self.tracker = tracker
        self.fqn = fqn or s.ROOT_MODULE_FQN
        self.info = ModuleInfo(
            self.fqn, fqn or type(module).__name__, type(module).__qualname__, parameter_infos(module)
        )

    def forward_pre(self, module: nn.Module, args: Any) -> None:
        observer = self.tracker.observer
        if observer is None or not observer.accepting:
            return
        observer.on_module_enter(self.info, s.PHASE_FORWARD)
        try:
            if torch.is_grad_enabled():
                inputs = _grad_tensors(args)
                if inputs:
                    self.tracker.add_grad_hook(inputs, self.backward_done)
        except Exception as exc:
            observer.on_fault("module_forward_pre", exc)

    def forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        observer = self.tracker.observer
        if observer is None or not observer.accepting:
            return
        error = sys.exc_info()[1]  # set when forward raised (always_call hooks run in its except block)
        observer.on_module_exit(self.fqn, s.PHASE_FORWARD, error)
        if error is not None:
            return
        try:
            if torch.is_grad_enabled():
                outputs = _grad_tensors(output)
                if outputs:
                    self.tracker.add_grad_hook(outputs, self.backward_start)
        except Exception as exc:
            observer.on_fault("module_forward_post", exc)

    def backward_start(self) -> None:
        observer = self.tracker.observer
        if observer is None or not observer.accepting:
            return
        observer.on_module_enter(self.info, s.PHASE_BACKWARD)
        try:
            self.tracker.close_at_backward_end()
        except Exception as exc:
            observer.on_fault("module_backward_start", exc)

    def backward_done(self) -> None:
        observer = self.tracker.observer
        if observer is not None and observer.accepting:
            observer.on_module_exit(self.fqn, s.PHASE_BACKWARD)


class TorchModuleTracker:
    """Source of module enter/exit events for one `nn.Module` tree."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.observer: Observer | None = None
        self._handles: list[RemovableHandle] = []
        # Grad hooks live on tensors: those on tensors that outlive a step (leaves such as
        # the batch or the parameters) are removed when the backward pass ends and on
        # uninstall, so they never pile up; the others go away with the autograd graph.
        self._grad_handles: list[RemovableHandle] = []
        # id(tensor) -> (weak ref, callbacks): tensors compare elementwise, so no WeakKeyDictionary
        self._tensor_callbacks: dict[int, tuple[weakref.ref[torch.Tensor], list[Any]]] = {}
        self._backward_end_queued = False

    def install(self, observer: Observer) -> None:
        self.observer = observer
        self._backward_end_queued = False
        for fqn, module in self.root.named_modules():
            tracked = _TrackedModule(self, fqn, module)
            self._handles.append(module.register_forward_pre_hook(tracked.forward_pre, prepend=True))
            self._handles.append(module.register_forward_hook(tracked.forward_post, always_call=True))

    def uninstall(self) -> None:
        self.observer = None
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._remove_grad_hooks()

    def add_grad_hook(self, tensors: list[torch.Tensor], callback: Any) -> None:
        """Run `callback()` once, when the first gradient of `tensors` arrives.

        Nested modules often share a tensor (the root's output is fc2's output; fc1's
        input is the root's input).  One hook per tensor runs the callbacks in reverse
        order of registration, so the outer module's backward opens first and the inner
        one's closes first whatever order autograd keeps for same-tensor hooks.
        """
        if len(tensors) != 1:
            with torch._C.DisableTorchFunction():  # our own tensor calls are not the user's ops
                self._grad_handles.append(
                    register_multi_grad_hook(tensors, lambda grads: self._run_safely(callback), mode="any")
                )
            return
        tensor = tensors[0]
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

        with torch._C.DisableTorchFunction():
            handle = tensor.register_hook(hook)
        if tensor.grad_fn is None:  # a leaf outlives the step: remove its hook after backward
            self._grad_handles.append(handle)

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
        if self._backward_end_queued:
            return
        self._backward_end_queued = True

        def backward_end() -> None:
            self._backward_end_queued = False
            observer = self.observer
            if observer is not None:
                observer.on_backward_end()
                try:
                    self._remove_grad_hooks()
                except Exception as exc:
                    observer.on_fault("module_grad_hook_cleanup", exc)

        torch.autograd.Variable._execution_engine.queue_callback(backward_end)
