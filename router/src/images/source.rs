//! Where an image's bytes come from: base64 inside the request, as a `data:` URL or a bare
//! payload.

use base64::Engine;
use bytes::Bytes;

use super::ImageError;

/// The encoded bytes of an image sent as `data:<media type>;base64,<payload>`, at most `max_bytes`
/// of them. The media type is not trusted: the file's own header decides its format.
pub fn inline_image(url: &str, max_bytes: usize) -> Result<Bytes, ImageError> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        return Err(ImageError::NotInline {
            scheme: scheme.chars().take(16).collect(),
        });
    };
    let (header, payload) = rest.split_once(',').ok_or_else(|| ImageError::BadDataUrl {
        reason: "it has no `,` before its payload".to_owned(),
    })?;
    if !header.ends_with(";base64") {
        return Err(ImageError::BadDataUrl {
            reason: "its payload is not marked `;base64`".to_owned(),
        });
    }
    base64_image(payload, max_bytes)
}

/// The bytes of a base64 `payload`, at most `max_bytes` of them.
pub fn base64_image(payload: &str, max_bytes: usize) -> Result<Bytes, ImageError> {
    // Base64 takes 4 characters for 3 bytes: a longer payload cannot fit the limit.
    let most_bytes = payload.len() / 4 * 3;
    if most_bytes > max_bytes.saturating_add(3) {
        return Err(ImageError::TooLarge {
            bytes: most_bytes,
            max: max_bytes,
        });
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(payload.trim_end())
        .map_err(|error| ImageError::BadDataUrl {
            reason: error.to_string(),
        })?;
    if data.len() > max_bytes {
        return Err(ImageError::TooLarge {
            bytes: data.len(),
            max: max_bytes,
        });
    }
    Ok(Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base64_data_url_gives_its_bytes() {
        let data = inline_image("data:image/png;base64,AQID", 16).unwrap();
        assert_eq!(&data[..], &[1, 2, 3]);
    }

    #[test]
    fn remote_urls_are_refused_by_scheme() {
        let error = inline_image("https://example.com/cat.png", 16).unwrap_err();
        assert_eq!(
            error,
            ImageError::NotInline {
                scheme: "https".to_owned()
            }
        );
        assert!(error.to_string().contains("`https:` URLs"));
    }

    #[test]
    fn malformed_data_urls_are_refused() {
        for url in [
            "data:image/png;base64",
            "data:image/png,AQID",
            "data:image/png;base64,!!!",
        ] {
            assert!(
                matches!(inline_image(url, 16), Err(ImageError::BadDataUrl { .. })),
                "{url}"
            );
        }
    }

    #[test]
    fn payloads_over_the_limit_are_refused_before_decoding() {
        let url = format!("data:image/png;base64,{}", "A".repeat(4000));
        assert_eq!(
            inline_image(&url, 100),
            Err(ImageError::TooLarge {
                bytes: 3000,
                max: 100
            })
        );
        assert!(matches!(
            inline_image("data:image/png;base64,AQIDBA==", 3),
            Err(ImageError::TooLarge { bytes: 4, max: 3 })
        ));
    }
}
