"""The KV block size: the user's --block-size, else what the attention backend can page (flash: 256), else 16."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import router_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))


def one_gpu() -> int:
    return 1


@pytest.mark.parametrize(
    ("argv", "environ", "expected", "reason"),
    [
        ([], {}, 16, "the default"),
        (["--attention-backend", "triton"], {}, 16, "the default"),
        (["--attention-backend", "flash"], {}, 256, "--attention-backend flash pages the KV cache in multiples of 256"),
        ([], {"ATTENTION_BACKEND": "flash"}, 256, "--attention-backend flash"),
        (["--attention-backend", "flash", "--block-size", "512"], {}, 512, "--block-size"),
        (["--attention-backend", "flash"], {"BLOCK_SIZE": "32"}, 32, "--block-size"),
    ],
)
def test_block_size_follows_the_attention_backend_unless_set(
    argv: list[str], environ: dict[str, str], expected: int, reason: str
) -> None:
    config = parse_config(argv, environ, count_gpus=one_gpu)
    assert config.block_size == expected
    assert config.block_size_reason.startswith(reason)


def test_the_router_warms_shards_up_with_the_chosen_block_size() -> None:
    parsed = parse_config(["--attention-backend", "flash"], {}, count_gpus=one_gpu)
    config = LauncherConfig(**{**parsed.__dict__, "commands": COMMANDS})
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    argv = router_argv(config, model, TokenLimits(max_input_tokens=100, max_total_tokens=200), [Path("/s")])
    assert argv[argv.index("--block-size") + 1] == "256"
