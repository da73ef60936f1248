"""Issue 41 item 3: a window writes its forward hooks straight into each module's hook dicts
(no RemovableHandle per hook), in the places the public API would put them, and takes exactly
those out again; a class that overrides the registration, or a torch without the dicts, goes
through the public API."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import modules


@pytest.fixture(autouse=True)
def _nothing_kept():
    hp_otel.uninstall()
    yield
    hp_otel.uninstall()


def _dicts(model: nn.Module) -> list[tuple[dict, dict, dict]]:
    return [
        (dict(m._forward_pre_hooks), dict(m._forward_hooks), dict(m._forward_hooks_always_called))
        for m in model.modules()
    ]


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))


def test_ours_run_first_and_last_around_the_users_hooks_and_leave_them_exactly() -> None:
    model = _model()
    calls: list[str] = []
    model[0].register_forward_pre_hook(lambda m, a: calls.append("user pre"))
    model[0].register_forward_hook(lambda m, a, o: calls.append("user post"))
    before = _dicts(model)
    with CommDebugMode(module=model):
        pre = list(model[0]._forward_pre_hooks.values())
        post = list(model[0]._forward_hooks.values())
        assert pre[0].__self__.fqn == "0" and pre[0].__name__ == "forward_pre"
        assert post[-1].__self__.fqn == "0" and post[-1].__name__ == "forward_post"
        post_id = list(model[0]._forward_hooks)[-1]
        assert model[0]._forward_hooks_always_called[post_id] is True
        # a hook the user registers during the window gets an id of its own: removing ours leaves it
        handle = model[0].register_forward_hook(lambda m, a, o: calls.append("late post"))
        assert handle.id not in (post_id, post_id - 1)
        model(torch.ones(1, 4))
    assert calls == ["user pre", "user post", "late post"]
    handle.remove()
    assert _dicts(model) == before


def test_the_post_hook_runs_when_forward_raises() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = nn.Sequential(nn.Linear(4, 4), Boom())
    seen: list[str] = []
    original = modules._TrackedModule.forward_post

    def spy(self, module, args, output):  # type: ignore[no-untyped-def]
        seen.append(self.fqn)
        return original(self, module, args, output)

    modules._TrackedModule.forward_post = spy  # type: ignore[method-assign]
    try:
        with CommDebugMode(module=model), pytest.raises(RuntimeError, match="boom"):
            model(torch.ones(1, 4))
    finally:
        modules._TrackedModule.forward_post = original  # type: ignore[method-assign]
    assert "1" in seen  # always_call: Boom's post-hook ran although its forward raised


def test_a_class_overriding_the_registration_is_registered_through_it() -> None:
    registered: list[str] = []

    class Custom(nn.Linear):
        def register_forward_pre_hook(self, hook, **kwargs):  # type: ignore[no-untyped-def]
            registered.append("pre")
            return super().register_forward_pre_hook(hook, **kwargs)

        def register_forward_hook(self, hook, **kwargs):  # type: ignore[no-untyped-def]
            registered.append("post")
            return super().register_forward_hook(hook, **kwargs)

    model = nn.Sequential(nn.Linear(4, 4), Custom(4, 4))
    before = _dicts(model)
    with CommDebugMode(module=model):
        assert len(model[1]._forward_pre_hooks) == 1 and len(model[0]._forward_pre_hooks) == 1
        model(torch.ones(1, 4))
    assert registered == ["pre", "post"]
    assert _dicts(model) == before


def test_without_the_dicts_hooks_go_through_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modules, "_hook_dicts", None)
    model = _model()
    before = _dicts(model)
    with CommDebugMode(module=model) as mode:
        model(torch.ones(1, 4))
        assert all(len(m._forward_pre_hooks) == 1 for m in model.modules())
    assert _dicts(model) == before
    assert mode.get_total_counts() == 0


def test_windows_one_after_another_reuse_the_hooks_description_and_leave_nothing() -> None:
    model = _model()
    before = _dicts(model)
    for _ in range(3):
        with CommDebugMode(module=model):
            model(torch.ones(1, 4)).sum().backward()
            assert all(len(m._forward_pre_hooks) == 1 and len(m._forward_hooks) == 1 for m in model.modules())
        assert _dicts(model) == before


def test_kept_hooks_stay_until_uninstall_then_leave_exactly() -> None:
    model = _model()
    before = _dicts(model)
    hp_otel.install()
    with CommDebugMode(module=model):
        model(torch.ones(1, 4))
    assert all(len(m._forward_pre_hooks) == 1 for m in model.modules())
    hp_otel.uninstall()
    assert _dicts(model) == before


def _save_and_load(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


_COPIES = {
    "torch.save": _save_and_load,
    "pickle": lambda model: pickle.loads(pickle.dumps(model)),
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("how", list(_COPIES))
@pytest.mark.parametrize("inside_a_window", [False, True])
def test_a_model_with_kept_hooks_can_be_saved_and_copied(how: str, inside_a_window: bool) -> None:
    """Kept hooks hold weak references and the window's books: a copy's hooks are no window's and
    take themselves out at the copy's first call; the model's own stay and still record."""
    model = _model()
    x = torch.ones(1, 4)
    before = _dicts(model)
    hp_otel.install()
    with CommDebugMode(module=model):
        model(x)
    kept = _dicts(model)
    with CommDebugMode(module=model):
        copied = _COPIES[how](model) if inside_a_window else None
        model(x)
    copied = copied if copied is not None else _COPIES[how](model)
    assert [tuple(map(len, d)) for d in _dicts(copied)] == [tuple(map(len, d)) for d in kept]
    with CommDebugMode(module=model) as mode:
        torch.testing.assert_close(copied(x), model(x))
    # one span per module of the model: the copy's calls recorded nothing
    assert sorted(span.name for span in mode.get_finished_spans()) == ["0", "1", "2", "Sequential"]
    assert _dicts(copied) == before  # nothing of ours left on the copy after its first call
    assert _dicts(model) == kept  # the model's own hooks stay as they were
    hp_otel.uninstall()
    assert _dicts(model) == before
