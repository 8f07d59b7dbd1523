//! Range checks for the logits-processor parameters: penalties, logit bias, min_p, typical_p.

use std::collections::BTreeMap;

use super::error::ValidationError;
use crate::scheduler::SamplingParams;

/// Largest absolute frequency or presence penalty (OpenAI's range).
pub const MAX_ABS_PENALTY: f64 = 2.0;
/// Largest absolute logit bias (OpenAI's range).
pub const MAX_ABS_LOGIT_BIAS: f64 = 100.0;

/// The processor parameters as a client sends them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessorParams {
    pub min_p: Option<f64>,
    pub typical_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    /// Token id (as a decimal string, the OpenAI shape) to bias.
    pub logit_bias: Option<BTreeMap<String, f64>>,
}

/// `sampling` with the processor parameters checked and filled in.
pub fn check(
    params: &ProcessorParams,
    sampling: SamplingParams,
) -> Result<SamplingParams, ValidationError> {
    let min_p = params.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ValidationError::out_of_range("min_p", "in [0, 1]", min_p));
    }
    let typical_p = params.typical_p.unwrap_or(1.0);
    if !(typical_p > 0.0 && typical_p <= 1.0) {
        return Err(ValidationError::out_of_range(
            "typical_p",
            "in (0, 1]",
            typical_p,
        ));
    }
    let repetition_penalty = params.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ValidationError::out_of_range(
            "repetition_penalty",
            "a positive number",
            repetition_penalty,
        ));
    }
    let frequency_penalty = check_penalty("frequency_penalty", params.frequency_penalty)?;
    let presence_penalty = check_penalty("presence_penalty", params.presence_penalty)?;
    #[allow(clippy::cast_possible_truncation)]
    Ok(SamplingParams {
        min_p: min_p as f32,
        typical_p: typical_p as f32,
        repetition_penalty: repetition_penalty as f32,
        frequency_penalty,
        presence_penalty,
        logit_bias: check_logit_bias(params.logit_bias.as_ref())?,
        ..sampling
    })
}

fn check_penalty(param: &'static str, value: Option<f64>) -> Result<f32, ValidationError> {
    let value = value.unwrap_or(0.0);
    if !(-MAX_ABS_PENALTY..=MAX_ABS_PENALTY).contains(&value) {
        return Err(ValidationError::out_of_range(
            param,
            "between -2 and 2",
            value,
        ));
    }
    #[allow(clippy::cast_possible_truncation)]
    Ok(value as f32)
}

fn check_logit_bias(
    bias: Option<&BTreeMap<String, f64>>,
) -> Result<Vec<(u32, f32)>, ValidationError> {
    let mut checked = Vec::new();
    for (key, &value) in bias.into_iter().flatten() {
        let id: u32 = key.trim().parse().map_err(|_| {
            ValidationError::out_of_range(
                "logit_bias",
                "keyed by token ids",
                format!("key {key:?}"),
            )
        })?;
        if !(-MAX_ABS_LOGIT_BIAS..=MAX_ABS_LOGIT_BIAS).contains(&value) {
            return Err(ValidationError::out_of_range(
                "logit_bias",
                "valued between -100 and 100",
                format!("{value} for token {id}"),
            ));
        }
        #[allow(clippy::cast_possible_truncation)]
        checked.push((id, value as f32));
    }
    checked.sort_by_key(|(id, _)| *id);
    checked.dedup_by_key(|(id, _)| *id);
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(params: ProcessorParams) -> Result<SamplingParams, ValidationError> {
        check(&params, SamplingParams::default())
    }

    #[test]
    fn absent_parameters_disable_every_processor() {
        assert_eq!(
            checked(ProcessorParams::default()).unwrap(),
            SamplingParams::default()
        );
    }

    #[test]
    fn accepted_values_reach_the_sampling_parameters() {
        let sampling = checked(ProcessorParams {
            min_p: Some(0.05),
            typical_p: Some(0.9),
            repetition_penalty: Some(1.3),
            frequency_penalty: Some(-2.0),
            presence_penalty: Some(2.0),
            logit_bias: Some(BTreeMap::from([("7".into(), -100.0), ("3".into(), 5.5)])),
        })
        .unwrap();
        assert_eq!(sampling.min_p, 0.05);
        assert_eq!(sampling.typical_p, 0.9);
        assert_eq!(sampling.repetition_penalty, 1.3);
        assert_eq!(sampling.frequency_penalty, -2.0);
        assert_eq!(sampling.presence_penalty, 2.0);
        assert_eq!(sampling.logit_bias, vec![(3, 5.5), (7, -100.0)]);
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        let cases = [
            (
                ProcessorParams {
                    min_p: Some(1.5),
                    ..ProcessorParams::default()
                },
                "min_p",
            ),
            (
                ProcessorParams {
                    typical_p: Some(0.0),
                    ..ProcessorParams::default()
                },
                "typical_p",
            ),
            (
                ProcessorParams {
                    repetition_penalty: Some(0.0),
                    ..ProcessorParams::default()
                },
                "repetition_penalty",
            ),
            (
                ProcessorParams {
                    frequency_penalty: Some(2.5),
                    ..ProcessorParams::default()
                },
                "frequency_penalty",
            ),
            (
                ProcessorParams {
                    presence_penalty: Some(-2.1),
                    ..ProcessorParams::default()
                },
                "presence_penalty",
            ),
            (
                ProcessorParams {
                    logit_bias: Some(BTreeMap::from([("12".into(), 101.0)])),
                    ..ProcessorParams::default()
                },
                "logit_bias",
            ),
            (
                ProcessorParams {
                    logit_bias: Some(BTreeMap::from([("hello".into(), 1.0)])),
                    ..ProcessorParams::default()
                },
                "logit_bias",
            ),
        ];
        for (case, param) in cases {
            let error = checked(case).unwrap_err();
            assert!(error.to_string().contains(&format!("`{param}`")), "{error}");
            assert_eq!(error.param(), Some(param));
        }
    }
}
