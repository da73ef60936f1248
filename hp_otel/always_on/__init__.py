"""What runs beside a whole training job: the always-on instrumentor (`instrumentation`),
one trace per step across ranks (`steps`), and the model finder for zero-code runs."""
