use super::*;

const R1: ReasoningParser = ReasoningParser::DeepseekR1;
const QWEN3: ReasoningParser = ReasoningParser::Qwen3;
const UNDECIDED: ReasoningStart = ReasoningStart::Undecided {
    reasoning_by_default: false,
};

/// Pushes every piece, then finishes; returns the joined reasoning and answer.
fn split_all(parser: ReasoningParser, start: ReasoningStart, pieces: &[&str]) -> (String, String) {
    let mut splitter = ReasoningSplitter::new(parser, start);
    let mut whole = Split::default();
    for piece in pieces {
        let split = splitter.push(piece);
        whole.reasoning.push_str(&split.reasoning);
        whole.answer.push_str(&split.answer);
    }
    let split = splitter.finish();
    whole.reasoning.push_str(&split.reasoning);
    whole.answer.push_str(&split.answer);
    (whole.reasoning, whole.answer)
}

/// Every way of cutting `text` into pieces of `size` characters.
fn pieces_of(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

fn owned(pieces: &[String]) -> Vec<&str> {
    pieces.iter().map(String::as_str).collect()
}

#[test]
fn output_that_starts_inside_the_reasoning_splits_at_the_end_marker() {
    let (reasoning, answer) = split_all(
        R1,
        ReasoningStart::Inside,
        &["\nLet me", " think.\n</think>\n\nHi", "!"],
    );
    assert_eq!(reasoning, "Let me think.\n");
    assert_eq!(answer, "Hi!");
}

#[test]
fn every_cut_of_the_output_gives_the_same_split() {
    let text = "<think>\na < b and </thin is not the end</think>\n\nThe <answer>.";
    for size in 1..text.len() {
        let pieces = pieces_of(text, size);
        let (reasoning, answer) = split_all(QWEN3, UNDECIDED, &owned(&pieces));
        assert_eq!(
            reasoning, "a < b and </thin is not the end",
            "cut every {size}"
        );
        assert_eq!(answer, "The <answer>.", "cut every {size}");
    }
}

#[test]
fn a_marker_split_across_tokens_is_held_back_until_decided() {
    let mut splitter = ReasoningSplitter::new(R1, ReasoningStart::Inside);
    assert_eq!(splitter.push("so 1 </").reasoning, "so 1 ");
    let held = splitter.push("thi");
    assert_eq!(held, Split::default());
    let split = splitter.push("nk>Yes");
    assert_eq!(
        (split.reasoning.as_str(), split.answer.as_str()),
        ("", "Yes")
    );
}

#[test]
fn a_partial_marker_that_turns_out_not_to_be_one_is_released_as_reasoning() {
    let mut splitter = ReasoningSplitter::new(R1, ReasoningStart::Inside);
    assert_eq!(splitter.push("x </thi").reasoning, "x ");
    assert_eq!(splitter.push("ng").reasoning, "</thing");
}

#[test]
fn several_tokens_in_one_delta_may_cross_both_markers() {
    let (reasoning, answer) = split_all(QWEN3, UNDECIDED, &["<think>a</think>b", "c"]);
    assert_eq!((reasoning.as_str(), answer.as_str()), ("a", "bc"));
}

#[test]
fn without_an_opening_marker_qwen3_output_is_all_answer_and_r1_output_all_reasoning() {
    let (reasoning, answer) = split_all(QWEN3, UNDECIDED, &["<th", "e end>"]);
    assert_eq!((reasoning.as_str(), answer.as_str()), ("", "<the end>"));
    let r1 = ReasoningStart::Undecided {
        reasoning_by_default: true,
    };
    let (reasoning, answer) = split_all(R1, r1, &["hmm", "</think>ok"]);
    assert_eq!((reasoning.as_str(), answer.as_str()), ("hmm", "ok"));
}

#[test]
fn output_after_a_closed_prompt_is_answer_even_with_markers() {
    let (reasoning, answer) = split_all(QWEN3, ReasoningStart::Closed, &["<think>x</think>y"]);
    assert_eq!(
        (reasoning.as_str(), answer.as_str()),
        ("", "<think>x</think>y")
    );
}

#[test]
fn reasoning_cut_off_before_its_end_marker_keeps_its_partial_marker() {
    let (reasoning, answer) = split_all(R1, ReasoningStart::Inside, &["still going </thi"]);
    assert_eq!(
        (reasoning.as_str(), answer.as_str()),
        ("still going </thi", "")
    );
}

#[test]
fn an_unfinished_opening_marker_at_the_end_is_answer() {
    let (reasoning, answer) = split_all(QWEN3, UNDECIDED, &["  <thi"]);
    assert_eq!((reasoning.as_str(), answer.as_str()), ("", "<thi"));
}

#[test]
fn reasoning_tokens_count_the_tokens_before_the_answer_markers_included() {
    let mut splitter = ReasoningSplitter::new(QWEN3, UNDECIDED);
    for token in ["<think>", "a", "b", "</think>", "\n\n", "c", "d"] {
        splitter.push(token);
    }
    assert_eq!(splitter.reasoning_tokens(), 4);
    let mut plain = ReasoningSplitter::new(QWEN3, UNDECIDED);
    plain.push("Hello");
    plain.push("<think>");
    assert_eq!(plain.reasoning_tokens(), 0);
}

#[test]
fn splitting_is_linear_in_the_output_length() {
    // A long reasoning of near-markers, one character per delta: each delta is looked at once
    // with at most a marker's length of held text, so this finishes instantly.
    let text = "</thin".repeat(50_000) + "</think>done";
    let mut splitter = ReasoningSplitter::new(R1, ReasoningStart::Inside);
    let mut reasoning_len = 0;
    let mut answer = String::new();
    let started = std::time::Instant::now();
    for c in text.chars() {
        let split = splitter.push(c.encode_utf8(&mut [0; 4]));
        reasoning_len += split.reasoning.len();
        answer.push_str(&split.answer);
    }
    assert_eq!((reasoning_len, answer.as_str()), (300_000, "done"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn harmony_output_splits_by_channel_and_counts_its_analysis_tokens() {
    let output = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.<|return|>";
    for size in [1, 4, 1000] {
        let pieces = pieces_of(output, size);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(
            split_all(ReasoningParser::Harmony, ReasoningStart::Inside, &refs),
            ("Think.".to_owned(), "Answer.".to_owned())
        );
    }
    let mut splitter = ReasoningSplitter::new(ReasoningParser::Harmony, ReasoningStart::Inside);
    for piece in ["<|channel|>analysis<|message|>", "a", "b<|end|>"] {
        splitter.push(piece);
    }
    assert_eq!(splitter.reasoning_tokens(), 3);
}
