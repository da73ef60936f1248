"""Small helpers every layer uses: atomic file writing (`files`), the launchers'
rank, world size and run id variables (`launcher_env`), and one object per OTel
provider (`per_provider`: hp_otel's tracer, its metric instruments), the ints an
attribute can carry (`int_range`: int64), names made safe for a terminal (`safe_text`)."""
