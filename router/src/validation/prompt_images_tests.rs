//! A chat prompt's images through validation: the template sees them as parts, each placeholder
//! becomes its image's span, and a text-only model refuses them.

use std::sync::Arc;

use bytes::Bytes;
use image::ImageFormat;

use super::testing;
use super::*;
use crate::images::testing::{
    encoded, gemma3, qwen2_5_vl, GEMMA3_SPECIAL_TOKENS, QWEN2_5_VL_SPECIAL_TOKENS,
};
use crate::images::{ImageError, ImageTokens, ImageTokensError};

/// Renders list content with `<image>` for each image part.
const IMAGE_TEMPLATE: &str = "{% for message in messages %}{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}{% if part.type == 'image' %}<image>{% else %}{{ part.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}";

/// The step token budget the validators see.
const MAX_STEP_TOKENS: usize = 16;

fn validator(image_tokens: Option<ImageTokens>) -> Validator {
    validator_for(&["<image>"], "<image>", image_tokens, MAX_STEP_TOKENS)
}

/// A validator whose tokenizer knows `special` tokens, whose template writes `mark` for each
/// image, and whose steps compute at most `max_step_tokens` tokens.
fn validator_for(
    special: &[&str],
    mark: &str,
    image_tokens: Option<ImageTokens>,
    max_step_tokens: usize,
) -> Validator {
    let source = IMAGE_TEMPLATE.replace("<image>", mark);
    let template = ChatTemplate::new(source, None, None).unwrap();
    Validator::new(
        Arc::new(testing::tokenizer_with_special_tokens(special)),
        Ok(template),
        Limits {
            max_input_tokens: 30,
            max_total_tokens: 40,
            max_stop_sequences: 4,
        },
    )
    .with_image_tokens(image_tokens, max_step_tokens)
}

fn image_token_id() -> u32 {
    let tokenizer = testing::tokenizer_with_special_tokens(&["<image>"]);
    tokenizer.token_to_id("<image>").expect("a special token")
}

fn prompt_with(images: usize) -> Prompt {
    prompt_with_sizes(&vec![(4, 4); images])
}

/// A chat whose message is "a", an image of each (width, height) of `sizes`, then "b".
fn prompt_with_sizes(sizes: &[(u32, u32)]) -> Prompt {
    let mut parts = vec![ContentPart::Text("a".to_owned())];
    parts.extend(sizes.iter().map(|&(width, height)| {
        let png = Bytes::from(encoded(ImageFormat::Png, width, height));
        ContentPart::Image(ImageData::Inline(png))
    }));
    parts.push(ContentPart::Text("b".to_owned()));
    let mut message = ChatMessage::new("user", "a\nb");
    message.parts = Some(parts);
    Prompt::Chat(vec![message], ChatEnding::Closed, TemplateExtras::default())
}

fn params() -> GenerationParams {
    GenerationParams {
        max_new_tokens_param: "max_tokens",
        ..GenerationParams::default()
    }
}

#[tokio::test]
async fn each_image_of_a_chat_takes_its_span_of_image_tokens() {
    let image_token_id = image_token_id();
    let tokens = ImageTokens::widened(image_token_id, 3);
    let valid = validator(Some(tokens))
        .validate(prompt_with(2), &params())
        .await
        .unwrap();
    let request = valid.request;
    let a = testing::encode("a");
    let b = testing::encode("b");
    let mut expected = a.clone();
    expected.extend([image_token_id; 6]);
    expected.extend(&b);
    assert_eq!(request.input_ids, expected);
    let spans: Vec<_> = request
        .images
        .iter()
        .map(|image| (image.offset, image.num_tokens))
        .collect();
    assert_eq!(spans, [(a.len(), 3), (a.len() + 3, 3)]);
    assert_eq!(request.images[0].digest, request.images[1].digest);
}

#[tokio::test]
async fn a_text_only_model_and_too_many_images_are_refused() {
    let error = validator(None)
        .validate(prompt_with(1), &params())
        .await
        .unwrap_err();
    assert_eq!(error, ValidationError::TextOnlyModel);
    let tokens = ImageTokens::widened(image_token_id(), 1);
    let error = validator(Some(tokens))
        .validate(prompt_with(9), &params())
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ValidationError::TooMany {
            param: "images",
            max: 8,
            got: 9
        }
    );
}

#[tokio::test]
async fn a_gemma3_chat_is_tokenized_from_the_text_its_processor_writes() {
    let (tokenizer, tokens) = gemma3(3);
    let soft = tokens.image_token_id;
    let validator = validator_for(
        &GEMMA3_SPECIAL_TOKENS,
        "<start_of_image>",
        Some(tokens),
        MAX_STEP_TOKENS,
    );
    let request = validator
        .validate(prompt_with(1), &params())
        .await
        .unwrap()
        .request;
    let text = "a\n\n<start_of_image><image_soft_token><image_soft_token><image_soft_token>\
                <end_of_image>\n\nb";
    let expected = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(request.input_ids, expected);
    let offset = expected.iter().position(|&id| id == soft).unwrap();
    assert_eq!(
        (request.images[0].offset, request.images[0].num_tokens),
        (offset, 3)
    );
    let counted = validator.count_tokens(prompt_with(1)).await.unwrap();
    assert_eq!(counted, expected.len());
}

#[tokio::test]
async fn a_gemma3_chat_with_a_mark_of_its_own_is_refused() {
    let (_, tokens) = gemma3(3);
    let validator = validator_for(
        &GEMMA3_SPECIAL_TOKENS,
        "<start_of_image>",
        Some(tokens),
        MAX_STEP_TOKENS,
    );
    let mut prompt = prompt_with(1);
    if let Prompt::Chat(messages, ..) = &mut prompt {
        let parts = messages[0].parts.as_mut().unwrap();
        parts.push(ContentPart::Text("<start_of_image>".to_owned()));
    }
    let error = validator.validate(prompt, &params()).await.unwrap_err();
    assert_eq!(
        error,
        ValidationError::ImagePlacement(ImageTokensError::PlaceholderCount {
            found: 2,
            images: 1
        })
    );
}

#[tokio::test]
async fn an_image_span_longer_than_a_step_is_refused_naming_both_numbers() {
    let tokens = ImageTokens::widened(image_token_id(), 5);
    let error = validator_for(&["<image>"], "<image>", Some(tokens), 4)
        .validate(prompt_with(1), &params())
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ValidationError::ImageSpanTooLong {
            number: 1,
            tokens: 5,
            max_step_tokens: 4
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("image 1 of the request takes 5 prompt tokens")
            && message.contains("the 4 one step computes"),
        "{message}"
    );
    let fits = ImageTokens::widened(image_token_id(), 4);
    let valid = validator_for(&["<image>"], "<image>", Some(fits), 4)
        .validate(prompt_with(1), &params())
        .await;
    assert!(valid.is_ok(), "a span as long as a step fits: {valid:?}");
}

/// A Qwen2.5-VL validator whose steps compute at most `max_step_tokens` tokens, and its
/// tokenizer.
fn qwen_validator(max_step_tokens: usize) -> (Validator, tokenizers::Tokenizer) {
    let (tokenizer, tokens) = qwen2_5_vl();
    let mark = "<|vision_start|><|image_pad|><|vision_end|>";
    let validator = validator_for(
        &QWEN2_5_VL_SPECIAL_TOKENS,
        mark,
        Some(tokens),
        max_step_tokens,
    );
    (validator, tokenizer)
}

#[tokio::test]
async fn qwen2_5_vl_images_take_spans_as_long_as_their_sizes_make_them() {
    let (validator, tokenizer) = qwen_validator(MAX_STEP_TOKENS);
    let pad = tokenizer.token_to_id("<|image_pad|>").unwrap();
    let start = tokenizer.token_to_id("<|vision_start|>").unwrap();
    let end = tokenizer.token_to_id("<|vision_end|>").unwrap();
    // transformers' smart_resize: 84x56 resizes to 56x84 (6 tokens), 10x10 to 56x56 (4).
    let sizes = [(84, 56), (10, 10)];
    let request = validator
        .validate(prompt_with_sizes(&sizes), &params())
        .await
        .unwrap()
        .request;
    let mut expected = testing::encode("a");
    for span in [6, 4] {
        expected.push(start);
        expected.extend(std::iter::repeat_n(pad, span));
        expected.push(end);
    }
    expected.extend(testing::encode("b"));
    assert_eq!(request.input_ids, expected);
    let spans: Vec<_> = request
        .images
        .iter()
        .map(|image| (image.offset, image.num_tokens))
        .collect();
    let first = testing::encode("a").len() + 1;
    assert_eq!(spans, [(first, 6), (first + 6 + 2, 4)]);
    assert_ne!(request.images[0].digest, request.images[1].digest);
    let counted = validator
        .count_tokens(prompt_with_sizes(&sizes))
        .await
        .unwrap();
    assert_eq!(counted, expected.len());
}

#[tokio::test]
async fn only_the_qwen2_5_vl_image_longer_than_a_step_is_refused_and_named() {
    let (validator, _) = qwen_validator(5);
    let fits = validator
        .validate(prompt_with_sizes(&[(10, 10)]), &params())
        .await;
    assert!(fits.is_ok(), "4 tokens fit a 5-token step: {fits:?}");
    let refused = ValidationError::ImageSpanTooLong {
        number: 2,
        tokens: 6,
        max_step_tokens: 5,
    };
    let prompt = || prompt_with_sizes(&[(10, 10), (84, 56)]);
    let error = validator.validate(prompt(), &params()).await.unwrap_err();
    assert_eq!(error, refused);
    assert_eq!(validator.count_tokens(prompt()).await.unwrap_err(), refused);
}

#[tokio::test]
async fn an_image_qwen2_5_vl_would_refuse_for_its_aspect_ratio_is_refused_by_number() {
    let (validator, _) = qwen_validator(MAX_STEP_TOKENS);
    let refused = ValidationError::Image {
        number: 2,
        source: ImageError::AspectRatio {
            width: 201,
            height: 1,
        },
    };
    let prompt = || prompt_with_sizes(&[(4, 4), (201, 1)]);
    let error = validator.validate(prompt(), &params()).await.unwrap_err();
    assert_eq!(error, refused);
    let message = error.to_string();
    assert!(
        message.contains("image 2 of the request") && message.contains("201x1"),
        "{message}"
    );
    assert_eq!(validator.count_tokens(prompt()).await.unwrap_err(), refused);
}
