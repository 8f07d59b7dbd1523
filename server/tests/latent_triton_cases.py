"""The Triton MLA decode kernel against the torch backend's eager absorbed form: run on CUDA, or on CPU by Triton's
interpreter.

Not collected by default (no `test_` prefix): `test_latent_triton.py` runs it in a subprocess with
TRITON_INTERPRET=1, and `make gpu-check` runs it on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from attention_testing import DECODE_STEP, MIXED_STEP, PagedCase, paged_case, uniform_layout
from reference_checks import Target, assert_mixed_steps_match_logits
from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionMetadata, TorchAttentionBackend, UniformShape
from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.layers.latent_attention import LatentAttention, LatentAttentionArgs
from tandem_server.layers.rope_config import RopeConfig
from tandem_server.layers.rotary import RotaryEmbedding
from triton_testing import widen_bfloat16_dots

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CUDA = torch.cuda.is_available() and not INTERPRETED
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
# The reference runs in float32 on the same (rounded) inputs; bfloat16 rounds the kernel's weights before the value
# product and its output.
TOLERANCE = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}

if not ON_CUDA and not INTERPRETED:
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)

if INTERPRETED:
    widen_bfloat16_dots()

from tandem_server.layers.attention.triton_backend import (  # noqa: E402
    DEFAULT_SM_COUNT,
    TritonAttentionBackend,
    decode_splits,
)


@dataclass(frozen=True)
class LatentShape:
    heads: int
    latent_dim: int
    rope_dim: int

    @property
    def width(self) -> int:
        return self.latent_dim + self.rope_dim


# DeepSeek-V3's latent (512 + 64) with the 16 heads of one rank of eight, and with 20 heads (two head tiles, the
# second partly empty); a small power-of-two shape; the small random checkpoints' shape (16 + 8, three heads of a
# rank), below every tile's width.
SHAPES = {
    "deepseek-v3-16-heads": LatentShape(16, 512, 64),
    "deepseek-v3-20-heads": LatentShape(20, 512, 64),
    "small": LatentShape(4, 32, 16),
    "tiny-3-heads": LatentShape(3, 16, 8),
}
# (cached prefix, tokens this step): decodes beside prompt chunks over 4-token pages (contexts across page
# boundaries); decodes only; a long context split across programs beside a short one, over 16-token pages.
LONG_DECODE = ((520, 1), (7, 1), (0, 3))
STEPS = {"mixed": (MIXED_STEP, 4), "decode_only": (DECODE_STEP, 4), "long_split": (LONG_DECODE, 16)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def latent_case(step: str, shape: LatentShape, dtype: torch.dtype, seed: int) -> PagedCase:
    requests, block_size = STEPS[step]
    return paged_case(requests, seed=seed, dtype=dtype, block_size=block_size, heads=(shape.heads, 1, shape.width))


def latent_cache(case: PagedCase, shape: LatentShape, device: torch.device, dtype: torch.dtype) -> LatentLayerCache:
    return LatentLayerCache.of(case.cache.key.to(device, dtype), shape.latent_dim)


def on_device(metadata: AttentionMetadata) -> AttentionMetadata:
    paged = metadata.paged
    moved = [tensor.to(DEVICE) for tensor in (paged.query_start_loc, paged.seq_lens, paged.block_tables)]
    return AttentionMetadata(
        slot_mapping=metadata.slot_mapping.to(DEVICE),
        paged=type(paged)(*moved, paged.max_query_len, paged.max_seq_len, paged.query_lens),
        host=metadata.host,
    )


def eager_absorbed(case: PagedCase, sizes: LatentShape, scale: float) -> tuple[torch.Tensor, torch.Tensor | slice]:
    """The torch backend's absorbed decode in float32, and the step's decode rows in its order."""
    reference = TorchAttentionBackend()
    cache = latent_cache(case, sizes, torch.device("cpu"), torch.float32)
    metadata = reference.prepare(case.batch().metadata, [cache]).metadata
    rows = reference.latent_layout(metadata).decode_rows
    assert rows is not None
    return reference.absorbed_decode(case.query.float()[rows], cache, metadata, scale), rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("step", STEPS)
def test_latent_decode_kernel_matches_the_eager_absorbed_form(step: str, shape: str, dtype: str) -> None:
    sizes, kind = SHAPES[shape], DTYPES[dtype]
    case = latent_case(step, sizes, kind, seed=len(shape) + len(step))
    scale = (sizes.width + 64) ** -0.5
    expected, reference_rows = eager_absorbed(case, sizes, scale)

    backend = TritonAttentionBackend()
    cache = latent_cache(case, sizes, DEVICE, kind)
    metadata = backend.prepare(on_device(case.batch().metadata), [cache]).metadata
    layout = backend.latent_layout(metadata)
    assert layout.decode_rows is not None
    rows = layout.decode_rows if isinstance(layout.decode_rows, slice) else layout.decode_rows.cpu()
    assert torch.equal(case.query[rows], case.query[reference_rows])
    output = backend.absorbed_decode(case.query.to(DEVICE)[layout.decode_rows], cache, metadata, scale)
    assert output.dtype == kind and output.shape == expected.shape
    torch.testing.assert_close(output.float().cpu(), expected, **TOLERANCE[kind])


def test_long_contexts_split_their_keys_across_programs() -> None:
    longest = max(start + count for start, count in LONG_DECODE)
    assert decode_splits(2, 1, longest, DEFAULT_SM_COUNT) > 1


def random_layer(args: LatentAttentionArgs, seed: int) -> LatentAttention:
    torch.manual_seed(seed)
    layer = LatentAttention(args, ParallelContext())
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) / parameter.shape[-1] ** 0.5)
    return layer


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_latent_layer_on_the_triton_backend_matches_it_on_the_torch_backend(dtype: str) -> None:
    """A mixed step through the whole layer: prompt chunks in expanded form, decodes through the kernel."""
    kind = DTYPES[dtype]
    args = LatentAttentionArgs(
        hidden_size=48, num_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
        v_head_dim=20, bias=False, scale=32**-0.5,
    )  # fmt: skip
    shape = LatentShape(args.num_heads, args.kv_lora_rank, args.qk_rope_head_dim)
    case = latent_case("mixed", shape, kind, seed=5)
    hidden = torch.randn(case.query.shape[0], args.hidden_size, generator=torch.Generator().manual_seed(6))
    layer = random_layer(args, seed=7)
    rotary = RotaryEmbedding(args.qk_rope_head_dim, 64, RopeConfig())
    batch = case.batch()

    reference = TorchAttentionBackend()
    reference_cache = latent_cache(case, shape, torch.device("cpu"), torch.float32)
    prepared = reference.prepare(batch.metadata, [reference_cache]).metadata
    angles = rotary.angles(batch.positions, torch.float32)
    expected = layer(hidden, angles, reference_cache, prepared, reference)

    backend = TritonAttentionBackend()
    cache = latent_cache(case, shape, DEVICE, kind)
    metadata = backend.prepare(on_device(batch.metadata), [cache]).metadata
    on_gpu = layer.to(DEVICE, kind)
    device_angles = rotary.to(DEVICE).angles(batch.positions.to(DEVICE), kind)
    output = on_gpu(hidden.to(DEVICE, kind), device_angles, cache, metadata, backend)
    tolerance = TOLERANCE[kind] if kind == torch.float32 else {"atol": 6e-2, "rtol": 6e-2}
    torch.testing.assert_close(output.float().cpu(), expected, **tolerance)
    torch.testing.assert_close(cache.key.float().cpu(), reference_cache.key, **tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_decode_step_laid_out_as_a_captured_graph_reads_the_device_layout_alone(dtype: str) -> None:
    """A graph's metadata has no host layout: its decodes run from the block tables, padding rows attend to the
    reserved block, and the real rows match the eager absorbed form."""
    sizes, kind = SHAPES["deepseek-v3-16-heads"], DTYPES[dtype]
    case = latent_case("decode_only", sizes, kind, seed=3)
    scale = 0.07
    expected, _ = eager_absorbed(case, sizes, scale)
    laid_out = uniform_layout(case, UniformShape(6, 1))
    assert laid_out.metadata.host is None
    backend = TritonAttentionBackend()
    cache = LatentLayerCache.of(laid_out.cache.key.to(DEVICE), sizes.latent_dim)
    metadata = backend.prepare(on_device(laid_out.metadata), [cache]).metadata
    assert backend.latent_layout(metadata).decode_rows == slice(None)
    output = backend.absorbed_decode(laid_out.query.to(DEVICE), cache, metadata, scale).float().cpu()
    assert torch.isfinite(output).all()
    torch.testing.assert_close(output.index_select(0, laid_out.rows), expected, **TOLERANCE[kind])


@pytest.mark.parametrize("family", ["deepseek-v3-mla", "deepseek-v3-mla-yarn"])
def test_a_small_deepseek_v3_on_the_triton_backend_matches_transformers(tmp_path: Path, family: str) -> None:
    """Mixed steps of prompt chunks and decodes over shuffled blocks, every token's logits against transformers'."""
    # Imported here: a transformers without DeepSeek-V3 fails this test alone, never the kernel's cases above.
    from test_families_grouped_moe import write_family  # noqa: PLC0415

    reference = write_family(tmp_path, family)
    dtype = torch.bfloat16 if ON_CUDA else torch.float32
    target = Target(device=DEVICE, dtype=dtype, backend=TritonAttentionBackend())
    assert_mixed_steps_match_logits(tmp_path, reference, f"{family} on the triton backend", target)
