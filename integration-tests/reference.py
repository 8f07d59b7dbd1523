"""transformers on the converted weights: the greedy reference Tandem must reproduce."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

# Different batch shapes round fp32 differently; only a genuine near-tie may flip the argmax.
NEAR_TIE_LOGIT_GAP = 1e-3


class Reference:
    """A fp32 transformers model and tokenizer loaded once per session."""

    def __init__(self, model_dir: Path) -> None:
        torch.manual_seed(0)
        # The cores are shared with the servers under test and other work; two threads that wait for each other
        # there are slower than one (16 greedy tokens: 24 s on two threads, 5.3 s on one, at a load average of 6).
        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.eos_token_id = int(self.model.generation_config.eos_token_id)

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt).input_ids

    @torch.inference_mode()
    def greedy(self, prompt: str, max_new_tokens: int) -> list[int]:
        """Greedy continuation, ending at (and including) EOS like Tandem's token list."""
        input_ids = torch.tensor([self.encode(prompt)])
        output = self.model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens, do_sample=False
        )
        generated = output[0, input_ids.shape[1] :].tolist()
        if self.eos_token_id in generated:
            generated = generated[: generated.index(self.eos_token_id) + 1]
        return generated

    @torch.inference_mode()
    def top2_gap(self, token_ids: list[int]) -> float:
        """Logit gap between the two likeliest next tokens after `token_ids`."""
        logits = self.model(torch.tensor([token_ids])).logits[0, -1]
        top2 = torch.topk(logits, 2).values
        return float(top2[0] - top2[1])

    def assert_same_greedy(self, prompt: str, expected: list[int], actual: list[int]) -> None:
        """`actual` equals `expected`, or first departs from it at a near-tie of the reference."""
        diverged_at = next(
            (i for i, (want, got) in enumerate(zip(expected, actual, strict=False)) if want != got), None
        )
        if diverged_at is None:
            assert len(actual) == len(expected), f"lengths differ for {prompt!r}: {actual} vs {expected}"
            return
        prefix = self.encode(prompt) + expected[:diverged_at]
        gap = self.top2_gap(prefix)
        assert gap < NEAR_TIE_LOGIT_GAP, (
            f"greedy tokens for {prompt!r} diverge at {diverged_at} where the reference top-2 gap is {gap:.2e}:\n"
            f"expected {expected}\nactual   {actual}"
        )
