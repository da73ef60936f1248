"""The benchmarks' own models, not shipped: a torchtitan-like llama on a DP x TP mesh (`llama`)
and a reproduction of torch's test Transformer (`dtensor_transformer`)."""
