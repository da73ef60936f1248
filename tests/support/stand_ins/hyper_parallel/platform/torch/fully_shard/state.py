"""`TorchHSDPStateV2`: the torch platform's state (the real `platform/torch/fully_shard/state.py`).

As the real one: `post_backward()` first applies the reductions still pending from earlier
modules (`reduce_params`), then reduce-scatters each parameter's gradient
(`torch.distributed.reduce_scatter_tensor`, async, AVG) and queues it, then reshards.
"""

from __future__ import annotations

from typing import ClassVar

from hyper_parallel.core.fully_shard.hsdp_state import HSDPState


class TorchHSDPStateV2(HSDPState):
    pre_reduce_scatter_params: ClassVar[list] = []  # shared by every state, as the real one

    def post_backward(self, *unused: object) -> None:
        self.reduce_params()
        for hsdp_param in self.hsdp_params:
            if hsdp_param.param.grad is None:
                continue
            hsdp_param.reduce_scatter_grad()
            TorchHSDPStateV2.pre_reduce_scatter_params.append(hsdp_param)
        self.shard()

    def reduce_params(self) -> None:
        """Wait for the queued reduce-scatters (the stand-in keeps the full gradient it computed)."""
        while TorchHSDPStateV2.pre_reduce_scatter_params:
            hsdp_param = TorchHSDPStateV2.pre_reduce_scatter_params.pop(0)
            if hsdp_param.reduce_scatter_handle is not None:
                hsdp_param.reduce_scatter_handle.wait()
                hsdp_param.reduce_scatter_handle = None
