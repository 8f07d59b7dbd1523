"""Attention through Tandem's own Triton kernels (CUDA; Triton ships with torch's CUDA wheels): paged attention, and
multi-head latent attention's absorbed decode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from tandem_server.interfaces.attention import BackendSettings
from tandem_server.interfaces.attention_registry import TRITON_CAPABILITIES
from tandem_server.layers.attention.backend import AttentionParams, LayerCache, PreparedStep, write_step_kv
from tandem_server.layers.attention.latent_cache import LatentLayerCache
from tandem_server.layers.attention.latent_step import LatentLayout
from tandem_server.layers.attention.metadata import AttentionMetadata, PagedLayout
from tandem_server.layers.attention.triton_latent import TritonLatentMetadata, build_latent_metadata

if TYPE_CHECKING:
    from tandem_server.layers.attention.triton_kernel import LaunchPlan
    from tandem_server.layers.attention.triton_latent_kernel import LatentLaunch

# Split a decode step's keys until about this many programs run per streaming multiprocessor.
PROGRAMS_PER_SM = 2
# Below this many keys per split the combine step costs more than the extra parallelism brings.
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 16
# Streaming multiprocessors and compute capability assumed where the device cannot say (Triton's CPU interpreter).
DEFAULT_SM_COUNT = 132
DEFAULT_CAPABILITY = (9, 0)


def decode_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, sm_count: int) -> int:
    """Programs per (sequence, KV head) of a decode-only step: enough to fill the GPU, never below
    MIN_KEYS_PER_SPLIT keys each. Depends only on host bounds, so a captured graph keeps its split."""
    wanted = -(-PROGRAMS_PER_SM * sm_count // (num_seqs * num_kv_heads))
    return max(1, min(MAX_SPLITS, wanted, max_seq_len // MIN_KEYS_PER_SPLIT))


def query_tiles(query_lens: tuple[int, ...], tile_tokens: int) -> list[tuple[int, int]]:
    """(sequence, tile) for every tile of `tile_tokens` query tokens that some sequence fills at least partly."""
    return [(seq, tile) for seq, length in enumerate(query_lens) for tile in range(-(-length // tile_tokens))]


class TritonAttentionBackend:
    """Mixed prefill/decode steps, cached prefixes, GQA, sliding windows and softcap; split-KV decoding. On latent
    caches (MLA), the absorbed decode of single-token sequences; the model expands prompt chunks itself."""

    name = "triton"
    capabilities = TRITON_CAPABILITIES
    supports_cuda_graphs = TRITON_CAPABILITIES.cuda_graphs

    def __init__(self, capability: tuple[int, int] | None = None) -> None:
        """`capability` picks the kernel's tiles; None: the compute capability of the device of the first step."""
        # Imported here so a machine without Triton can still import (and select among) the other backends.
        from tandem_server.layers.attention import triton_kernel, triton_latent_kernel  # noqa: PLC0415

        self._kernel = triton_kernel
        self._latent_kernel = triton_latent_kernel
        # Every layer of a step shares its metadata, so the launch plan is built once per step.
        self._planned: tuple[PagedLayout, LaunchPlan] | None = None
        self._planned_latent: tuple[TritonLatentMetadata, LatentLaunch] | None = None
        self._sm_count: int | None = None
        self._capability = capability

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> TritonAttentionBackend:
        """Tiles for the device of the first step; it reads none of the settings."""
        return cls()

    def prepare(self, metadata: AttentionMetadata, layers: Sequence[LayerCache]) -> PreparedStep:
        """The common metadata as it is; on latent caches, the step's rows split into prompt chunks and decodes."""
        if layers and isinstance(layers[0], LatentLayerCache):
            return PreparedStep(build_latent_metadata(metadata, layers[0].key.shape[1]), layers)
        return PreparedStep(metadata, layers)

    def latent_layout(self, metadata: AttentionMetadata) -> LatentLayout:
        """The prompt chunks and decode rows of a latent step, as `prepare` split them."""
        return _latent_metadata(metadata).layout

    def absorbed_decode(
        self, query: torch.Tensor, cache: LatentLayerCache, metadata: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """The decode rows' latent-space queries through the MLA decode kernel, over their block tables."""
        latent = _latent_metadata(metadata)
        launch = self._latent_launch(latent, query)
        latent_dim = cache.value.shape[-1]
        return self._latent_kernel.latent_decode(query.contiguous(), cache.key, latent.paged, latent_dim, scale, launch)

    def _latent_launch(self, metadata: TritonLatentMetadata, query: torch.Tensor) -> LatentLaunch:
        if self._planned_latent is not None and self._planned_latent[0] is metadata:
            return self._planned_latent[1]
        kernel = self._latent_kernel
        num_rows, num_heads, _ = query.shape
        head_tiles = -(-num_heads // kernel.HEAD_TILE)
        sm_count = self._streaming_multiprocessors(query.device)
        splits = decode_splits(num_rows, head_tiles, metadata.decode_max_seq_len, sm_count)
        launch = kernel.LatentLaunch(seqs=metadata.decode_seqs, num_splits=splits)
        self._planned_latent = (metadata, launch)
        return launch

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: LayerCache,
        metadata: AttentionMetadata,
        params: AttentionParams,
    ) -> torch.Tensor:
        """Writes the step's K/V at `slot_mapping`, then runs the kernel over every sequence's block table."""
        write_step_kv(cache, key, value, metadata.slot_mapping)
        plan = self._plan(metadata.paged, query, cache.key.shape[2])
        return self._kernel.paged_attention(query.contiguous(), cache.key, cache.value, metadata.paged, params, plan)

    def _plan(self, paged: PagedLayout, query: torch.Tensor, num_kv_heads: int) -> LaunchPlan:
        if self._planned is not None and self._planned[0] is paged:
            return self._planned[1]
        kernel = self._kernel
        decode_only = paged.max_query_len == 1
        groups = query.shape[1] // num_kv_heads
        tiles = kernel.tile_config(self._device_capability(query.device), query.dtype, query.shape[2])
        tile_tokens = kernel.query_tile_tokens(groups, decode_only, tiles)
        if decode_only:
            sm_count = self._streaming_multiprocessors(query.device)
            splits = decode_splits(paged.num_seqs, num_kv_heads, paged.max_seq_len, sm_count)
            plan = kernel.LaunchPlan(
                work=None, num_items=paged.num_seqs, tile_tokens=tile_tokens, tiles=tiles, num_splits=splits
            )
        elif len(set(paged.query_lens)) == 1:
            # Uniform steps (what CUDA graphs replay) need no work list: every sequence has as many tiles.
            tiles_per_seq = -(-paged.query_lens[0] // tile_tokens)
            plan = kernel.LaunchPlan(
                work=None,
                num_items=paged.num_seqs * tiles_per_seq,
                tile_tokens=tile_tokens,
                tiles=tiles,
                tiles_per_seq=tiles_per_seq,
            )
        else:
            items = query_tiles(paged.query_lens, tile_tokens)
            work = torch.tensor(items, dtype=torch.int32).to(query.device, non_blocking=True)
            plan = kernel.LaunchPlan(work=work, num_items=len(items), tile_tokens=tile_tokens, tiles=tiles)
        self._planned = (paged, plan)
        return plan

    def _device_capability(self, device: torch.device) -> tuple[int, int]:
        if self._capability is None:
            on_gpu = device.type == "cuda"
            self._capability = torch.cuda.get_device_capability(device) if on_gpu else DEFAULT_CAPABILITY
        return self._capability

    def _streaming_multiprocessors(self, device: torch.device) -> int:
        if self._sm_count is None:
            on_gpu = device.type == "cuda"
            self._sm_count = (
                torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else DEFAULT_SM_COUNT
            )
        return self._sm_count


def _latent_metadata(metadata: AttentionMetadata) -> TritonLatentMetadata:
    if not isinstance(metadata, TritonLatentMetadata):
        raise TypeError("invariant: a latent step runs on the metadata the Triton backend's `prepare` built")
    return metadata
