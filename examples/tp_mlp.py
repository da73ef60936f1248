import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

from hp_otel import CommDebugMode


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


# Rank 0 of 2 on torch's fake process group: DTensor issues the collectives a real 2-rank
# step issues, and they return at once (one process, no GPU). Under torchrun on GPUs instead:
# init_process_group("nccl"), torch.cuda.set_device(local_rank), init_device_mesh("cuda", ...), the
# model moved with MLP().cuda() before parallelize_module, x made with device="cuda".
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cpu", (2,))
model = parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
x = torch.randn(4, 16, requires_grad=True)  # as inside a model: the input needs a gradient

with CommDebugMode(module=model) as mode:
    model(x).sum().backward()

print(mode.get_comm_counts(normalized=True))
print(mode.generate_comm_debug_tracing_table(noise_level=3))
dist.destroy_process_group()
