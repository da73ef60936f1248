"""The models and process-group set-ups that the CLI's demo, the tests and the examples run
(and the benchmarks under `benchmarks/`, beside the tests): a TP MLP (`tp_mlp`), a small TP +
sequence-parallel transformer (`tp_transformer`), and the gloo and fake process groups
(`process_groups`). The benchmarks' own models (a llama, torch's test Transformer) are in
`benchmarks/models/`, not shipped.

A package of its own, below the CLI: a test or an example that needs a model imports it
from here, not from the `hp-otel` command. Nothing here imports torch at package import.
"""
