"""Sending spans and metrics out: OTLP, Prometheus and the SDK wiring around them.

`telemetry` builds the exporting providers (`hp_otel.configure`, `shutdown`); `config`
reads the OTEL_* settings the SDK does not read itself; `providers` makes the default
providers and resource; `resource_detector` names the rank as an OTel resource;
`prometheus_sd` writes each rank's scrape target; `log_limits` rate-limits the SDK's logs.
"""
