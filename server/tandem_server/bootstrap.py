"""Assembles a loaded ModelRunner and its Info facts from a ShardConfig."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from tandem_server.config import CompileMode, ShardConfig, dtype_name
from tandem_server.distributed import GroupAddress, ParallelContext, init_distributed
from tandem_server.engine.companions import Companions
from tandem_server.engine.draft_model import DraftModel
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.errors import ConfigError, LoraAdapterError, LoraAdapterExistsError
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.layers.attention import AttentionBackend, create_backend
from tandem_server.layers.attention.selection import detect_packages, needs_from_hf_config, select_backend
from tandem_server.layers.attention.torch_backend import TorchAttentionBackend
from tandem_server.lora import LoraLimits
from tandem_server.models.config import CheckpointConfig, read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.parameter_counts import parameter_counts
from tandem_server.models.registry import ATTENTION_SINK_FAMILIES, CausalLM, model_factory
from tandem_server.quant.checks import check_quantization
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.pipeline import WeightPreparation, prepare_weights
from tandem_server.rpc.generated import shard_pb2
from tandem_server.rpc.servicer import build_info
from tandem_server.structured import GrammarCompiler
from tandem_server.vision.loader import attends_bidirectionally_within_images, load_image_embedder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedShard:
    """A runner ready for Warmup and the facts Info reports."""

    runner: ModelRunner
    info: shard_pb2.InfoResponse


def load_shard(config: ShardConfig) -> LoadedShard:
    """Joins the process group, loads the checkpoint for this rank and builds the runner."""
    started = time.perf_counter()
    for reason in config.auto_reasons:
        logger.info("%s", reason)
    checkpoint = read_checkpoint_config(config.model_path)
    backend = choose_attention_backend(config, checkpoint, config.decode_mirror_memory)
    address = GroupAddress(config.master_addr, config.master_port, config.rendezvous_timeout_s)
    parallel = init_distributed(
        config.rank, config.world_size, address, config.device, config.local_rank, config.expert_parallel
    )
    device = (
        torch.device(config.device, torch.cuda.current_device()) if config.device == "cuda" else torch.device("cpu")
    )
    check_quantization(config.quantize, checkpoint, device)
    model = load_model(
        checkpoint,
        config.dtype,
        device,
        parallel,
        backend,
        config.allow_pickle_weights,
        gguf_blocks=config.quantize is QuantizeMode.GGUF,
    )
    counts = parameter_counts(model)
    weights = prepare_weights(model, weight_preparation(config, device))
    options = execution_options(config, backend)
    grammar_compiler = GrammarCompiler.from_model_dir(
        config.model_path, model.spec.vocab_size, checkpoint.eos_token_ids
    )
    draft_model = load_draft_model(config, model, parallel, device)
    images = load_image_embedder(checkpoint, config.dtype, device, config.encoder_cache_memory)
    runner = ModelRunner(
        model,
        checkpoint.eos_token_ids,
        config.dtype,
        device,
        options,
        Companions(grammar_compiler, draft_model, images),
    )
    load_startup_adapters(runner, config)
    logger.info(
        "loaded %s (%s on %s, KV cache in %s; rank %d/%d holds %s) in %.1fs",
        checkpoint.architecture,
        dtype_name(config.dtype),
        device,
        dtype_name(config.cache_dtype),
        parallel.rank,
        parallel.world_size,
        counts.describe(),
        time.perf_counter() - started,
    )
    return LoadedShard(runner, build_info(runner, checkpoint.architecture, backend.name, parallel, weights))


def load_startup_adapters(runner: ModelRunner, config: ShardConfig) -> None:
    """Loads every `--lora-adapter` before the shard serves; one that cannot serve is a start-up error naming it."""
    for name, directory in config.lora_adapters:
        try:
            runner.lora.load(name, directory)
        except (LoraAdapterError, LoraAdapterExistsError) as error:
            raise ConfigError(f"--lora-adapter {name}={directory}: {error}") from error


def load_draft_model(
    config: ShardConfig, model: CausalLM, parallel: ParallelContext, device: torch.device
) -> DraftModel | None:
    """The draft model of `--draft-model-path`, in the model's dtype and tensor-parallel group, with a backend of its
    own; refused unless its vocabulary and positions cover the model's."""
    if config.draft_model_path is None:
        return None
    started = time.perf_counter()
    checkpoint = read_checkpoint_config(config.draft_model_path)
    if checkpoint.fp8 is not None:
        raise ConfigError(f"--draft-model-path {checkpoint.path}: an FP8 checkpoint cannot draft; give a float one")
    # The draft model's short decodes gather their keys and values: no mirror beside the model's.
    backend = choose_attention_backend(config, checkpoint, decode_mirror_memory=0)
    draft = load_model(checkpoint, config.dtype, device, parallel, backend, config.allow_pickle_weights)
    spec, own = model.spec, draft.spec
    if own.vocab_size != spec.vocab_size:
        raise ConfigError(
            f"--draft-model-path {checkpoint.path}: its vocabulary has {own.vocab_size} tokens, the model's "
            f"{spec.vocab_size}; a draft model must share the model's tokenizer"
        )
    if own.max_position_embeddings < spec.max_position_embeddings:
        raise ConfigError(
            f"--draft-model-path {checkpoint.path}: it holds {own.max_position_embeddings} positions, the model "
            f"{spec.max_position_embeddings}; a draft model must hold every position the model does"
        )
    drafting = DraftModel(draft, checkpoint.architecture, config.cache_dtype, device)
    logger.info("loaded draft model %s in %.1fs", drafting.describe(), time.perf_counter() - started)
    return drafting


def weight_preparation(config: ShardConfig, device: torch.device) -> WeightPreparation:
    """What the weight preparation steps read from the shard's flags."""
    return WeightPreparation(
        quantize=config.quantize,
        dense_copy_memory=config.quantized_dense_memory,
        ranks_on_node=config.world_size,
        packed_gemm_rows=config.packed_gemm_rows,
        device=device,
        dtype=config.dtype,
    )


def choose_attention_backend(
    config: ShardConfig, checkpoint: CheckpointConfig, decode_mirror_memory: int | None
) -> AttentionBackend:
    """Builds the requested backend, or for `auto` the first one the device, packages and model allow."""
    # An unsupported architecture is the clearer error, and its config may lack the fields read below.
    model_factory(checkpoint.family)
    needs = needs_from_hf_config(
        checkpoint.hf,
        config.device,
        config.dtype,
        config.kv_cache_dtype,
        config.block_size,
        attention_sinks=checkpoint.family in ATTENTION_SINK_FAMILIES,
        bidirectional_spans=attends_bidirectionally_within_images(checkpoint.architecture),
    )
    choice = select_backend(config.attention_backend, needs, detect_packages(config.device))
    logger.info("%s", choice.describe())
    return create_backend(choice.name, decode_mirror_memory=decode_mirror_memory)


def execution_options(config: ShardConfig, backend: AttentionBackend) -> ExecutionOptions:
    """The runner's options; CUDA graphs stay off when the backend's decode steps cannot be captured."""
    graph_sizes = config.cuda_graph_sizes
    if graph_sizes and not backend.supports_cuda_graphs:
        logger.info("CUDA graphs off: the %s attention backend runs decode steps eagerly", backend.name)
        graph_sizes = ()
    return ExecutionOptions(
        kv_cache_memory=config.kv_cache_memory,
        ranks_on_node=config.world_size,
        cuda_memory_fraction=config.cuda_memory_fraction,
        cuda_graph_sizes=graph_sizes,
        kv_cache_dtype=config.cache_dtype,
        launch_ahead=config.launches_ahead,
        compile_mode=config.torch_compile,
        decode_package=decode_package_spec(config, backend),
        lora=LoraLimits(config.max_loras, config.max_lora_rank, config.lora_memory_limit),
        kv_offload=config.kv_offload,
    )


def decode_package_spec(config: ShardConfig, backend: AttentionBackend) -> DecodePackageSpec | None:
    """How a child process builds `background`'s decode package: one CPU rank whose decodes run on the torch
    backend's decode mirror. None elsewhere (several ranks compile on a thread; other backends compile nothing)."""
    if config.torch_compile is not CompileMode.BACKGROUND or config.world_size != 1 or config.device != "cpu":
        return None
    if not isinstance(backend, TorchAttentionBackend) or not backend.mirrors_decodes:
        return None
    return DecodePackageSpec(
        model_path=str(config.model_path),
        dtype=dtype_name(config.dtype),
        kv_cache_dtype=dtype_name(config.cache_dtype),
        quantize=config.quantize.value,
        dense_copy_memory=config.quantized_dense_memory,
        packed_gemm_rows=config.packed_gemm_rows,
        allow_pickle_weights=config.allow_pickle_weights,
        num_threads=config.num_threads,
        cache_dir=str(config.compile_cache_dir),
    )
