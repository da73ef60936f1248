"""The torch platform's fully_shard state and scheduler (stand-in)."""
