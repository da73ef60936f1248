"""`hp-otel ranks` as it was before issue 30 (commit 832e346), frozen: the reference the new reader and
comparison are checked against, field by field (tests/analysis/test_ranks_at_scale.py).

The five modules are copied verbatim but for their imports of each other; they read spans
files through the protobuf reader (`hp_otel.spans.otlp_json.read_trace_file`), which is
independent of the new reader in `hp_otel.analysis.rank_input`.
"""
