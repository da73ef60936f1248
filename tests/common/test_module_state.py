"""Process-wide mutable state in the package is a reviewed list, not an accident.

A module-level dict, list or set outside `cli/` is either a constant table that should be
read-only (a `MappingProxyType`, tuple or frozenset), a bounded cache, a registry of what
hp_otel patched or installed (restored exactly by `uninstall()`), or thread-local state.
This test finds every one and fails on a container that is not listed here with its
reason, and on a listed one that is gone (so the list stays true).
"""

from __future__ import annotations

import ast
from pathlib import Path

import hp_otel

_PACKAGE = Path(hp_otel.__file__).parent
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "local"}
_MUTABLE_CALLS |= {"WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}

CACHE = "a cache, bounded where its keys can grow (cleared at a limit) or keyed by a fixed set"
INSTALLED = "what hp_otel patched, registered or installed in this process: uninstall() restores it"
THREAD = "per-thread state (threading.local)"
ONCE = "what this process was told or did once"
TODO_FROZEN = "a constant table in a module being rewritten on a branch: to be made read-only after it lands"

REVIEWED: dict[str, str] = {
    "always_on/steps.py:_root_tracers": CACHE + " (weak: one per provider)",
    "common/env_read.py:_keys": CACHE + " (one entry per variable name read)",
    "common/env_read.py:_values": CACHE + " (one entry per variable name read)",
    "common/said_once.py:_said": ONCE + " (said_once: the package's one record of messages said)",
    "export/prometheus_sd.py:_written": ONCE + " (the SD files this process wrote, removed at exit)",
    "export/secrets.py:_installed": INSTALLED + " (log redaction filters)",
    "mode/registry.py:thread_state": THREAD + " (the windows open on this thread)",
    "mode/registry.py:traced_modules": INSTALLED + " (modules a window claimed)",
    "record/call_stack.py:_modules": CACHE + " (one entry per source file seen)",
    "record/call_stack.py:_shared": CACHE + " (one call-stack capturer per depth and skipped packages)",
    "record/installation.py:_holders": INSTALLED,
    "record/installation.py:_lingering": INSTALLED,
    "record/installation.py:_uninstalls": INSTALLED + " (how many uninstall() calls: a generation count)",
    "record/matching.py:_step_traces": CACHE + " (trace id -> step of the latest steps, oldest dropped)",
    "record/span_builder.py:_HANDLERS": TODO_FROZEN,
    "record/span_store.py:_CODES": TODO_FROZEN,
    "record/span_store.py:_FLAGS": TODO_FROZEN,
    "record/span_store.py:_KINDS": TODO_FROZEN,
    "render/table.py:_label_cache": CACHE,
    "sources/__init__.py:_spec_cache": CACHE,
    "sources/function_collectives.py:_inside": THREAD + " (a function collective is being recorded)",
    "sources/hyper_parallel.py:_torch_graph_task_id": CACHE + " (one slot: the graph task being recorded)",
    "sources/pytorch/_compat.py:_missing": CACHE + " (the torch symbols found missing, one entry each)",
    "sources/pytorch/collectives.py:_groups": CACHE + " (one entry per process group, dropped with the group)",
    "sources/pytorch/compile_wrappers.py:_found": CACHE + " (one slot: the wrappers found)",
    "sources/pytorch/deepspeed.py:_attached": INSTALLED,
    "sources/pytorch/deepspeed.py:_infos": CACHE,
    "sources/pytorch/dtensor.py:_parked_modes": INSTALLED,
    "sources/pytorch/dtensor.py:_wrappers": INSTALLED,
    "sources/pytorch/fsdp.py:_namers": INSTALLED,
    "sources/pytorch/fsdp.py:_wrappers": INSTALLED,
    "sources/pytorch/kernels.py:_depth": THREAD + " (a collective of this thread is being recorded)",
    "sources/pytorch/kernels.py:_kernels": CACHE + " (one kernel per collective op)",
    "sources/pytorch/kernels.py:_libraries": INSTALLED + " (the dispatcher libraries the kernels are on)",
    "sources/pytorch/kernels.py:_planned_for": CACHE + " (one plan per collective spec set)",
    "sources/pytorch/modules.py:_hidden": ONCE + " (the hooks were hidden from dynamo)",
    "sources/pytorch/modules.py:_hook_sets": INSTALLED + " (weak: hooks per module)",
    "sources/pytorch/modules.py:_param_cache": CACHE + " (weak: one entry per module)",
    "sources/pytorch/modules.py:_registrations": INSTALLED,
    "sources/pytorch/modules.py:_watching": INSTALLED,
    "sources/pytorch/native/__init__.py:_loaded": ONCE + " (an extension module loads once per process)",
    "sources/pytorch/op_hook.py:_NO_KWARGS": "never written: a hot call's empty **kwargs (a dict unpacks fastest)",
    "sources/pytorch/optimizer.py:_attached": INSTALLED,
    "sources/pytorch/optimizer.py:_infos": CACHE,
    "sources/pytorch/optimizer.py:_registered": INSTALLED,
    "sources/pytorch/tensors.py:_dtype_names": CACHE + " (one entry per dtype)",
    "sources/pytorch/tensors.py:_plain_infos": CACHE,
    "sources/pytorch/tensors.py:_spec_infos": CACHE,
    "sources/pytorch/waits.py:_wrappers": INSTALLED,
    "spans/codec.py:_decoded": CACHE,
    "spans/codec.py:_placements_texts": CACHE,
    "spans/codec.py:_module_attrs": CACHE,
    "spans/codec.py:_op_attrs": CACHE,
    "spans/codec.py:_redistribute_attrs": CACHE,
    "spans/codec.py:_shared_by_values": CACHE + " (the shared encodings by their values tuple)",
    "testing/snapshots.py:_session": "the pytest plugin's session option (--hp-otel-update-snapshots)",
    "testing/snapshots.py:written": "the snapshots this test session wrote, listed by the plugin at its end",
}


def _is_mutable(value: ast.expr) -> bool:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in _MUTABLE_CALLS
    return False


def _module_level_containers() -> set[str]:
    found = set()
    for path in sorted(_PACKAGE.rglob("*.py")):
        relative = path.relative_to(_PACKAGE)
        if relative.parts[0] == "cli":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id != "__all__" and _is_mutable(value):
                found.add(f"{relative.as_posix()}:{target.id}")
    return found


def test_every_module_level_container_is_reviewed() -> None:
    unreviewed = sorted(_module_level_containers() - REVIEWED.keys())
    assert not unreviewed, (
        f"module-level mutable containers not reviewed: {unreviewed}; make a constant table read-only "
        "(MappingProxyType, tuple, frozenset) or list the container in REVIEWED with why it is process-wide"
    )


def test_the_reviewed_list_is_true() -> None:
    gone = sorted(REVIEWED.keys() - _module_level_containers())
    assert not gone, f"REVIEWED lists containers that are no longer there: {gone}"


def test_the_check_sees_a_planted_container(tmp_path: Path) -> None:
    source = "TABLE = {'a': 1}\nFROZEN = MappingProxyType({'a': 1})\nNAMES = ('a',)\nseen = set()\n"
    tree = ast.parse(source)
    mutable = [node.targets[0].id for node in tree.body if _is_mutable(node.value)]  # type: ignore[attr-defined]
    assert mutable == ["TABLE", "seen"]
