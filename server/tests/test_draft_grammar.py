"""Speculative decoding for grammar-constrained requests: each drafted position's mask is the grammar's after the
drafts before it, a draft the grammar forbids is refused, and the matcher consumes only the tokens kept."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from draft_testing import oracle, run
from grammar_testing import VOCAB_SIZE, grammar_compiler, write_grammar_checkpoint
from shard_testing import load_tiny_model, new_request
from tandem_server.engine.companions import Companions
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, WarmupPlan
from tandem_server.models.config import read_checkpoint_config
from tandem_server.sampling import SamplingParams
from tandem_server.structured import GrammarCompiler, GrammarKind, GrammarSpec, grammar_token_mask

# The embedded model's tokenizer; the tiny random model shares its vocabulary so masks are real.
PROMPT = [1, 504, 3458, 282, 4649, 314]
CPU = torch.device("cpu")
DIGITS = GrammarSpec(GrammarKind.REGEX, "[0-9]+")
SCHEMA = GrammarSpec(
    GrammarKind.JSON_SCHEMA,
    json.dumps(
        {
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 0}, "tag": {"enum": ["red", "blue"]}},
            "required": ["score", "tag"],
            "additionalProperties": False,
            "x-guidance": {"whitespace_flexible": False},
        }
    ),
)
HEX = GrammarSpec(GrammarKind.REGEX, "[a-f]{2}[0-9]{3,12}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_grammar_checkpoint(tmp_path_factory.mktemp("draft-grammar"))


@pytest.fixture(scope="module")
def compiler(checkpoint: Path) -> GrammarCompiler:
    return grammar_compiler(checkpoint)


def _runner(checkpoint: Path, compiler: GrammarCompiler) -> ModelRunner:
    eos = read_checkpoint_config(checkpoint).eos_token_ids
    options = ExecutionOptions(kv_cache_memory=8 << 20)
    runner = ModelRunner(load_tiny_model(checkpoint), eos, torch.float32, CPU, options, Companions(compiler))
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=64, max_batch_requests=8))
    return runner


def _requests() -> list[NewRequest]:
    seeded = SamplingParams(temperature=1.0, seed=11)
    return [
        replace(new_request(1, PROMPT, 40), grammar=SCHEMA),
        replace(new_request(2, PROMPT, 40, seeded), grammar=SCHEMA),
        replace(new_request(3, PROMPT, 16, replace(seeded, temperature=0.7, seed=3)), grammar=HEX),
    ]


def _prompts(requests: list[NewRequest]) -> dict[int, int]:
    return {r.id: len(r.token_ids) for r in requests}


def test_right_drafts_are_all_kept_and_change_nothing(checkpoint: Path, compiler: GrammarCompiler) -> None:
    requests = _requests()
    reference = run(_runner(checkpoint, compiler), requests, drafter=None)
    drafted = run(_runner(checkpoint, compiler), requests, drafter=oracle(reference.tokens, _prompts(requests)))
    assert drafted.tokens == reference.tokens
    # A JSON request whose grammar completes on a kept draft ends there, and the driver counts that draft as
    # the step's drawn token rather than a kept one.
    assert drafted.drafted - 2 <= drafted.accepted > 0
    assert drafted.steps < reference.steps / 2, (drafted.steps, reference.steps)


def test_wrong_drafts_are_refused_at_the_first_difference_and_change_nothing(
    checkpoint: Path, compiler: GrammarCompiler
) -> None:
    requests = _requests()
    reference = run(_runner(checkpoint, compiler), requests, drafter=None)
    wrong = oracle(reference.tokens, _prompts(requests), wrong_every=3)
    drafted = run(_runner(checkpoint, compiler), requests, drafter=wrong)
    assert drafted.tokens == reference.tokens
    assert 0 < drafted.accepted < drafted.drafted


def test_a_draft_the_grammar_forbids_is_refused_and_the_request_continues_unchanged(
    checkpoint: Path, compiler: GrammarCompiler
) -> None:
    request = replace(new_request(1, PROMPT, 6), grammar=DIGITS)
    reference = run(_runner(checkpoint, compiler), [request], drafter=None).tokens[1]
    letter = compiler.tokenizer.tokenize_str("a")[0]
    runner = _runner(checkpoint, compiler)
    first = runner.step(StepInput(new_requests=(request,), scheduled=(ScheduledRequest(1, 6, (0, 1, 2, 3), 0),)))
    # The right next token, then a letter: the digits grammar never allows it, so it is scored and refused.
    drafted = runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), 6, (reference[1], letter)),)))
    tokens = [g.token_id for g in (*first.generations, *drafted.generations)]
    assert tokens == reference[:3] and drafted.failures == ()
    # The matcher consumed the kept draft and the bonus token only: the request goes on as without drafts.
    while len(tokens) < len(reference):
        output = runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), len(PROMPT) + len(tokens) - 1),)))
        assert output.failures == ()
        tokens.extend(g.token_id for g in output.generations)
    assert tokens == reference


def test_a_drafted_row_is_masked_as_after_its_drafts_and_leaves_the_matcher_as_it_was(
    compiler: GrammarCompiler,
) -> None:
    digit, letter = (compiler.tokenizer.tokenize_str(text)[0] for text in ("7", "a"))
    matcher = compiler.matcher(HEX)
    before = grammar_token_mask([matcher], VOCAB_SIZE, CPU).allowed
    drafted = [(), (letter, letter), (letter, digit), (digit,)]
    mask = grammar_token_mask([matcher] * len(drafted), VOCAB_SIZE, CPU, drafted)
    assert mask.allowed is not None and before is not None and mask.failures == {}
    advanced = compiler.matcher(HEX, generated=[letter, letter])
    assert torch.equal(mask.allowed[0], before[0])
    assert torch.equal(mask.allowed[1], grammar_token_mask([advanced], VOCAB_SIZE, CPU).allowed[0])
    assert not torch.equal(mask.allowed[1], before[0])
    # Behind a forbidden draft nothing is ever kept: the row is left unconstrained.
    assert bool(mask.allowed[2].all()) and bool(mask.allowed[3].all())
    assert torch.equal(grammar_token_mask([matcher], VOCAB_SIZE, CPU).allowed, before)


# A reasoning budget as the router writes it: llguidance cannot roll back a matcher inside a `max_tokens` lexeme.
BUDGETED = GrammarSpec(
    GrammarKind.LARK,
    'start: reasoning "</think>" answer\n'
    "answer: /(?s:.*)/\n"
    "reasoning[max_tokens=8]: %lark {\n  start: TEXT*\n  TEXT: /[^<]+/\n}\n",
)


def test_masking_drafts_of_a_budgeted_grammar_leaves_its_matcher_able_to_go_on(compiler: GrammarCompiler) -> None:
    word = compiler.tokenizer.tokenize_str(" so")[0]
    matcher = compiler.matcher(BUDGETED)
    before = grammar_token_mask([matcher], VOCAB_SIZE, CPU).allowed
    mask = grammar_token_mask([matcher, matcher], VOCAB_SIZE, CPU, [(), (word, word)])
    assert mask.failures == {} and mask.allowed is not None and before is not None
    assert torch.equal(mask.allowed[0], before[0])
    for _ in range(2):
        matcher.advance(word)
    assert torch.equal(grammar_token_mask([matcher], VOCAB_SIZE, CPU).allowed, mask.allowed[1:])
