use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use super::*;
use crate::harmony::MARKERS;

/// Ids 0..=255 are the bytes, then harmony's markers as special tokens in `MARKERS` order,
/// then EOS: one token per byte, so a budget counts bytes.
const FIRST_MARKER: u32 = 256;
const EOS: u32 = FIRST_MARKER + MARKERS.len() as u32;

fn id(marker: &str) -> u32 {
    let index = MARKERS.iter().position(|m| *m == marker).unwrap();
    FIRST_MARKER + index as u32
}

fn factory() -> ParserFactory {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|byte| vec![byte]).collect();
    for marker in MARKERS {
        words.push([b"\xFF", marker.as_bytes()].concat());
    }
    words.push(b"\xFF<|endoftext|>".to_vec());
    let trie = TokTrie::from(&TokRxInfo::new(EOS + 1, EOS), &words);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).expect("test vocabulary");
    factory.quiet();
    factory
}

/// `text` as tokens: markers as their special tokens, everything else byte by byte.
fn tokens(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match MARKERS.iter().find(|marker| rest.starts_with(**marker)) {
            Some(marker) => {
                out.push(id(marker));
                rest = &rest[marker.len()..];
            }
            None => {
                let c = rest.chars().next().unwrap();
                let mut buffer = [0u8; 4];
                out.extend(c.encode_utf8(&mut buffer).bytes().map(u32::from));
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

fn matcher(lark: &str) -> Matcher {
    let matcher =
        Matcher::new(factory().create_parser(TopLevelGrammar::from_lark(lark.to_owned())));
    assert_eq!(matcher.get_error(), None, "{lark}");
    matcher
}

/// Whether `lark` lets the text come token by token and then end.
fn accepts(lark: &str, text: &str) -> bool {
    let mut matcher = matcher(lark);
    let allowed = tokens(text).iter().all(|&token| {
        let allowed = matcher
            .compute_mask_or_eos()
            .expect("mask")
            .is_allowed(token);
        allowed && matcher.consume_token(token).is_ok()
    });
    allowed && (matcher.is_stopped() || matcher.is_accepting().expect("state"))
}

fn weather() -> Vec<CallTool> {
    let schema = r#"{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}}"#;
    vec![
        CallTool {
            name: "get_weather".to_owned(),
            schema: schema.to_owned(),
        },
        CallTool {
            name: "get_time".to_owned(),
            schema: r#"{"type": "object"}"#.to_owned(),
        },
    ]
}

const ANALYSIS: &str = "<|channel|>analysis<|message|>Let me think <|e.<|end|><|start|>assistant";
const CALL_TEXT: &str =
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
const FINAL: &str = "<|channel|>final<|message|>It is sunny.";

#[test]
fn auto_allows_analysis_then_a_final_message_or_a_declared_call() {
    let lark = harmony_grammar(Analysis::Free, &Tail::Grammar(tool_tail(&weather(), true)));
    assert!(accepts(&lark, &format!("{ANALYSIS}{FINAL}")));
    assert!(accepts(&lark, &format!("{ANALYSIS}{CALL_TEXT}")));
    assert!(accepts(&lark, CALL_TEXT));
    assert!(accepts(&lark, FINAL));
    assert!(!accepts(
        &lark,
        &CALL_TEXT.replace("get_weather", "get_wether")
    ));
    assert!(!accepts(&lark, &CALL_TEXT.replace("\"Paris\"", "3")));
    assert!(!accepts(&lark, "plain text"));
}

#[test]
fn required_forces_a_call_after_the_optional_analysis() {
    let lark = harmony_grammar(Analysis::Free, &Tail::Grammar(tool_tail(&weather(), false)));
    assert!(accepts(&lark, &format!("{ANALYSIS}{CALL_TEXT}")));
    assert!(accepts(
        &lark,
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}"
    ));
    assert!(!accepts(&lark, &format!("{ANALYSIS}{FINAL}")));
}

#[test]
fn a_budget_bounds_the_analysis_and_zero_leaves_it_out() {
    let lark = harmony_grammar(
        Analysis::Budget(5),
        &Tail::Grammar(tool_tail(&weather(), false)),
    );
    let short = format!("<|channel|>analysis<|message|>abcde<|end|><|start|>assistant{CALL_TEXT}");
    assert!(accepts(&lark, &short));
    assert!(!accepts(&lark, &short.replace("abcde", "abcdef")));
    let none = harmony_grammar(
        Analysis::Budget(0),
        &Tail::Grammar(tool_tail(&weather(), false)),
    );
    assert!(accepts(&none, CALL_TEXT));
    assert!(!accepts(&none, &format!("{ANALYSIS}{CALL_TEXT}")));
}

#[test]
fn the_answer_grammar_applies_to_the_final_text_and_not_to_the_analysis() {
    let answer = r#"answer: %json {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}}"#;
    let lark = harmony_grammar(Analysis::Free, &Tail::Final(Some(answer.to_owned())));
    assert!(accepts(
        &lark,
        &format!("{ANALYSIS}<|channel|>final<|message|>{{\"a\":1}}")
    ));
    assert!(!accepts(
        &lark,
        &format!("{ANALYSIS}<|channel|>final<|message|>not json")
    ));
    assert!(!accepts(&lark, &format!("{ANALYSIS}{CALL_TEXT}")));
}
