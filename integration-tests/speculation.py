"""What the speculative-decoding tests share: input-grounded prompts, whose answers prompt lookup drafts, and the
router's draft counters."""

from __future__ import annotations

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, polished the great "
    "lens and watched the ships pass the rocks below."
)
REPEAT = "Repeat after me: one two three four five six seven eight nine ten."
# The answer repeats text the prompt holds.
GROUNDED = (
    f"Copy this sentence exactly.\nSentence: {PASSAGE}\nCopy: {PASSAGE}\nCopy again:",
    f"<|im_start|>user\n{REPEAT}<|im_end|>\n<|im_start|>assistant\n",
)
ACCEPTED = "tandem_speculative_accepted_tokens_total"
DRAFTED = "tandem_speculative_draft_tokens_total"
