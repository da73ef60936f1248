"""hp_otel's own benchmarks, run from a checkout (not shipped in the wheel): `python -m benchmarks --help`.

What tracing costs a step against untraced and torch's own tools (`timing`, `variants`,
`workloads`), its instruction counts under callgrind (`instructions`), the cost of each of its
parts (`pieces`), of a refused or blackholed export (`export_down`), of a long window
(`scale`), what one rank sends (`telemetry`), and `hp-otel ranks` on many ranks' files with
faults planted (`ranks`, `rank_files`). The bench-only models are in `models/`.
docs/how-it-works/benchmark.md says how to read the results.
"""
