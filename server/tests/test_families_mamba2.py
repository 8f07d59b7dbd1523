"""Granite 4.0-H's hybrid (Mamba-2 beside attention without rotary, Granite's multipliers; dense, with rotary, and
with routed experts) matches transformers: logits of mixed steps whose spans cross the scan's chunks and the shard's
prefill chunks, and greedy tokens of requests that decode together, finish at different steps and hand their state
slots to later requests. The scan's chunked and token-by-token forms agree from carried states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from recurrent_testing import assert_mixed_steps_match_logits, assert_requests_pass_their_slots_on
from shard_testing import CPU, load_tiny_model, write_tiny_checkpoint
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.recurrent.kernels import ssd_spans
from tandem_server.layers.recurrent.mamba2 import Mamba2Args, Mamba2Mixer
from tandem_server.layers.recurrent.ssd_scan import chunked_ssd, recurrent_ssd
from tandem_server.layers.recurrent.state_pool import RecurrentStatePool, state_pool_bytes
from tandem_server.models.granite_hybrid import granite_hybrid_args
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, PreTrainedModel

LOGITS_ATOL = 2e-4
BLOCK_SIZE = 4
GRANITE_HYBRID: dict[str, Any] = {
    "num_hidden_layers": 3,
    "layer_types": ["mamba", "attention", "mamba"],
    "max_position_embeddings": 256,
    "shared_intermediate_size": 96,
    "num_local_experts": 0,
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    # Small chunks, so that spans cross several of the scan's chunks.
    "mamba_chunk_size": 16,
    "embedding_multiplier": 3.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.2,
    "logits_scaling": 2.5,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "dense": GRANITE_HYBRID,
    "rope": {**GRANITE_HYBRID, "position_embedding_type": "rope", "mamba_conv_bias": False, "mamba_proj_bias": True},
    "experts": {**GRANITE_HYBRID, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32},
}
SEQUENCE_LENGTHS = {"A": 70, "B": 41, "C": 9}
# (request, first position, tokens): spans start inside the scan's chunks; decodes share steps with prompt chunks.
SCHEDULE = [
    [("A", 0, 37), ("B", 0, 11)],
    [("B", 11, 29), ("A", 37, 30)],
    [("A", 67, 1), ("C", 0, 6)],
    [("C", 6, 3), ("A", 68, 1)],
    [("A", 69, 1), ("B", 40, 1)],
]


def randomize_mamba(model: PreTrainedModel) -> None:
    """Random `dt_bias`, `A_log` and `D` (their inits are constant or in head order, which would hide one loaded per
    wrong head), and routers."""
    for name, param in model.named_parameters():
        if name.endswith(("dt_bias", ".D", "router.weight")):
            param.copy_(torch.randn_like(param))
        elif name.endswith("A_log"):
            param.copy_(torch.rand_like(param) * 2 - 1)


def write_granite_hybrid(path: Path, variant: str = "dense") -> PreTrainedModel:
    return write_tiny_checkpoint(
        path, GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, randomize=randomize_mamba, **VARIANTS[variant]
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mixed_steps_across_scan_chunks_match_transformers_logits(tmp_path: Path, variant: str) -> None:
    reference = write_granite_hybrid(tmp_path, variant)
    model = load_tiny_model(tmp_path)
    assert_mixed_steps_match_logits(reference, model, SEQUENCE_LENGTHS, SCHEDULE, BLOCK_SIZE, LOGITS_ATOL)


def test_requests_decode_together_finish_apart_and_pass_their_slots_on(tmp_path: Path) -> None:
    reference = write_granite_hybrid(tmp_path)
    # Three state slots: the fourth request runs only in the slot a finished one gave back. Prefill chunks of 40
    # tokens: the 60-token prompt takes two, each crossing a scan chunk boundary.
    assert_requests_pass_their_slots_on(reference, tmp_path, (5, 60, 9, 12), (3, 6, 6, 6), BLOCK_SIZE, 40)


def _scan_inputs(seqs: int, heads: int, tokens: int, head_dim: int, state_size: int) -> tuple[torch.Tensor, ...]:
    """`dt · x`, `dt · A` (A in [-1.1, -0.1)), B and C `[seqs, heads, tokens, ...]`."""
    dt = torch.nn.functional.softplus(torch.randn(seqs, heads, tokens))
    weighted_x = torch.randn(seqs, heads, tokens, head_dim) * dt.unsqueeze(-1)
    log_decay = dt * (-torch.rand(heads) - 0.1)[:, None]
    return (
        weighted_x,
        log_decay,
        torch.randn(seqs, heads, tokens, state_size),
        torch.randn(seqs, heads, tokens, state_size),
    )


def test_chunked_and_token_by_token_scans_agree_from_carried_states() -> None:
    torch.manual_seed(0)
    x, log_decay, b, c = _scan_inputs(2, 3, 37, 5, 6)
    initial = torch.randn(2, 3, 5, 6)
    state, expected = initial, []
    for t in range(x.shape[2]):
        out, state = recurrent_ssd(x[:, :, t], log_decay[:, :, t], b[:, :, t], c[:, :, t], state)
        expected.append(out)
    # Chunks of 8: several whole chunks and a shorter last one.
    outputs, final = chunked_ssd(x, log_decay, b, c, initial, chunk=8)
    torch.testing.assert_close(outputs, torch.stack(expected, dim=2), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, state, atol=1e-4, rtol=1e-4)


def test_spans_of_different_lengths_leave_each_sequence_its_own_state() -> None:
    torch.manual_seed(1)
    lens = [6, 1, 11]
    # Flat [tokens, heads, ...] as a step holds them.
    x, log_decay, b, c = (t[0].transpose(0, 1) for t in _scan_inputs(1, 2, sum(lens), 3, 4))
    initial = torch.randn(len(lens), 2, 3, 4)
    outputs, states = ssd_spans(x, log_decay, b, c, lens, initial, chunk=4)
    start = 0
    for i, n in enumerate(lens):
        state = initial[i : i + 1]
        for t in range(start, start + n):
            step = slice(t, t + 1)
            out, state = recurrent_ssd(x[step], log_decay[step], b[step], c[step], state)
            torch.testing.assert_close(outputs[step], out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[i : i + 1], state, atol=1e-5, rtol=1e-5)
        start += n


def test_config_reading_layer_kinds_and_the_even_head_split() -> None:
    base = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 32}
    hf = {**base, **GRANITE_HYBRID, "layer_types": ["linear_attention", "full_attention", "mamba"]}
    args = granite_hybrid_args(hf)
    assert [kind.recurrent for kind in args.layers] == [True, False, True]
    assert (args.intermediate_size, args.layers[1].rope.partial_rotary_factor, args.moe) == (96, 0.0, None)
    assert granite_hybrid_args({**hf, "position_embedding_type": "rope"}).layers[1].rope.partial_rotary_factor == 1
    with pytest.raises(ConfigError, match="unsupported Granite hybrid layer types"):
        granite_hybrid_args({**hf, "layer_types": ["mamba", "sliding_attention", "mamba"]})
    with pytest.raises(ConfigError, match="mamba_n_groups"):
        Mamba2Args.from_hf({**hf, "mamba_n_groups": 3})
    with pytest.raises(ConfigError, match="3 shards cannot split the Mamba-2 layers' 4 heads evenly"):
        Mamba2Mixer(Mamba2Args.from_hf(hf), ParallelContext(rank=0, world_size=3))


@pytest.mark.parametrize(("groups", "conv_channels"), [(2, 64 + 2 * 16), (1, 64 + 2 * 16), (4, 64 + 2 * 2 * 16)])
def test_each_rank_declares_the_state_of_its_heads_and_the_groups_it_keeps(groups: int, conv_channels: int) -> None:
    # Two ranks: whole groups split (2 and 4 groups); one group's B and C kept by both.
    hf = {"hidden_size": 64, **GRANITE_HYBRID, "mamba_n_groups": groups}
    for rank in range(2):
        mixer = Mamba2Mixer(Mamba2Args.from_hf(hf), ParallelContext(rank=rank, world_size=2))
        assert mixer.state_shapes == ((conv_channels, 3), (2, 32, 16))


def test_state_pool_keeps_the_scan_memory_in_float32(tmp_path: Path) -> None:
    write_granite_hybrid(tmp_path)
    spec = load_tiny_model(tmp_path).spec
    # Per Mamba-2 layer: the convolution's last 3 inputs of x, B and C, then the scan's memory.
    assert spec.state_shapes == ((128 + 2 * 2 * 16, 3), (4, 32, 16)) * 2
    pool = RecurrentStatePool(spec.state_shapes, 2, torch.bfloat16, CPU, spec.state_dtypes)
    assert [layer.dtype for layer in pool.layers] == [torch.bfloat16, torch.float32] * 2
    assert state_pool_bytes(spec.state_shapes, 2, torch.bfloat16, spec.state_dtypes) == pool.nbytes
