"""Greedy output that may part from the float32 server's only where float32's runner-up was a near-tie."""

from __future__ import annotations

from typing import Any

import requests
from tandem_harness import TandemServer

# Both servers multiply by the same values (the float32 conversion is the blocks' exact dequantization, and the
# quantized scales are those values' bfloat16 roundings); the quantized GEMMs take and give bfloat16. Measured on 8
# held-out prompts x 16 tokens: logprobs within 0.07 of float32's until the first departure, departures only where
# float32's runner-up was within 0.1 of its choice.
LOGPROB_TOLERANCE = 0.3
NEAR_TIE = 0.3


def greedy_tokens(server: TandemServer, prompt: str) -> list[dict[str, Any]]:
    """16 greedy tokens, each with its logprob and the two most likely tokens at its position."""
    parameters = {"max_new_tokens": 16, "details": True, "top_n_tokens": 2}
    response = requests.post(
        f"{server.base_url}/generate", json={"inputs": prompt, "parameters": parameters}, timeout=60
    )
    assert response.status_code == 200, response.text
    details = response.json()["details"]
    return [{**token, "top": top} for token, top in zip(details["tokens"], details["top_tokens"], strict=True)]


def assert_follows_up_to_near_ties(want: list[dict[str, Any]], got: list[dict[str, Any]], what: str) -> None:
    """`got` has `want`'s tokens (logprobs close) until it departs where `want`'s runner-up was a near-tie."""
    for expected, actual in zip(want, got, strict=True):
        if expected["id"] != actual["id"]:
            top = {token["id"]: token["logprob"] for token in expected["top"]}
            assert actual["id"] in top, f"{what}: the departing token is not the runner-up"
            assert expected["logprob"] - top[actual["id"]] < NEAR_TIE, f"{what}: parted at no near-tie"
            return
        assert abs(actual["logprob"] - expected["logprob"]) < LOGPROB_TOLERANCE, what
