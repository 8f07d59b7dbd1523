use std::sync::Arc;

use tokio::sync::mpsc;

use super::*;
use crate::scheduler::GeneratedToken;
use crate::validation::testing::{self, EOS_ID};

fn stream(stop: &[&str]) -> (mpsc::UnboundedSender<GenerationEvent>, TextStream) {
    let (sender, events) = mpsc::unbounded_channel();
    let decoding = Arc::new(TokenDecoding::new(Arc::new(testing::tokenizer())));
    let stops = stop.iter().map(|s| (*s).to_owned()).collect();
    let text = TextStream::new(GenerationStream { events }, decoding, &[], stops, false);
    (sender, text)
}

#[tokio::test]
async fn chat_text_keeps_the_formats_markers_and_other_text_does_not() {
    let tokenizer = Arc::new(testing::tokenizer_with_special_tokens(&[
        "<|call|>", "<|x|>",
    ]));
    let call = tokenizer.token_to_id("<|call|>").unwrap();
    let other = tokenizer.token_to_id("<|x|>").unwrap();
    let decoding =
        Arc::new(TokenDecoding::new(Arc::clone(&tokenizer)).with_chat_markers(["<|call|>"]));
    let mut ids = testing::encode("hi");
    ids.extend([call, other]);
    ids.extend(testing::encode("!"));
    let mut texts = Vec::new();
    for is_chat in [true, false] {
        let (sender, events) = mpsc::unbounded_channel();
        let mut text = TextStream::new(
            GenerationStream { events },
            Arc::clone(&decoding),
            &[],
            Vec::new(),
            is_chat,
        );
        send_tokens(&sender, &ids, FinishReason::Length);
        texts.push(collect(&mut text).await.0.concat());
    }
    assert_eq!(texts, ["hi<|call|>!", "hi!"]);
}

fn send_tokens(sender: &mpsc::UnboundedSender<GenerationEvent>, ids: &[u32], last: FinishReason) {
    sender
        .send(GenerationEvent::Started { cached_tokens: 0 })
        .unwrap();
    for (index, &id) in ids.iter().enumerate() {
        let finish = (index + 1 == ids.len()).then_some(last);
        let token = GeneratedToken {
            id,
            logprob: -0.5,
            top_logprobs: Vec::new(),
            finish,
        };
        sender.send(GenerationEvent::Token(token)).unwrap();
    }
}

async fn collect(text: &mut TextStream) -> (Vec<String>, Option<Finish>) {
    let mut pieces = Vec::new();
    let mut finish = None;
    while let Some(delta) = text.next().await {
        let delta = delta.unwrap();
        pieces.push(delta.token.text);
        finish = delta.finish;
    }
    (pieces, finish)
}

#[tokio::test]
async fn text_is_released_per_token_and_ends_with_the_shard_reason() {
    let (sender, mut text) = stream(&[]);
    let mut ids = testing::encode("hi é");
    ids.push(EOS_ID);
    send_tokens(&sender, &ids, FinishReason::Eos);
    let (pieces, finish) = collect(&mut text).await;
    assert_eq!(pieces, ["h", "i", " ", "", "é", ""]);
    assert_eq!(finish, Some(Finish::EosToken));
}

#[tokio::test]
async fn special_tokens_are_flagged() {
    let (sender, mut text) = stream(&[]);
    send_tokens(&sender, &[EOS_ID], FinishReason::Eos);
    let delta = text.next().await.unwrap().unwrap();
    assert!(delta.token.special);
    assert_eq!(delta.token.text, "");
}

#[tokio::test]
async fn stop_string_across_tokens_ends_the_stream_and_cancels_the_request() {
    let (sender, mut text) = stream(&["wor"]);
    let ids = testing::encode("hello world and more");
    send_tokens(&sender, &ids, FinishReason::Length);
    let (pieces, finish) = collect(&mut text).await;
    assert_eq!(pieces.concat(), "hello ");
    assert_eq!(finish, Some(Finish::StopSequence));
    assert!(
        sender.is_closed(),
        "the scheduler sees the request cancelled"
    );
}

#[tokio::test]
async fn held_back_text_is_flushed_when_the_shard_stops() {
    let (sender, mut text) = stream(&["xyz"]);
    send_tokens(&sender, &testing::encode("abx"), FinishReason::Length);
    let (pieces, finish) = collect(&mut text).await;
    assert_eq!(pieces, ["a", "b", "x"]);
    assert_eq!(finish, Some(Finish::Length));
}

#[tokio::test]
async fn scheduler_errors_and_lost_channels_end_the_stream_with_an_error() {
    let (sender, mut text) = stream(&[]);
    sender
        .send(GenerationEvent::Error(SchedulerError::ShuttingDown))
        .unwrap();
    assert!(matches!(
        text.next().await,
        Some(Err(StreamError::Scheduler(SchedulerError::ShuttingDown)))
    ));
    assert!(text.next().await.is_none());

    let (sender, mut text) = stream(&[]);
    drop(sender);
    assert!(matches!(
        text.next().await,
        Some(Err(StreamError::Incomplete))
    ));
}

#[test]
fn finish_labels_are_the_native_api_names() {
    let labels = [Finish::Length, Finish::EosToken, Finish::StopSequence].map(Finish::label);
    assert_eq!(labels, ["length", "eos_token", "stop_sequence"]);
}
