"""Grammar-constrained decoding: exact masks, replay after recompute, mixed constrained and unconstrained batches."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from grammar_testing import EOS, VOCAB_SIZE, grammar_compiler, write_grammar_checkpoint
from shard_testing import StepDriver, load_tiny_model, new_request
from tandem_server.engine.companions import Companions
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import StepInput, StoppingCriteria, WarmupPlan
from tandem_server.errors import FailureKind, RequestFailedError
from tandem_server.models.config import read_checkpoint_config
from tandem_server.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow, seeding
from tandem_server.structured import GrammarCompiler, GrammarKind, GrammarSpec, grammar_token_mask
from tandem_server.structured import compiler as compiler_module
from tandem_server.structured.matcher import GrammarMatcher
from tokenizers import Tokenizer

# The embedded model's tokenizer; the tiny random model shares its vocabulary so masks are real.
PROMPT = [1, 504, 3458, 282, 4649, 314]
DIGITS = GrammarSpec(GrammarKind.REGEX, "[0-9]{3}")
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["red", "blue"]}},
    "required": ["score", "tag"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
SAMPLING = SamplingParams(temperature=1.0, seed=11)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_grammar_checkpoint(tmp_path_factory.mktemp("tiny-llama-grammar"))


@pytest.fixture(scope="module")
def compiler(checkpoint: Path) -> GrammarCompiler:
    return grammar_compiler(checkpoint)


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> Tokenizer:
    return Tokenizer.from_file(str(checkpoint / "tokenizer.json"))


@pytest.fixture
def runner(checkpoint: Path, compiler: GrammarCompiler) -> ModelRunner:
    model = load_tiny_model(checkpoint)
    eos = read_checkpoint_config(checkpoint).eos_token_ids
    runner = ModelRunner(
        model, eos, torch.float32, torch.device("cpu"), ExecutionOptions(kv_cache_memory=4 << 20), Companions(compiler)
    )
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=64, max_batch_requests=8))
    return runner


def test_mask_allows_exactly_the_tokens_that_keep_a_regex_matchable(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    matcher = compiler.matcher(DIGITS)
    mask = grammar_token_mask([matcher], VOCAB_SIZE, torch.device("cpu")).allowed
    assert mask is not None
    allowed = mask[0].nonzero().flatten().tolist()
    texts = {token: tokenizer.decode([token]) for token in allowed}
    assert all(re.fullmatch("[0-9]{1,3}", text) for text in texts.values()), texts
    single_digits = {tokenizer.token_to_id(str(d)) for d in range(10)}
    assert single_digits <= set(allowed)
    for token in (tokenizer.token_to_id("1"), tokenizer.token_to_id("2"), tokenizer.token_to_id("3")):
        matcher.advance(token)
    mask = grammar_token_mask([matcher], VOCAB_SIZE, torch.device("cpu")).allowed
    assert mask is not None
    assert mask[0].nonzero().flatten().tolist() == [EOS]


def test_unconstrained_batch_builds_no_mask_and_mixed_batch_masks_only_constrained_rows(
    compiler: GrammarCompiler,
) -> None:
    assert grammar_token_mask([None, None], VOCAB_SIZE, torch.device("cpu")).allowed is None
    mask = grammar_token_mask([None, compiler.matcher(DIGITS), None], VOCAB_SIZE, torch.device("cpu")).allowed
    assert mask is not None
    assert bool(mask[0].all()) and bool(mask[2].all())
    assert 0 < int(mask[1].sum()) < VOCAB_SIZE


def test_constrained_generation_is_valid_json_and_stops_when_the_grammar_completes(
    runner: ModelRunner, tokenizer: Tokenizer
) -> None:
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    free = new_request(2, PROMPT, 12, SAMPLING)
    request = replace(new_request(1, PROMPT, 40, SAMPLING), grammar=spec)
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=4)
    done = driver.run([free, request])
    # The grammar closes with its last token (nothing but EOS could follow), so no EOS is sampled.
    value = json.loads(tokenizer.decode(done[1]))
    assert set(value) == {"score", "tag"} and 0 <= value["score"] <= 99 and value["tag"] in ("red", "blue")
    assert len(done[2]) == 12


def test_readmitted_request_replays_its_tokens_and_continues_identically(runner: ModelRunner) -> None:
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    request = replace(new_request(1, PROMPT, 40, SAMPLING), grammar=spec)
    alone = StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run([request])[1]

    partial = StepDriver(runner, runner.cache.num_blocks, chunk_size=8, seed=1)
    partial.step([replace(request, id=3)])
    while len(partial.tracked[3].generated) < 4:
        partial.step([])
    generated = partial.tracked.pop(3).generated
    runner.step(StepInput(finished=(3,)))
    resumed_request = replace(request, id=4, token_ids=(*PROMPT, *generated), num_output_tokens=4)
    resumed = StepDriver(runner, runner.cache.num_blocks, chunk_size=16, seed=2).run([resumed_request])[4]
    assert generated + resumed == alone
    assert 4 not in runner.requests


def test_invalid_grammar_or_replayed_token_outside_it_fails_that_request_alone(runner: ModelRunner) -> None:
    free = new_request(3, PROMPT, 6)
    alone = StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run([free])[3]
    bad = replace(new_request(1, PROMPT, 8), grammar=GrammarSpec(GrammarKind.REGEX, "(unclosed"))
    letters = replace(
        new_request(2, [*PROMPT, 257], 8, num_output_tokens=1), grammar=GrammarSpec(GrammarKind.REGEX, "[0-9]+")
    )
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=8)
    done = driver.run([free, bad, letters])
    assert done == {3: alone}
    assert driver.failed[1].kind is FailureKind.GRAMMAR and "does not compile" in driver.failed[1].message
    assert driver.failed[2].kind is FailureKind.GRAMMAR and "does not continue the grammar" in driver.failed[2].message
    assert len(runner.requests) == 0


def test_one_compiled_grammar_serves_every_request_that_names_it(compiler: GrammarCompiler) -> None:
    spec = GrammarSpec(GrammarKind.REGEX, "[a-f]{2}[0-9]+")
    compiled: list[object] = []
    real_matcher = compiler_module.llguidance.LLMatcher

    def counting(*args: object, **kwargs: object) -> object:
        compiled.append(args[1])
        return real_matcher(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiler_module, "llguidance", SimpleNamespace(LLMatcher=counting))
        first, second = compiler.matcher(spec), compiler.matcher(spec, generated=[])
    assert len(compiled) == 1
    # Each request got its own copy: advancing one leaves the other where it started.
    before = grammar_token_mask([second], VOCAB_SIZE, torch.device("cpu")).allowed
    first.advance(compiler.tokenizer.tokenize_str("a")[0])
    after = grammar_token_mask([second], VOCAB_SIZE, torch.device("cpu")).allowed
    assert before is not None and after is not None and torch.equal(before, after)
    assert not torch.equal(grammar_token_mask([first], VOCAB_SIZE, torch.device("cpu")).allowed, before)


def test_a_token_the_grammar_forbids_fails_the_request_without_naming_engine_ids(compiler: GrammarCompiler) -> None:
    matcher = compiler.matcher(DIGITS)
    letter = compiler.tokenizer.tokenize_str("a")[0]
    with pytest.raises(RequestFailedError) as failure:
        matcher.advance(letter)
    assert failure.value.kind is FailureKind.GRAMMAR
    assert str(letter) not in str(failure.value) and "does not continue the grammar" in str(failure.value)


def test_a_sampled_row_never_draws_a_masked_token_even_when_the_noise_is_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # A uniform draw of exactly 0 once made 0/0 = NaN for masked tokens, and argmax picks NaN.
    monkeypatch.setattr(seeding.torch, "rand", lambda size, **kwargs: torch.zeros(size))
    rows = [SamplingRow(params=SAMPLING, position=3)]
    allowed = torch.zeros(1, 16, dtype=torch.bool)
    allowed[0, 5] = True
    sampled = Sampler()(torch.randn(1, 16), SamplingBatch.build(rows, torch.device("cpu"), allowed))
    assert sampled.token_ids == [5]


def test_hashed_noise_is_never_zero_even_for_a_uniform_draw_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seeding, "hashed_uniform", lambda pairs, vocab: torch.ones(len(pairs), vocab))
    noise = seeding.hashed_noise(seeding.key_pairs([seeding.mix_seed(1, 3)]), 16)
    assert bool((noise > 0).all())


def test_constraints_that_leave_no_token_fail_that_request_instead_of_sampling_token_0(
    runner: ModelRunner, tokenizer: Tokenizer
) -> None:
    free = new_request(3, PROMPT, 6)
    alone = StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run([free])[3]
    digits = tuple(tokenizer.token_to_id(str(d)) for d in range(10))
    # The grammar allows only digits and every digit is a stop token that min_new_tokens bans: nothing is left.
    impossible = replace(
        new_request(1, PROMPT, 8, SAMPLING),
        grammar=GrammarSpec(GrammarKind.REGEX, "[0-9]"),
        stopping=StoppingCriteria(max_new_tokens=8, stop_token_ids=digits, min_new_tokens=1),
    )
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=8)
    assert driver.run([free, impossible]) == {3: alone}
    assert driver.failed[1].kind is FailureKind.NO_VALID_TOKEN
    assert 1 not in runner.requests


def test_a_grammar_engine_failure_deep_into_a_generation_fails_that_request_alone(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    free = new_request(3, PROMPT, 12, SAMPLING)
    alone = StepDriver(runner, runner.cache.num_blocks, chunk_size=8).run([free])[3]
    fill_bitmask = GrammarMatcher.fill_bitmask
    masks_built: list[int] = []

    def engine_stops_at_the_fifth_token(matcher: GrammarMatcher, bitmask: torch.Tensor, row: int) -> None:
        masks_built.append(row)
        if len(masks_built) == 5:
            matcher._matcher.consume_token(EOS)  # EOS mid-object puts the real engine into its error state
        fill_bitmask(matcher, bitmask, row)

    monkeypatch.setattr(GrammarMatcher, "fill_bitmask", engine_stops_at_the_fifth_token)
    driver = StepDriver(runner, runner.cache.num_blocks, chunk_size=8)
    done = driver.run([free, replace(new_request(1, PROMPT, 40, SAMPLING), grammar=spec)])
    assert done == {3: alone}
    assert driver.failed[1].kind is FailureKind.GRAMMAR
    assert driver.tracked == {} and len(runner.requests) == 0
    # Short and free of the engine's internal state.
    assert len(driver.failed[1].message) < 120 and "\n" not in driver.failed[1].message
