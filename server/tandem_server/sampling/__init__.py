"""Heterogeneous batched sampling: per-request parameters, seeded per (seed, position)."""

from tandem_server.sampling.batch import SamplingBatch
from tandem_server.sampling.params import SamplingParams, SamplingRow
from tandem_server.sampling.sampler import DeviceSample, SampledTokens, Sampler

__all__ = ["DeviceSample", "SampledTokens", "Sampler", "SamplingBatch", "SamplingParams", "SamplingRow"]
