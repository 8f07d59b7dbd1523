"""Build step: generate the gRPC stubs of the shard contract from `proto/` (never committed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from grpc_tools import protoc
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

CONTRACT_DIR = Path("proto/tandem/shard/v1")
GENERATED_DIR = Path("tandem_server/rpc/generated")


class ProtoBuildHook(BuildHookInterface):
    """Runs grpcio-tools' protoc over the contract before every wheel or editable build."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        contract_dir = (root.parent / CONTRACT_DIR).resolve()
        out_dir = root / GENERATED_DIR
        out_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"-I{contract_dir}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(contract_dir / "shard.proto"),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {contract_dir / 'shard.proto'}")
        grpc_module = out_dir / "shard_pb2_grpc.py"
        # protoc writes a top-level import; the stubs live inside our package.
        text = re.sub(r"^import shard_pb2", "from . import shard_pb2", grpc_module.read_text(), flags=re.M)
        grpc_module.write_text(text)
        (out_dir / "__init__.py").write_text('"""Generated from proto/tandem/shard/v1/shard.proto."""\n')
        build_data["artifacts"].append(str(GENERATED_DIR) + "/*")
