"""Writes the integration tests' tiny random LLaVA (a two-layer CLIP tower reading 56x56 images as 16 image tokens, a
two-layer Llama with the embedded model's tokenizer) into a directory the launcher serves in seconds, for
`tandem-bench images --model-id DIR`.

Run: uv run --no-sync python benchmark/scripts/tiny_llava.py DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration-tests"))

from tandem_harness import write_tiny_llava


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", type=Path, help="where to write the checkpoint (created)")
    directory = parser.parse_args().directory
    directory.mkdir(parents=True, exist_ok=True)
    write_tiny_llava(directory)
    print(directory)


if __name__ == "__main__":
    main()
