"""What runs beside a whole training job: the always-on instrumentor, one trace per step
across ranks (`steps`), the model finder for zero-code runs and the hang watchdog."""
