"""`tandem-bench lora`: the embedded model served with Tandem's defaults and four LoRA adapters, 32 concurrent
streams spread round-robin over the adapters against the same 32 streams on the base model alone, on the same server.

The adapters are drawn once into the log directory in PEFT's layout (rank 16 on all seven projections of every
layer, random weights). Rounds alternate between the two workloads after one unmeasured round of each, so a machine
whose speed drifts favours neither.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tandem_bench.moe_run import StreamsResult, concurrent_streams
from tandem_bench.server_process import LaunchedTandem
from tandem_bench.side_by_side import served_model

COMMAND = "tandem-bench lora"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def projection_shapes(config: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each LoRA-targetable projection of a Llama-style `config`."""
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    return {
        "q_proj": (hidden, config["num_attention_heads"] * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (config["num_attention_heads"] * head_dim, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


def write_random_adapter(directory: Path, config: dict[str, int], rank: int, seed: int) -> Path:
    """A PEFT adapter of `rank` on every projection of every layer, with small random A and B."""
    import torch  # noqa: PLC0415  (only the writer needs torch)
    from safetensors.torch import save_file  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (inputs, outputs) in projection_shapes(config).items():
            group = "self_attn" if module in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inputs, generator=generator) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(outputs, rank, generator=generator) * 0.01
    save_file(tensors, directory / "adapter_model.safetensors")
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": [*ATTENTION, *MLP],
        "bias": "none",
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config))
    return directory


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--streams", type=int, default=32, help="concurrent requests")
    parser.add_argument("--adapters", type=int, default=4, help="adapters the LoRA rounds spread requests over")
    parser.add_argument("--rank", type=int, default=16, help="each adapter's rank")
    parser.add_argument("--input-len", type=int, default=50, help="prompt words")
    parser.add_argument("--output-len", type=int, default=128, help="tokens each request generates")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds of each workload")
    parser.add_argument("--launcher-args", default="", help="extra launcher flags (one string)")
    parser.add_argument("--log-dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "lora")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR  # noqa: PLC0415
    from tandem_launcher.embedded import converted_model_dir, embedded_gguf  # noqa: PLC0415

    config = json.loads((converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR) / "config.json").read_text())
    names = [f"adapter-{index}" for index in range(args.adapters)]
    paths = [
        write_random_adapter(args.log_dir / f"{name}-r{args.rank}", config, args.rank, seed)
        for seed, name in enumerate(names)
    ]
    adapters = ",".join(f"{name}={path}" for name, path in zip(names, paths, strict=True))
    flags = ["--lora-adapters", adapters, "--max-loras", str(args.adapters), *args.launcher_args.split()]
    lengths = [args.output_len] * args.streams
    base: list[StreamsResult] = []
    spread: list[StreamsResult] = []
    with LaunchedTandem(args.log_dir / "tandem.log", flags) as server:
        model = served_model(server.base_url)
        concurrent_streams(server, [model], lengths, args)
        concurrent_streams(server, names, lengths, args)
        for _ in range(args.rounds):
            base.append(concurrent_streams(server, [model], lengths, args))
            spread.append(concurrent_streams(server, names, lengths, args))
    base_tps = sum(r.tokens for r in base) / sum(r.seconds for r in base)
    lora_tps = sum(r.tokens for r in spread) / sum(r.seconds for r in spread)
    print(
        f"embedded model, Tandem's defaults, {args.streams} streams, {args.input_len} words in, {args.output_len} out"
    )
    print("| workload | output tok/s |")
    print("|---|---|")
    print(f"| base model only ({args.rounds} rounds) | {base_tps:.1f} |")
    print(f"| round-robin over {args.adapters} adapters of rank {args.rank} ({args.rounds} rounds) | {lora_tps:.1f} |")
    print(f"adapters / base: {lora_tps / base_tps:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
