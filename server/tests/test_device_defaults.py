"""The shard's `auto` device settings: CUDA graphs on CUDA, prepacked GEMM rows and the decode mirror on CPU, each
with its logged reason; a value the user gave is kept."""

from __future__ import annotations

import pytest
from tandem_server.cli import config_from_args
from tandem_server.device_defaults import DEFAULT_CUDA_GRAPH_SIZES, DEFAULT_PACKED_GEMM_ROWS, choose_device_settings
from tandem_server.errors import ConfigError

GIB = 1024**3
SHARD = ["--model-path", "m", "--uds-path", "s", "--kv-cache-memory", "2GiB"]


def choose(device: str, graphs: str = "auto", rows: str = "auto", mirror: str = "auto"):
    return choose_device_settings(graphs, rows, mirror, device, 2 * GIB)


def test_auto_on_cpu_packs_gemm_rows_and_mirrors_half_the_kv_cache_without_graphs() -> None:
    cpu = choose("cpu")
    assert (cpu.cuda_graph_sizes, cpu.packed_gemm_rows, cpu.decode_mirror_memory) == (
        (),
        DEFAULT_PACKED_GEMM_ROWS,
        GIB,
    )


def test_auto_on_cuda_replays_graphs_without_packed_rows_or_mirror() -> None:
    cuda = choose("cuda")
    assert (cuda.cuda_graph_sizes, cuda.packed_gemm_rows, cuda.decode_mirror_memory) == (
        DEFAULT_CUDA_GRAPH_SIZES,
        (),
        0,
    )


def test_given_values_are_kept_on_either_device() -> None:
    given = choose("cpu", graphs="0", rows="16, 32", mirror="256MiB")
    assert (given.cuda_graph_sizes, given.packed_gemm_rows, given.decode_mirror_memory) == ((), (16, 32), 256 << 20)
    assert choose("cuda", graphs="8,1").cuda_graph_sizes == (1, 8)


def test_every_device_choice_states_its_reason() -> None:
    assert choose("cpu").reasons == (
        "--cuda-graphs 0: a CUDA option",
        "--packed-gemm-rows 32: decode batches of up to 32 rows multiply by prepacked weights on CPU",
        "--decode-mirror-memory 1024MiB: half of --kv-cache-memory: decode attention on CPU reads contiguous copies",
    )
    assert choose("cuda", rows="0").reasons[:2] == (
        "--cuda-graphs 1,2,4,8,16,32,64: decode steps on CUDA replay captured graphs instead of launching each kernel",
        "--packed-gemm-rows 0: as given",
    )


def test_the_device_flags_default_to_auto_and_resolve_by_device() -> None:
    cpu = config_from_args(SHARD)
    assert (cpu.cuda_graph_sizes, cpu.packed_gemm_rows, cpu.decode_mirror_memory) == ((), (32,), GIB)
    assert "--decode-mirror-memory 1024MiB: half of --kv-cache-memory" in " ".join(cpu.auto_reasons)
    explicit = config_from_args([*SHARD, "--cuda-graphs", "auto", "--packed-gemm-rows", "auto"])
    assert (explicit.cuda_graph_sizes, explicit.packed_gemm_rows) == ((), (32,))
    cuda = config_from_args([*SHARD, "--device", "cuda", "--decode-mirror-memory", "auto"])
    assert (cuda.cuda_graph_sizes, cuda.packed_gemm_rows, cuda.decode_mirror_memory) == (
        DEFAULT_CUDA_GRAPH_SIZES,
        (),
        0,
    )


def test_a_given_device_option_on_the_wrong_device_is_still_refused() -> None:
    with pytest.raises(ConfigError, match="--packed-gemm-rows is a CPU option"):
        config_from_args([*SHARD, "--device", "cuda", "--packed-gemm-rows", "32"])
    with pytest.raises(ConfigError, match="--decode-mirror-memory is a CPU option"):
        config_from_args([*SHARD, "--device", "cuda", "--decode-mirror-memory", "1GiB"])
