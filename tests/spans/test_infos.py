"""CollectiveInfo's copy with another output shape: the same value `dataclasses.replace` makes."""

from __future__ import annotations

import dataclasses

import pytest

from hp_otel.common.rank_set import RankSet
from hp_otel.spans.infos import CollectiveInfo

pytestmark = pytest.mark.torch_free


def test_with_output_shape_is_replace_without_its_walk() -> None:
    info = CollectiveInfo(
        "_c10d_functional.all_gather_into_tensor", "all_gather", 4, "tp", RankSet.of((0, 1, 2, 3)), (2, 8), (2, 8),
        "f32", 64, "", True, "layers.0", backend="gloo", mesh_dim="tp",
    )  # fmt: skip
    copied = info.with_output_shape((8, 8))
    replaced = dataclasses.replace(info, output_shape=(8, 8))
    assert copied == replaced and hash(copied) == hash(replaced) and type(copied) is CollectiveInfo
    assert vars(copied) == vars(replaced)  # every field, the derived ones included
    assert info.output_shape == (2, 8) and copied is not info  # the original stands
    with pytest.raises(dataclasses.FrozenInstanceError):
        copied.output_shape = (1,)  # type: ignore[misc]
