"""The models and process-group set-ups that the CLI's demo and benchmark, the tests and the
examples run: a TP MLP (`tp_mlp`), a small TP + sequence-parallel transformer
(`tp_transformer`), a reproduction of torch's test Transformer (`dtensor_transformer`), a
torchtitan-like llama on a DP x TP mesh (`llama`), and the gloo and fake process groups
(`process_groups`).

A package of its own, below the CLI: a test or an example that needs a model imports it
from here, not from the `hp-otel` command. Nothing here imports torch at package import.
"""
