"""Callbacks for the loops where users train: Lightning (`hp_otel.integrations.lightning`) and the
Hugging Face `Trainer` (`hp_otel.integrations.transformers`).

Each traces a window of steps (`window`: every step, every N-th, or a range), marks each traced
step with `hp_otel.step()` and takes the always-on instrumentor's settings (`tracer`). Importing
`hp_otel` never imports a framework: only the framework's own module here does.
"""
