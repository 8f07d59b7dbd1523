//! Images in the scheduler: each new request carries its images to the shards, and cached
//! prefixes are shared only over the same image.

use bytes::Bytes;

use super::fake_shard::FakeShard;
use super::request::GenerationRequest;
use super::state::SchedulerState;
use super::tests::{config, run_until_idle, submit, tokens_of};
use crate::images::PromptImage;
use crate::shard::StoppingParams;

const IMAGE_TOKEN: u32 = 99;

/// Four text tokens, an eight-token image span, four text tokens; the image is known by `digest`.
fn with_image(digest: u8) -> GenerationRequest {
    let mut input_ids: Vec<u32> = (0..4).collect();
    input_ids.extend([IMAGE_TOKEN; 8]);
    input_ids.extend(4..8);
    GenerationRequest {
        input_ids,
        stopping: StoppingParams {
            max_new_tokens: 2,
            ..StoppingParams::default()
        },
        images: vec![PromptImage {
            data: Bytes::from(vec![digest; 3]),
            digest: [digest; 32],
            offset: 4,
            num_tokens: 8,
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
