"""Launcher flags whose defaults come from environment variables of the same name, shared by every subcommand."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

# Flags whose variable is not the flag's name in upper case: shells and Kubernetes set `HOSTNAME`
# to the machine or pod name, which must never become the bind address.
_ENV_OVERRIDES = {"--hostname": "TANDEM_HOSTNAME"}


def _env_name(flag: str) -> str:
    return _ENV_OVERRIDES.get(flag, flag.lstrip("-").replace("-", "_").upper())


def key_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated list, stripped."""
    return [key.strip() for key in text.split(",") if key.strip()]


def _env_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SystemExit(f"error: environment variable {name}={value!r} is not a boolean (use true/false)")


def bool_value(text: str) -> bool:
    """A true/false flag value (1/0, yes/no, on/off too); anything else is a usage error."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean (use true/false): {text!r}")


COMPILE_MODES = ("auto", "off", "warmup", "background")


def compile_mode(text: str) -> str:
    """A `--torch-compile` mode; a boolean (as `TORCH_COMPILE=true` has always been) means warmup or off."""
    lowered = text.strip().lower()
    if lowered in COMPILE_MODES:
        return lowered
    if lowered in _TRUE:
        return "warmup"
    if lowered in _FALSE:
        return "off"
    raise argparse.ArgumentTypeError(f"not one of {', '.join(COMPILE_MODES)} (or true/false): {text!r}")


class _AppendOverEnv(argparse.Action):
    """Collects every use of a repeatable flag; the first use replaces the env var's list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*([] if current is self.default else current), values])


class FlagAdder:
    """Adds flags whose default comes from the matching env var, and says so in `--help`."""

    def __init__(self, parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
        self.parser = parser
        self.environ = environ

    def value(self, flag: str, kind: Callable[[str], Any], default: Any, help_text: str, **extra: Any) -> None:
        env = _env_name(flag)
        # argparse converts string defaults with `kind`, so env values are validated like flags.
        chosen = self.environ.get(env, default)
        shown = "none" if default is None else default
        self.parser.add_argument(
            flag, type=kind, default=chosen, help=f"{help_text} (default: {shown}; env: {env})", **extra
        )

    def repeated(self, flag: str, kind: Callable[[str], Any], help_text: str) -> None:
        """A flag that may be given several times; its env var holds a comma-separated list."""
        env = _env_name(flag)
        default = [kind(item) for item in key_list(self.environ.get(env, ""))]
        self.parser.add_argument(
            flag, type=kind, action=_AppendOverEnv, default=default, help=f"{help_text} (env: {env}, comma-separated)"
        )

    def switch(self, flag: str, help_text: str) -> None:
        env = _env_name(flag)
        default = _env_bool(env, self.environ[env]) if env in self.environ else False
        self.parser.add_argument(flag, action="store_true", default=default, help=f"{help_text} (env: {env})")
