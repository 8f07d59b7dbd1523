use std::sync::Arc;

use super::testing::{self, BOS_ID, CHATML_TEMPLATE};
use super::*;

fn validator(with_template: bool) -> Validator {
    let template = if with_template {
        Ok(ChatTemplate::new(CHATML_TEMPLATE.to_owned(), Some("<s>".into()), None).unwrap())
    } else {
        Err(ChatUnavailable::Disabled)
    };
    Validator::new(
        Arc::new(testing::tokenizer()),
        template,
        Limits {
            max_input_tokens: 30,
            max_total_tokens: 40,
            max_stop_sequences: 4,
        },
    )
    .with_eos_token_ids(vec![7])
}

fn params() -> GenerationParams {
    GenerationParams {
        max_new_tokens_param: "max_tokens",
        ..GenerationParams::default()
    }
}

#[tokio::test]
async fn text_prompts_get_bos_and_default_to_the_remaining_room() {
    let valid = validator(false)
        .validate(Prompt::Text("hello".into()), &params())
        .await
        .unwrap();
    assert_eq!(valid.request.input_ids, vec![BOS_ID, 261]);
    assert_eq!(valid.request.stopping.max_new_tokens, 38);
    assert_eq!(valid.request.stopping.stop_token_ids, vec![7]);
}

#[tokio::test]
async fn chat_prompts_are_rendered_then_tokenized_without_extra_special_tokens() {
    let messages = vec![ChatMessage::new("user", "hi")];
    let valid = validator(true)
        .validate(
            Prompt::Chat(
                messages,
                ChatEnding::GenerationPrompt,
                TemplateExtras::default(),
            ),
            &params(),
        )
        .await
        .unwrap();
    assert_eq!(
        valid.request.input_ids,
        testing::encode("<|user|>hi\n<|assistant|>")
    );
}

#[tokio::test]
async fn prompt_longer_than_max_input_tokens_reports_both_numbers() {
    let error = validator(false)
        .validate(Prompt::Text("x".repeat(40)), &params())
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ValidationError::InputTooLong {
            input_tokens: 41,
            max_input_tokens: 30
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("41") && message.contains("30"),
        "{message}"
    );
}

#[tokio::test]
async fn prompt_plus_max_new_tokens_must_fit_max_total_tokens() {
    let params = GenerationParams {
        max_new_tokens: Some(39),
        ..params()
    };
    let error = validator(false)
        .validate(Prompt::Text("hello".into()), &params)
        .await
        .unwrap_err();
    assert!(matches!(error, ValidationError::TotalTooLong { .. }));
    assert!(error.to_string().contains("`max_tokens` is 39"), "{error}");
}

#[tokio::test]
async fn empty_prompt_and_empty_messages_are_rejected() {
    let validator = validator(true);
    let error = validator
        .validate(Prompt::Text(String::new()), &params())
        .await
        .unwrap_err();
    assert_eq!(error, ValidationError::Empty("prompt"));
    let error = validator
        .validate(
            Prompt::Chat(
                vec![],
                ChatEnding::GenerationPrompt,
                TemplateExtras::default(),
            ),
            &params(),
        )
        .await
        .unwrap_err();
    assert_eq!(error, ValidationError::Empty("messages"));
}

#[tokio::test]
async fn unknown_roles_are_rejected_with_their_index() {
    let messages = vec![
        ChatMessage::new("user", "a"),
        ChatMessage::new("wizard", "b"),
    ];
    let error = validator(true)
        .validate(
            Prompt::Chat(
                messages,
                ChatEnding::GenerationPrompt,
                TemplateExtras::default(),
            ),
            &params(),
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("messages[1].role"), "{error}");
}

#[tokio::test]
async fn chat_without_a_template_is_a_clear_error() {
    let error = validator(false)
        .validate(
            Prompt::Chat(
                vec![ChatMessage::new("user", "a")],
                ChatEnding::GenerationPrompt,
                TemplateExtras::default(),
            ),
            &params(),
        )
        .await
        .unwrap_err();
    assert_eq!(error, ValidationError::NoChat(ChatUnavailable::Disabled));
}

#[tokio::test]
async fn parameter_errors_come_before_tokenization() {
    let params = GenerationParams {
        top_p: Some(2.0),
        ..params()
    };
    let error = validator(false)
        .validate(Prompt::Text(String::new()), &params)
        .await
        .unwrap_err();
    assert_eq!(error.param(), Some("top_p"));
}

#[tokio::test]
async fn token_prompts_are_used_as_given_and_unknown_ids_are_refused() {
    let valid = validator(false)
        .validate(Prompt::Tokens(vec![104, 105]), &params())
        .await
        .unwrap();
    assert_eq!(valid.request.input_ids, vec![104, 105]);
    let error = validator(false)
        .validate(Prompt::Tokens(vec![104, 99_999]), &params())
        .await
        .unwrap_err();
    assert_eq!(error.param(), Some("prompt"));
    assert!(error.to_string().contains("99999"), "{error}");
    let error = validator(false)
        .validate(Prompt::Tokens(vec![]), &params())
        .await
        .unwrap_err();
    assert_eq!(error, ValidationError::Empty("prompt"));
}

#[tokio::test]
async fn truncate_keeps_the_last_prompt_tokens_and_is_bounded() {
    let truncated = GenerationParams {
        truncate: Some(2),
        ..params()
    };
    let valid = validator(false)
        .validate(Prompt::Tokens(vec![104, 105, 106]), &truncated)
        .await
        .unwrap();
    assert_eq!(valid.request.input_ids, vec![105, 106]);
    for bad in [0, 31, -1] {
        let params = GenerationParams {
            truncate: Some(bad),
            ..params()
        };
        let error = validator(false)
            .validate(Prompt::Text("hello".into()), &params)
            .await
            .unwrap_err();
        assert_eq!(error.param(), Some("truncate"), "{error}");
    }
}

#[tokio::test]
async fn token_ids_beyond_the_models_vocabulary_are_refused_where_they_appear() {
    let validator = validator(false).with_model_vocab_size(100);
    let biased = |id: u32| GenerationParams {
        processors: ProcessorParams {
            logit_bias: Some([(id.to_string(), 1.0)].into()),
            ..ProcessorParams::default()
        },
        ..params()
    };
    let stopped = |id: u32| GenerationParams {
        stop_token_ids: vec![id],
        ..params()
    };
    let cases = [
        (Prompt::Tokens(vec![1, 100]), params(), "prompt"),
        (Prompt::Text("a".into()), biased(100), "logit_bias"),
        (Prompt::Text("a".into()), stopped(100), "stop_token_ids"),
    ];
    for (prompt, params, param) in cases {
        let error = validator.validate(prompt, &params).await.unwrap_err();
        assert_eq!(
            error,
            ValidationError::UnknownToken {
                param,
                id: 100,
                vocab_size: 100
            }
        );
    }
    let last = validator
        .validate(Prompt::Tokens(vec![99]), &stopped(99))
        .await;
    assert!(last.is_ok(), "{last:?}");
}

#[tokio::test]
async fn min_tokens_beyond_the_room_the_prompt_leaves_is_refused_not_shortened() {
    let params = GenerationParams {
        min_new_tokens: Some(39),
        ..params()
    };
    let error = validator(false)
        .validate(Prompt::Text("hello".into()), &params)
        .await
        .unwrap_err();
    assert_eq!(error.param(), Some("min_tokens"));
    assert!(error.to_string().contains("room for 38"), "{error}");
}

#[test]
fn a_token_prompt_over_the_input_limit_is_refused_before_tokenizing() {
    let error = validator(false)
        .check_prompt(&Prompt::Tokens(vec![1; 31]))
        .unwrap_err();
    assert_eq!(
        error,
        ValidationError::InputTooLong {
            input_tokens: 31,
            max_input_tokens: 30
        }
    );
}

#[tokio::test]
async fn the_models_eos_joins_the_stop_tokens_unless_the_request_ignores_it() {
    let params = GenerationParams {
        stop_token_ids: vec![5],
        ..params()
    };
    let prompt = || Prompt::Text("hello".into());
    let valid = validator(false).validate(prompt(), &params).await.unwrap();
    assert_eq!(valid.request.stopping.stop_token_ids, vec![5, 7]);
    let ignoring = GenerationParams {
        ignore_eos: true,
        ..params
    };
    let valid = validator(false)
        .validate(prompt(), &ignoring)
        .await
        .unwrap();
    assert_eq!(valid.request.stopping.stop_token_ids, vec![5]);
}

#[tokio::test]
async fn speculate_caps_drafts_up_to_the_servers_bound_and_names_it_beyond() {
    let speculating = validator(false).with_max_drafts(4);
    let asked = |speculate: Option<i64>| GenerationParams {
        speculate,
        ..params()
    };
    for (speculate, max_drafts) in [(None, None), (Some(0), Some(0)), (Some(4), Some(4))] {
        let valid = speculating
            .validate(Prompt::Text("hello".into()), &asked(speculate))
            .await
            .unwrap();
        assert_eq!(valid.request.max_drafts, max_drafts, "{speculate:?}");
    }
    let not_speculating = validator(false);
    for (checker, speculate, max) in [
        (&speculating, 5, 4),
        (&speculating, -1, 4),
        (&not_speculating, 1, 0),
    ] {
        let error = checker
            .validate(Prompt::Text("hello".into()), &asked(Some(speculate)))
            .await
            .unwrap_err();
        assert_eq!(error.param(), Some("speculate"));
        assert_eq!(
            error.to_string(),
            format!("`speculate` must be an integer from 0 to {max}, got {speculate}")
        );
    }
}

#[tokio::test]
async fn priority_reaches_the_scheduler_only_where_it_schedules_by_priority() {
    let asked = |priority: Option<i64>| GenerationParams {
        priority,
        ..params()
    };
    let by_priority = validator(false).with_scheduling_policy(SchedulingPolicy::Priority);
    for (priority, expected) in [(None, 0), (Some(-3), -3), (Some(7), 7)] {
        let valid = by_priority
            .validate(Prompt::Text("hello".into()), &asked(priority))
            .await
            .unwrap();
        assert_eq!(valid.request.priority, expected, "{priority:?}");
    }
    let too_large = by_priority
        .validate(Prompt::Text("hello".into()), &asked(Some(1 << 40)))
        .await
        .unwrap_err();
    assert_eq!(too_large.param(), Some("priority"));
    let first_come = validator(false);
    let zero = first_come
        .validate(Prompt::Text("hello".into()), &asked(Some(0)))
        .await
        .unwrap();
    assert_eq!(zero.request.priority, 0);
    let refused = first_come
        .validate(Prompt::Text("hello".into()), &asked(Some(2)))
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "`priority` must be 0 on this server, which schedules first come, first served \
         (`--scheduling-policy priority` serves priorities), got 2"
    );
}

#[tokio::test]
async fn fair_sharing_refuses_a_priority_other_than_zero_naming_the_priority_policy() {
    let fair = validator(false).with_scheduling_policy(SchedulingPolicy::Fair);
    let asked = |priority: Option<i64>| GenerationParams {
        priority,
        ..params()
    };
    let zero = fair
        .validate(Prompt::Text("hello".into()), &asked(Some(0)))
        .await
        .unwrap();
    assert_eq!(zero.request.priority, 0);
    let refused = fair
        .validate(Prompt::Text("hello".into()), &asked(Some(-1)))
        .await
        .unwrap_err();
    assert_eq!(refused.param(), Some("priority"));
    assert_eq!(
        refused.to_string(),
        "`priority` must be 0 on this server, which schedules by fair share per API key \
         (`--scheduling-policy priority` serves priorities), got -1"
    );
}
