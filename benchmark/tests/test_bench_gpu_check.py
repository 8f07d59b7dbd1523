"""The GPU check's CPU-runnable parts: FLOP counts, peaks, MFU rows, the random checkpoint and its tokenizer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from tandem_bench.gpu_check import CUDA_TESTS, REPO, build_parser
from tandem_bench.gpu_report import format_sweep, prefill_mfu, sweep_row
from tandem_bench.metrics import Stats, Summary
from tandem_bench.mfu import TransformerShape, bf16_peak_flops, utilisation
from tandem_bench.random_model import (
    LLAMA3_8B,
    checkpoint_shapes,
    llama3_8b_config,
    write_padded_tokenizer,
    write_random_checkpoint,
)
from tokenizers import Tokenizer, models, pre_tokenizers

LLAMA3_8B_SHAPE = TransformerShape.from_hf_config(LLAMA3_8B)
H200_PEAK = 989.4e12


def test_every_kernel_cases_file_runs_on_the_gpu() -> None:
    """Each `*_cases.py` checks a Triton kernel under the interpreter in `make test`; on a GPU the check runs it."""
    cases = {f"server/tests/{path.name}" for path in (REPO / "server" / "tests").glob("*_cases.py")}
    assert "server/tests/latent_triton_cases.py" in cases
    assert cases <= set(CUDA_TESTS)
    assert all((REPO / path).is_file() for path in CUDA_TESTS)


def test_llama3_8b_checkpoint_has_its_published_parameter_count() -> None:
    shapes = checkpoint_shapes(llama3_8b_config(eos_token_id=2, bos_token_id=1))
    assert sum(torch.Size(shape).numel() for shape in shapes.values()) == 8_030_261_248
    assert shapes["model.layers.31.self_attn.k_proj.weight"] == (1024, 4096)
    assert shapes["lm_head.weight"] == (128256, 4096)


def test_matmul_flops_count_every_projection_and_the_lm_head_but_not_the_embedding() -> None:
    # 32 x (4096*128*(2*32 + 2*8) + 3*4096*14336) + 4096*128256.
    assert LLAMA3_8B_SHAPE.matmul_params == 7_504_658_432
    # Attention adds 4 * layers * heads * head_dim FLOPs per position of context.
    assert LLAMA3_8B_SHAPE.token_flops(100) - LLAMA3_8B_SHAPE.token_flops(99) == 4 * 32 * 32 * 128


def test_prefill_flops_are_the_sum_of_its_tokens_attending_to_their_prefixes() -> None:
    prompt = 37
    per_token = sum(LLAMA3_8B_SHAPE.token_flops(position) for position in range(1, prompt + 1))
    assert LLAMA3_8B_SHAPE.prefill_flops(prompt) == pytest.approx(per_token, rel=1e-12)
    assert LLAMA3_8B_SHAPE.decode_flops(prompt, 3) == LLAMA3_8B_SHAPE.token_flops(38) + LLAMA3_8B_SHAPE.token_flops(39)


@pytest.mark.parametrize(
    ("name", "peak"),
    [("NVIDIA H200", 989.4e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 80GB HBM3", 989.4e12),
     ("NVIDIA L40S", 362.05e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("Tesla T4", None)],
)  # fmt: skip
def test_bf16_peaks_are_looked_up_by_device_name(name: str, peak: float | None) -> None:
    assert bf16_peak_flops(name) == peak


def summary(completed: int, input_tokens: int, output_throughput: float, tpot_median_ms: float) -> Summary:
    return Summary(
        completed=completed,
        failed=0,
        duration_s=10.0,
        input_tokens=input_tokens,
        output_tokens=completed * 256,
        request_throughput=completed / 10.0,
        output_throughput=output_throughput,
        total_token_throughput=0.0,
        ttft=Stats(mean=60.0, median=50.0, p90=80.0, p99=95.0, count=completed),
        tpot=Stats(mean=21.0, median=tpot_median_ms, p90=24.0, p99=30.0, count=completed),
        itl=Stats(mean=20.0, median=19.0, p90=25.0, p99=40.0, count=completed * 255),
        e2e=Stats(),
    )


def test_decode_mfu_is_batch_tokens_per_median_tpot_at_the_mean_context() -> None:
    row = sweep_row(64, summary(128, 128 * 512, 3000.0, 20.0), LLAMA3_8B_SHAPE, 256, H200_PEAK)
    expected = 64 * LLAMA3_8B_SHAPE.token_flops(512 + 128) / 0.020 / H200_PEAK
    assert row.decode_mfu == pytest.approx(expected)
    assert (row.mean_prompt_tokens, row.ttft_p99_ms, row.itl_p50_ms) == (512.0, 95.0, 19.0)
    assert "64" in format_sweep([row]).splitlines()[1]


def test_prefill_mfu_divides_the_prompts_flops_by_the_shards_forward_time() -> None:
    # 64 prompts of 512 tokens in 2.5 s of prefill forward passes.
    flops = 64 * LLAMA3_8B_SHAPE.prefill_flops(512)
    assert prefill_mfu(LLAMA3_8B_SHAPE, [512] * 64, 2.5, H200_PEAK) == pytest.approx(flops / 2.5 / H200_PEAK)
    assert utilisation(1.0, 0.0, H200_PEAK) == 0.0


def test_random_checkpoint_loads_into_the_shards_llama(tmp_path: Path) -> None:
    from tandem_server.distributed import ParallelContext  # noqa: PLC0415
    from tandem_server.layers.attention import TorchAttentionBackend  # noqa: PLC0415
    from tandem_server.models.config import read_checkpoint_config  # noqa: PLC0415
    from tandem_server.models.loader import load_model  # noqa: PLC0415

    tiny = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = llama3_8b_config(2, 1, **tiny, num_key_value_heads=2, head_dim=16, vocab_size=300)
    written = write_random_checkpoint(tmp_path, config, "cpu")
    assert written == 2 * sum(torch.Size(shape).numel() for shape in checkpoint_shapes(config).values())
    model = load_model(
        read_checkpoint_config(tmp_path),
        torch.bfloat16,
        torch.device("cpu"),
        ParallelContext(),
        TorchAttentionBackend(),
    )
    assert model.spec.vocab_size == 300 and json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == 2


def test_tokenizer_is_padded_to_the_model_vocabulary_and_decodes_every_id(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(source / "tokenizer.json"))
    (source / "generation_config.json").write_text('{"eos_token_id": 2, "bos_token_id": 1}')
    write_padded_tokenizer(source, tmp_path / "model", 40)
    padded = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    assert padded.get_vocab_size(with_added_tokens=True) == 40
    assert padded.decode([39], skip_special_tokens=False) == "<|pad_39|>"
    assert (tmp_path / "model" / "generation_config.json").is_file()
    with pytest.raises(ValueError, match="already has more than 2 entries"):
        write_padded_tokenizer(source, tmp_path / "small", 2)


def test_default_sweep_is_batch_1_to_256_with_512_token_prompts_and_256_token_outputs() -> None:
    args = build_parser().parse_args([])
    assert args.sweep == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert (args.prompt_tokens, args.output_len) == (512, 256)


def test_each_attention_backend_then_fp8_serves_on_its_share_of_the_remaining_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tandem_bench import gpu_check  # noqa: PLC0415

    served: list[tuple[str, str, tuple[int, ...], float]] = []
    clock = iter([100.0, 100.0, 200.0, 200.0, 400.0, 400.0])
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: next(clock))

    def serve(model_dir: Path, log_path: Path, args: argparse.Namespace, report: object) -> None:
        served.append((args.backend, args.quantize, args.points, args.backend_deadline))
        assert log_path.name == f"launcher-{args.run}.log"

    monkeypatch.setattr(gpu_check, "serve_with_backend", serve)
    args = build_parser().parse_args([])
    assert args.attention_backends == ["triton", "flash"] and args.fp8
    args.deadline = 500.0
    gpu_check.serve_and_measure(Path("/m"), args, gpu_check.CheckReport())
    # triton gets a third of the 400 s left, flash half of what remains after it, FP8 the rest.
    sweep = tuple(args.sweep)
    assert served == [
        ("triton", "none", sweep, 100.0 + 400.0 / 3),
        ("flash", "none", sweep, 350.0),
        ("triton", "fp8", (1, 256), 500.0),
    ]
    assert [run[1] for run in gpu_check.serve_runs(build_parser().parse_args(["--no-fp8"]))] == ["none", "none"]


def test_the_fp8_gemms_stay_within_the_stated_bound_of_bfloat16() -> None:
    from tandem_bench.fp8_check import FP8_RELATIVE_RMS_BOUND, fp8_gemm_errors  # noqa: PLC0415

    errors = fp8_gemm_errors({"small": (256, 512), "wide": (64, 1024)}, rows=4, device="cpu")
    assert all(error["ok"] for error in errors.values())
    # Both weights and activations are rounded: the error is well above bfloat16's own (2^-9).
    assert all(0.02 < error["relative_rms"] <= FP8_RELATIVE_RMS_BOUND for error in errors.values())


def test_the_fp8_row_sets_batch_1_latency_and_batch_256_throughput_beside_bfloat16s() -> None:
    from tandem_bench.fp8_check import fp8_against_bf16  # noqa: PLC0415

    def rows(tpot: float, throughput: float) -> dict[str, object]:
        return {"rows": [{"concurrency": 1, "tpot_p50_ms": tpot, "output_throughput": 1000 / tpot},
                         {"concurrency": 256, "tpot_p50_ms": 40.0, "output_throughput": throughput}]}  # fmt: skip

    phases = {"throughput/triton": rows(7.0, 9000.0), "throughput/triton+fp8": rows(5.0, 12000.0)}
    assert fp8_against_bf16(phases, "triton", "triton+fp8") == {
        "bf16_tpot_ms_batch_1": 7.0, "fp8_tpot_ms_batch_1": 5.0,
        "bf16_tokens_per_s_batch_256": 9000.0, "fp8_tokens_per_s_batch_256": 12000.0,
    }  # fmt: skip
    # A run that never reached batch 256 (its time ran out) compares batch 1 only; none at all compares nothing.
    phases["throughput/triton+fp8"]["rows"].pop()
    assert set(fp8_against_bf16(phases, "triton", "triton+fp8")) == {"bf16_tpot_ms_batch_1", "fp8_tpot_ms_batch_1"}
    assert fp8_against_bf16({}, "triton", "triton+fp8") == {}
