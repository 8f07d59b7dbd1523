"""Request tracing (docs/tracing.md): one `--otlp-*` flag set for the launcher, passed on to the router and every
shard as explicit argv. Off unless `--otlp-endpoint` is set; then the router traces requests (sampling at
`--otlp-sample-ratio`) and the shards trace the Steps the router sends them with a trace context."""

from __future__ import annotations

from tandem_launcher.flags import FlagAdder

DEFAULT_SERVICE_NAME = "tandem"
# What each child appends to `--otlp-service-name`, so the router's and the shards' spans tell apart.
ROUTER_SUFFIX = ".router"
SHARD_SUFFIX = ".shard"


def add_tracing_flags(add: FlagAdder) -> None:
    """The tracing flags, with TGI's names."""
    add.value(
        "--otlp-endpoint",
        str,
        None,
        "export request traces to this OTLP/HTTP (protobuf) receiver, e.g. http://otel-collector:4318 (/v1/traces is "
        "appended); the router traces requests, the shards their forward passes; unset: no tracing",
    )
    add.value(
        "--otlp-sample-ratio",
        float,
        1.0,
        "share of requests traced (0 to 1) when the client sent no traceparent; a client's traceparent decides by its "
        "sampled flag",
    )
    add.value(
        "--otlp-service-name",
        str,
        DEFAULT_SERVICE_NAME,
        f"service.name of the spans: the router's get '{ROUTER_SUFFIX}' appended, the shards' '{SHARD_SUFFIX}'",
    )


def tracing_problems(endpoint: str | None, sample_ratio: float, service_name: str) -> list[str]:
    """What is wrong with the tracing flags' values."""
    problems = []
    if endpoint is not None and not endpoint.lower().startswith(("http://", "https://")):
        problems.append(f"--otlp-endpoint must be an http:// or https:// URL, got {endpoint!r}")
    if not 0.0 <= sample_ratio <= 1.0:
        problems.append(f"--otlp-sample-ratio must be from 0 to 1, got {sample_ratio}")
    if not service_name.strip():
        problems.append("--otlp-service-name must not be empty")
    return problems


def router_tracing_argv(endpoint: str | None, sample_ratio: float, service_name: str) -> list[str]:
    """The router's tracing flags; none when tracing is off."""
    if endpoint is None:
        return []
    return [
        "--otlp-endpoint", endpoint,
        "--otlp-sample-ratio", repr(sample_ratio),
        "--otlp-service-name", service_name + ROUTER_SUFFIX,
    ]  # fmt: skip


def shard_tracing_argv(endpoint: str | None, service_name: str) -> list[str]:
    """A shard's tracing flags; none when tracing is off. The router decides what is sampled."""
    if endpoint is None:
        return []
    return ["--otlp-endpoint", endpoint, "--otlp-service-name", service_name + SHARD_SUFFIX]
