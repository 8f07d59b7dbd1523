//! Fetching an image by URL, only from hosts the operator allowed: within the image byte limit
//! and a timeout, following redirects only to allowed hosts, and never reaching a private,
//! loopback or link-local address unless the operator allowed that too (no SSRF by images).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect::{Attempt, Policy};
use reqwest::Url;

use super::ImageError;

/// Most redirects one fetch follows.
const MAX_REDIRECTS: usize = 3;

/// Which images may be fetched by URL, and how long a fetch may take.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct MediaFetchConfig {
    /// Hosts whose `http(s)` image URLs are fetched (comma-separated, exact names); empty: images
    /// come inline as base64 only.
    #[arg(
        long = "allowed-media-domains",
        env = "ALLOWED_MEDIA_DOMAINS",
        value_delimiter = ','
    )]
    pub allowed_domains: Vec<String>,
    /// Seconds one image fetch may take, connection and body together.
    #[arg(
        long = "media-fetch-timeout",
        env = "MEDIA_FETCH_TIMEOUT",
        default_value_t = 10
    )]
    pub timeout_secs: u64,
    /// Allowed hosts may resolve to private, loopback and link-local addresses (media servers
    /// inside the cluster); off, such addresses are never reached.
    #[arg(
        long = "allow-private-media-addresses",
        env = "ALLOW_PRIVATE_MEDIA_ADDRESSES"
    )]
    pub allow_private_addresses: bool,
}

impl MediaFetchConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

/// Fetches images from allowed hosts.
#[derive(Debug, Clone)]
pub struct MediaFetcher {
    client: reqwest::Client,
    config: Arc<MediaFetchConfig>,
}

/// Why the fetching client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the image fetching client: {0}")]
pub struct FetcherSetupError(#[from] reqwest::Error);

impl MediaFetcher {
    pub fn new(mut config: MediaFetchConfig) -> Result<Self, FetcherSetupError> {
        for domain in &mut config.allowed_domains {
            *domain = domain.trim().to_ascii_lowercase();
        }
        let config = Arc::new(config);
        let for_redirects = Arc::clone(&config);
        let client = reqwest::Client::builder()
            .redirect(Policy::custom(move |attempt| {
                follow(attempt, &for_redirects)
            }))
            .dns_resolver(PublicResolver {
                allow_private: config.allow_private_addresses,
            })
            .timeout(config.timeout())
            .connect_timeout(config.timeout())
            .no_proxy()
            .build()?;
        Ok(Self { client, config })
    }

    /// The bytes at `url`, at most `max_bytes` of them.
    pub async fn fetch(&self, url: &str, max_bytes: usize) -> Result<Bytes, ImageError> {
        let parsed = Url::parse(url).map_err(|error| ImageError::Fetch {
            reason: format!("the URL does not parse: {error}"),
        })?;
        check_url(&parsed, &self.config)?;
        let response = self.client.get(parsed).send().await.map_err(fetch_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(ImageError::Fetch {
                reason: format!("the server answered {status}"),
            });
        }
        if let Some(length) = response.content_length() {
            let bytes = usize::try_from(length).unwrap_or(usize::MAX);
            if bytes > max_bytes {
                return Err(ImageError::TooLarge {
                    bytes,
                    max: max_bytes,
                });
            }
        }
        let mut body = BytesMut::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            body.extend_from_slice(&chunk.map_err(fetch_error)?);
            if body.len() > max_bytes {
                return Err(ImageError::TooLarge {
                    bytes: body.len(),
                    max: max_bytes,
                });
            }
        }
        Ok(body.freeze())
    }
}

/// Refuses `url` as a server that fetches nothing would (no host is allowed).
pub fn refuse_url(url: &str) -> ImageError {
    match Url::parse(url) {
        Ok(parsed) => check_url(&parsed, &MediaFetchConfig::default())
            .err()
            .unwrap_or(ImageError::Fetch {
                reason: "no host is allowed".to_owned(),
            }),
        Err(error) => ImageError::Fetch {
            reason: format!("the URL does not parse: {error}"),
        },
    }
}

/// `url` may be fetched: `http(s)`, an allowed host, and no private address literal.
fn check_url(url: &Url, config: &MediaFetchConfig) -> Result<(), ImageError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ImageError::NotInline {
            scheme: url.scheme().to_owned(),
        });
    }
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !config.allowed_domains.iter().any(|allowed| allowed == host) {
        return Err(ImageError::HostNotAllowed {
            host: host.to_owned(),
        });
    }
    match host.parse::<IpAddr>() {
        Ok(ip) if !config.allow_private_addresses && !is_public(ip) => {
            Err(ImageError::PrivateAddress {
                host: host.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// Follows a redirect only to a URL that may be fetched, and at most `MAX_REDIRECTS` of them.
fn follow(attempt: Attempt, config: &MediaFetchConfig) -> reqwest::redirect::Action {
    if attempt.previous().len() > MAX_REDIRECTS {
        return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
    }
    match check_url(attempt.url(), config) {
        Ok(()) => attempt.follow(),
        Err(refusal) => attempt.error(format!("a redirect {refusal}")),
    }
}

fn fetch_error(error: reqwest::Error) -> ImageError {
    let reason = if error.is_timeout() {
        "the fetch timed out".to_owned()
    } else {
        // The source chain holds the refusal of a redirect or of a private address.
        let mut reason = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(inner) = source {
            reason = format!("{reason}: {inner}");
            source = inner.source();
        }
        reason
    };
    ImageError::Fetch { reason }
}

/// Whether `ip` is a public address: not private, loopback, link-local, unspecified,
/// multicast, shared (100.64/10) or documentation space.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => {
            let [a, b, ..] = ip.octets();
            !(ip.is_private()
                || ip.is_loopback()
                || ip.is_link_local()
                || ip.is_unspecified()
                || ip.is_broadcast()
                || ip.is_multicast()
                || ip.is_documentation()
                || (a == 100 && (64..128).contains(&b))
                || a == 0)
        }
        IpAddr::V6(ip) => {
            if let Some(mapped) = ip.to_ipv4_mapped() {
                return is_public(IpAddr::V4(mapped));
            }
            let first = ip.segments()[0];
            !(ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// Resolves names with the system resolver, keeping only public addresses unless private ones
/// are allowed: the check and the connection use the same addresses, so a name cannot
/// rebind between them.
struct PublicResolver {
    allow_private: bool,
}

impl Resolve for PublicResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|address| allow_private || is_public(address.ip()))
                .collect();
            if found.is_empty() {
                return Err(format!("`{host}` resolves to no public address").into());
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
