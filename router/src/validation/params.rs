//! Route-independent generation parameters and their range checks.

use serde_json::{Map, Value};

use super::adapters::AdapterChoice;
use super::cache_hints::CacheHint;
use super::error::ValidationError;
use super::processors::{self, ProcessorParams};
use super::requested_grammar::RequestedGrammar;
use crate::reasoning::ReasoningRequest;
use crate::scheduler::{LogprobOptions, SamplingParams, SchedulingPolicy};

/// Largest accepted temperature.
pub const MAX_TEMPERATURE: f64 = 100.0;

/// Generation parameters as the client sent them, named the way its route names them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationParams {
    /// `None` means 1.0; 0 means greedy.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    /// `None` means "up to `max_total_tokens`".
    pub max_new_tokens: Option<i64>,
    /// How the route calls `max_new_tokens` (`max_tokens`, `max_new_tokens`, ...), for messages.
    pub max_new_tokens_param: &'static str,
    /// `None` draws a random seed.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// Penalties, bias, min_p, typical_p.
    pub processors: ProcessorParams,
    /// EOS and stop tokens are masked until this many tokens were generated.
    pub min_new_tokens: Option<i64>,
    pub ignore_eos: bool,
    /// Tokens that end the request, besides EOS.
    pub stop_token_ids: Vec<u32>,
    /// Already range-checked by the route, whose limits differ.
    pub logprobs: LogprobOptions,
    /// Keep only this many prompt tokens, the last ones (TGI's `truncate`).
    pub truncate: Option<i64>,
    /// Compiled by the validator before admission; `None` means unconstrained.
    pub grammar: Option<RequestedGrammar>,
    /// Most draft tokens per step (`speculate`), 0 to the server's `--speculate`; `None` means
    /// the server's.
    pub speculate: Option<i64>,
    /// What the request asks of a reasoning model's reasoning.
    pub reasoning: ReasoningRequest,
    /// The LoRA adapter the request names (`None`: the base model).
    pub adapter: Option<AdapterChoice>,
    /// vLLM's `priority`: lower runs earlier under `--scheduling-policy priority`.
    pub priority: Option<i64>,
    /// The route's prompt-cache hints, which the validator turns into a retention.
    pub cache_hint: CacheHint,
}

/// Parameters that passed their range checks.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedParams {
    pub sampling: SamplingParams,
    /// At least 1, as the client sent it: only the prompt's length bounds it.
    pub max_new_tokens: Option<i64>,
    pub min_new_tokens: u32,
    pub stop: Vec<String>,
}

/// Checks every parameter's range; the first violation names its parameter.
pub fn check(
    params: &GenerationParams,
    max_stop_sequences: usize,
) -> Result<CheckedParams, ValidationError> {
    let temperature = params.temperature.unwrap_or(1.0);
    if !(0.0..=MAX_TEMPERATURE).contains(&temperature) {
        return Err(ValidationError::out_of_range(
            "temperature",
            "between 0 and 100",
            temperature,
        ));
    }
    let top_p = params.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ValidationError::out_of_range("top_p", "in (0, 1]", top_p));
    }
    let top_k = match params.top_k {
        None => 0,
        Some(k) => u32::try_from(k)
            .map_err(|_| ValidationError::out_of_range("top_k", "a non-negative integer", k))?,
    };
    let max_new_tokens = match params.max_new_tokens {
        None => None,
        Some(n) if n >= 1 => Some(n),
        Some(n) => {
            return Err(ValidationError::out_of_range(
                params.max_new_tokens_param,
                "at least 1",
                n,
            ));
        }
    };
    check_stop(&params.stop, max_stop_sequences)?;
    let min_new_tokens = match params.min_new_tokens {
        None => 0,
        Some(n) => u32::try_from(n).map_err(|_| {
            ValidationError::out_of_range("min_tokens", "a non-negative integer", n)
        })?,
    };
    if let Some(max) = max_new_tokens.filter(|&max| i64::from(min_new_tokens) > max) {
        return Err(ValidationError::OutOfRange {
            param: "min_tokens".to_owned(),
            expected: "at most the maximum number of new tokens",
            value: format!("{min_new_tokens} (maximum {max})"),
        });
    }
    #[allow(clippy::cast_possible_truncation)]
    let sampling = processors::check(
        &params.processors,
        SamplingParams {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            seed: params.seed.unwrap_or_else(random_seed),
            ..SamplingParams::default()
        },
    )?;
    Ok(CheckedParams {
        sampling,
        max_new_tokens,
        min_new_tokens,
        stop: params.stop.clone(),
    })
}

/// A count such as `top_logprobs` checked against a route's maximum.
pub fn check_count(
    param: &'static str,
    value: Option<i64>,
    max: u32,
) -> Result<u32, ValidationError> {
    match value {
        None => Ok(0),
        Some(n) => {
            u32::try_from(n)
                .ok()
                .filter(|&n| n <= max)
                .ok_or(ValidationError::CountOutOfRange {
                    param,
                    max,
                    value: n,
                })
        }
    }
}

fn check_stop(stop: &[String], max_stop_sequences: usize) -> Result<(), ValidationError> {
    if stop.len() > max_stop_sequences {
        return Err(ValidationError::TooManyStops {
            max: max_stop_sequences,
            got: stop.len(),
        });
    }
    if stop.iter().any(String::is_empty) {
        return Err(ValidationError::Empty("stop"));
    }
    Ok(())
}

/// A fresh random seed below 2^63, so it fits the `int64` the API documents; reported back to
/// the client so it can replay the request.
fn random_seed() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0 >> 1
}

/// Rejects every parameter in `extra` (the fields a route does not declare) unless it is
/// in `accepted` or its value is neutral (`null`, `false`, `0`, empty, or a documented
/// no-op such as `repetition_penalty: 1`).
pub fn reject_unsupported(
    extra: &Map<String, Value>,
    accepted: &[&str],
) -> Result<(), ValidationError> {
    let mut names: Vec<&String> = extra
        .iter()
        .filter(|(name, value)| !accepted.contains(&name.as_str()) && !is_neutral(name, value))
        .map(|(name, _)| name)
        .collect();
    names.sort();
    match names.first() {
        None => Ok(()),
        Some(name) => Err(ValidationError::Unsupported {
            param: (*name).clone(),
            detail: String::new(),
        }),
    }
}

fn is_neutral(name: &str, value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Number(number) => {
            let x = number.as_f64().unwrap_or(f64::NAN);
            x == 0.0 || (x == 1.0 && matches!(name, "repetition_penalty" | "typical_p"))
        }
        Value::String(text) => text.is_empty() || (name == "tool_choice" && text == "none"),
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => {
            fields.is_empty()
                || (name == "response_format" && fields.get("type") == Some(&Value::from("text")))
        }
        Value::Bool(true) => false,
    }
}

/// `n`/`best_of`: an integer from 1 to `max`; 1 when absent.
pub fn check_choices(
    param: &str,
    value: Option<i64>,
    max: usize,
) -> Result<usize, ValidationError> {
    match value {
        None => Ok(1),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|count| (1..=max).contains(count))
            .ok_or_else(|| ValidationError::OutOfRange {
                param: param.to_owned(),
                expected: "an integer from 1 to the server's maximum",
                value: format!("{n} (maximum {max})"),
            }),
    }
}

/// A request's `priority`: any 32-bit integer where the server schedules by priority, else
/// only 0, as vLLM refuses it (fair sharing between keys orders no request by priority).
pub fn check_priority(
    priority: Option<i64>,
    scheduling: SchedulingPolicy,
) -> Result<i32, ValidationError> {
    let Some(asked) = priority else {
        return Ok(0);
    };
    let only_zero = match scheduling {
        SchedulingPolicy::Priority => None,
        SchedulingPolicy::Fcfs => Some(
            "0 on this server, which schedules first come, first served \
             (`--scheduling-policy priority` serves priorities)",
        ),
        SchedulingPolicy::Fair => Some(
            "0 on this server, which schedules by fair share per API key \
             (`--scheduling-policy priority` serves priorities)",
        ),
    };
    if let Some(expected) = only_zero.filter(|_| asked != 0) {
        return Err(ValidationError::OutOfRange {
            param: "priority".to_owned(),
            expected,
            value: asked.to_string(),
        });
    }
    i32::try_from(asked).map_err(|_| {
        ValidationError::out_of_range(
            "priority",
            "an integer from -2147483648 to 2147483647",
            asked,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params() -> GenerationParams {
        GenerationParams {
            max_new_tokens_param: "max_tokens",
            ..GenerationParams::default()
        }
    }

    fn message(result: Result<CheckedParams, ValidationError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn defaults_sample_at_temperature_one_with_a_random_seed() {
        let a = check(&params(), 4).unwrap();
        let b = check(&params(), 4).unwrap();
        assert_eq!(a.sampling.temperature, 1.0);
        assert_eq!(a.sampling.top_p, 1.0);
        assert_eq!(a.sampling.top_k, 0);
        assert_eq!(a.max_new_tokens, None);
        assert_ne!(a.sampling.seed, b.sampling.seed);
        assert!(a.sampling.seed <= i64::MAX as u64);
    }

    #[test]
    fn explicit_seed_is_kept() {
        let checked = check(
            &GenerationParams {
                seed: Some(42),
                ..params()
            },
            4,
        )
        .unwrap();
        assert_eq!(checked.sampling.seed, 42);
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        let cases = [
            (
                GenerationParams {
                    temperature: Some(-0.1),
                    ..params()
                },
                "temperature",
            ),
            (
                GenerationParams {
                    temperature: Some(101.0),
                    ..params()
                },
                "temperature",
            ),
            (
                GenerationParams {
                    top_p: Some(0.0),
                    ..params()
                },
                "top_p",
            ),
            (
                GenerationParams {
                    top_p: Some(1.5),
                    ..params()
                },
                "top_p",
            ),
            (
                GenerationParams {
                    top_k: Some(-1),
                    ..params()
                },
                "top_k",
            ),
            (
                GenerationParams {
                    max_new_tokens: Some(-1),
                    ..params()
                },
                "max_tokens",
            ),
            (
                GenerationParams {
                    max_new_tokens: Some(0),
                    ..params()
                },
                "max_tokens",
            ),
        ];
        for (case, param) in cases {
            let text = message(check(&case, 4));
            assert!(text.contains(&format!("`{param}`")), "{text}");
        }
    }

    #[test]
    fn greedy_and_boundary_values_are_accepted() {
        let checked = check(
            &GenerationParams {
                temperature: Some(0.0),
                top_p: Some(1.0),
                top_k: Some(0),
                max_new_tokens: Some(1),
                ..params()
            },
            4,
        )
        .unwrap();
        assert_eq!(checked.sampling.temperature, 0.0);
        assert_eq!(checked.max_new_tokens, Some(1));
    }

    #[test]
    fn stop_strings_are_limited_and_non_empty() {
        let five = GenerationParams {
            stop: vec!["a".into(); 5],
            ..params()
        };
        assert!(message(check(&five, 4)).contains("at most 4"));
        assert!(check(&five, 5).is_ok());
        let empty = GenerationParams {
            stop: vec![String::new()],
            ..params()
        };
        assert!(message(check(&empty, 4)).contains("`stop`"));
    }

    #[test]
    fn unsupported_parameters_are_rejected_unless_neutral() {
        let neutral = json!({
            "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "logprobs": false, "tools": [], "tool_choice": "none", "logit_bias": {},
            "response_format": {"type": "text"}, "grammar": null, "suffix": ""
        });
        reject_unsupported(neutral.as_object().unwrap(), &[]).unwrap();
        for (name, value) in [
            ("watermark", json!(true)),
            ("suffix", json!("x")),
            ("tools", json!([{"type": "function"}])),
            ("response_format", json!({"type": "json_object"})),
            ("grammar", json!({"type": "regex", "value": "a"})),
            ("echo", json!(true)),
        ] {
            let extra = json!({ name: value });
            let error = reject_unsupported(extra.as_object().unwrap(), &[]).unwrap_err();
            assert!(error.to_string().contains(&format!("`{name}`")), "{error}");
            assert_eq!(error.param(), Some(name));
        }
    }

    #[test]
    fn accepted_parameters_pass_whatever_their_value() {
        let extra = json!({"model": "anything", "user": "u-1"});
        reject_unsupported(extra.as_object().unwrap(), &["model", "user"]).unwrap();
        assert!(reject_unsupported(extra.as_object().unwrap(), &["model"]).is_err());
    }

    #[test]
    fn choices_range_from_one_to_the_maximum() {
        assert_eq!(check_choices("n", None, 16).unwrap(), 1);
        assert_eq!(check_choices("n", Some(16), 16).unwrap(), 16);
        for bad in [0, -1, 17] {
            let error = check_choices("best_of", Some(bad), 16).unwrap_err();
            assert!(error.to_string().contains("`best_of`"), "{error}");
        }
    }
}
