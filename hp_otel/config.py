"""Export settings, read the way OpenTelemetry's own SDK reads them.

Environment variables follow OTel's conventions (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_*`, `OTEL_TRACES_SAMPLER(_ARG)`,
`OTEL_EXPORTER_PROMETHEUS_HOST/PORT`); arguments to `hp_otel.configure(...)` win over
them.  The OTLP exporter classes ignore `OTEL_EXPORTER_OTLP_PROTOCOL` (only the SDK's
auto-configurator reads it), so it is resolved here, together with the per-signal
endpoints (HTTP appends `/v1/traces` to a base endpoint, gRPC uses it as is).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import sampling

from hp_otel.launcher_env import env_value
from hp_otel.launcher_env import run_id as launcher_run_id

PROTOCOLS = ("grpc", "http/protobuf")
# OTEL_TRACES_SAMPLER's names and the SDK sampler each makes from the ratio argument.
SAMPLERS: dict[str, Callable[[float], sampling.Sampler]] = {
    "always_on": lambda ratio: sampling.ALWAYS_ON,
    "always_off": lambda ratio: sampling.ALWAYS_OFF,
    "traceidratio": lambda ratio: sampling.TraceIdRatioBased(ratio),
    "parentbased_always_on": lambda ratio: sampling.ParentBased(sampling.ALWAYS_ON),
    "parentbased_always_off": lambda ratio: sampling.ParentBased(sampling.ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
}
DEFAULT_PROTOCOL = "http/protobuf"  # the OTel specification's default
DEFAULT_PROMETHEUS_PORT = 9464  # OTel's default for OTEL_EXPORTER_PROMETHEUS_PORT
_DEFAULT_ENDPOINTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}
_HTTP_PATHS = {"traces": "/v1/traces", "metrics": "/v1/metrics"}


class ConfigError(ValueError):
    """A setting (argument or environment variable) with a value hp_otel cannot use."""


def _exporter_names(name: str, environ: Mapping[str, str]) -> set[str] | None:
    value = env_value(name, environ)
    return None if value is None else {part.strip().lower() for part in value.split(",") if part.strip()}


def check_protocol(protocol: str, source: str) -> str:
    value = protocol.strip().lower()
    if value not in PROTOCOLS:
        raise ConfigError(f"{source} must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return value


def _port(value: Any, source: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ConfigError(f"{source} must be a port number 0-65535, got {value!r}")
    return int(text)


def signal_endpoint(signal: str, protocol: str, base: str | None, specific: str | None) -> str:
    """Where one signal goes: the per-signal endpoint as is, else the base one (+ `/v1/<signal>` for HTTP)."""
    if specific:
        return specific
    root = base or _DEFAULT_ENDPOINTS[protocol]
    if protocol == "grpc":
        return root
    return root.rstrip("/") + _HTTP_PATHS[signal]


@dataclass(frozen=True)
class ExportConfig:
    """Everything `hp_otel.configure()` needs; build it with `ExportConfig.resolve(...)`."""

    service_name: str | None = None
    resource_attributes: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    traces_endpoint: str | None = None  # None: no OTLP span export
    metrics_endpoint: str | None = None  # None: no OTLP metric export
    traces_protocol: str = DEFAULT_PROTOCOL
    metrics_protocol: str = DEFAULT_PROTOCOL
    headers: dict[str, str] = field(default_factory=dict)
    prometheus_host: str = "localhost"
    prometheus_port: int | None = None  # the base port; each rank serves base + local rank
    prometheus_port_source: str = "prometheus_port"  # the setting it came from, for error messages
    sampler: str | None = None  # None: the SDK reads OTEL_TRACES_SAMPLER itself
    sampler_arg: float | None = None
    max_queue_size: int = 2048
    schedule_delay_ms: int = 1000
    export_timeout_s: float = 5.0
    metric_export_interval_ms: int = 10_000
    shutdown_timeout_s: float = 5.0

    def __repr__(self) -> str:
        """Every setting, with header values and URL credentials replaced by `***` (reprs end up in logs)."""
        shown = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "headers":
                value = {key: "***" for key in value}
            elif name.endswith("_endpoint"):
                value = redacted_url(value)
            shown.append(f"{name}={value!r}")
        return f"ExportConfig({', '.join(shown)})"

    @classmethod
    def resolve(
        cls,
        *,
        service_name: str | None = None,
        resource_attributes: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        endpoint: str | None = None,
        traces_endpoint: str | None = None,
        metrics_endpoint: str | None = None,
        protocol: str | None = None,
        prometheus_port: int | None = None,
        prometheus_host: str | None = None,
        sampler: str | None = None,
        sampler_arg: float | None = None,
        max_queue_size: int | None = None,
        export_timeout_s: float | None = None,
        metric_export_interval_ms: int | None = None,
        shutdown_timeout_s: float | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> ExportConfig:
        """Arguments first, then OTel's environment variables, then OTel's defaults.

        OTLP export is on when an endpoint is set (argument or `OTEL_EXPORTER_OTLP_*ENDPOINT`)
        and `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` do not say `none`; a
        Prometheus endpoint when a port is set (argument or `OTEL_EXPORTER_PROMETHEUS_PORT`)
        or `OTEL_METRICS_EXPORTER` names `prometheus` (port 9464).
        """
        base_protocol = protocol or env_value("OTEL_EXPORTER_OTLP_PROTOCOL", environ)
        protocols = {}
        for signal in ("traces", "metrics"):
            name = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
            chosen = protocol or env_value(name, environ) or base_protocol or DEFAULT_PROTOCOL
            source = "protocol" if protocol else (name if env_value(name, environ) else "OTEL_EXPORTER_OTLP_PROTOCOL")
            protocols[signal] = check_protocol(chosen, source)

        base = _endpoint(endpoint, "endpoint") or _endpoint(
            env_value("OTEL_EXPORTER_OTLP_ENDPOINT", environ), "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        traces_exporters = _exporter_names("OTEL_TRACES_EXPORTER", environ)
        metrics_exporters = _exporter_names("OTEL_METRICS_EXPORTER", environ)
        endpoints: dict[str, str | None] = {}
        for signal, specific_arg, exporters in (
            ("traces", traces_endpoint, traces_exporters),
            ("metrics", metrics_endpoint, metrics_exporters),
        ):
            variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
            specific = _endpoint(specific_arg, f"{signal}_endpoint") or _endpoint(
                env_value(variable, environ), variable
            )
            wanted = bool(base or specific) or (exporters is not None and "otlp" in exporters)
            if exporters is not None and "otlp" not in exporters and not (specific_arg or endpoint):
                wanted = False  # OTEL_<SIGNAL>_EXPORTER=none (or prometheus only) turns OTLP off
            endpoints[signal] = signal_endpoint(signal, protocols[signal], base, specific) if wanted else None

        port_value: Any = prometheus_port
        port_source = "prometheus_port"
        if port_value is None and env_value("OTEL_EXPORTER_PROMETHEUS_PORT", environ):
            port_value, port_source = (
                env_value("OTEL_EXPORTER_PROMETHEUS_PORT", environ),
                "OTEL_EXPORTER_PROMETHEUS_PORT",
            )
        if port_value is None and metrics_exporters and "prometheus" in metrics_exporters:
            port_value = DEFAULT_PROMETHEUS_PORT
        port = _port(port_value, port_source) if port_value is not None else None

        chosen_sampler = sampler
        if chosen_sampler is not None and chosen_sampler not in SAMPLERS:
            raise ConfigError(f"sampler must be one of {', '.join(SAMPLERS)}, got {chosen_sampler!r}")
        if sampler_arg is not None and not (isinstance(sampler_arg, (int, float)) and 0.0 <= sampler_arg <= 1.0):
            raise ConfigError(f"sampler_arg must be a ratio between 0 and 1, got {sampler_arg!r}")
        _check_sampler_environment(chosen_sampler, sampler_arg, environ)

        headers = _parse_pairs(env_value("OTEL_EXPORTER_OTLP_HEADERS", environ) or "", "OTEL_EXPORTER_OTLP_HEADERS")
        defaults = cls()
        return cls(
            service_name=service_name,
            resource_attributes=dict(resource_attributes or {}),
            run_id=run_id or launcher_run_id(environ),
            traces_endpoint=endpoints["traces"],
            metrics_endpoint=endpoints["metrics"],
            traces_protocol=protocols["traces"],
            metrics_protocol=protocols["metrics"],
            headers=headers,
            prometheus_host=prometheus_host or env_value("OTEL_EXPORTER_PROMETHEUS_HOST", environ) or "localhost",
            prometheus_port=port,
            prometheus_port_source=port_source if port_value is not None else "prometheus_port",
            sampler=chosen_sampler,
            sampler_arg=sampler_arg,
            max_queue_size=_positive(max_queue_size, "max_queue_size", defaults.max_queue_size),
            export_timeout_s=_positive(export_timeout_s, "export_timeout_s", defaults.export_timeout_s),
            metric_export_interval_ms=_positive(
                metric_export_interval_ms, "metric_export_interval_ms", defaults.metric_export_interval_ms
            ),
            shutdown_timeout_s=_positive(shutdown_timeout_s, "shutdown_timeout_s", defaults.shutdown_timeout_s),
        )


def _endpoint(value: str | None, source: str) -> str | None:
    """An OTLP endpoint URL as given, or ConfigError naming `source` (credentials not echoed)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{source} must be a URL string like http://host:4318, got {type(value).__name__}")
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number 0-65535
    except ValueError as exc:
        raise ConfigError(
            f"{source} must be a URL like http://host:4318, got {redacted_url(value)!r} ({exc})"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{source} must be an http:// or https:// URL with a host, like http://host:4318, "
            f"got {redacted_url(value)!r}"
        )
    return value.strip()


# Ratio samplers: the only ones that read OTEL_TRACES_SAMPLER_ARG as a number.
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")


def _check_sampler_environment(sampler: str | None, sampler_arg: float | None, environ: Mapping[str, str]) -> None:
    """OTEL_TRACES_SAMPLER(_ARG) as the SDK will read them: a known name, and a ratio 0-1 for the ratio samplers.

    The SDK itself only logs a bad value and falls back to another sampler; here it is an error.
    """
    name = env_value("OTEL_TRACES_SAMPLER", environ)
    if sampler is None and name is not None:
        name = name.lower()
        allowed = (*SAMPLERS, *_plugin_samplers())
        if name not in allowed:
            raise ConfigError(f"OTEL_TRACES_SAMPLER must be one of {', '.join(allowed)}, got {name!r}")
    arg = env_value("OTEL_TRACES_SAMPLER_ARG", environ)
    if arg is None or sampler_arg is not None or (sampler or name) not in _RATIO_SAMPLERS:
        return
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG must be a ratio between 0 and 1 for {sampler or name}, got {arg!r}")


def _plugin_samplers() -> tuple[str, ...]:
    """Samplers other packages register for OTEL_TRACES_SAMPLER (the SDK's entry point group)."""
    from importlib.metadata import entry_points

    try:
        return tuple(sorted(ep.name for ep in entry_points(group="opentelemetry_traces_sampler")))
    except Exception:  # broken package metadata must not break configuration
        return ()


def _positive(value: Any, name: str, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return type(default)(value)


def _parse_pairs(text: str, source: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (the format of OTEL_EXPORTER_OTLP_HEADERS).

    Values are credentials (`Authorization=Bearer ...`), so an error names the entry by
    its position and, where there is one, its key; never the value.
    """
    out: dict[str, str] = {}
    for number, part in enumerate(filter(None, (p.strip() for p in text.split(","))), start=1):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(
                f"{source} must be comma-separated key=value pairs; entry {number} ({len(part)} characters, "
                "not shown: it may hold a credential) has no '='"
            )
        if not key.strip():
            raise ConfigError(f"{source} must be comma-separated key=value pairs; entry {number} has an empty key")
        out[key.strip()] = value.strip()
    return out


def redacted_url(url: str | None) -> str | None:
    """The URL without a password or token in its user part (`https://user:***@host`)."""
    if not url or "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host = rest.partition("@")
    if not at or "/" in userinfo:
        return url
    return f"{scheme}://***@{host}"
