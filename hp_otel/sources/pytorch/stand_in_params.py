"""Parameters a module holds only through a tensor made from them.

`replicate(model, device_mesh=dp)` on a tensor-parallel model replaces each DTensor parameter
with a local `nn.Parameter` that DDP reduces, and at each forward sets the module's attribute to
a DTensor made from it by `DTensor.from_local` (torch's `_pre_dp_module_transform` before `DDP`
makes the same swap; untested here): the local Parameter is in no module's `_parameters`, yet the
bucket all_reduce runs in its AccumulateGrad.  Its owner is the module whose attribute was made
from it: the attribute's autograd node leads straight to the Parameter's AccumulateGrad (public
autograd attributes, whatever made the attribute).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def stand_in_parameters(module: nn.Module) -> Iterator[nn.Parameter]:
    """The Parameters behind `module`'s plain tensor attributes (not its registered parameters or
    buffers) that were made from them by one differentiable op (`DTensor.from_local`)."""
    for value in vars(module).values():
        if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
            continue
        node = value.grad_fn
        if node is None:
            continue
        for source, _ in node.next_functions:
            variable = getattr(source, "variable", None)  # an AccumulateGrad node's leaf
            if isinstance(variable, nn.Parameter):
                yield variable
