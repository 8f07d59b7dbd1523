//! A prompt's images: refused by a text-only model, bounded in number, size and pixels, their
//! spans sized from their headers (each must fit one step), decoded to the end within the
//! decoding budget, and placed at their spans once the prompt is tokenized.

use bytes::Bytes;

use super::budget::TokenizationBudget;
use std::sync::Arc;

use super::{ImageData, Prompt, ValidationError, Validator};
use crate::images::{
    check_image, refuse_url, ImageError, ImageHeader, ImageLimits, ImageTokens, MediaFetcher,
    PromptImage, SizedImage,
};

impl Prompt {
    /// The images of a chat prompt, in message order.
    pub fn images(&self) -> Vec<ImageData> {
        match self {
            Prompt::Chat(messages, ..) => messages
                .iter()
                .flat_map(|message| message.images().cloned())
                .collect(),
            Prompt::Text(_) | Prompt::Tokens(_) => Vec::new(),
        }
    }
}

/// How a validator takes images in: how they are placed (`None`: a text-only model), the most
/// tokens one step computes (an image's span must fit), their bounds, the budget decoding draws
/// on, and the fetcher of images by URL (`None`: none is fetched).
pub struct ImageIntake<'a> {
    pub tokens: Option<&'a ImageTokens>,
    pub max_step_tokens: usize,
    pub limits: &'a ImageLimits,
    pub budget: &'a TokenizationBudget,
    pub fetcher: Option<&'a MediaFetcher>,
}

/// The bytes of `image`: its own, or fetched from its URL within `max_bytes`.
async fn image_bytes(
    image: ImageData,
    fetcher: Option<&MediaFetcher>,
    max_bytes: usize,
) -> Result<Bytes, ImageError> {
    match (image, fetcher) {
        (ImageData::Inline(data), _) => Ok(data),
        (ImageData::Remote(url), Some(fetcher)) => fetcher.fetch(&url, max_bytes).await,
        (ImageData::Remote(url), None) => Err(refuse_url(&url)),
    }
}

/// The model's image tokens, when `images` may come in at all: none or at most the limit's
/// number, and a model that reads images (`None`: there are no images).
fn admitted<'a>(
    images: &[ImageData],
    intake: &ImageIntake<'a>,
) -> Result<Option<&'a ImageTokens>, ValidationError> {
    if images.is_empty() {
        return Ok(None);
    }
    let Some(tokens) = intake.tokens else {
        return Err(ValidationError::TextOnlyModel);
    };
    let max = intake.limits.max_images_per_request;
    if images.len() > max {
        return Err(ValidationError::TooMany {
            param: "images",
            max,
            got: images.len(),
        });
    }
    Ok(Some(tokens))
}

/// Image `number`'s bytes, header and span, read without decoding it: refused when over a
/// limit, of a size the model's processor refuses, or with a span longer than one step.
async fn sized_header(
    image: ImageData,
    number: usize,
    tokens: &ImageTokens,
    intake: &ImageIntake<'_>,
) -> Result<(Bytes, ImageHeader, usize), ValidationError> {
    let limits = intake.limits;
    let refused = |source| ValidationError::Image { number, source };
    let data = image_bytes(image, intake.fetcher, limits.max_image_bytes)
        .await
        .map_err(refused)?;
    if data.len() > limits.max_image_bytes {
        return Err(refused(ImageError::TooLarge {
            bytes: data.len(),
            max: limits.max_image_bytes,
        }));
    }
    let header = ImageHeader::read(&data, limits).map_err(refused)?;
    let span = tokens
        .span
        .tokens(header.width, header.height)
        .map_err(refused)?;
    if span > intake.max_step_tokens {
        return Err(ValidationError::ImageSpanTooLong {
            number,
            tokens: span,
            max_step_tokens: intake.max_step_tokens,
        });
    }
    Ok((data, header, span))
}

/// Checks `images` one at a time: each holds its decoded size from the budget while a blocking
/// thread decodes it, so concurrent requests never decode more than the budget at once.
pub async fn check_images(
    images: Vec<ImageData>,
    intake: ImageIntake<'_>,
) -> Result<Vec<SizedImage>, ValidationError> {
    let Some(tokens) = admitted(&images, &intake)? else {
        return Ok(Vec::new());
    };
    let mut checked = Vec::with_capacity(images.len());
    for (index, image) in images.into_iter().enumerate() {
        let number = index + 1;
        let (data, header, num_tokens) = sized_header(image, number, tokens, &intake).await?;
        let reserved = intake.budget.reserve(header.decoded_bytes()).await;
        let image = tokio::task::spawn_blocking(move || {
            let _reserved = reserved;
            check_image(data, header)
        })
        .await
        .map_err(|error| ValidationError::Tokenizer(error.to_string()))?
        .map_err(|source| ValidationError::Image { number, source })?;
        checked.push(SizedImage { image, num_tokens });
    }
    Ok(checked)
}

/// The span each of `images` takes, in order, from their headers alone (a count decodes
/// nothing); refused as `check_images` refuses an image before decoding it.
pub async fn image_spans(
    images: Vec<ImageData>,
    intake: ImageIntake<'_>,
) -> Result<Vec<usize>, ValidationError> {
    let Some(tokens) = admitted(&images, &intake)? else {
        return Ok(Vec::new());
    };
    let mut spans = Vec::with_capacity(images.len());
    for (index, image) in images.into_iter().enumerate() {
        let (_, _, span) = sized_header(image, index + 1, tokens, &intake).await?;
        spans.push(span);
    }
    Ok(spans)
}

/// `ids` with the images placed at their spans (see `ImageTokens::place`); unchanged without
/// images.
pub fn place_images(
    ids: Vec<u32>,
    images: Vec<SizedImage>,
    tokens: Option<&ImageTokens>,
) -> Result<(Vec<u32>, Vec<PromptImage>), ValidationError> {
    match tokens {
        Some(tokens) if !images.is_empty() => tokens
            .place(ids, images)
            .map_err(ValidationError::ImagePlacement),
        _ => Ok((ids, Vec::new())),
    }
}

impl Validator {
    /// Lets requests carry images, placed as `tokens` says (`None`: the model takes text only),
    /// when one scheduler step computes at most `max_step_tokens` tokens
    /// (`--max-batch-prefill-tokens`): a prompt chunk never ends inside an image's span, so an
    /// image whose span is longer than that is refused.
    #[must_use]
    pub fn with_image_tokens(
        mut self,
        tokens: Option<ImageTokens>,
        max_step_tokens: usize,
    ) -> Self {
        self.image_tokens = tokens.map(Arc::new);
        self.max_step_tokens = max_step_tokens;
        self
    }

    /// Fetches images given by URL with `fetcher` (from the hosts it allows).
    #[must_use]
    pub fn with_media_fetcher(mut self, fetcher: MediaFetcher) -> Self {
        self.media_fetcher = Some(Arc::new(fetcher));
        self
    }

    /// How this validator takes images in.
    pub(super) fn image_intake(&self) -> ImageIntake<'_> {
        ImageIntake {
            tokens: self.image_tokens.as_deref(),
            max_step_tokens: self.max_step_tokens,
            limits: &self.request_limits.images,
            budget: &self.tokenizing,
            fetcher: self.media_fetcher.as_deref(),
        }
    }

    /// The prompt's token ids, with its images checked and placed at their spans, and only its
    /// last `truncate` tokens kept (a prompt with images is never cut).
    pub(super) async fn prompt_ids(
        &self,
        prompt: Prompt,
        switches: Vec<(&'static str, serde_json::Value)>,
        truncate: Option<usize>,
    ) -> Result<(Vec<u32>, Vec<PromptImage>), ValidationError> {
        let images = check_images(prompt.images(), self.image_intake()).await?;
        let input_ids = self.tokenize(prompt, switches, images.len()).await?;
        let (mut input_ids, images) =
            place_images(input_ids, images, self.image_tokens.as_deref())?;
        if let Some(keep) = truncate.filter(|&keep| keep < input_ids.len()) {
            if !images.is_empty() {
                return Err(ValidationError::OutOfRange {
                    param: "truncate".to_owned(),
                    expected: "at least the prompt's length when the prompt holds images",
                    value: format!("{keep} (the prompt has {} tokens)", input_ids.len()),
                });
            }
            input_ids.drain(..input_ids.len() - keep);
        }
        Ok((input_ids, images))
    }
}
