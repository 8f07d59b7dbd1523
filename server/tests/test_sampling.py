"""Sampling: truncation against a straightforward reference, seeded draws independent of the batch."""

from __future__ import annotations

import math

import torch
from sampling_testing import CPU, batch_of, row_with_history
from tandem_server.errors import FailureKind
from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow, seeding
from tandem_server.sampling.warpers import TopKTopP


def reference_truncation(logits: list[float], top_k: int, top_p: float) -> set[int]:
    """Tokens kept: the k most likely, then the smallest most-likely head whose probability reaches top_p."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if top_k > 0:
        order = order[:top_k]
    weights = [math.exp(logits[i] - logits[order[0]]) for i in order]
    total = sum(weights)
    kept, mass = [], 0.0
    for token, weight in zip(order, weights, strict=True):
        kept.append(token)
        mass += weight / total
        if mass >= top_p:
            break
    return set(kept)


def test_top_k_top_p_keep_the_same_tokens_as_reference() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 40) * 3
    top_k = torch.tensor([0, 5, 1, 0, 12, 40])
    top_p = torch.tensor([0.5, 1.0, 0.9, 0.95, 0.3, 0.8])
    params = [SamplingParams(1.0, top_k=int(k), top_p=float(p)) for k, p in zip(top_k, top_p, strict=True)]
    warped = TopKTopP(params, CPU)(logits)
    for row in range(6):
        kept = set(torch.nonzero(torch.isfinite(warped[row])).flatten().tolist())
        assert kept == reference_truncation(logits[row].tolist(), int(top_k[row]), float(top_p[row])), row
        torch.testing.assert_close(warped[row, list(kept)], logits[row, list(kept)])


def test_greedy_takes_argmax_and_reports_raw_logprob() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    batch = batch_of([SamplingParams(), SamplingParams(top_k=1)], [4, 9])
    sampled = Sampler()(logits, batch)
    assert sampled.token_ids == [1, 0]
    expected = torch.log_softmax(logits, dim=-1)[[0, 1], [1, 0]]
    torch.testing.assert_close(torch.tensor(sampled.logprobs), expected)


def test_row_status_flags_every_non_finite_logit_and_fully_forbidden_rows_but_not_huge_finite_ones() -> None:
    logits = torch.zeros(6, 8)
    logits[0, 3] = 1.0
    logits[1, 5] = float("nan")
    logits[2, 0] = float("inf")
    logits[3, 7] = float("-inf")
    # Finite, yet their float32 sum overflows: the row is still valid.
    logits[4] = 3.0e38
    logits[4, 6] = 3.3e38
    forbid_row_5 = torch.ones(6, 8, dtype=torch.bool)
    forbid_row_5[5] = False
    batch = SamplingBatch.build([SamplingRow(SamplingParams(), 2)] * 6, CPU, forbid_row_5)
    sampled = Sampler()(logits, batch)
    assert sampled.failures == {
        1: FailureKind.NON_FINITE_LOGITS,
        2: FailureKind.NON_FINITE_LOGITS,
        3: FailureKind.NON_FINITE_LOGITS,
        5: FailureKind.NO_VALID_TOKEN,
    }
    assert (sampled.token_ids[0], sampled.token_ids[4]) == (3, 6)


def test_greedy_ties_take_the_first_maximal_token() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    assert Sampler()(logits, batch_of([SamplingParams()] * 2, [0, 0])).token_ids == [1, 0]


def test_logprob_is_taken_before_temperature_and_truncation() -> None:
    torch.manual_seed(1)
    logits = torch.randn(1, 30)
    params = SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=11)
    sampled = Sampler()(logits, batch_of([params], [7]))
    token = sampled.token_ids[0]
    assert token in logits[0].topk(3).indices.tolist()
    assert math.isclose(sampled.logprobs[0], torch.log_softmax(logits[0], dim=-1)[token].item(), rel_tol=1e-6)


def test_same_seed_and_position_draw_the_same_token_alone_and_in_a_batch() -> None:
    torch.manual_seed(2)
    vocab = 64
    target = torch.randn(vocab)
    params = SamplingParams(temperature=1.5, seed=1234)
    for position in range(5):
        alone = Sampler()(target.unsqueeze(0), batch_of([params], [position])).token_ids[0]
        others = torch.randn(3, vocab)
        mixed_logits = torch.stack([others[0], others[1], target, others[2]])
        mixed_params = [
            SamplingParams(),
            SamplingParams(temperature=0.7, top_k=5, seed=9),
            params,
            SamplingParams(top_p=0.5),
        ]
        batch = batch_of(mixed_params, [3, 8, position, 1])
        assert Sampler()(mixed_logits, batch).token_ids[2] == alone


def test_seeded_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().unsqueeze(0)
    draws = 3000
    counts = torch.zeros(4)
    sampler = Sampler()
    for position in range(draws):
        batch = batch_of([SamplingParams(temperature=1.0, seed=5)], [position])
        counts[sampler(logits, batch).token_ids[0]] += 1
    # Four standard deviations of a binomial proportion at n=3000 is below 0.037.
    assert torch.allclose(counts / draws, probs, atol=0.037)
    batches = [batch_of([SamplingParams(1.0, seed=seed)], [0]) for seed in range(40)]
    assert len({sampler(logits, batch).token_ids[0] for batch in batches}) > 1


def test_logprobs_and_alternatives_ignore_top_p_top_k_and_penalties() -> None:
    torch.manual_seed(3)
    logits = torch.randn(2, 50)
    warped = SamplingParams(temperature=0.3, top_k=2, top_p=0.1, repetition_penalty=3.0, seed=1)
    rows = [row_with_history(warped, 5, (1, 2, 3), 2, 50, top_logprobs=4), SamplingRow(SamplingParams(), 5)]
    sampled = Sampler()(logits, SamplingBatch.build(rows, CPU))
    raw = torch.log_softmax(logits, dim=-1)
    values, indices = raw[0].topk(4)
    assert [token for token, _ in sampled.top_logprobs[0]] == indices.tolist()
    torch.testing.assert_close(torch.tensor([lp for _, lp in sampled.top_logprobs[0]]), values)
    assert sampled.top_logprobs[1] == ()
    assert math.isclose(sampled.logprobs[0], raw[0, sampled.token_ids[0]].item(), rel_tol=1e-6)


def test_temperature_top_p_draws_match_the_reference_distribution_by_chi_square() -> None:
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=77)
    probs = torch.softmax(logits[0] / 0.8, dim=-1)
    kept = reference_truncation((logits[0] / 0.8).tolist(), 0, 0.9)
    expected = torch.zeros_like(probs)
    expected[list(kept)] = probs[list(kept)] / probs[list(kept)].sum()
    draws = 4000
    counts = torch.zeros(8)
    sampler = Sampler()
    for position in range(draws):
        counts[sampler(logits, batch_of([params], [position])).token_ids[0]] += 1
    assert counts[expected == 0].sum() == 0
    mask = expected > 0
    chi_square = (((counts[mask] - draws * expected[mask]) ** 2) / (draws * expected[mask])).sum().item()
    # 99.9% quantile of chi-square with (kept - 1) <= 6 degrees of freedom is 22.46; seeds make this fixed.
    assert chi_square < 22.46, (chi_square, counts, expected * draws)


def test_hashed_noise_races_follow_the_distribution_and_ignore_the_batch() -> None:
    # CUDA's noise: every row's keyed hash in one pass; here on the CPU, where the same integer arithmetic runs.
    probs = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.04, 0.01])
    draws = 6000
    pairs = seeding.key_pairs([seeding.mix_seed(9, position) for position in range(draws)])
    noise = seeding.hashed_noise(pairs, len(probs))
    torch.testing.assert_close(noise[123:124], seeding.hashed_noise(pairs[123:124], len(probs)), rtol=0, atol=0)
    counts = torch.bincount((probs / noise).argmax(dim=-1), minlength=len(probs)).float()
    chi_square = (((counts - draws * probs) ** 2) / (draws * probs)).sum().item()
    # 99.9% quantile of chi-square with 5 degrees of freedom is 20.52; the keys make this fixed.
    assert chi_square < 20.52, (chi_square, counts, probs * draws)
