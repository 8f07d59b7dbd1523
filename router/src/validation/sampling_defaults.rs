//! The sampling defaults a model's `generation_config.json` recommends. With
//! `--generation-config auto` they fill the fields an OpenAI request leaves unset, as vLLM does;
//! the native TGI routes keep TGI's own defaults.

use serde::Serialize;
use serde_json::Value;
use tracing::warn;
use utoipa::ToSchema;

use super::params::{check, GenerationParams};
use super::processors::ProcessorParams;

/// Recommended values; `None` where the model recommends nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct SamplingDefaults {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
}

impl SamplingDefaults {
    /// The sampling fields of a parsed `generation_config.json`. Transformers only samples with
    /// `do_sample: true` and decodes greedily otherwise, so without it nothing is recommended.
    /// A value Tandem would refuse from a client is dropped with a warning, so that no request
    /// fails for a field it never sent.
    pub fn from_generation_config(config: &Value) -> Self {
        if config.get("do_sample").and_then(Value::as_bool) != Some(true) {
            return Self::default();
        }
        let number = |key: &str| config.get(key).and_then(Value::as_f64);
        let recommended = Self {
            temperature: number("temperature"),
            top_p: number("top_p"),
            top_k: config.get("top_k").and_then(Value::as_i64),
            min_p: number("min_p"),
            repetition_penalty: number("repetition_penalty"),
        };
        recommended.without_refused_values()
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    fn without_refused_values(mut self) -> Self {
        // Each round drops the value the range checks name first, until the rest all pass.
        while let Err(error) = check(&self.as_params(), 0) {
            warn!(%error, "generation_config.json recommends a value Tandem refuses; ignoring it");
            match error.param() {
                Some("temperature") => self.temperature = None,
                Some("top_p") => self.top_p = None,
                Some("top_k") => self.top_k = None,
                Some("min_p") => self.min_p = None,
                Some("repetition_penalty") => self.repetition_penalty = None,
                _ => return Self::default(),
            }
        }
        self
    }

    fn as_params(&self) -> GenerationParams {
        GenerationParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            processors: ProcessorParams {
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                ..ProcessorParams::default()
            },
            ..GenerationParams::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sampling_fields_are_recommended_only_with_do_sample() {
        let config = json!({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
            "min_p": 0.05, "repetition_penalty": 1.05, "eos_token_id": 2});
        assert_eq!(
            SamplingDefaults::from_generation_config(&config),
            SamplingDefaults {
                temperature: Some(0.6),
                top_p: Some(0.9),
                top_k: Some(20),
                min_p: Some(0.05),
                repetition_penalty: Some(1.05),
            }
        );
        for greedy in [
            json!({"temperature": 0.6, "top_p": 0.9}),
            json!({"do_sample": false, "temperature": 0.6}),
        ] {
            assert!(SamplingDefaults::from_generation_config(&greedy).is_empty());
        }
    }

    #[test]
    fn values_a_client_could_not_send_are_dropped_alone() {
        let config = json!({"do_sample": true, "temperature": 0.7, "top_p": 1.5, "top_k": -3,
            "repetition_penalty": 0.0, "min_p": "high"});
        assert_eq!(
            SamplingDefaults::from_generation_config(&config),
            SamplingDefaults {
                temperature: Some(0.7),
                ..SamplingDefaults::default()
            }
        );
    }
}
