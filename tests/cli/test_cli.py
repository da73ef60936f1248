"""The hp-otel command: demo (a real 2-process gloo run), render, the registry (the benchmarks are
`python -m benchmarks`, tests/bench/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hp_otel.cli import main

ROOT = Path(__file__).resolve().parents[2]  # the repository: `python -m benchmarks` runs from here


def _hp_otel(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    result = _hp_otel("demo", "--out", str(out))
    return out, result


@pytest.mark.multiprocess  # a real 2-process gloo demo
def test_demo_prints_counts_and_table_and_writes_files(demo_run) -> None:
    out, result = demo_run
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "ran a 2-layer MLP, tensor parallel (fc1 ColwiseParallel, fc2 RowwiseParallel) on 2 CPU ranks "
        "(gloo), 1 training step (forward + backward)",
        # the normalised op first, torch's own name after it (issue 47)
        "collectives on rank 0: {'all_reduce': 2} (torch's names: {'_c10d_functional.all_reduce': 2})",
    ]
    assert "  fc1: backward {'all_reduce': 1}" in lines
    assert "collectives seen through torch's kernels hook (HP_OTEL_TORCH_COLLECTIVE_HOOK=dispatch|kernels)" in lines
    # one table, at the default noise level (3, as `render`'s), with a heading that says what it shows
    assert [line for line in lines if line.startswith("Type ")] == ["Type                 Detail"]
    assert (
        "rank 0's table, noise level 3 of 0-3: modules (forward, then backward), DTensor ops, redistributes, "
        "collectives with bytes and bandwidth"
    ) in lines
    assert "Module((root)) [enter]" in result.stdout
    assert "Collective(_c10d_functional.all_reduce) group_size=2" in result.stdout
    assert " busbw=" in result.stdout and "communication: comm " in result.stdout
    # the words it uses, said once, bandwidth said to include waiting
    terms = lines[lines.index("terms:") + 1 :][:3]
    assert [t.split(":")[0].strip() for t in terms] == ["exposed", "overlapped", "busbw/algbw"]
    assert "includes waiting for the other rank" in terms[2]
    assert lines[-1] == (
        f"next: hp-otel plot {out}/spans_rank*.json -o {out}/timeline.html  (both ranks on one time axis; "
        f"open it in a browser), or hp-otel ranks {out}/spans_rank*.json (the ranks compared)"
    )
    for rank in (0, 1):
        dump = json.loads((out / f"comm_rank{rank}.json").read_text())
        assert dump["total_counts"] == 2
        spans = json.loads((out / f"spans_rank{rank}.json").read_text())
        assert spans["resourceSpans"][0]["scopeSpans"][0]["scope"]["name"] == "hp_otel"


@pytest.mark.multiprocess  # reads the demo's files
def test_the_demos_next_commands_and_diff_run_on_its_folder(demo_run, tmp_path, capsys) -> None:
    """What the demo's last line says to run works as written (the shell expands the glob), and
    `hp-otel diff` takes its folder (a spans file and a JSON dump per rank, issue 47)."""
    import glob

    out, result = demo_run
    plot, ranks = result.stdout.splitlines()[-1].removeprefix("next: ").split("  (both")[0], "ranks"
    words = plot.split()
    assert words[:2] == ["hp-otel", "plot"] and words[-2] == "-o"
    picture = tmp_path / "timeline.html"
    assert main(["plot", *sorted(glob.glob(words[2])), "-o", str(picture)]) == 0
    assert "<svg" in picture.read_text()
    assert main([ranks, *sorted(glob.glob(words[2]))]) == 0
    capsys.readouterr()
    assert main(["diff", str(out), str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.err == "" and f"A: {out} (2 ranks, 1 window)" in printed.out.splitlines(), printed
    assert "4 → 4 collectives (+0)" in printed.out  # 2 all_reduce a rank, read once each (not from both files)


@pytest.mark.multiprocess  # reads the demo's files
def test_render_rebuilds_the_table_from_a_spans_file(demo_run, capsys) -> None:
    out, _ = demo_run
    assert main(["render", str(out / "spans_rank0.json"), "--noise-level", "2"]) == 0
    printed = capsys.readouterr().out
    assert "collective counts: {'_c10d_functional.all_reduce': 2}" in printed
    assert "  Module             Module(fc2) [enter]" in printed


def test_render_reports_missing_and_malformed_files(tmp_path, capsys) -> None:
    assert main(["render", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert main(["render", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_bad_noise_level_is_rejected_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["render", "x.json", "--noise-level", "7"])
    assert exc.value.code == 2
    assert "must be one of 0, 1, 2, 3" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--step-pause", "--linger"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_demo_seconds_must_be_a_finite_number_0_or_more(capsys, flag: str, value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a number of seconds, 0 or more" in err and "Traceback" not in err


@pytest.mark.multiprocess  # a real 2-process gloo demo
def test_demo_transformer(tmp_path) -> None:
    result = _hp_otel("demo", "--model", "transformer", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Module(layers.0.attention.wq) [enter]" in result.stdout
    for rank in (0, 1):
        dump = json.loads((tmp_path / f"comm_rank{rank}.json").read_text())
        assert dump["total_counts"] == 21  # 11 all_gather + 10 reduce_scatter
        modules = dump["comm_module_counts"]
        # attention's own input gather/scatter belongs to attention, not to its wq/wk/wv
        assert modules["layers.0.attention"]["backward"] == {
            "_c10d_functional.all_gather_into_tensor": 1,
            "_c10d_functional.reduce_scatter_tensor": 1,
        }
        assert "layers.0.attention.wq" not in modules


def test_version(capsys) -> None:
    from hp_otel.version import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"hp-otel {__version__}"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("demo", ["--noise-level 0-3", "0 collectives only", "(default: 3)", "(default: hp_otel_out)"]),
        ("render", ["--noise-level 0-3", "(default: 3)", "an OTLP/JSON spans file"]),
        ("ranks", ["Lines up the ranks' collectives", "--top N", "(default: 5)"]),
        ("plot", ["(default: hp_otel_out/timeline.html)", "output: .svg or .html"]),
        ("chrome-trace", ["--merge TRACE", "(default: hp_otel_out/trace.json)", "(default: chrome)"]),
    ],
)
def test_help_states_ranges_and_defaults(command, expected, capsys) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for phrase in expected:
        assert phrase in text, text
    assert "(default: None)" not in text


def test_help_lists_every_registered_command(capsys) -> None:
    from hp_otel.cli import COMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert [c.name for c in COMMANDS] == [
        "demo",
        "render",
        "ranks",
        "diff",
        "plot",
        "chrome-trace",
        "build-native",
    ]
    for command in COMMANDS:
        assert command.name in text and " ".join(command.help.split()) in text, command.name
    assert "chrome-trace (export)" in text and "(export: its old name, deprecated)" in text


def test_a_row_of_the_registry_is_a_subcommand(monkeypatch, capsys) -> None:
    import hp_otel.cli as cli

    def add_arguments(parser):
        parser.add_argument("--times", type=int, default=1)

    def run(args):
        print("hello " * args.times)
        return 7

    row = cli.Command("hello", "say hello", add_arguments, run, deprecated_aliases=("hi",))
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, row))
    assert main(["hello", "--times", "2"]) == 7
    assert capsys.readouterr().out == "hello hello \n"
    assert main(["hi"]) == 7
    assert capsys.readouterr().err == "hp-otel: `hi` is deprecated, use `hp-otel hello`\n"


# `pip install hp_otel torch` brings no numpy: every command must still run.
_WITHOUT_NUMPY = """
import sys
sys.modules["numpy"] = None  # as if not installed: `import numpy` fails, find_spec says absent
from hp_otel.cli import main
if sys.argv[1] == "benchmarks":  # python -m benchmarks, from the repository (not a user's command)
    import runpy
    sys.argv = sys.argv[1:]
    runpy.run_module("benchmarks", run_name="__main__")
if sys.argv[1] == "render":
    from benchmarks.scale import record_window
    from hp_otel.spans.otlp_json import write_spans
    write_spans(sys.argv[2], record_window(7).get_finished_spans())
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.multiprocess  # each runs a command in a child process
@pytest.mark.parametrize(
    ("args", "stdout_has", "progress"),
    [
        (["benchmarks", "--rounds", "1", "--steps", "1"], "skipped   cannot import it", True),
        (["benchmarks", "--scale", "--spans", "700"], "noise_level=3: table", True),
        (["render", "{tmp}/spans.json", "--noise-level", "0"], "Collective(_c10d_functional.all_reduce)", False),
        (["demo", "--out", "{tmp}/demo"], "collectives on rank 0: {'all_reduce': 2}", True),
    ],
    ids=["bench", "bench-scale", "render", "demo"],
)
def test_every_command_runs_without_numpy(args, stdout_has, progress, tmp_path) -> None:
    argv = [arg.format(tmp=tmp_path) for arg in args]
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NUMPY, *argv],
        capture_output=True, text=True, timeout=240, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert stdout_has in result.stdout, result.stdout
    program = "python -m" if args[0] == "benchmarks" else "hp-otel"
    assert (f"{program} {args[0]}" in result.stderr) is progress  # progress on stderr, stdout stays the result


@pytest.mark.multiprocess  # a real 2-process torchrun
def test_the_torchrun_example_writes_every_ranks_file_into_its_folder(tmp_path) -> None:
    from pathlib import Path

    torchrun = Path(sys.executable).with_name("torchrun")
    example = Path(__file__).resolve().parents[2] / "examples" / "tp_mlp_comm_debug.py"
    out = tmp_path / "out"
    result = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", str(example), str(out)],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["comm_rank0.json", "comm_rank1.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing in the working directory
    for rank in (0, 1):
        assert json.loads((out / f"comm_rank{rank}.json").read_text())["total_counts"] == 2


def test_build_native_says_what_is_missing(monkeypatch, capsys) -> None:
    """No C++ compiler (nor a build there): exit 2 with one line naming what to install."""
    from hp_otel.sources.pytorch import native

    monkeypatch.setattr(native, "_built_file", lambda name: None)
    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert main(["build-native"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "C++ compiler" in err[0] and "apt-get install g++" in err[0]
