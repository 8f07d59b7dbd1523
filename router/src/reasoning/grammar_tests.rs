use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use super::*;

/// Ids 0..=255 are the bytes, 256 and 258 the whole end and start markers (added tokens, which
/// llguidance holds as special), 257 is EOS: one token per byte, so a budget counts bytes.
const END_MARKER_ID: u32 = 256;
const EOS: u32 = 257;
const START_MARKER_ID: u32 = 258;
const TOKENS: MarkerTokens = MarkerTokens {
    start: Some(START_MARKER_ID),
    end: Some(END_MARKER_ID),
};
const PARSER: ReasoningParser = ReasoningParser::DeepseekR1;

fn factory() -> ParserFactory {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|byte| vec![byte]).collect();
    words.push(b"\xFF</think>".to_vec());
    words.push(b"\xFF</s>".to_vec());
    words.push(b"\xFF<think>".to_vec());
    let trie = TokTrie::from(&TokRxInfo::new(259, EOS), &words);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).expect("test vocabulary");
    factory.quiet();
    factory
}

fn matcher(grammar: &Grammar) -> Matcher {
    let Grammar::Lark(lark) = grammar else {
        panic!("expected a Lark grammar, got {grammar:?}");
    };
    let matcher = Matcher::new(factory().create_parser(TopLevelGrammar::from_lark(lark.clone())));
    assert_eq!(matcher.get_error(), None, "{lark}");
    matcher
}

fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Whether `grammar` lets the tokens come one after another.
fn allows(grammar: &Grammar, tokens: &[u32]) -> bool {
    let mut matcher = matcher(grammar);
    tokens.iter().all(|&token| {
        let allowed = matcher.compute_mask().expect("mask").is_allowed(token);
        allowed && matcher.consume_token(token).is_ok()
    })
}

/// The tokens `grammar` allows after `tokens`.
fn allowed_after(grammar: &Grammar, tokens: &[u32]) -> Vec<u32> {
    let mut matcher = matcher(grammar);
    matcher.consume_tokens(tokens).expect("allowed prefix");
    let mask = matcher.compute_mask().expect("mask");
    (0..=START_MARKER_ID)
        .filter(|&token| mask.is_allowed(token))
        .collect()
}

fn json_answer() -> Grammar {
    Grammar::JsonSchema(r#"{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "x-guidance": {"whitespace_flexible": false}}"#.to_owned())
}

#[test]
fn past_the_budget_only_the_end_marker_may_come() {
    let grammar = reasoning_grammar(PARSER, ReasoningStart::Inside, Some(3), None, TOKENS).unwrap();
    assert!(allows(&grammar, &bytes("abc")));
    assert_eq!(
        allowed_after(&grammar, &bytes("abc")),
        vec![u32::from(b'<'), END_MARKER_ID]
    );
    assert!(!allows(&grammar, &bytes("abcd")));
    let mut forced = bytes("abc");
    forced.push(END_MARKER_ID);
    forced.extend(bytes("\n\nfree answer"));
    assert!(allows(&grammar, &forced));
}

#[test]
fn a_budget_of_zero_forces_the_end_marker_first() {
    let grammar = reasoning_grammar(PARSER, ReasoningStart::Inside, Some(0), None, TOKENS).unwrap();
    assert_eq!(
        allowed_after(&grammar, &[]),
        vec![u32::from(b'<'), END_MARKER_ID]
    );
}

#[test]
fn the_reasoning_is_free_of_the_answer_grammar_which_applies_after_the_marker() {
    let grammar = reasoning_grammar(
        PARSER,
        ReasoningStart::Inside,
        None,
        Some(&json_answer()),
        TOKENS,
    )
    .unwrap();
    assert!(allows(
        &grammar,
        &bytes("not {json} a < b, </thin</think>\n{\"a\":1}")
    ));
    assert!(allows(
        &grammar,
        &[bytes("x").as_slice(), &[END_MARKER_ID], &bytes("{\"a\":2}")].concat()
    ));
    assert!(!allows(&grammar, &bytes("x</think>not json")));
}

#[test]
fn the_model_may_end_its_reasoning_early_within_the_budget() {
    let grammar = reasoning_grammar(
        PARSER,
        ReasoningStart::Inside,
        Some(50),
        Some(&json_answer()),
        TOKENS,
    )
    .unwrap();
    assert!(allows(&grammar, &bytes("ok</think>{\"a\":3}")));
}

#[test]
fn an_undecided_start_without_a_budget_allows_the_answer_with_or_without_reasoning() {
    let start = ReasoningStart::Undecided {
        reasoning_by_default: false,
    };
    let grammar = reasoning_grammar(
        ReasoningParser::Qwen3,
        start,
        None,
        Some(&json_answer()),
        TOKENS,
    )
    .unwrap();
    assert!(allows(&grammar, &bytes("{\"a\":1}")));
    assert!(allows(&grammar, &bytes("<think>hm</think>\n\n{\"a\":1}")));
    let budgeted = reasoning_grammar(ReasoningParser::Qwen3, start, Some(4), None, TOKENS).unwrap();
    assert!(!allows(&budgeted, &bytes("plain")));
    assert!(allows(&budgeted, &bytes("<think>abcd</think>done")));
    assert!(!allows(&budgeted, &bytes("<think>abcde")));
    let as_tokens = [&[START_MARKER_ID][..], &bytes("abcd"), &[END_MARKER_ID]].concat();
    assert!(allows(&budgeted, &as_tokens));
    assert_eq!(
        allowed_after(&budgeted, &[]),
        vec![u32::from(b'<'), START_MARKER_ID]
    );
}

#[test]
fn regex_and_lark_answers_are_nested_as_they_are() {
    let regex = Grammar::Regex("a/b[0-9]+".to_owned());
    let grammar =
        reasoning_grammar(PARSER, ReasoningStart::Inside, None, Some(&regex), TOKENS).unwrap();
    assert!(allows(&grammar, &bytes("x</think>a/b12")));
    assert!(!allows(&grammar, &bytes("x</think>ab12")));
    let lark = Grammar::Lark("start: \"yes\" | \"no\"".to_owned());
    let grammar =
        reasoning_grammar(PARSER, ReasoningStart::Inside, None, Some(&lark), TOKENS).unwrap();
    assert!(allows(&grammar, &bytes("x</think>no")));
    assert!(!allows(&grammar, &bytes("x</think>maybe")));
}

#[test]
fn a_closed_start_or_nothing_to_constrain_keeps_the_request_grammar() {
    let answer = json_answer();
    assert_eq!(
        reasoning_grammar(
            PARSER,
            ReasoningStart::Closed,
            Some(5),
            Some(&answer),
            TOKENS
        ),
        Some(answer)
    );
    assert_eq!(
        reasoning_grammar(PARSER, ReasoningStart::Inside, None, None, TOKENS),
        None
    );
}

#[test]
fn a_start_marker_longer_than_its_token_is_that_token_then_the_rest_as_text() {
    let grammar = reasoning_grammar(
        ReasoningParser::Gemma4,
        ReasoningStart::Undecided {
            reasoning_by_default: false,
        },
        Some(20),
        None,
        TOKENS,
    )
    .unwrap();
    let mut thought = vec![START_MARKER_ID];
    thought.extend(bytes("thought\nhmm"));
    thought.push(END_MARKER_ID);
    thought.extend(bytes("answer"));
    assert!(allows(&grammar, &thought));
    assert!(allows(&grammar, &bytes("<|channel>thought\nhmm")));
    assert!(!allows(&grammar, &[START_MARKER_ID, u32::from(b'\n')]));
}
