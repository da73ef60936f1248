"""Where the real hyper-parallel source is, and an independent referee that counts its collectives.

hyper-parallel (github.com/mindspore-ai/hyper-parallel) is not on PyPI: the tests that run
against it find its source tree through `HP_OTEL_HYPER_PARALLEL_SRC` (the folder holding
the `hyper_parallel` package) and skip, saying so, where it is unset.  Nothing of it is
part of this project.

The referee wraps the platform's collective methods and `torch.distributed`'s functions
itself (not through hp_otel), counts outermost calls only (a collective run by another
one is one call), and attributes each call to a phase and to the modules it ran in,
with its own module hooks.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV = "HP_OTEL_HYPER_PARALLEL_SRC"


def source_dir() -> str | None:
    """The hyper-parallel source folder, or None (the tests skip)."""
    path = os.environ.get(ENV)
    if path and (Path(path) / "hyper_parallel" / "__init__.py").is_file():
        return path
    return None


SKIP_REASON = (
    f"hyper-parallel source not found: set {ENV} to a checkout of github.com/mindspore-ai/hyper-parallel "
    "(it is not on PyPI; see docs/guide/engines.md, 'hyper-parallel for real')"
)


class Referee:
    """Counts collectives by wrapping `owner.name` for each given name; restores every attribute exactly."""

    def __init__(self, phase_of: Any = lambda: "forward") -> None:
        self.calls: list[dict[str, Any]] = []
        self._depth = 0
        self._saved: list[tuple[Any, str, Any]] = []
        self._modules: list[str] = []  # forward module stack
        self._backward_modules: list[str] = []
        self._phase_of = phase_of
        self._hooks: list[Any] = []

    def wrap(self, owner: Any, names: list[str], prefix: str = "", group_arg: str = "group") -> None:
        for name in names:
            if name not in vars(owner):
                continue
            saved = vars(owner)[name]
            function = saved.__func__ if isinstance(saved, staticmethod) else saved
            wrapper = self._wrapper(function, prefix + name)
            self._saved.append((owner, name, saved))
            setattr(owner, name, staticmethod(wrapper) if isinstance(saved, staticmethod) else wrapper)

    def _wrapper(self, function: Any, name: str) -> Any:
        @functools.wraps(function)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return function(*args, **kwargs)
            self._depth += 1
            call = {"name": name, "phase": self._phase_of(), "args": args, "kwargs": kwargs, "error": None}
            call["modules"] = tuple(self._backward_modules if call["phase"] == "backward" else self._modules)
            self.calls.append(call)
            try:
                return function(*args, **kwargs)
            except BaseException as error:
                call["error"] = error
                raise
            finally:
                self._depth -= 1

        return counted

    def track_torch_modules(self, model: Any) -> None:
        """Forward: pre/post hooks; backward: full backward pre/post hooks (root named '(root)')."""
        for fqn, module in model.named_modules():
            fqn = fqn or "(root)"
            # prepend: the module is entered before the framework's own pre-hooks (fully_shard all-gathers there)
            self._hooks.append(
                module.register_forward_pre_hook(lambda m, a, f=fqn: self._modules.append(f), prepend=True)
            )
            self._hooks.append(module.register_forward_hook(lambda m, a, o, f=fqn: self._pop(self._modules, f)))
            self._hooks.append(
                module.register_full_backward_pre_hook(
                    lambda m, g, f=fqn: self._backward_modules.append(f), prepend=True
                )
            )
            self._hooks.append(module.register_full_backward_hook(lambda m, gi, go, f=fqn: self._backward_done(gi, f)))

    def _enter_backward(self, fqn: str, module: Any, grad_output: Any) -> None:
        self._backward_modules.append(fqn)

    def _backward_done(self, grad_input: Any, fqn: str) -> None:
        # A module none of whose inputs needs a gradient gets this hook at once, before its backward ran:
        # its backward lasts until the pass ends (the stack is dropped by `end_backward`).
        if any(g is not None for g in grad_input):
            self._pop(self._backward_modules, fqn)

    def end_backward(self) -> None:
        self._backward_modules.clear()

    @staticmethod
    def _pop(stack: list[str], fqn: str) -> None:
        if fqn in stack:
            del stack[len(stack) - 1 - stack[::-1].index(fqn)]

    def restore(self) -> None:
        for hook in self._hooks:
            hook.remove()
        for owner, name, saved in reversed(self._saved):
            type.__setattr__(owner, name, saved) if isinstance(owner, type) else setattr(owner, name, saved)
        self._saved.clear()

    def counts(self, phase: str | None = None) -> dict[str, int]:
        return dict(Counter(c["name"] for c in self.calls if phase is None or c["phase"] == phase))

    def module_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        out: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        for call in self.calls:
            for fqn in dict.fromkeys(call["modules"]):
                out[fqn][call["phase"]][call["name"]] += 1
        return {m: {p: dict(c) for p, c in phases.items()} for m, phases in out.items()}

    def clear(self) -> None:
        self.calls.clear()


@contextlib.contextmanager
def refereed(referee: Referee) -> Iterator[Referee]:
    try:
        yield referee
    finally:
        referee.restore()
