//! Checks on a request body that no single parameter owns: required fields, list lengths,
//! features a route does not serve, flags that need each other, and how choices, echo and
//! prompts combine.

use tokenizers::Tokenizer;

use super::{ContentPart, GenerationParams, ImageData, Prompt, ValidationError};
use crate::images;

/// The value of a required field.
pub fn required<T>(param: &'static str, value: Option<T>) -> Result<T, ValidationError> {
    value.ok_or(ValidationError::Missing(param))
}

/// A list field holds at most `max` entries.
pub fn check_list_len(param: &'static str, len: usize, max: usize) -> Result<(), ValidationError> {
    if len > max {
        return Err(ValidationError::TooMany {
            param,
            max,
            got: len,
        });
    }
    Ok(())
}

/// Refuses `param` when the request `uses` it; `detail` says why or where to go instead.
pub fn refuse_feature(uses: bool, param: &str, detail: &str) -> Result<(), ValidationError> {
    if uses {
        return Err(ValidationError::Unsupported {
            param: param.to_owned(),
            detail: detail.to_owned(),
        });
    }
    Ok(())
}

/// `param` must be `expected`, the request sent `value`.
pub fn refuse_value<T>(
    param: &str,
    expected: &'static str,
    value: String,
) -> Result<T, ValidationError> {
    Err(out_of_range(param, expected, value))
}

/// The refusal of `value` for `param`, which must be `expected`.
pub fn out_of_range(param: &str, expected: &'static str, value: String) -> ValidationError {
    ValidationError::OutOfRange {
        param: param.to_owned(),
        expected,
        value,
    }
}

/// `error` with its out-of-range parameter named as `rename` spells it (a route whose body
/// names a field differently from the checks it shares).
pub fn rename_out_of_range(
    error: ValidationError,
    rename: impl Fn(String) -> String,
) -> ValidationError {
    match error {
        ValidationError::OutOfRange {
            param,
            expected,
            value,
        } => ValidationError::OutOfRange {
            param: rename(param),
            expected,
            value,
        },
        other => other,
    }
}

/// `top_logprobs` asks for alternatives of the logprobs that `logprobs: true` turns on.
pub fn check_logprobs_flag(
    top_logprobs: u32,
    logprobs: Option<bool>,
) -> Result<(), ValidationError> {
    if top_logprobs > 0 && logprobs != Some(true) {
        return refuse_value(
            "logprobs",
            "true when `top_logprobs` is set",
            format!("{logprobs:?}"),
        );
    }
    Ok(())
}

/// An error about a field of message `index`, named from the request's root.
pub fn in_message(index: usize, error: ValidationError) -> ValidationError {
    match error {
        ValidationError::Unsupported { param, detail } => ValidationError::Unsupported {
            param: format!("messages[{index}].{param}"),
            detail,
        },
        other => other,
    }
}

/// The image at `url`: a `data:` URL's bytes (at most `max_bytes`), or an `http(s)` URL to fetch.
pub fn image_by_url(url: String, max_bytes: usize) -> Result<ImageData, images::ImageError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(ImageData::Remote(url));
    }
    images::inline_image(&url, max_bytes).map(ImageData::Inline)
}

/// A content part as the client sent it: its type, with its text or its image's URL.
pub struct SentPart {
    pub kind: String,
    pub text: Option<String>,
    pub image_url: Option<String>,
}

/// A message's content (at `param`, such as `messages[0].content`) from its parts: the text
/// parts joined by newlines, and, when it holds images, every part in order. Images come as
/// `data:` URLs of at most `max_image_bytes`.
pub fn message_content(
    param: &str,
    parts: impl IntoIterator<Item = SentPart>,
    max_image_bytes: usize,
) -> Result<(String, Option<Vec<ContentPart>>), ValidationError> {
    let mut texts = Vec::new();
    let mut ordered = Vec::new();
    for (part_index, part) in parts.into_iter().enumerate() {
        let at = format!("{param}[{part_index}]");
        match (part.kind.as_str(), part.text, part.image_url) {
            ("text", Some(text), _) => {
                ordered.push(ContentPart::Text(text.clone()));
                texts.push(text);
            }
            ("image_url", _, Some(url)) => {
                let image = image_by_url(url, max_image_bytes).map_err(|source| {
                    ValidationError::ImagePart {
                        param: format!("{at}.image_url"),
                        source,
                    }
                })?;
                ordered.push(ContentPart::Image(image));
            }
            (kind, ..) => {
                return Err(ValidationError::Unsupported {
                    param: at,
                    detail: format!(": content of type `{kind}`"),
                })
            }
        }
    }
    let has_images = ordered
        .iter()
        .any(|part| matches!(part, ContentPart::Image(_)));
    Ok((texts.join("\n"), has_images.then_some(ordered)))
}

/// Tools the model may call constrain the generation themselves, so no other grammar may.
pub fn check_grammar_free_for_tools(params: &GenerationParams) -> Result<(), ValidationError> {
    refuse_feature(
        params.grammar.is_some(),
        "response_format",
        " together with `tools` the model may call",
    )
}

/// `best_of` is at least `n`; streaming returns every candidate, so it needs `best_of == n`.
pub fn check_best_of(n: usize, best_of: usize, streaming: bool) -> Result<(), ValidationError> {
    if best_of < n {
        return refuse_value("best_of", "at least `n`", format!("{best_of} (n = {n})"));
    }
    refuse_feature(
        best_of > n && streaming,
        "best_of",
        " greater than `n` when streaming",
    )
}

/// Several greedy candidates would all be the same sequence.
pub fn check_best_of_samples(best_of: usize, sampling: bool) -> Result<(), ValidationError> {
    if best_of > 1 && !sampling {
        let expected = "1 unless sampling (`do_sample` or a sampling parameter)";
        return refuse_value("best_of", expected, best_of.to_string());
    }
    Ok(())
}

/// A prompt scored alone (`max_tokens: 0`) needs `echo`, no `min_tokens` and no `best_of`
/// beyond `n`: there is no completion to rank.
pub fn check_prompt_only(
    echo: bool,
    min_tokens: Option<i64>,
    n: usize,
    best_of: usize,
) -> Result<(), ValidationError> {
    if !echo {
        return refuse_value("max_tokens", "at least 1 without `echo`", "0".to_owned());
    }
    if let Some(min) = min_tokens.filter(|&min| min > 0) {
        return refuse_value("min_tokens", "0 when `max_tokens` is 0", min.to_string());
    }
    if best_of > n {
        let expected = "`n` when `max_tokens` is 0 (there is no completion to rank)";
        return refuse_value("best_of", expected, format!("{best_of} (n = {n})"));
    }
    Ok(())
}

/// A request's prompts: at least one, at most `max` (the client batch size).
pub fn check_prompt_count(count: usize, max: usize) -> Result<(), ValidationError> {
    if count == 0 {
        return Err(ValidationError::Empty("prompt"));
    }
    if count > max {
        return Err(ValidationError::TooManyPrompts { max, got: count });
    }
    Ok(())
}

/// Every prompt runs `best_of` candidates; all of them together stay within `max_choices`.
pub fn check_generations(
    prompts: usize,
    n: usize,
    best_of: usize,
    max_choices: usize,
) -> Result<(), ValidationError> {
    let generations = prompts * best_of;
    if generations > max_choices {
        let param = if best_of > n { "best_of" } else { "n" };
        let expected = "at most the server's maximum of generations per request when multiplied by the number of prompts";
        let value =
            format!("{best_of} × {prompts} prompts = {generations} (maximum {max_choices})");
        return refuse_value(param, expected, value);
    }
    Ok(())
}

/// A prompt's text as sent, or its token ids decoded; a chat prompt has none.
pub fn prompt_text(prompt: &Prompt, tokenizer: &Tokenizer) -> Result<String, ValidationError> {
    match prompt {
        Prompt::Text(text) => Ok(text.clone()),
        Prompt::Tokens(ids) => tokenizer
            .decode(ids, false)
            .map_err(|e| ValidationError::Tokenizer(e.to_string())),
        Prompt::Chat(..) => Ok(String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_field_or_a_long_list_is_named() {
        assert_eq!(
            required::<u32>("messages", None),
            Err(ValidationError::Missing("messages"))
        );
        assert_eq!(required("messages", Some(3)), Ok(3));
        let error = check_list_len("tools", 3, 2).unwrap_err();
        assert_eq!(
            error,
            ValidationError::TooMany {
                param: "tools",
                max: 2,
                got: 3
            }
        );
        assert_eq!(check_list_len("tools", 2, 2), Ok(()));
    }

    #[test]
    fn message_errors_are_named_from_the_root() {
        let error = in_message(
            2,
            ValidationError::Unsupported {
                param: "audio".to_owned(),
                detail: String::new(),
            },
        );
        assert_eq!(
            error.to_string(),
            "`messages[2].audio` is not supported yet"
        );
    }

    fn part(kind: &str, text: Option<&str>, image_url: Option<&str>) -> SentPart {
        SentPart {
            kind: kind.to_owned(),
            text: text.map(str::to_owned),
            image_url: image_url.map(str::to_owned),
        }
    }

    #[test]
    fn text_parts_join_and_keep_no_part_list() {
        let parts = [part("text", Some("a"), None), part("text", Some("b"), None)];
        assert_eq!(
            message_content("messages[0].content", parts, 16),
            Ok(("a\nb".to_owned(), None))
        );
    }

    #[test]
    fn a_message_with_an_image_keeps_its_parts_in_order() {
        let parts = [
            part("image_url", None, Some("data:image/png;base64,AQID")),
            part("text", Some("what is it?"), None),
        ];
        let (text, parts) = message_content("messages[0].content", parts, 16).expect("accepted");
        assert_eq!(text, "what is it?");
        assert_eq!(
            parts,
            Some(vec![
                ContentPart::Image(ImageData::Inline(bytes::Bytes::from_static(&[1, 2, 3]))),
                ContentPart::Text("what is it?".to_owned())
            ])
        );
    }

    #[test]
    fn image_parts_without_an_inline_url_and_unknown_parts_are_refused_by_path() {
        let remote = [part("image_url", None, Some("ftp://example.com/a.png"))];
        let error = message_content("messages[1].content", remote, 16).unwrap_err();
        assert_eq!(
            error.to_string(),
            "`messages[1].content[0].image_url`: only `data:` image URLs (`data:image/png;base64,...`) and `http(s)` URLs are accepted, not `ftp:` URLs"
        );
        let error = message_content("messages[1].content", [part("input_audio", None, None)], 16)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "`messages[1].content[0]` is not supported yet: content of type `input_audio`"
        );
    }

    #[test]
    fn only_out_of_range_parameters_are_renamed() {
        let upper = |param: String| param.to_uppercase();
        let renamed = rename_out_of_range(out_of_range("tools", "a list", "1".to_owned()), upper);
        assert_eq!(renamed.param(), Some("TOOLS"));
        let missing = rename_out_of_range(ValidationError::Missing("tools"), upper);
        assert_eq!(missing, ValidationError::Missing("tools"));
    }

    #[test]
    fn top_logprobs_needs_logprobs() {
        assert_eq!(check_logprobs_flag(0, None), Ok(()));
        assert_eq!(check_logprobs_flag(2, Some(true)), Ok(()));
        let error = check_logprobs_flag(2, Some(false)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "`logprobs` must be true when `top_logprobs` is set, got Some(false)"
        );
    }

    #[test]
    fn best_of_is_at_least_n_streams_only_when_equal_and_needs_sampling() {
        assert!(check_best_of(2, 1, false).is_err());
        assert!(check_best_of(1, 2, true).is_err());
        assert_eq!(check_best_of(1, 2, false), Ok(()));
        assert!(check_best_of_samples(2, false).is_err());
        assert_eq!(check_best_of_samples(2, true), Ok(()));
    }

    #[test]
    fn a_prompt_alone_needs_echo_no_min_tokens_and_nothing_to_rank() {
        assert_eq!(check_prompt_only(true, None, 1, 1), Ok(()));
        for (echo, min_tokens, best_of, param) in [
            (false, None, 1, "max_tokens"),
            (true, Some(1), 1, "min_tokens"),
            (true, None, 2, "best_of"),
        ] {
            let error = check_prompt_only(echo, min_tokens, 1, best_of).unwrap_err();
            assert_eq!(error.param(), Some(param), "{error}");
        }
    }

    #[test]
    fn prompts_are_counted_alone_and_with_their_candidates() {
        assert_eq!(
            check_prompt_count(0, 4),
            Err(ValidationError::Empty("prompt"))
        );
        assert_eq!(
            check_prompt_count(5, 4),
            Err(ValidationError::TooManyPrompts { max: 4, got: 5 })
        );
        assert_eq!(check_prompt_count(4, 4), Ok(()));
        assert_eq!(check_generations(2, 1, 2, 4), Ok(()));
        assert_eq!(
            check_generations(3, 1, 2, 4).unwrap_err().param(),
            Some("best_of")
        );
        assert_eq!(
            check_generations(5, 1, 1, 4).unwrap_err().param(),
            Some("n")
        );
    }
}
