"""Each logits processor and warper against a straightforward per-row reference on random logits."""

from __future__ import annotations

import math

import torch
from sampling_testing import CPU, row_with_history
from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow
from tandem_server.sampling.penalties import BannedTokens, FrequencyPresencePenalty, LogitBias, RepetitionPenalty
from tandem_server.sampling.statistics import TokenStatistics
from tandem_server.sampling.warpers import MinP, Temperature, TypicalP

VOCAB = 12


def random_logits(rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=generator) * 2


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = random_logits(2, 0)
    histories = [(0, 1, 2, 3, 3), (4, 5)]
    rows = [
        row_with_history(SamplingParams(repetition_penalty=1.5), 0, histories[0], 3, VOCAB),
        row_with_history(SamplingParams(), 0, histories[1], 2, VOCAB),
    ]
    out = RepetitionPenalty(rows, CPU)(logits)
    for r, (row, history) in enumerate(zip(rows, histories, strict=True)):
        penalty = row.params.repetition_penalty
        for token in range(VOCAB):
            x = logits[r, token].item()
            want = (x / penalty if x > 0 else x * penalty) if token in history else x
            assert math.isclose(out[r, token].item(), want, rel_tol=1e-6), (r, token)


def test_frequency_and_presence_penalties_count_generated_tokens_only() -> None:
    logits = random_logits(1, 1)
    history = (7, 7, 2, 2, 2, 9)
    row = row_with_history(SamplingParams(frequency_penalty=0.5, presence_penalty=-1.0), 0, history, 3, VOCAB)
    out = FrequencyPresencePenalty([row], CPU)(logits)
    counts = {token: list(history[3:]).count(token) for token in range(VOCAB)}
    for token in range(VOCAB):
        want = logits[0, token].item() - 0.5 * counts[token] + (1.0 if counts[token] else 0.0)
        assert math.isclose(out[0, token].item(), want, rel_tol=1e-6), token
    assert out[0, 7].item() == logits[0, 7].item()


def test_logit_bias_adds_to_named_tokens_and_bans_mask_them() -> None:
    logits = random_logits(2, 2)
    rows = [
        row_with_history(SamplingParams(logit_bias=((3, 100.0), (5, -2.5))), 0, (0,), 1, VOCAB, banned_ids=(1, 2)),
        SamplingRow(SamplingParams(), 0),
    ]
    biased = LogitBias(rows, CPU)(logits)
    expected = logits.clone()
    expected[0, 3] += 100.0
    expected[0, 5] -= 2.5
    torch.testing.assert_close(biased, expected)
    banned = BannedTokens(rows, CPU)(logits)
    assert torch.isinf(banned[0, [1, 2]]).all()
    torch.testing.assert_close(banned[1], logits[1])


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability() -> None:
    logits = random_logits(3, 3)
    params = [SamplingParams(1.0, min_p=m) for m in (0.0, 0.1, 0.5)]
    out = MinP(params, CPU)(logits)
    for r, p in enumerate(params):
        probs = torch.softmax(logits[r], dim=-1).tolist()
        kept = {t for t in range(VOCAB) if probs[t] >= p.min_p * max(probs)}
        assert set(torch.nonzero(torch.isfinite(out[r])).flatten().tolist()) == kept, r


def reference_typical(logits: list[float], mass: float) -> set[int]:
    """Tokens sorted by |surprise - entropy| kept until their cumulative mass reaches `mass`."""
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    probs = [w / sum(weights) for w in weights]
    entropy = -sum(p * math.log(p) for p in probs)
    order = sorted(range(len(probs)), key=lambda t: abs(-math.log(probs[t]) - entropy))
    kept, total = set(), 0.0
    for token in order:
        kept.add(token)
        total += probs[token]
        if total >= mass:
            break
    return kept


def test_typical_p_keeps_the_same_tokens_as_reference() -> None:
    logits = random_logits(3, 4)
    params = [SamplingParams(1.0, typical_p=m) for m in (0.2, 0.7, 1.0)]
    out = TypicalP(params, CPU)(logits)
    for r, p in enumerate(params):
        kept = set(torch.nonzero(torch.isfinite(out[r])).flatten().tolist())
        assert kept == reference_typical(logits[r].tolist(), p.typical_p), r


def test_temperature_scales_each_row_by_its_own_value() -> None:
    logits = random_logits(2, 5)
    out = Temperature([SamplingParams(0.5), SamplingParams(2.0)], CPU)(logits)
    torch.testing.assert_close(out, logits / torch.tensor([[0.5], [2.0]]))


def test_only_the_processors_some_row_needs_are_built() -> None:
    rows = [SamplingRow(SamplingParams(), 0), SamplingRow(SamplingParams(0.7, min_p=0.1), 0)]
    batch = SamplingBatch.build(rows, CPU)
    assert batch.processors == ()
    assert [type(w) for w in batch.warpers] == [Temperature, MinP]
    assert batch.sampled_rows == (1,)


def test_penalties_change_greedy_choice_and_bans_hold_until_min_tokens() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    repeated = row_with_history(SamplingParams(repetition_penalty=2.0), 0, (0,), 1, 3)
    assert Sampler()(logits, SamplingBatch.build([repeated], CPU)).token_ids == [1]
    banned = SamplingRow(SamplingParams(), 0, banned_ids=(0, 1))
    assert Sampler()(logits, SamplingBatch.build([banned], CPU)).token_ids == [2]


def test_token_statistics_kept_current_token_by_token_equal_those_built_from_the_whole_history() -> None:
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, logit_bias=((2, 1.5),))
    prompt, generated = (1, 4, 4), (7, 1, 7, 11)
    kept = TokenStatistics(params, prompt, len(prompt), VOCAB, CPU)
    for token in generated:
        kept.record(token)
    rebuilt = TokenStatistics(params, (*prompt, *generated), len(prompt), VOCAB, CPU)
    for name in ("bias", "seen", "output_counts"):
        torch.testing.assert_close(getattr(kept, name), getattr(rebuilt, name))
    assert kept.output_counts is not None and kept.output_counts[7].item() == 2.0
    assert TokenStatistics(SamplingParams(temperature=0.5), prompt, 3, VOCAB, CPU).seen is None
