//! Start-up checks of the shards' facts against the flags.

use clap::Parser;

use super::*;
use crate::config::RouterArgs;
use crate::pb;

pub(super) fn config(extra: &[&str]) -> RouterConfig {
    let mut argv = vec![
        "tandem-router",
        "--shard-uds-path",
        "/run/s0.sock",
        "--tokenizer-path",
        "/models/m",
        "--model-id",
        "m",
    ];
    argv.extend_from_slice(extra);
    let args = RouterArgs::try_parse_from(argv).expect("valid flags");
    RouterConfig::try_from(args).expect("a valid configuration")
}

fn shards_with_draft_model(draft_model: &str) -> ModelInfo {
    ModelInfo::from(pb::InfoResponse {
        architecture: "LlamaForCausalLM".to_owned(),
        draft_model: draft_model.to_owned(),
        ..pb::InfoResponse::default()
    })
}

#[test]
fn drafting_with_the_draft_model_refuses_to_start_on_shards_without_one() {
    let drafting = config(&["--speculate", "4", "--speculative-method", "draft"]);
    let error = check_draft_model(&drafting, &shards_with_draft_model(""))
        .expect_err("no draft model to draft with");
    assert!(matches!(error, StartupError::NoDraftModel));
    assert!(
        error.to_string().contains("--speculative-method draft"),
        "{error}"
    );
    let with_one = shards_with_draft_model("LlamaForCausalLM, 2 layers");
    assert!(check_draft_model(&drafting, &with_one).is_ok());
}

#[test]
fn shards_without_a_draft_model_serve_when_the_draft_model_is_not_asked_for() {
    let without = shards_with_draft_model("");
    for flags in [
        &["--speculative-method", "draft"][..],
        &["--speculate", "4"],
        &["--speculate", "4", "--speculative-method", "radix"],
    ] {
        assert!(
            check_draft_model(&config(flags), &without).is_ok(),
            "{flags:?}"
        );
    }
}

#[test]
fn warmup_names_the_drafts_a_step_may_carry_so_shards_capture_their_shapes() {
    let plan = warmup_plan(&config(&[
        "--speculate",
        "3",
        "--speculative-disable-by-batch-size",
        "6",
    ]));
    assert_eq!((plan.max_drafts, plan.max_drafting_requests), (3, 6));
    let small_batches = warmup_plan(&config(&["--speculate", "3", "--max-batch-size", "2"]));
    assert_eq!(small_batches.max_drafting_requests, 2);
    let plain = warmup_plan(&config(&[]));
    assert_eq!((plain.max_drafts, plain.max_drafting_requests), (0, 0));
}
