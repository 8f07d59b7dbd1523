//! Flags bounding what one request and one connection may cost, in size and in work. Each is
//! also reported by `/info`, so clients can see the bounds they are held to.

use std::time::Duration;

use serde::Serialize;
use utoipa::ToSchema;

use crate::images::ImageLimits;

/// Bounds on one request's inputs beyond its token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args, Serialize, ToSchema)]
pub struct RequestLimits {
    /// Longest stop string, in bytes of UTF-8.
    #[arg(long, env = "MAX_STOP_SEQUENCE_LENGTH", default_value_t = 512)]
    pub max_stop_sequence_length: usize,
    /// Most `stop_token_ids` one request may list.
    #[arg(long, env = "MAX_STOP_TOKEN_IDS", default_value_t = 64)]
    pub max_stop_token_ids: usize,
    /// Most `logit_bias` entries one request may carry (OpenAI allows 300).
    #[arg(long, env = "MAX_LOGIT_BIAS", default_value_t = 300)]
    pub max_logit_bias: usize,
    /// Most tool definitions one chat request may carry (OpenAI allows 128).
    #[arg(long, env = "MAX_TOOLS", default_value_t = 128)]
    pub max_tools: usize,
    /// Largest grammar source (a JSON schema, a regex, or the grammar generated from tools), in bytes.
    #[arg(long, env = "MAX_GRAMMAR_BYTES", default_value_t = 128 * 1024)]
    pub max_grammar_bytes: usize,
    /// Most generations one request may start: `n` (or `best_of`) times the prompts it lists.
    #[arg(long, env = "MAX_CHOICES", default_value_t = 16)]
    pub max_choices: usize,
    #[command(flatten)]
    #[serde(flatten)]
    pub images: ImageLimits,
}

/// Bounds on client connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args, Serialize, ToSchema)]
pub struct ConnectionLimits {
    /// Client connections open at once; more are closed as soon as they are accepted.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds a connection may take to send a complete request head, counted from its
    /// opening or, on a kept-alive connection, from the end of its previous response (so it
    /// is also how long an idle connection stays open).
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value_t = 10)]
    #[serde(rename = "header_read_timeout_s")]
    pub header_read_timeout: u64,
}

impl RequestLimits {
    /// The flag of a limit that must be at least 1 and is 0, if any.
    pub fn zero_flag(&self) -> Option<&'static str> {
        [
            ("max-stop-sequence-length", self.max_stop_sequence_length),
            ("max-grammar-bytes", self.max_grammar_bytes),
            ("max-choices", self.max_choices),
            ("max-image-bytes", self.images.max_image_bytes),
            (
                "max-image-pixels",
                usize::try_from(self.images.max_image_pixels).unwrap_or(usize::MAX),
            ),
        ]
        .into_iter()
        .find_map(|(flag, value)| (value == 0).then_some(flag))
    }
}

impl ConnectionLimits {
    /// The flag of a limit that must be at least 1 and is 0, if any.
    pub fn zero_flag(&self) -> Option<&'static str> {
        if self.max_connections == 0 {
            Some("max-connections")
        } else if self.header_read_timeout == 0 {
            Some("header-read-timeout")
        } else {
            None
        }
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout)
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_stop_sequence_length: 512,
            max_stop_token_ids: 64,
            max_logit_bias: 300,
            max_tools: 128,
            max_grammar_bytes: 128 * 1024,
            max_choices: 16,
            images: ImageLimits::default(),
        }
    }
}
