"""Every attention backend the shard runs: its name, its class (imported only when built) and what it serves.

A new backend is its own module under `tandem_server/layers/attention/`, whose class declares `capabilities` and
`from_settings`, and one entry here; selection, `--attention-backend`'s choices and the launcher's block size follow.
"""

from __future__ import annotations

from tandem_server.interfaces.attention import (
    BackendCapabilities,
    BackendRegistry,
    PackageRelease,
    PageSizes,
    RegisteredBackend,
)

TRITON = PackageRelease("triton", "triton", distribution="triton")
# The Triton kernel's tiles are checked to fit every supported GPU's shared memory up to this head size
# (test_triton_compile.py); the kernel refuses larger ones.
TRITON_MAX_HEAD_SIZE = 256
# flash-attn-4 (`flash_attn.cute`, CuTe DSL kernels compiled at first use, pure-Python wheels) reads any page size on
# Hopper and Blackwell, but loads a page with TMA only when it is exactly one key tile of 128 tokens: any other size
# looks up every key row's page itself (a divmod by the page size) on its slower cp.async path.
FLASH_ATTN_4 = PackageRelease(
    "flash-attn-4",
    "flash_attn.cute",
    distribution="flash-attn-4",
    entry_point="flash_attn_varlen_func",
    capability_majors=(9, 10, 11),
    pages=PageSizes(fast=128, fast_loads="TMA"),
)
# flash-attn 2 (`flash_attn`, a CUDA extension built from source) reads a paged cache through `block_table` only in
# blocks of a multiple of 256 tokens, on Ampere and newer.
FLASH_ATTN_2 = PackageRelease(
    "flash-attn 2",
    "flash_attn",
    distribution="flash-attn",
    entry_point="flash_attn_varlen_func",
    capability_majors=(8, 9, 10, 11, 12),
    pages=PageSizes(multiple=256),
)

TORCH_CAPABILITIES = BackendCapabilities(
    kernel="the torch backend",
    devices=("cuda", "cpu"),
    other_kv_cache_dtype=True,
    latent_attention=True,
    attention_sinks=True,
    bidirectional_spans=True,
    auto_priority={"cuda": 40, "cpu": 40},
)
SDPA_CAPABILITIES = BackendCapabilities(
    kernel="torch SDPA",
    devices=("cuda", "cpu"),
    logit_softcap=False,
    auto_priority={"cuda": 30},
)
TRITON_CAPABILITIES = BackendCapabilities(
    kernel="the Triton kernel",
    devices=("cuda",),
    max_head_size=TRITON_MAX_HEAD_SIZE,
    attention_sinks=True,
    latent_attention=True,
    cuda_graphs=True,
    releases=(TRITON,),
    auto_priority={"cuda": 20},
)
FLASH_CAPABILITIES = BackendCapabilities(
    kernel="flash-attn",
    devices=("cuda",),
    dtypes=("float16", "bfloat16"),
    max_head_size=256,
    head_size_multiple=8,
    cuda_graphs=True,
    releases=(FLASH_ATTN_4, FLASH_ATTN_2),
    install_hint="on Hopper or Blackwell: flash-attn-4, pip install 'tandem-server[cuda]'; elsewhere flash-attn 2, "
    "built from source",
    auto_priority={"cuda": 10},
    # Off its fast page size flash-attn-4 takes its slow paged path, and neither release splits decode work across
    # the SMs as the Triton kernel does; named, flash serves every block size its release reads.
    auto_only_at_fast_pages_over="the Triton kernel",
)

_LAYERS = "tandem_server.layers.attention"
ATTENTION_REGISTRY = BackendRegistry(
    (
        RegisteredBackend("torch", f"{_LAYERS}.torch_backend:TorchAttentionBackend", TORCH_CAPABILITIES),
        RegisteredBackend("sdpa", f"{_LAYERS}.sdpa_backend:SdpaAttentionBackend", SDPA_CAPABILITIES),
        RegisteredBackend("triton", f"{_LAYERS}.triton_backend:TritonAttentionBackend", TRITON_CAPABILITIES),
        RegisteredBackend("flash", f"{_LAYERS}.flash_backend:FlashAttentionBackend", FLASH_CAPABILITIES),
    )
)
