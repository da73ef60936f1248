"""The docs site's pages hold code that runs: includes name files a test runs, fragments parse,
the usage block runs on the quick start's model and returns what its comments say, and the
README's commands and the settings reference stay true to `.ci/run` and the package."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
# An example shown on a page: its file's text, verbatim, under a marker naming the file. Inlined, not
# included at build time (`--8<--`), so the page reads the same on GitHub as on the site (issue 47).
INCLUDED = re.compile(r"^<!-- include: (\S+) -->\n```\w*\n(.*?)^```$", re.S | re.M)


def _blocks(path: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text())]


def _tests_text() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py")


def test_every_shown_example_is_its_file_verbatim_and_no_page_needs_the_site_to_read() -> None:
    """GitHub shows a page's Markdown as it is: a `--8<--` include would show as the marker."""
    shown = 0
    for page in [*PAGES, ROOT / "README.md"]:
        text = page.read_text()
        assert "--8<--" not in text, f"{page}: an include shows as its marker on GitHub; inline the file instead"
        for name, body in INCLUDED.findall(text):
            assert body == (ROOT / name).read_text(), f"{page}: the block under `include: {name}` is not that file"
            shown += 1
    assert shown >= 17


def test_every_included_example_is_run_by_a_test() -> None:
    tests = _tests_text()
    included = {name for page in PAGES for name, _ in INCLUDED.findall(page.read_text())}
    assert included, "no page includes an example"
    for name in sorted(included):
        assert (ROOT / name).is_file(), f"{name} is included but missing"
        stem = Path(name).stem  # examples/x.py, or its printed output examples/output/x.txt
        assert (ROOT / "examples" / f"{stem}.py").is_file(), name
        if stem.startswith("test_"):  # a test itself: pytest collects examples/ (pyproject's testpaths)
            assert (
                "examples"
                in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
            )
            continue
        assert f'"{stem}.py"' in tests or f'"{stem}"' in tests, f"{name} is shown but no test names it"


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_parses(page: Path) -> None:
    for language, code in _blocks(page):
        if language in ("python", "py"):
            ast.parse(code, filename=str(page))


def test_the_usage_block_runs_on_the_quick_start_model_and_returns_what_it_says(tp_mlp, tmp_path, monkeypatch) -> None:
    model, x = tp_mlp
    (code,) = [
        c
        for lang, c in _blocks(ROOT / "docs" / "guide" / "usage.md")
        if c.startswith("from hp_otel import CommDebugMode\n\nwith CommDebugMode(module=model) as mode:")
    ]
    monkeypatch.chdir(tmp_path)  # it writes comm.txt and comm.json
    checked = 0
    namespace = {"model": model, "x": x}
    for statement in ast.parse(code).body:
        line = code.splitlines()[statement.end_lineno - 1]
        source = ast.get_source_segment(code, statement)
        comment = line.split("  # ", 1)[1] if "  # " in line else ""
        if (
            isinstance(statement, ast.Expr)
            and comment
            and "..." not in comment
            and not comment.startswith(("OTel", "alias"))
        ):
            assert eval(source, namespace) == ast.literal_eval(comment), source
            checked += 1
        else:
            exec(compile(ast.Module([statement], []), "usage.md", "exec"), namespace)
    assert checked >= 3
    assert (tmp_path / "comm.txt").is_file() and (tmp_path / "comm.json").is_file()
    with namespace["CommDebugMode"](module=model) as mode:  # the page's table is the same window's
        model(x).sum().backward()
    (shown,) = [c for _, c in _blocks(ROOT / "docs" / "guide" / "usage.md") if c.startswith("Type ")]
    assert shown.rstrip("\n") == mode.generate_comm_debug_tracing_table(noise_level=2)


def test_the_readmes_first_commands_set_up_and_test_as_ci_does() -> None:
    bash = [code for lang, code in _blocks(ROOT / "README.md") if lang == "bash"]
    setup, tests = bash[0].strip(), bash[1].strip()
    # the first command installs what the demo needs, no test extras; the test command installs those itself
    assert "torch==2.13.0" in setup and '".[torch]"' in setup and setup.endswith("hp-otel demo")
    assert '".[torch,test]"' in tests and tests.endswith("python -m pytest -q") and "\n" not in tests
    assert f"({tests})" in (ROOT / ".ci" / "run").read_text().splitlines()  # the same command, verbatim


def test_the_export_page_lists_every_prometheus_label_of_the_collective_metrics() -> None:
    from hp_otel.spans import schema

    page = " ".join((ROOT / "docs" / "guide" / "export.md").read_text().split())
    labels = page[page.index("**Prometheus** names") : page.index("The rank is in `target_info`")]
    # OTel's Prometheus rule: every character outside [a-zA-Z0-9_] becomes `_`
    names = [re.sub(r"[^a-zA-Z0-9_]", "_", key) for key in (*schema.METRIC_ATTRIBUTE_KEYS, schema.ERROR_TYPE)]
    assert [name for name in names if f"`{name}`" not in labels] == []


def test_the_readme_is_200_lines_at_most() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_settings_page_names_every_variable_the_package_reads() -> None:
    read = set()
    for path in (ROOT / "hp_otel").rglob("*.py"):
        read |= set(re.findall(r"\"(HP_OTEL_[A-Z_]+)\"", path.read_text()))
    assert read >= {"HP_OTEL_RUN_ID", "HP_OTEL_TORCH_COLLECTIVE_HOOK"}
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    assert sorted(v for v in read if f"`{v}`" not in page) == []


def test_the_built_site_works_from_disk_without_the_network() -> None:
    """Opened as files, the site's links must name .html files and search must not fetch its
    Web Worker shim from unpkg.com (issue 35 item 6)."""
    config = (ROOT / "mkdocs.yml").read_text()  # read as text: PyYAML is no test dependency
    plugins = config[config.index("\nplugins:\n") :]
    assert re.search(r"(?m)^  - offline$", plugins)
    (shim,) = re.findall(r"(?m)^    - (\S*iframe-worker\S*)", config)
    assert not shim.startswith(("http:", "https:")) and (ROOT / "docs" / shim).is_file()


def test_the_cli_reference_says_where_every_subcommand_is_explained() -> None:
    from hp_otel.cli import COMMANDS

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    where = page[page.index("Where each command is explained") : page.index("<!-- cli-help -->")]
    assert [c.name for c in COMMANDS if f"`{c.name}`" not in where] == []


def test_the_cli_reference_shows_every_subcommands_help() -> None:
    import importlib.util

    from hp_otel.cli import COMMANDS

    spec = importlib.util.spec_from_file_location("cli_help", ROOT / "docs" / "hooks" / "cli_help.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert hook.MARKER in page
    rendered = hook.on_page_markdown(page, page=None)
    for command in COMMANDS:
        assert f"## `hp-otel {command.name}`\n\n```text\nusage: hp-otel {command.name}" in rendered, command.name
