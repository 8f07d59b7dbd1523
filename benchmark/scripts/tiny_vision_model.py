"""Writes one of the integration tests' tiny random vision-language checkpoints into a directory the launcher serves
in seconds, for `tandem-bench images --model-id DIR`:

- `llava` (the default): a two-layer CLIP tower reading 56x56 images as 16 image tokens, a two-layer Llama;
- `gemma3`: a two-layer SigLIP tower reading 64x64 images pooled to 16 tokens that attend to each other
  bidirectionally, a sliding and a global Gemma 3 text layer;
- `qwen2_5_vl`: a two-layer windowed Qwen2.5-VL tower at each image's own resolution (4 to 64 tokens), a two-layer
  Qwen2 decoder with multimodal rotary positions.

Each uses the embedded model's tokenizer with its family's image tokens added.

Run: uv run --no-sync python benchmark/scripts/tiny_vision_model.py DIR [--family llava|gemma3|qwen2_5_vl]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration-tests"))

from tandem_harness import write_tiny_gemma3_vision, write_tiny_llava, write_tiny_qwen2_5_vl

WRITERS = {"llava": write_tiny_llava, "gemma3": write_tiny_gemma3_vision, "qwen2_5_vl": write_tiny_qwen2_5_vl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="where to write the checkpoint (created)")
    parser.add_argument("--family", choices=sorted(WRITERS), default="llava", help="which vision family (llava)")
    args = parser.parse_args()
    args.directory.mkdir(parents=True, exist_ok=True)
    WRITERS[args.family](args.directory)
    print(args.directory)


if __name__ == "__main__":
    main()
