//! Size bounds on a request's inputs beyond its token counts, checked before any of them is
//! converted or used: stop strings, stop token ids and logit bias entries.

use std::collections::BTreeMap;

use super::error::ValidationError;
use super::params::GenerationParams;
use crate::limits::RequestLimits;

/// The first input over its bound, named by its parameter.
pub fn check(params: &GenerationParams, limits: &RequestLimits) -> Result<(), ValidationError> {
    let longest_stop = params.stop.iter().map(String::len).max().unwrap_or(0);
    if longest_stop > limits.max_stop_sequence_length {
        return Err(ValidationError::TooLong {
            param: "stop",
            max: limits.max_stop_sequence_length,
            got: longest_stop,
        });
    }
    let counted = [
        (
            "stop_token_ids",
            params.stop_token_ids.len(),
            limits.max_stop_token_ids,
        ),
        (
            "logit_bias",
            params
                .processors
                .logit_bias
                .as_ref()
                .map_or(0, BTreeMap::len),
            limits.max_logit_bias,
        ),
    ];
    match counted.into_iter().find(|(_, got, max)| got > max) {
        Some((param, got, max)) => Err(ValidationError::TooMany { param, max, got }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::processors::ProcessorParams;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_stop_sequence_length: 4,
            max_stop_token_ids: 2,
            max_logit_bias: 1,
            ..RequestLimits::default()
        }
    }

    #[test]
    fn inputs_at_their_bounds_pass() {
        let params = GenerationParams {
            stop: vec!["abcd".into(), "é".into()],
            stop_token_ids: vec![1, 2],
            processors: ProcessorParams {
                logit_bias: Some(BTreeMap::from([("3".into(), 1.0)])),
                ..ProcessorParams::default()
            },
            ..GenerationParams::default()
        };
        assert_eq!(check(&params, &limits()), Ok(()));
    }

    #[test]
    fn each_input_over_its_bound_is_named() {
        let long_stop = GenerationParams {
            stop: vec!["ab".into(), "abcde".into()],
            ..GenerationParams::default()
        };
        let many_ids = GenerationParams {
            stop_token_ids: vec![1, 2, 3],
            ..GenerationParams::default()
        };
        let many_biases = GenerationParams {
            processors: ProcessorParams {
                logit_bias: Some(BTreeMap::from([("1".into(), 1.0), ("2".into(), 1.0)])),
                ..ProcessorParams::default()
            },
            ..GenerationParams::default()
        };
        // Bytes, not characters: three two-byte characters are six bytes.
        let multibyte_stop = GenerationParams {
            stop: vec!["ééé".into()],
            ..GenerationParams::default()
        };
        for (params, param, max, got) in [
            (long_stop, "stop", 4, 5),
            (many_ids, "stop_token_ids", 2, 3),
            (many_biases, "logit_bias", 1, 2),
            (multibyte_stop, "stop", 4, 6),
        ] {
            let error = check(&params, &limits()).unwrap_err();
            assert_eq!(error.param(), Some(param));
            assert!(
                error.to_string().contains(&format!("at most {max}")),
                "{error}"
            );
            assert!(error.to_string().contains(&got.to_string()), "{error}");
        }
    }
}
