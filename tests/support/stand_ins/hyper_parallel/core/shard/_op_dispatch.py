"""OpDispatcher: every op on a DTensor goes through `_OP_DISPATCHER.dispatch(op_call, args, kwargs)`.

Releases after the snapshot have the `_debug_mode_observer` slot: its observer's
`on_op_dispatch_enter` runs at entry and `on_op_dispatch_exit` in a `finally`.
dispatch() itself never redistributes.  Layout rules cover what the tests' MLP needs
(linear colwise/rowwise, elementwise activations, sum of a replicated tensor); other
ops raise NotImplementedError.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
import torch.nn.functional as F

from hyper_parallel._release import HAS_OBSERVER_SLOT
from hyper_parallel.core.dtensor.placement_types import Partial, Replicate, Shard
from hyper_parallel.platform import get_platform

if HAS_OBSERVER_SLOT:
    _debug_mode_observer: ContextVar = ContextVar("_debug_mode_observer", default=None)

# Ops that bypass layout inference: run on the local tensor, keep the layout.
_WHITELIST = frozenset({"requires_grad_", "detach", "clone", "contiguous"})
_ELEMENTWISE = frozenset({"gelu", "relu", "silu", "tanh"})


def _unwrap(value):
    from hyper_parallel.core.dtensor.dtensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


class OpDispatcher:
    def dispatch(self, op_call, args, kwargs):
        op_name = get_platform().get_op_name(op_call)
        observer = _debug_mode_observer.get() if HAS_OBSERVER_SLOT else None
        if observer is not None:
            observer.on_op_dispatch_enter(op_name, op_call, args, kwargs)
        result = None
        try:
            result = self._dispatch(op_name, op_call, args, kwargs or {})
            return result
        finally:
            if observer is not None:
                observer.on_op_dispatch_exit(op_name, result)

    def _dispatch(self, op_name, op_call, args, kwargs):
        from hyper_parallel.core.dtensor.dtensor import DTensor

        if op_name in _WHITELIST:
            out = op_call(*_unwrap(args), **_unwrap(kwargs))
            src = args[0]
            return DTensor(out, src.device_mesh, src.placements, src.shape) if isinstance(out, torch.Tensor) else out
        if op_name == "linear":
            return self._linear(*args, **kwargs)
        if op_name in _ELEMENTWISE:
            x = args[0]
            if any(isinstance(p, Partial) for p in x.placements):
                raise NotImplementedError(f"{op_name} of a Partial DTensor")
            out = op_call(x.to_local(), *args[1:], **kwargs)
            return DTensor(out, x.device_mesh, x.placements, x.shape)
        if op_name == "sum" and len(args) == 1 and not kwargs:
            x = args[0]
            if not all(isinstance(p, Replicate) for p in x.placements):
                raise NotImplementedError("sum of a non-replicated DTensor")
            return DTensor(op_call(x.to_local()), x.device_mesh, x.placements, torch.Size(()))
        raise NotImplementedError(f"the hyper_parallel stand-in has no layout rule for op {op_name!r}")

    @staticmethod
    def _linear(input, weight, bias=None):
        from hyper_parallel.core.dtensor.dtensor import DTensor

        mesh = weight.device_mesh
        (x_place,), (w_place,) = input.placements, weight.placements
        global_shape = torch.Size((*input.shape[:-1], weight.shape[0]))
        last = len(input.shape) - 1
        local_bias = bias.to_local() if isinstance(bias, DTensor) else bias
        if isinstance(x_place, Replicate) and isinstance(w_place, Shard) and w_place.dim == 0:
            out, placement = F.linear(input.to_local(), weight.to_local(), local_bias), Shard(last)
        elif isinstance(x_place, Shard) and x_place.dim == last and isinstance(w_place, Shard) and w_place.dim == 1:
            if mesh.get_local_rank() != 0:
                local_bias = None  # the bias is added once to the partial sums
            out, placement = F.linear(input.to_local(), weight.to_local(), local_bias), Partial("sum")
        elif isinstance(x_place, Replicate) and isinstance(w_place, Replicate):
            out, placement = F.linear(input.to_local(), weight.to_local(), local_bias), Replicate()
        else:
            raise NotImplementedError(f"linear with input {x_place} and weight {w_place}")
        return DTensor(out, mesh, (placement,), global_shape)


_OP_DISPATCHER = OpDispatcher()
