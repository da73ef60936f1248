"""Export settings: only what OpenTelemetry's SDK and exporters do not decide themselves.

hp_otel hands the SDK what it reads on its own: the exporters read
`OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)ENDPOINT/HEADERS/TIMEOUT/COMPRESSION/CERTIFICATE`
(per-signal winning, headers percent-decoded), the `BatchSpanProcessor` `OTEL_BSP_*`,
the periodic metric reader `OTEL_METRIC_EXPORT_INTERVAL/TIMEOUT`, the `TracerProvider`
`OTEL_TRACES_SAMPLER(_ARG)`, `Resource.create` `OTEL_SERVICE_NAME`/`OTEL_RESOURCE_ATTRIBUTES`.
Their values are checked here (`SDK_NUMBERS`, the sampler, headers, endpoints, compression and
TLS files), so a bad one is a
`ConfigError` naming the variable rather than the SDK's bare ValueError or its silent default.
What is decided here: whether and where to export (`OTEL_TRACES_EXPORTER` /
`OTEL_METRICS_EXPORTER` names, looked up in the SDK's exporter entry points; OTLP only
when an endpoint is set or `otlp` is named), the OTLP protocol (the exporter classes
ignore `OTEL_EXPORTER_OTLP_PROTOCOL`), the Prometheus port per rank, and the run id.
Arguments to `hp_otel.configure(...)` win over the environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry.sdk.trace import sampling

from hp_otel.common.launcher_env import env_value
from hp_otel.common.launcher_env import run_id as launcher_run_id
from hp_otel.export.secrets import redact_url

PROTOCOLS = ("grpc", "http/protobuf")
# OTEL_TRACES_SAMPLER's names and the SDK sampler each makes from the ratio argument.
SAMPLERS: Mapping[str, Callable[[float], sampling.Sampler]] = MappingProxyType(
    {
        "always_on": lambda ratio: sampling.ALWAYS_ON,
        "always_off": lambda ratio: sampling.ALWAYS_OFF,
        "traceidratio": lambda ratio: sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda ratio: sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": lambda ratio: sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": lambda ratio: sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }
)
DEFAULT_PROTOCOL = "http/protobuf"  # the OTel specification's default
DEFAULT_PROMETHEUS_PORT = 9464  # OTel's default for OTEL_EXPORTER_PROMETHEUS_PORT
_DEFAULT_ENDPOINTS = MappingProxyType({"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"})
_HTTP_PATHS = MappingProxyType({"traces": "/v1/traces", "metrics": "/v1/metrics"})
# OTEL_<SIGNAL>_EXPORTER names hp_otel handles itself; other names are the SDK's exporter entry points.
OTLP, NONE, PROMETHEUS = "otlp", "none", "prometheus"
HEADER_VARIABLES = (
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
)
_EXPORTER_GROUPS = MappingProxyType(
    {"traces": "opentelemetry_traces_exporter", "metrics": "opentelemetry_metrics_exporter"}
)


class ConfigError(ValueError):
    """A setting (argument or environment variable) with a value hp_otel cannot use."""


def _exporter_names(name: str, environ: Mapping[str, str]) -> set[str] | None:
    value = env_value(name, environ)
    return None if value is None else {part.strip().lower() for part in value.split(",") if part.strip()}


def installed_exporters(signal: str) -> list[str]:
    """The exporter names the SDK's auto-configuration knows for a signal (entry points), plus hp_otel's."""
    names = {entry.name for entry in entry_points(group=_EXPORTER_GROUPS[signal])} | {OTLP, NONE}
    if signal == "metrics":
        names.add(PROMETHEUS)
    return sorted(names)


def _exporters_for(
    signal: str, names: set[str] | None, otlp_by_endpoint: bool, otlp_by_argument: bool, otlp_by_signal_argument: bool
) -> tuple:
    """Which exporters a signal gets: `OTEL_<SIGNAL>_EXPORTER`'s names, OTLP when an endpoint says so.

    `none` in the variable wins over the shared `endpoint=` argument (it says where to send, not
    which signals: a traces-only backend answers 404 on /v1/metrics); only the signal's own
    argument (`metrics_endpoint=`) asks for it by name and wins over `none`."""
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    if names is None:  # not set: OTLP when an endpoint is set (hp_otel exports nothing by default)
        chosen = [OTLP] if otlp_by_endpoint or otlp_by_argument else []
    else:
        unknown = sorted(names - set(installed_exporters(signal)))
        if unknown:
            raise ConfigError(
                f"{variable} names {', '.join(unknown)}, which is not an installed exporter; "
                f"allowed: {', '.join(installed_exporters(signal))}"
            )
        chosen = sorted(names - {NONE, PROMETHEUS})
        asked = otlp_by_signal_argument or (otlp_by_argument and NONE not in names)
        if asked and OTLP not in chosen:  # configure(endpoint=...) adds OTLP to the variable's names
            chosen.append(OTLP)
    return tuple(chosen)


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
    """Everything `hp_otel.configure()` needs; build it with `ExportConfig.resolve(...)`.

    None means "not set here": the SDK component reads its own environment variable.
    """

    service_name: str | None = None
    resource_attributes: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    traces_exporters: tuple[str, ...] = ()  # "otlp" and/or SDK exporter names ("console"); () = no span export
    metrics_exporters: tuple[str, ...] = ()  # the same for metrics (Prometheus: prometheus_port)
    traces_endpoint: str | None = None  # from an argument; None: the exporter reads OTEL_EXPORTER_OTLP_*
    metrics_endpoint: str | None = None
    traces_protocol: str = DEFAULT_PROTOCOL
    metrics_protocol: str = DEFAULT_PROTOCOL
    headers: dict[str, str] = field(default_factory=dict)  # from an argument; {}: the exporter reads the variables
    prometheus_host: str = "localhost"
    prometheus_port: int | None = None  # the base port; each rank serves base + local rank
    prometheus_port_source: str = "prometheus_port"  # the setting it came from, for error messages
    sampler: str | None = None  # None: the SDK reads OTEL_TRACES_SAMPLER itself
    sampler_arg: float | None = None
    max_queue_size: int | None = None  # None: OTEL_BSP_MAX_QUEUE_SIZE (SDK default 2048)
    schedule_delay_ms: int | None = None  # None: OTEL_BSP_SCHEDULE_DELAY (SDK default 5000)
    export_timeout_s: float | None = None  # None: OTEL_EXPORTER_OTLP_(<SIGNAL>_)TIMEOUT (default 10 s)
    metric_export_interval_ms: int | None = None  # None: OTEL_METRIC_EXPORT_INTERVAL (SDK default 60000)
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
        headers: Mapping[str, str] | None = None,
        prometheus_port: int | None = None,
        prometheus_host: str | None = None,
        sampler: str | None = None,
        sampler_arg: float | None = None,
        max_queue_size: int | None = None,
        schedule_delay_ms: int | None = None,
        export_timeout_s: float | None = None,
        metric_export_interval_ms: int | None = None,
        shutdown_timeout_s: float | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> ExportConfig:
        """Arguments first, then OTel's environment variables, then OTel's defaults.

        OTLP export is on when an endpoint is set (argument or `OTEL_EXPORTER_OTLP_*ENDPOINT`)
        or `OTEL_<SIGNAL>_EXPORTER` names `otlp`; that variable may also name `console`,
        `none` or any exporter installed for the SDK. `none` turns the signal off even with
        `endpoint=` (only `traces_endpoint=` / `metrics_endpoint=` name a signal over it).
        A Prometheus endpoint when a port is set (argument or `OTEL_EXPORTER_PROMETHEUS_PORT`)
        or `OTEL_METRICS_EXPORTER` names `prometheus` (port 9464). Settings left None here are read
        by the SDK from `os.environ`.
        """
        base_protocol = protocol or env_value("OTEL_EXPORTER_OTLP_PROTOCOL", environ)
        protocols = {}
        for signal in ("traces", "metrics"):
            name = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
            chosen = protocol or env_value(name, environ) or base_protocol or DEFAULT_PROTOCOL
            source = "protocol" if protocol else (name if env_value(name, environ) else "OTEL_EXPORTER_OTLP_PROTOCOL")
            protocols[signal] = check_protocol(chosen, source)

        # Endpoints are checked here (a clear ConfigError, credentials not echoed); the exporters read them.
        endpoint = _endpoint(endpoint, "endpoint")
        base_in_env = _endpoint(env_value("OTEL_EXPORTER_OTLP_ENDPOINT", environ), "OTEL_EXPORTER_OTLP_ENDPOINT")
        exporters: dict[str, tuple[str, ...]] = {}
        endpoints: dict[str, str | None] = {}
        for signal, specific_arg in (("traces", traces_endpoint), ("metrics", metrics_endpoint)):
            variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
            specific_in_env = _endpoint(env_value(variable, environ), variable)
            specific_arg = _endpoint(specific_arg, f"{signal}_endpoint")
            exporters[signal] = _exporters_for(
                signal,
                _exporter_names(f"OTEL_{signal.upper()}_EXPORTER", environ),
                otlp_by_endpoint=bool(base_in_env or specific_in_env),
                otlp_by_argument=bool(endpoint or specific_arg),
                otlp_by_signal_argument=bool(specific_arg),
            )
            # Only an argument is resolved here; else the exporter reads the variables itself.
            endpoints[signal] = (
                signal_endpoint(signal, protocols[signal], endpoint, specific_arg) if endpoint or specific_arg else None
            )
        metrics_names = _exporter_names("OTEL_METRICS_EXPORTER", environ)
        for signal in ("traces", "metrics"):
            if OTLP in exporters[signal]:
                _check_tls_and_compression(signal, environ)

        port_value: Any = prometheus_port
        port_source = "prometheus_port"
        if port_value is None and env_value("OTEL_EXPORTER_PROMETHEUS_PORT", environ):
            port_value, port_source = (
                env_value("OTEL_EXPORTER_PROMETHEUS_PORT", environ),
                "OTEL_EXPORTER_PROMETHEUS_PORT",
            )
        if port_value is None and metrics_names and PROMETHEUS in metrics_names:
            port_value = DEFAULT_PROMETHEUS_PORT
        port = _port(port_value, port_source) if port_value is not None else None

        chosen_sampler = sampler
        if chosen_sampler is not None and chosen_sampler not in SAMPLERS:
            raise ConfigError(f"sampler must be one of {', '.join(SAMPLERS)}, got {chosen_sampler!r}")
        if sampler_arg is not None and not (isinstance(sampler_arg, (int, float)) and 0.0 <= sampler_arg <= 1.0):
            raise ConfigError(f"sampler_arg must be a ratio between 0 and 1, got {sampler_arg!r}")
        _check_sampler_environment(chosen_sampler, sampler_arg, environ)

        # The exporters parse (and percent-decode) the header variables themselves; a malformed
        # one is refused here with a clear error instead of being dropped with a warning.
        for variable in HEADER_VARIABLES:
            _parse_pairs(env_value(variable, environ) or "", variable)
        given = {
            "max_queue_size": max_queue_size,
            "schedule_delay_ms": schedule_delay_ms,
            "export_timeout_s": export_timeout_s,
            "metric_export_interval_ms": metric_export_interval_ms,
        }
        _check_sdk_numbers(environ, {name for name, value in given.items() if value is not None})
        return cls(
            service_name=service_name,
            resource_attributes=dict(resource_attributes or {}),
            run_id=run_id or launcher_run_id(environ),
            traces_exporters=exporters["traces"],
            metrics_exporters=exporters["metrics"],
            traces_endpoint=endpoints["traces"],
            metrics_endpoint=endpoints["metrics"],
            traces_protocol=protocols["traces"],
            metrics_protocol=protocols["metrics"],
            headers=check_headers(headers),
            prometheus_host=prometheus_host or env_value("OTEL_EXPORTER_PROMETHEUS_HOST", environ) or "localhost",
            prometheus_port=port,
            prometheus_port_source=port_source if port_value is not None else "prometheus_port",
            sampler=chosen_sampler,
            sampler_arg=sampler_arg,
            max_queue_size=_positive(max_queue_size, "max_queue_size", None, int),
            schedule_delay_ms=_positive(schedule_delay_ms, "schedule_delay_ms", None, int),
            export_timeout_s=_positive(export_timeout_s, "export_timeout_s", None, float),
            metric_export_interval_ms=_positive(metric_export_interval_ms, "metric_export_interval_ms", None, int),
            shutdown_timeout_s=_positive(shutdown_timeout_s, "shutdown_timeout_s", cls.shutdown_timeout_s, float),
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
    except ValueError as exc:  # its text may quote a password taken for the port: not echoed
        why = "its port is not a number 0-65535" if "port" in str(exc).lower() else "it cannot be parsed"
        scheme, sep, rest = value.strip().partition("://")
        authority = rest.split("/")[0].split("?")[0].split("#")[0]
        port = authority.rpartition("@")[2].rpartition(":")[2]
        shown = value  # a port that is not digits may be a misplaced password: the whole host part is masked
        if not port.isdigit():
            shown = f"{scheme}://***" + rest[len(authority) :] if sep else "***"
        raise ConfigError(
            f"{source} must be a URL like http://host:4318, got {redacted_url(shown)!r} ({why})"
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
        # The SDK registers its own samplers under the entry point group too: each name once.
        allowed = tuple(dict.fromkeys((*SAMPLERS, *_plugin_samplers())))
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


@dataclass(frozen=True)
class _SdkNumber:
    """A numeric variable the SDK reads itself: what it must be, and the argument that overrides it."""

    variable: str
    integer: bool  # the SDK parses it with int() (else float())
    unit: str
    argument: str | None = None  # the configure() argument that, when given, makes the SDK not read it
    infinite_ok: bool = False


# The SDK refuses some of these with a bare ValueError (`max_queue_size must be a positive integer.`),
# others it logs and replaces by its default, or uses as is (a negative timeout): each is refused here, named.
SDK_NUMBERS = (
    _SdkNumber("OTEL_BSP_MAX_QUEUE_SIZE", True, "spans", "max_queue_size"),
    _SdkNumber("OTEL_BSP_SCHEDULE_DELAY", True, "milliseconds", "schedule_delay_ms"),
    _SdkNumber("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", True, "spans"),
    _SdkNumber("OTEL_BSP_EXPORT_TIMEOUT", True, "milliseconds"),
    # inf: no periodic export (the SDK starts no export thread)
    _SdkNumber("OTEL_METRIC_EXPORT_INTERVAL", False, "milliseconds", "metric_export_interval_ms", infinite_ok=True),
    _SdkNumber("OTEL_METRIC_EXPORT_TIMEOUT", False, "milliseconds", "export_timeout_s"),
    _SdkNumber("OTEL_EXPORTER_OTLP_TIMEOUT", False, "seconds", "export_timeout_s"),
    _SdkNumber("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", False, "seconds", "export_timeout_s"),
    _SdkNumber("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", False, "seconds", "export_timeout_s"),
)


COMPRESSIONS = ("gzip", "deflate", "none")  # the OTLP exporters' `Compression` values
TLS_FILES = ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY")


def _check_tls_and_compression(signal: str, environ: Mapping[str, str]) -> None:
    """The OTLP exporter's compression and TLS file variables, checked now: the exporters find a
    bad value only at their first export (a raw ValueError, or a missing file), in the middle of training."""
    for middle in ("", f"{signal.upper()}_"):
        variable = f"OTEL_EXPORTER_OTLP_{middle}COMPRESSION"
        value = env_value(variable, environ)
        if value is not None and value.strip().lower() not in COMPRESSIONS:
            raise ConfigError(f"{variable} must be one of {', '.join(COMPRESSIONS)}, got {value!r}")
        for name in TLS_FILES:
            variable = f"OTEL_EXPORTER_OTLP_{middle}{name}"
            path = env_value(variable, environ)
            if not path:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(
                    f"{variable} must name a readable PEM file, got {path!r} ({exc.strerror or type(exc).__name__})"
                ) from None
            if os.path.isdir(path):  # pragma: no cover - open() refuses a folder on Linux
                raise ConfigError(f"{variable} must name a readable PEM file, got the folder {path!r}")


def _check_sdk_numbers(environ: Mapping[str, str], given: set[str]) -> None:
    """Each of SDK_NUMBERS the SDK will read (no argument overrides it): a positive number, else ConfigError."""
    for number in SDK_NUMBERS:
        raw = env_value(number.variable, environ)
        if raw is None or number.argument in given:
            continue
        try:
            value = int(raw) if number.integer else float(raw)
        except ValueError:
            value = None
        if value is None or not value > 0 or (value == math.inf and not number.infinite_ok):
            kind = "a positive integer" if number.integer else "a positive number"
            unit = f"{number.unit}; inf: no periodic export" if number.infinite_ok else number.unit
            raise ConfigError(f"{number.variable} must be {kind} ({unit}), got {raw!r}")


def _positive(value: Any, name: str, default: Any, kind: type = float) -> Any:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return kind(value)


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
        _refuse_line_breaks(key.strip(), unquote(key.strip()), value, unquote(value), source, number)
        out[key.strip()] = value.strip()
    return out


def _refuse_line_breaks(key: str, decoded_key: str, value: str, decoded_value: str, source: str, number: int) -> None:
    """CR, LF or NUL in a header (also percent-encoded, as the exporters decode it) would inject lines
    into the request: refused, naming the setting and the entry, never the value."""
    for what, texts in (("name", (key, decoded_key)), ("value", (value, decoded_value))):
        if any(c in text for text in texts for c in "\r\n\x00"):
            where = f"entry {number}" + (f" ({printable_key(decoded_key)})" if what == "value" else "")
            raise ConfigError(
                f"{source}: the header {what} of {where} contains a line break (CR/LF, or %0D/%0A) or NUL, "
                "which would inject lines into the request; remove it"
            )


def printable_key(key: str) -> str:
    """A header name for a message: its line breaks written as escapes."""
    return key.encode("unicode_escape").decode("ascii")


def check_headers(headers: Any) -> dict[str, str]:
    """The `headers=` argument: a mapping of text names to text values without line breaks."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ConfigError(f"headers must be a mapping of header names to values, got {type(headers).__name__}")
    for number, (key, value) in enumerate(headers.items(), start=1):
        if not isinstance(key, str) or not key.strip() or not isinstance(value, str):
            raise ConfigError(
                f"headers: entry {number} must be a non-empty text name with a text value "
                f"(got a {type(key).__name__} name and a {type(value).__name__} value)"
            )
        _refuse_line_breaks(key, key, value, value, "headers", number)
    return dict(headers)


def redacted_url(url: str | None) -> str | None:
    """The URL without a password or token in its user part, query or fragment (`https://***@host?***`)."""
    return redact_url(url)


ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


def known_secrets(config: ExportConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """What must never appear in a log line: every header value the exporters will send (arguments and
    variables, also percent-decoded) and the user part and query of every endpoint."""
    values = [v for v in config.headers.values() if isinstance(v, str)]
    for variable in HEADER_VARIABLES:
        for value in _parse_pairs(env_value(variable, environ) or "", variable).values():
            values.extend({value, unquote(value)})
    endpoints = [config.traces_endpoint, config.metrics_endpoint]
    endpoints += [env_value(variable, environ) for variable in ENDPOINT_VARIABLES]
    for endpoint in filter(None, endpoints):
        parts = urlsplit(endpoint)
        values += [p for p in (parts.password, parts.username if parts.password is None else None) if p]
        values += [parts.query, *(v for _k, _s, v in (q.partition("=") for q in parts.query.split("&")))]
    return [v for v in values if v]
