//! Placing a prompt's images at their spans: the chat template's marks, one per image in order,
//! become spans of image tokens (each as long as its image takes), widened after tokenizing or
//! expanded in the text before it.

use super::{ImageMarks, ImageTokens, ImageTokensError, PromptImage, SizedImage};

impl ImageTokens {
    /// The rendered `text` of a prompt carrying `images` images as the tokenizer must see it:
    /// with text marks, every mark expanded, as the model's processor expands every one (a mark
    /// the client wrote counts too), and there must be exactly one per image. Unchanged with
    /// token marks.
    pub fn expand_text(&self, text: String, images: usize) -> Result<String, ImageTokensError> {
        let ImageMarks::Text { mark, expansion } = &self.marks else {
            return Ok(text);
        };
        let found = text.matches(mark.as_str()).count();
        if found != images {
            return Err(ImageTokensError::PlaceholderCount { found, images });
        }
        Ok(text.replace(mark.as_str(), expansion))
    }

    /// Bytes `expand_text` adds to the text per image.
    pub fn expanded_bytes_per_image(&self) -> usize {
        match &self.marks {
            ImageMarks::Token => 0,
            ImageMarks::Text { mark, expansion } => expansion.len().saturating_sub(mark.len()),
        }
    }

    /// `ids`, tokenized from `expand_text`'s text, with `images` placed at their spans in order:
    /// each span is its image's `num_tokens` copies of `image_token_id` and no other image
    /// token is in the prompt.
    pub fn place(
        &self,
        ids: Vec<u32>,
        images: Vec<SizedImage>,
    ) -> Result<(Vec<u32>, Vec<PromptImage>), ImageTokensError> {
        match self.marks {
            ImageMarks::Token => widen_placeholders(&ids, images, self),
            ImageMarks::Text { .. } => {
                let placed = place_in_runs(&ids, images, self)?;
                Ok((ids, placed))
            }
        }
    }

    /// Tokens a prompt with images whose spans take `spans` tokens each, in order, takes once
    /// placed, from the ids of its `expand_text` text; refused as `place` refuses a template
    /// that did not write one placeholder per image.
    pub fn count_tokens(&self, ids: &[u32], spans: &[usize]) -> Result<usize, ImageTokensError> {
        match self.marks {
            ImageMarks::Token => {
                let found = ids.iter().filter(|&&id| id == self.image_token_id).count();
                if found != spans.len() {
                    return Err(ImageTokensError::PlaceholderCount {
                        found,
                        images: spans.len(),
                    });
                }
                let widened: usize = spans.iter().map(|span| span.saturating_sub(1)).sum();
                Ok(ids.len().saturating_add(widened))
            }
            ImageMarks::Text { .. } => Ok(ids.len()),
        }
    }
}

/// `ids` with each image placeholder widened into its image's span, and the images placed at
/// their spans; the template must have written exactly one placeholder per image.
fn widen_placeholders(
    ids: &[u32],
    images: Vec<SizedImage>,
    tokens: &ImageTokens,
) -> Result<(Vec<u32>, Vec<PromptImage>), ImageTokensError> {
    let found = ids
        .iter()
        .filter(|&&id| id == tokens.image_token_id)
        .count();
    if found != images.len() {
        return Err(ImageTokensError::PlaceholderCount {
            found,
            images: images.len(),
        });
    }
    let widened: usize = images
        .iter()
        .map(|image| image.num_tokens.saturating_sub(1))
        .sum();
    let mut expanded = Vec::with_capacity(ids.len() + widened);
    let mut images = images.into_iter();
    let mut placed = Vec::with_capacity(found);
    for &id in ids {
        if id != tokens.image_token_id {
            expanded.push(id);
            continue;
        }
        let SizedImage { image, num_tokens } = images
            .next()
            .expect("invariant: one image per placeholder, counted above");
        placed.push(PromptImage {
            data: image.data,
            digest: image.digest,
            offset: expanded.len(),
            num_tokens,
        });
        expanded.extend(std::iter::repeat_n(id, num_tokens));
    }
    Ok((expanded, placed))
}

/// `images` placed, in order, at the runs of image tokens in `ids`: there must be one run per
/// image, each exactly its image's span long (a run of another length holds image tokens the
/// client wrote, and one run beyond the images is such tokens too: it is reported against the
/// last image's span).
fn place_in_runs(
    ids: &[u32],
    images: Vec<SizedImage>,
    tokens: &ImageTokens,
) -> Result<Vec<PromptImage>, ImageTokensError> {
    let total = images.len();
    let mut images = images.into_iter();
    let mut placed = Vec::with_capacity(total);
    let mut position = 0;
    let mut last_span = 0;
    while let Some(skipped) = ids[position..]
        .iter()
        .position(|&id| id == tokens.image_token_id)
    {
        let offset = position + skipped;
        let found = ids[offset..]
            .iter()
            .take_while(|&&id| id == tokens.image_token_id)
            .count();
        let image = images.next();
        let expected = image.as_ref().map_or(last_span, |image| image.num_tokens);
        let Some(SizedImage { image, .. }) = image.filter(|_| found == expected) else {
            return Err(ImageTokensError::StrayImageTokens {
                offset,
                found,
                expected,
            });
        };
        placed.push(PromptImage {
            data: image.data,
            digest: image.digest,
            offset,
            num_tokens: found,
        });
        position = offset + found;
        last_span = found;
    }
    if placed.len() < total {
        return Err(ImageTokensError::PlaceholderCount {
            found: placed.len(),
            images: total,
        });
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::images::testing::{encoded, gemma3, qwen2_5_vl};
    use crate::images::{check_image, ImageHeader, ImageLimits};

    /// A `width` x `height` image known by `byte`, sized as `tokens` sizes it.
    fn sized_as(tokens: &ImageTokens, byte: u8, width: u32, height: u32) -> SizedImage {
        let data = encoded(image::ImageFormat::Png, width, height);
        let header = ImageHeader::read(&data, &ImageLimits::default()).expect("a small PNG");
        let mut image = check_image(Bytes::from(data), header).expect("decodes");
        image.digest = [byte; 32];
        let num_tokens = tokens.span.tokens(width, height).expect("a served size");
        SizedImage { image, num_tokens }
    }

    /// An image known by `byte`, sized as `tokens` sizes every image.
    fn sized(tokens: &ImageTokens, byte: u8) -> SizedImage {
        sized_as(tokens, byte, 2, 2)
    }

    fn spans(images: &[PromptImage]) -> Vec<(u8, usize, usize)> {
        images
            .iter()
            .map(|image| (image.digest[0], image.offset, image.num_tokens))
            .collect()
    }

    #[test]
    fn each_placeholder_becomes_its_images_span() {
        let tokens = ImageTokens::widened(9, 3);
        let images = vec![sized(&tokens, 1), sized(&tokens, 2)];
        let (ids, images) = tokens.place(vec![1, 9, 2, 9], images).unwrap();
        assert_eq!(ids, [1, 9, 9, 9, 2, 9, 9, 9]);
        assert_eq!(spans(&images), [(1, 1, 3), (2, 5, 3)]);
        assert_eq!(tokens.count_tokens(&[1, 9, 2, 9], &[3, 3]), Ok(8));
        assert_eq!(
            tokens.expand_text("a<image>".to_owned(), 1).unwrap(),
            "a<image>"
        );
    }

    #[test]
    fn placeholders_must_match_the_images_one_for_one() {
        let tokens = ImageTokens::widened(9, 3);
        let refused = ImageTokensError::PlaceholderCount {
            found: 0,
            images: 1,
        };
        let image = sized(&tokens, 1);
        assert_eq!(tokens.place(vec![1, 2], vec![image]).unwrap_err(), refused);
        assert_eq!(tokens.count_tokens(&[1, 2], &[3]), Err(refused));
    }

    #[test]
    fn qwen2_5_vl_images_of_different_sizes_take_spans_of_their_own_lengths() {
        let (tokenizer, tokens) = qwen2_5_vl();
        let text = "a<|vision_start|><|image_pad|><|vision_end|>b\
                    <|vision_start|><|image_pad|><|vision_end|>";
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let pad = tokens.image_token_id;
        // transformers' smart_resize: 56x84 resizes to 56x84 (6 tokens), 10x10 to 56x56 (4).
        let images = vec![sized_as(&tokens, 1, 84, 56), sized_as(&tokens, 2, 10, 10)];
        assert_eq!(
            images
                .iter()
                .map(|image| image.num_tokens)
                .collect::<Vec<_>>(),
            [6, 4]
        );
        let (placed_ids, placed) = tokens.place(ids.clone(), images).unwrap();
        let first = ids.iter().position(|&id| id == pad).unwrap();
        let second = first + 6 + ids[first + 1..].iter().position(|&id| id == pad).unwrap();
        assert_eq!(spans(&placed), [(1, first, 6), (2, second, 4)]);
        assert_eq!(placed_ids.len(), ids.len() + 5 + 3);
        assert!(placed_ids[first..first + 6].iter().all(|&id| id == pad));
        assert!(placed_ids[second..second + 4].iter().all(|&id| id == pad));
        assert_ne!(placed_ids[second + 4], pad);
        assert_eq!(tokens.count_tokens(&ids, &[6, 4]), Ok(placed_ids.len()));
    }

    #[test]
    fn a_gemma3_mark_becomes_the_processors_text_and_its_soft_tokens_the_span() {
        let (tokenizer, tokens) = gemma3(3);
        let text = tokens
            .expand_text("a\n<start_of_image>b<start_of_image>".to_owned(), 2)
            .unwrap();
        let image = "<start_of_image><image_soft_token><image_soft_token><image_soft_token>\
                     <end_of_image>";
        assert_eq!(text, format!("a\n\n\n{image}\n\nb\n\n{image}\n\n"));
        let ids = tokenizer
            .encode(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let images = vec![sized(&tokens, 1), sized(&tokens, 2)];
        let (placed_ids, images) = tokens.place(ids.clone(), images).unwrap();
        assert_eq!(
            placed_ids, ids,
            "the tokenized text already holds the spans"
        );
        let soft = tokens.image_token_id;
        let starts: Vec<usize> = (0..ids.len())
            .filter(|&i| ids[i] == soft && (i == 0 || ids[i - 1] != soft))
            .collect();
        assert_eq!(spans(&images), [(1, starts[0], 3), (2, starts[1], 3)]);
        assert_eq!(tokens.count_tokens(&ids, &[3, 3]), Ok(ids.len()));
    }

    #[test]
    fn a_gemma3_prompt_needs_one_mark_per_image_counting_the_clients_own() {
        let (_, tokens) = gemma3(3);
        let written = "describe <start_of_image> this: <start_of_image>".to_owned();
        assert_eq!(
            tokens.expand_text(written, 1).unwrap_err(),
            ImageTokensError::PlaceholderCount {
                found: 2,
                images: 1
            }
        );
    }

    #[test]
    fn soft_tokens_the_client_wrote_are_refused_where_they_stand() {
        let (tokenizer, tokens) = gemma3(3);
        let text = tokens
            .expand_text("a<image_soft_token><start_of_image>".to_owned(), 1)
            .unwrap();
        let ids = tokenizer
            .encode(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(
            tokens.place(ids, vec![sized(&tokens, 1)]).unwrap_err(),
            ImageTokensError::StrayImageTokens {
                offset: 1,
                found: 1,
                expected: 3
            }
        );
        let mut ids = vec![tokens.image_token_id; 3];
        ids.push(1);
        ids.extend([tokens.image_token_id; 3]);
        assert_eq!(
            tokens.place(ids, vec![sized(&tokens, 1)]).unwrap_err(),
            ImageTokensError::StrayImageTokens {
                offset: 4,
                found: 3,
                expected: 3
            }
        );
    }
}
