"""Nemotron-H (Mamba-2, attention without rotary and ungated relu² MLP blocks, per `hybrid_override_pattern`) matches
transformers: logits of mixed steps whose spans cross the scan's chunks, and greedy tokens of requests that decode
together, finish apart and hand their state slots on. MLP blocks take neither paged caches nor state slots."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from shard_testing import CPU, StepDriver, load_tiny_model, make_runner, new_request, write_tiny_checkpoint
from tandem_server.distributed import ParallelContext
from tandem_server.engine.step import StepInput, WarmupPlan
from tandem_server.errors import ConfigError
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import run_prepared
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.execution.protocol import PlannedStep
from tandem_server.layers.recurrent.mamba2 import Mamba2Args, Mamba2Mixer
from tandem_server.layers.recurrent.state_pool import RecurrentStatePool
from tandem_server.models.nemotron_h import nemotron_h_args, nemotron_h_blocks
from transformers import NemotronHConfig, NemotronHForCausalLM, PreTrainedModel

LOGITS_ATOL = 2e-4
BLOCK_SIZE = 4
NEMOTRON_H: dict[str, Any] = {
    "hybrid_override_pattern": "M-*M-",
    "head_dim": 16,
    "intermediate_size": 96,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    # Small chunks, so that spans cross several of the scan's chunks.
    "chunk_size": 16,
    "n_routed_experts": 4,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": NEMOTRON_H,
    # A floor under the step that many heads' steps fall below (the reference's chunked scan applies it; the
    # logits here are the reference's over whole sequences).
    "biased-step-floor": {
        **NEMOTRON_H,
        "use_bias": True,
        "use_conv_bias": False,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "time_step_min": 0.3,
    },
}
SEQUENCE_LENGTHS = {"A": 70, "B": 41, "C": 9}
SCHEDULE = [
    [("A", 0, 37), ("B", 0, 11)],
    [("B", 11, 29), ("A", 37, 30)],
    [("A", 67, 1), ("C", 0, 6)],
    [("C", 6, 3), ("A", 68, 1)],
    [("A", 69, 1), ("B", 40, 1)],
]


def randomize(model: PreTrainedModel) -> None:
    """Random `dt_bias`, `A_log`, `D` and biases (their inits are constant), which would hide a misplaced one."""
    for name, param in model.named_parameters():
        if name.endswith(("dt_bias", ".D", ".bias")):
            param.copy_(torch.randn_like(param) * 0.5)
        elif name.endswith("A_log"):
            param.copy_(torch.rand_like(param) * 2 - 1)


def write_nemotron_h(path: Path, variant: str = "plain") -> PreTrainedModel:
    return write_tiny_checkpoint(path, NemotronHConfig, NemotronHForCausalLM, randomize=randomize, **VARIANTS[variant])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mixed_steps_across_scan_chunks_match_transformers_logits(tmp_path: Path, variant: str) -> None:
    reference = write_nemotron_h(tmp_path, variant)
    model = load_tiny_model(tmp_path)
    # One paged cache (the attention block), two Mamba-2 layers' states; the MLP blocks keep nothing.
    assert (model.spec.num_layers, len(model.spec.state_shapes)) == (1, 4)
    rng = random.Random(1)
    sequences = {seq: [rng.randrange(3, 96) for _ in range(n)] for seq, n in SEQUENCE_LENGTHS.items()}
    with torch.no_grad():
        expected = {seq: reference(torch.tensor([ids])).logits[0] for seq, ids in sequences.items()}
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in SEQUENCE_LENGTHS.values())
    cache = KVCache(CacheGeometry.of(model.spec, BLOCK_SIZE, torch.float32), num_blocks=num_blocks, device=CPU)
    blocks = list(range(num_blocks))
    rng.shuffle(blocks)
    tables = {seq: [blocks.pop() for _ in range(-(-n // BLOCK_SIZE))] for seq, n in SEQUENCE_LENGTHS.items()}
    request_ids = {seq: i for i, seq in enumerate(SEQUENCE_LENGTHS)}
    pool = RecurrentStatePool(model.spec.state_shapes, 3, torch.float32, CPU, model.spec.state_dtypes)

    with torch.inference_mode():
        for step in SCHEDULE:
            spans = [ScheduledSpan(sequences[n][s : s + k], s, tables[n], request_ids[n]) for n, s, k in step]
            batch = build_step_batch(spans, BLOCK_SIZE, CPU)
            states = pool.place([(request_ids[n], s, k) for n, s, k in step])
            logits = model.compute_logits(run_prepared(model, PlannedStep(batch, cache.layers, model.backend, states)))
            row = 0
            for seq, start, num_tokens in step:
                error = (logits[row : row + num_tokens] - expected[seq][start : start + num_tokens]).abs().max()
                assert error.item() <= LOGITS_ATOL, f"{seq}@{start}: |logit error| {error.item():.4g}"
                row += num_tokens


def test_requests_decode_together_finish_apart_and_pass_their_slots_on(tmp_path: Path) -> None:
    reference = write_nemotron_h(tmp_path)
    runner = make_runner(tmp_path)
    # Three state slots: the fourth request runs only in the slot a finished one gave back.
    runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=128, max_batch_requests=3))
    rng = random.Random(7)
    lengths, budgets = (5, 60, 9, 12), (3, 6, 6, 6)
    prompts = [[rng.randrange(3, 96) for _ in range(n)] for n in lengths]
    requests = [new_request(i, p, budget) for i, (p, budget) in enumerate(zip(prompts, budgets, strict=True))]
    driver = StepDriver(runner, num_blocks=runner.cache.num_blocks, chunk_size=40, seed=3)
    driver.step(requests[:3])
    while not driver.done:
        driver.step([])
    assert runner.execution.states is not None and runner.execution.states.held == 3
    driver.step([requests[3]])
    while driver.tracked:
        driver.step([])

    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            output = reference.generate(
                torch.tensor([prompt]), max_new_tokens=budgets[i], do_sample=False, eos_token_id=None
            )
        assert driver.done[i] == output[0, len(prompt) :].tolist(), f"request {i}"
    runner.step(StepInput())
    assert runner.execution.states.held == 0


def test_config_reading_block_kinds_and_refusals() -> None:
    base = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 32}
    hf = {**base, **NEMOTRON_H}
    assert nemotron_h_blocks(hf) == ["mamba", "mlp", "attention", "mamba", "mlp"]
    listed = ["linear_attention", "full_attention", "mlp"]
    assert nemotron_h_blocks({**base, "layers_block_type": listed}) == ["mamba", "attention", "mlp"]
    args = nemotron_h_args(hf)
    assert [kind.recurrent for kind in args.layers] == [True, False, False, True, False]
    assert (args.hidden_act, args.layers[2].rope.partial_rotary_factor, args.rms_norm_eps) == ("relu2", 0.0, 1e-5)
    with pytest.raises(ConfigError, match="routed-expert layers"):
        nemotron_h_blocks({**hf, "hybrid_override_pattern": "ME*"})
    with pytest.raises(ConfigError, match="unsupported Nemotron-H layer types"):
        nemotron_h_blocks({**hf, "hybrid_override_pattern": "M+"})
    assert Mamba2Args.from_nemotron_h(hf).time_step_limit == (0.001, float("inf"))
    with pytest.raises(ConfigError, match="n_groups"):
        Mamba2Args.from_nemotron_h({**hf, "n_groups": 3})
    with pytest.raises(ConfigError, match="Mamba-2 layers run on one shard"):
        Mamba2Mixer(Mamba2Args.from_nemotron_h(hf), ParallelContext(rank=0, world_size=2))
