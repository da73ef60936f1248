"""A training script with children, run under `opentelemetry-instrument` by tests/always_on/test_zero_code_children.py.

DataLoader workers forked from the instrumented rank (`num_workers=2`, the `fork` start method), and
a `multiprocessing` spawn child that imports torch (as its parent's main module does). Prints one
JSON line: what the parent recorded and served, and each child's exit code.
"""

import logging

logging.basicConfig(level=logging.INFO, format="%(process)d %(name)s %(levelname)s %(message)s")

import json  # noqa: E402 (logging first: a spawn child logs while it imports this module)
import multiprocessing  # noqa: E402
import os  # noqa: E402
import urllib.request  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def spawned(queue: "multiprocessing.Queue[int]") -> None:
    queue.put(os.getpid())


def main() -> None:
    from hp_otel.always_on.instrumentation import active_session
    from hp_otel.export import telemetry

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{os.environ['STORE_PORT']}", rank=0, world_size=1
    )
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.ones(16, 4))
    loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for (batch,) in loader:
        model(batch).sum().backward()
        torch.distributed.all_reduce(model.weight.grad)  # one collective per step, in the step's window
        optimizer.step()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=spawned, args=(queue,))
    child.start()
    child_pid = queue.get(timeout=120)
    child.join(120)
    configured = telemetry.configured()
    port = configured.prometheus_port if configured else None
    served = ""
    if port is not None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            served = response.read().decode()
    session = active_session()
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "steps": session.implicit_steps if session else 0,
                "port": port,
                "calls": [line for line in served.splitlines() if line.startswith("hp_otel_collective_calls_total{")],
                "spawned": {"pid": child_pid, "exitcode": child.exitcode},
            }
        )
    )


if __name__ == "__main__":
    main()
    torch.distributed.destroy_process_group()
