"""MindSpore without hyper-parallel: trace a Cell that all-reduces its output, on CPU over mccl.

Run with two workers:
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True examples/mindspore_allreduce.py
or by environment: one `MS_ROLE=MS_SCHED` process and two `MS_ROLE=MS_WORKER MS_NODE_ID=<i>`
processes, all with `MS_SCHED_HOST=127.0.0.1 MS_SCHED_PORT=<port> MS_WORKER_NUM=2`.
"""

from __future__ import annotations

import os

import numpy as np
from mindspore import Tensor, mint, nn
from mindspore.communication import get_rank, init

from hp_otel import CommDebugMode


class RowParallelDense(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(8, 4, has_bias=False)

    def construct(self, x):
        y = self.dense(x)
        mint.distributed.all_reduce(y)  # sum the partial outputs of every worker
        return y


class Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = RowParallelDense()

    def construct(self, x):
        return self.fc2(self.fc1(x))


def main() -> None:
    init()  # picks mccl on CPU
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    net = Net()
    with CommDebugMode(module=net) as mode:  # a Cell: the MindSpore engine
        net(Tensor(np.ones((2, 4), np.float32)))
        handle = mint.distributed.all_reduce(Tensor(np.ones((3,), np.float32)), async_op=True)
        handle.wait()  # an async collective is reported when it is waited for
    if get_rank() == 0:
        print(mode.get_comm_counts())  # {'mint.distributed.all_reduce': 2}
        print(mode.get_comm_module_counts())  # fc2 forward: 1
        print(mode.generate_comm_debug_tracing_table(noise_level=2))


if __name__ == "__main__":
    main()
