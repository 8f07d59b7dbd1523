"""Runs one launch whose config comes as JSON on argv[1], so tests can point it at fake children."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tandem_launcher.config import FORWARDED_FLAGS, ChildCommands, LauncherConfig
from tandem_launcher.launch import launch
from tandem_launcher.lora_adapters import AdapterSpec


def main() -> int:
    values = json.loads(sys.argv[1])
    commands = values.pop("commands")
    model_cache_dir = Path(values.pop("model_cache_dir", "/nonexistent"))
    if values.get("cluster_secret_file") is not None:
        values["cluster_secret_file"] = Path(values["cluster_secret_file"])
    values["worker_addr"] = tuple(values.get("worker_addr", ()))
    values["lora_adapters"] = tuple(AdapterSpec(name, source) for name, source in values.get("lora_adapters", ()))
    forwarded = {entry.dest: values.pop(entry.dest) for entry in FORWARDED_FLAGS if entry.dest in values}
    config = LauncherConfig(
        **values,
        forwarded=forwarded,
        model_cache_dir=model_cache_dir,
        commands=ChildCommands(shard=tuple(commands["shard"]), router=tuple(commands["router"])),
    )
    return launch(config)


if __name__ == "__main__":
    sys.exit(main())
