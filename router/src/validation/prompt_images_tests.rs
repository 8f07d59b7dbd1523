//! A chat prompt's images through validation: the template sees them as parts, each placeholder
//! becomes its image's span, and a text-only model refuses them.

use std::sync::Arc;

use bytes::Bytes;
use image::ImageFormat;

use super::testing;
use super::*;
use crate::images::testing::encoded;
use crate::images::ImageTokens;

/// Renders list content with `<image>` for each image part.
const IMAGE_TEMPLATE: &str = "{% for message in messages %}{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}{% if part.type == 'image' %}<image>{% else %}{{ part.text }}{% endif %}{% endfor %}{% endif %}{% endfor %}";

fn validator(image_tokens: Option<ImageTokens>) -> Validator {
    let template = ChatTemplate::new(IMAGE_TEMPLATE.to_owned(), None, None).unwrap();
    Validator::new(
        Arc::new(testing::tokenizer_with_special_tokens(&["<image>"])),
        Ok(template),
        Limits {
            max_input_tokens: 30,
            max_total_tokens: 40,
            max_stop_sequences: 4,
        },
    )
    .with_image_tokens(image_tokens)
}

fn image_token_id() -> u32 {
    let tokenizer = testing::tokenizer_with_special_tokens(&["<image>"]);
    tokenizer.token_to_id("<image>").expect("a special token")
}

fn prompt_with(images: usize) -> Prompt {
    let png = Bytes::from(encoded(ImageFormat::Png, 4, 4));
    let mut parts = vec![ContentPart::Text("a".to_owned())];
    parts.extend((0..images).map(|_| ContentPart::Image(ImageData::Inline(png.clone()))));
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
    let tokens = ImageTokens {
        image_token_id,
        tokens_per_image: 3,
    };
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
    let tokens = ImageTokens {
        image_token_id: image_token_id(),
        tokens_per_image: 1,
    };
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
