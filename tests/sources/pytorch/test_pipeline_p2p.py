"""Point-to-point and pipeline parallel on 2 gloo ranks: every send and receive counted,
with peer rank, tag and bytes, against the referee's dispatch-mode count."""

from __future__ import annotations

import json

import p2p_workers
import pytest
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes


def test_every_point_to_point_path(tmp_path) -> None:
    mp.spawn(p2p_workers.p2p_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"p2p_rank{rank}.json").read_text())
        assert seen["ours"] == seen["referee"]
        first = "send" if rank == 0 else "recv_"
        assert seen["ours"] == {
            f"c10d.{first}": 1,  # isend / irecv
            "c10d.send": 2 if rank == 0 else 1,  # batch_isend_irecv: one send, one receive
            "c10d.recv_": 2 if rank == 1 else 1,
            "_c10d_functional.isend" if rank == 0 else "_c10d_functional.irecv": 1,
            "_c10d_functional.batch_p2p_ops": 1,
        }
        # torch's CommDebugMode counts none of them
        assert not set(seen["torch"]) & {"c10d.send", "c10d.recv_", "_c10d_functional.isend", "_c10d_functional.irecv"}
        peer = 1 - rank
        for name, peers, tags, nbytes in seen["spans"]:
            assert set(peers) == {peer}, name
            assert all(7 <= tag <= 10 for tag in tags), name
            assert nbytes == 4 * 2 * 4 * len(peers), name
        print(f"rank {rank}:", seen)


def test_pipelining_two_stage_schedule(tmp_path) -> None:
    mp.spawn(p2p_workers.pipeline_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"pipeline_rank{rank}.json").read_text())
        assert seen["ours_by_name"] == seen["referee"]
        # 4 microbatches: activations forward (0 -> 1), gradients backward (1 -> 0)
        assert seen["ours"] == {"send": 4, "recv": 4}
        assert seen["peers"] == [1 - rank]
        assert seen["bytes"] == [2 * 16 * 4]  # one microbatch of (2, 16) float32
        print(f"rank {rank}:", seen)
