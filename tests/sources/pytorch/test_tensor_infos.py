"""tensors.tensor_info: a plain tensor's cached info is always its own shape and dtype."""

from __future__ import annotations

import torch

from hp_otel.sources.pytorch import tensors
from hp_otel.spans.infos import TensorInfo


def test_plain_tensors_get_their_own_shape_and_dtype_every_time() -> None:
    cases = [
        torch.zeros(4, 16),
        torch.zeros(4, 16, dtype=torch.bfloat16),  # same shape, another dtype
        torch.zeros(16, 4),  # same numel, another shape
        torch.zeros(4, 16),  # a repeat: the cached info
        torch.zeros(()),
        torch.zeros(0, 3, dtype=torch.int64),
    ]
    got = [tensors.tensor_info(t) for t in cases]
    assert got == [
        TensorInfo(shape=(4, 16), dtype="torch.float32"),
        TensorInfo(shape=(4, 16), dtype="torch.bfloat16"),
        TensorInfo(shape=(16, 4), dtype="torch.float32"),
        TensorInfo(shape=(4, 16), dtype="torch.float32"),
        TensorInfo(shape=(), dtype="torch.float32"),
        TensorInfo(shape=(0, 3), dtype="torch.int64"),
    ]
    assert all(type(d) is int for info in got for d in info.shape)  # plain ints, not a torch.Size
    assert all(type(info.shape) is tuple for info in got)


def test_a_tensor_changed_in_place_gets_its_new_shape() -> None:
    t = torch.zeros(2, 3)
    assert tensors.tensor_info(t).shape == (2, 3)
    t.resize_(3, 5)
    assert tensors.tensor_info(t) == TensorInfo(shape=(3, 5), dtype="torch.float32")


def test_the_plain_cache_stays_bounded() -> None:
    for n in range(tensors._PLAIN_CACHE_LIMIT + 10):
        tensors.tensor_info(torch.empty(n, 0))
    assert len(tensors._plain_infos) <= tensors._PLAIN_CACHE_LIMIT
    assert tensors.tensor_info(torch.empty(7, 0)).shape == (7, 0)
