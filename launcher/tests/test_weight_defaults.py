"""The CPU defaults chosen from the model and the machine: a GGUF serves its blocks, bfloat16 where the CPU multiplies
it natively, bfloat16 copies of quantized weights for batches there; a flag the user set is passed as given."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_launcher import weight_defaults
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.model_resolution import ResolvedModel
from tandem_launcher.weight_defaults import dtype, host_cpu_flags, quantize, quantized_dense_memory
from tandem_server.weights.gguf_format import GGUF_BLOCKS_DIR

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
AVX2_ONLY = frozenset({"avx2", "fma"})
COMMANDS = ChildCommands(shard=("tandem-shard",), router=("tandem-router",))


def gguf_model(tmp_path: Path) -> Path:
    (tmp_path / GGUF_BLOCKS_DIR).mkdir()
    (tmp_path / GGUF_BLOCKS_DIR / "model.safetensors").write_bytes(b"")
    return tmp_path


def config(*argv: str) -> LauncherConfig:
    parsed = parse_config(list(argv), {}, count_gpus=lambda: 0 if "cuda" not in argv else 1)
    return LauncherConfig(**{**parsed.__dict__, "commands": COMMANDS})


def test_a_gguf_model_on_cpu_serves_its_blocks_and_float_models_stay_float(tmp_path: Path) -> None:
    assert quantize(config("--device", "cpu"), gguf_model(tmp_path)).value == "gguf"
    assert quantize(config("--device", "cpu"), tmp_path / "float").value == "none"
    assert quantize(config("--device", "cpu", "--quantize", "none"), tmp_path).value == "none"
    assert quantize(config("--device", "cpu", "--quantize", "int8"), tmp_path).value == "int8"


def test_activations_are_bfloat16_where_the_cpu_multiplies_it_natively() -> None:
    cpu = config("--device", "cpu")
    assert dtype(cpu, ZEN4).value == "bfloat16" and "avx512_bf16" in dtype(cpu, ZEN4).reason
    assert dtype(cpu, SAPPHIRE_RAPIDS).value == "bfloat16"
    assert dtype(cpu, AVX2_ONLY).value == "float32"
    assert dtype(config("--device", "cpu", "--dtype", "float32"), ZEN4).value == "float32"
    assert dtype(config("--device", "cpu", "--dtype", "bfloat16"), AVX2_ONLY).value == "bfloat16"


@pytest.mark.parametrize(
    ("argv", "cpu_flags", "gguf", "expected"),
    [
        ((), ZEN4, True, "auto"),
        ((), SAPPHIRE_RAPIDS, True, "auto"),
        ((), AVX2_ONLY, True, "0"),
        ((), ZEN4, False, "0"),
        (("--dtype", "float32"), ZEN4, True, "0"),
        (("--quantize", "none"), ZEN4, True, "0"),
        (("--quantized-dense-memory", "1GiB"), AVX2_ONLY, True, "1GiB"),
        (("--quantized-dense-memory", "0"), ZEN4, True, "0"),
    ],
)
def test_bfloat16_copies_serve_batches_of_quantized_weights_where_they_pay(
    tmp_path: Path, argv: tuple[str, ...], cpu_flags: frozenset[str], gguf: bool, expected: str
) -> None:
    model = gguf_model(tmp_path) if gguf else tmp_path
    assert quantized_dense_memory(config("--device", "cpu", *argv), model, cpu_flags).value == expected


def test_cuda_keeps_float_weights_bfloat16_and_no_copies(tmp_path: Path) -> None:
    cuda = config("--device", "cuda")
    model = gguf_model(tmp_path)
    assert (quantize(cuda, model).value, dtype(cuda, ZEN4).value) == ("none", "bfloat16")
    assert quantized_dense_memory(cuda, model, ZEN4).value == "0"


def test_the_shard_gets_the_choices_for_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_defaults, "host_cpu_flags", lambda: ZEN4)
    model = ResolvedModel(path=gguf_model(tmp_path), served_name="m", max_position_embeddings=None)
    argv = shard_argv(config("--device", "cpu"), model, 0, Path("/s"), 1)
    values = {flag: argv[argv.index(flag) + 1] for flag in ("--quantize", "--dtype", "--quantized-dense-memory")}
    assert values == {"--quantize": "gguf", "--dtype": "bfloat16", "--quantized-dense-memory": "auto"}


def test_cpu_flags_come_from_cpuinfo_and_an_unreadable_one_gives_none(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert host_cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "avx512_bf16"})
    assert host_cpu_flags(tmp_path / "missing") == frozenset()
