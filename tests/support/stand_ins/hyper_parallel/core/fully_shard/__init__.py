"""fully_shard (FSDP) of the stand-in: see api.py and README.md."""
