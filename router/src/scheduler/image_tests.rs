//! Images in the scheduler: each new request carries its images to the shards, cached
//! prefixes are shared only over the same image, and no prompt chunk ends inside an image's
//! span (the fake shard panics on one that does).

use bytes::Bytes;

use super::fake_shard::FakeShard;
use super::request::GenerationRequest;
use super::sequence::Sequence;
use super::state::SchedulerState;
use super::tests::{config, request, run_until_idle, submit, tokens_of};
use crate::images::PromptImage;
use crate::kv::BlockPool;
use crate::shard::{Step, StoppingParams};

const IMAGE_TOKEN: u32 = 99;

/// Four text tokens, an eight-token image span, four text tokens; the image is known by `digest`.
fn with_image(digest: u8) -> GenerationRequest {
    image_between(&[0, 1, 2, 3], digest, 8, &[4, 5, 6, 7])
}

/// `before`, a span of `span` image tokens of the image known by `digest`, `after`.
fn image_between(before: &[u32], digest: u8, span: usize, after: &[u32]) -> GenerationRequest {
    let mut input_ids = before.to_vec();
    input_ids.extend(std::iter::repeat_n(IMAGE_TOKEN, span));
    input_ids.extend(after);
    GenerationRequest {
        input_ids,
        stopping: StoppingParams {
            max_new_tokens: 2,
            ..StoppingParams::default()
        },
        images: vec![PromptImage {
            data: Bytes::from(vec![digest; 3]),
            digest: [digest; 32],
            offset: before.len(),
            num_tokens: span,
        }],
        ..GenerationRequest::default()
    }
}

#[test]
fn a_new_request_carries_its_images_to_the_shards() {
    let mut state = SchedulerState::new(config(64, 64));
    let _receiver = submit(&mut state, 1, with_image(1));
    let step = state.schedule().expect("one request waits");
    let images = &step.new_requests[0].images;
    assert_eq!(images.len(), 1);
    assert_eq!((images[0].offset, images[0].num_tokens), (4, 8));
    assert_eq!(&images[0].data[..], &[1, 1, 1]);
}

#[test]
fn the_same_image_reuses_its_blocks_and_another_image_only_the_text_before_it() {
    let mut state = SchedulerState::new(config(64, 64));
    let mut shard = FakeShard::new(4);
    let mut first = submit(&mut state, 1, with_image(1));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut first).len(), 2);
    let mut receivers = vec![
        submit(&mut state, 2, with_image(2)),
        submit(&mut state, 3, with_image(1)),
    ];
    let step = state.schedule().expect("two requests wait");
    let computed: Vec<(u64, usize)> = step
        .scheduled
        .iter()
        .map(|span| (span.id, span.num_computed_tokens))
        .collect();
    assert!(computed.contains(&(3, 12)), "{computed:?}");
    assert!(computed.contains(&(2, 4)), "{computed:?}");
    state.apply(shard.step(step));
    run_until_idle(&mut state, &mut shard);
    for receiver in &mut receivers {
        assert_eq!(tokens_of(receiver).len(), 2);
    }
}

/// Request `id`'s span in `step`: (tokens computed before it, tokens in it).
fn span_of(step: &Step, id: u64) -> Option<(usize, usize)> {
    step.scheduled
        .iter()
        .find(|span| span.id == id)
        .map(|span| (span.num_computed_tokens, span.num_tokens))
}

/// Runs every step, recording request `id`'s span in each.
fn spans_of(
    state: &mut SchedulerState,
    shard: &mut FakeShard,
    id: u64,
) -> Vec<Option<(usize, usize)>> {
    let mut spans = Vec::new();
    while let Some(step) = state.schedule() {
        spans.push(span_of(&step, id));
        state.apply(shard.step(step));
    }
    spans
}

#[test]
fn a_chunk_that_would_end_inside_an_image_ends_where_the_image_begins() {
    let mut state = SchedulerState::new(config(64, 10));
    let mut shard = FakeShard::new(4);
    let mut receiver = submit(&mut state, 1, with_image(1));
    let spans = spans_of(&mut state, &mut shard, 1);
    assert_eq!(
        spans,
        [Some((0, 4)), Some((4, 10)), Some((14, 2)), Some((16, 1))]
    );
    assert_eq!(tokens_of(&mut receiver).len(), 2);
}

#[test]
fn images_of_different_span_lengths_are_each_computed_whole() {
    // [0, 1], a 3-token span at 2..5, [2], a 7-token span at 6..13, [3, 4]: spans as long as a
    // size-dependent family (Qwen2.5-VL) makes them, the longer one a whole step.
    let mut request = image_between(&[0, 1], 1, 3, &[2]);
    let second = image_between(&[], 2, 7, &[3, 4]);
    let offset = request.input_ids.len();
    request.input_ids.extend(&second.input_ids);
    request
        .images
        .extend(second.images.into_iter().map(|image| PromptImage {
            offset: offset + image.offset,
            ..image
        }));
    let mut state = SchedulerState::new(config(64, 7));
    let mut shard = FakeShard::new(4);
    let mut receiver = submit(&mut state, 1, request);
    let spans = spans_of(&mut state, &mut shard, 1);
    assert_eq!(
        spans,
        [Some((0, 6)), Some((6, 7)), Some((13, 2)), Some((15, 1))],
        "cut before the longer span, which then takes a step of its own"
    );
    assert_eq!(tokens_of(&mut receiver).len(), 2);
}

#[test]
fn a_chunk_at_an_image_waits_for_room_for_the_whole_span_and_then_runs() {
    // The span is exactly the step's budget: the longest that validation lets through.
    let mut state = SchedulerState::new(config(64, 8));
    let mut shard = FakeShard::new(4);
    let mut decoding = submit(&mut state, 1, request(4, 3));
    let mut with_image = submit(&mut state, 2, with_image(1));
    let spans = spans_of(&mut state, &mut shard, 2);
    assert_eq!(
        spans,
        [
            Some((0, 4)),
            // The decode ahead of it leaves 7 tokens: too few for the 8 of the span.
            None,
            None,
            Some((4, 8)),
            Some((12, 4)),
            Some((16, 1)),
        ]
    );
    assert_eq!(tokens_of(&mut decoding).len(), 3);
    assert_eq!(tokens_of(&mut with_image).len(), 2);
}

#[test]
fn a_request_resuming_inside_an_image_computes_the_rest_of_it_at_once() {
    let mut state = SchedulerState::new(config(64, 12));
    let mut shard = FakeShard::new(4);
    // The image takes positions 2..14; a prompt with other text after it shares the blocks
    // up to 12, inside the span.
    let mut first = submit(&mut state, 1, image_between(&[0, 1], 1, 12, &[20, 21, 22]));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut first).len(), 2);
    let mut ahead = submit(&mut state, 2, request(11, 2));
    let mut resuming = submit(&mut state, 3, image_between(&[0, 1], 1, 12, &[30, 31, 32]));
    let step = state.schedule().expect("two requests wait");
    assert_eq!(span_of(&step, 2), Some((0, 11)));
    assert_eq!(
        span_of(&step, 3),
        None,
        "one token of budget is left, and 2 of the image remain"
    );
    state.apply(shard.step(step));
    let step = state.schedule().expect("it is admitted next");
    assert_eq!(span_of(&step, 3), Some((12, 5)));
    state.apply(shard.step(step));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut ahead).len(), 2);
    assert_eq!(tokens_of(&mut resuming).len(), 2);
    shard.assert_shared_blocks_agree();
}

#[test]
fn chunks_are_cut_before_an_image_or_stretched_over_its_rest() {
    let at = |computed: usize| {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        let table = BlockPool::new(8).new_table();
        let mut sequence = Sequence::new(0, with_image(1), table, events);
        sequence.num_computed = computed;
        sequence
    };
    // The image takes positions 4..12 of 16.
    assert_eq!(
        at(0).chunk_within_images(4, 4),
        Some(4),
        "ends where it begins"
    );
    assert_eq!(at(0).chunk_within_images(6, 6), Some(4), "cut before it");
    assert_eq!(
        at(0).chunk_within_images(14, 14),
        Some(14),
        "covers it whole"
    );
    assert_eq!(
        at(4).chunk_within_images(3, 8),
        Some(8),
        "stretched over it"
    );
    assert_eq!(
        at(8).chunk_within_images(1, 4),
        Some(4),
        "over the rest of it"
    );
    assert_eq!(
        at(8).chunk_within_images(3, 3),
        None,
        "no room for its rest"
    );
    assert_eq!(at(12).chunk_within_images(2, 2), Some(2), "past it");
}

#[test]
fn a_preempted_request_recomputes_its_images_without_splitting_them() {
    let mut state = SchedulerState::new(config(6, 10));
    let mut shard = FakeShard::new(4);
    let mut receivers = vec![
        submit(&mut state, 1, with_image(1)),
        submit(&mut state, 2, with_image(2)),
    ];
    run_until_idle(&mut state, &mut shard);
    assert!(
        state.preemptions() > 0,
        "six blocks hold one request at a time"
    );
    for receiver in &mut receivers {
        assert_eq!(tokens_of(receiver).len(), 2);
    }
}
