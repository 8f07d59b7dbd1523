"""Heterogeneous batched sampling: per-request parameters, seeded per (seed, position)."""

from tandem_server.sampling.params import SamplingParams
from tandem_server.sampling.sampler import SampledTokens, Sampler

__all__ = ["SampledTokens", "Sampler", "SamplingParams"]
