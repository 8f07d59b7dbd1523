//! LoRA adapters in the scheduler: each new request names its adapter to the shards, a step
//! carries at most `max_loras` adapters, and cached prefixes stay with the adapter that
//! computed them.

use std::sync::Arc;

use super::fake_shard::FakeShard;
use super::request::GenerationRequest;
use super::state::SchedulerState;
use super::tests::{config, run_until_idle, submit, tokens_of};
use crate::kv::AdapterKey;
use crate::shard::StoppingParams;

fn under(adapter: Option<(u32, &str)>, max_new_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        input_ids: (0..10).collect(),
        stopping: StoppingParams {
            max_new_tokens,
            ..StoppingParams::default()
        },
        adapter: adapter.map(|(id, name)| AdapterKey {
            id,
            name: Arc::from(name),
        }),
        ..GenerationRequest::default()
    }
}

#[test]
fn new_requests_name_their_adapter_and_reuse_only_its_cached_prefix() {
    let mut state = SchedulerState::new(super::config::SchedulerConfig {
        max_loras: 2,
        ..config(64, 64)
    });
    let mut shard = FakeShard::new(4);
    let mut first = submit(&mut state, 1, under(Some((1, "sql")), 2));
    run_until_idle(&mut state, &mut shard);
    assert_eq!(tokens_of(&mut first).len(), 2);
    let mut receivers = vec![
        submit(&mut state, 2, under(Some((2, "chat")), 2)),
        submit(&mut state, 3, under(None, 2)),
        submit(&mut state, 4, under(Some((1, "sql")), 2)),
    ];
    let step = state.schedule().expect("three requests wait");
    let adapters: Vec<_> = step
        .new_requests
        .iter()
        .map(|new| new.lora_adapter.as_deref())
        .collect();
    // Behind the head, the request with the longest cached prefix goes first.
    assert_eq!(adapters, [Some("chat"), Some("sql"), None]);
    let computed: Vec<_> = step
        .scheduled
        .iter()
        .map(|span| span.num_computed_tokens)
        .collect();
    assert_eq!(
        computed,
        [0, 8, 0],
        "only the same adapter reuses the cached blocks"
    );
    state.apply(shard.step(step));
    run_until_idle(&mut state, &mut shard);
    for receiver in &mut receivers {
        assert_eq!(tokens_of(receiver).len(), 2);
    }
}

#[test]
fn a_request_under_an_adapter_beyond_max_loras_waits_until_one_is_free() {
    let mut state = SchedulerState::new(super::config::SchedulerConfig {
        max_loras: 1,
        ..config(64, 64)
    });
    let mut shard = FakeShard::new(4);
    let mut sql = submit(&mut state, 1, under(Some((1, "sql")), 3));
    let mut chat = submit(&mut state, 2, under(Some((2, "chat")), 3));
    let mut seen_together = false;
    let step = state.schedule().expect("two requests wait");
    let (running, waiting) = state.adapters();
    assert_eq!((running, waiting), (["sql"].into(), ["chat"].into()));
    state.apply(shard.step(step));
    while let Some(step) = state.schedule() {
        let ids: Vec<u64> = step.scheduled.iter().map(|span| span.id).collect();
        seen_together |= ids.contains(&1) && ids.contains(&2);
        state.apply(shard.step(step));
    }
    assert!(
        !seen_together,
        "one step carried two adapters with max_loras 1"
    );
    assert_eq!(tokens_of(&mut sql).len(), 3);
    assert_eq!(
        tokens_of(&mut chat).len(),
        3,
        "the second adapter ran once the first was done"
    );
}
