"""Sampling: truncation against a straightforward reference, seeded draws independent of the batch."""

from __future__ import annotations

import math

import torch
from tandem_server.sampling import Sampler, SamplingParams
from tandem_server.sampling.params import SamplingBatch
from tandem_server.sampling.warpers import apply_top_k_top_p

CPU = torch.device("cpu")


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
    warped = apply_top_k_top_p(logits, top_k, top_p)
    for row in range(6):
        kept = set(torch.nonzero(torch.isfinite(warped[row])).flatten().tolist())
        assert kept == reference_truncation(logits[row].tolist(), int(top_k[row]), float(top_p[row])), row
        torch.testing.assert_close(warped[row, list(kept)], logits[row, list(kept)])


def test_greedy_takes_argmax_and_reports_raw_logprob() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    batch = SamplingBatch.build([SamplingParams(), SamplingParams(top_k=1)], [4, 9], CPU)
    sampled = Sampler()(logits, batch)
    assert sampled.token_ids == [1, 0]
    expected = torch.log_softmax(logits, dim=-1)[[0, 1], [1, 0]]
    torch.testing.assert_close(torch.tensor(sampled.logprobs), expected)


def test_logprob_is_taken_before_temperature_and_truncation() -> None:
    torch.manual_seed(1)
    logits = torch.randn(1, 30)
    params = SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=11)
    sampled = Sampler()(logits, SamplingBatch.build([params], [7], CPU))
    token = sampled.token_ids[0]
    assert token in logits[0].topk(3).indices.tolist()
    assert math.isclose(sampled.logprobs[0], torch.log_softmax(logits[0], dim=-1)[token].item(), rel_tol=1e-6)


def test_same_seed_and_position_draw_the_same_token_alone_and_in_a_batch() -> None:
    torch.manual_seed(2)
    vocab = 64
    target = torch.randn(vocab)
    params = SamplingParams(temperature=1.5, seed=1234)
    for position in range(5):
        alone = Sampler()(target.unsqueeze(0), SamplingBatch.build([params], [position], CPU)).token_ids[0]
        others = torch.randn(3, vocab)
        mixed_logits = torch.stack([others[0], others[1], target, others[2]])
        mixed_params = [
            SamplingParams(),
            SamplingParams(temperature=0.7, top_k=5, seed=9),
            params,
            SamplingParams(top_p=0.5),
        ]
        batch = SamplingBatch.build(mixed_params, [3, 8, position, 1], CPU)
        assert Sampler()(mixed_logits, batch).token_ids[2] == alone


def test_seeded_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().unsqueeze(0)
    draws = 3000
    counts = torch.zeros(4)
    sampler = Sampler()
    for position in range(draws):
        batch = SamplingBatch.build([SamplingParams(temperature=1.0, seed=5)], [position], CPU)
        counts[sampler(logits, batch).token_ids[0]] += 1
    # Four standard deviations of a binomial proportion at n=3000 is below 0.037.
    assert torch.allclose(counts / draws, probs, atol=0.037)
    batches = [SamplingBatch.build([SamplingParams(1.0, seed=seed)], [0], CPU) for seed in range(40)]
    assert len({sampler(logits, batch).token_ids[0] for batch in batches}) > 1
