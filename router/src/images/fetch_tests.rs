//! Fetching images against a local stand-in server: allowed hosts only, private addresses only
//! when allowed, and every fetch bounded in bytes, time and redirects.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::response::Redirect;
use axum::routing::get;

use super::*;

const IMAGE: &[u8] = b"\x89PNG\r\n\x1a\n the rest";

/// A stand-in media server on a loopback port: `/image`, `/huge` (no length, endless),
/// `/long` (4 KiB with its length declared), `/slow`, `/elsewhere` (a redirect to another
/// host) and `/again` (a redirect to `/image` on the same host).
async fn stand_in() -> SocketAddr {
    let app = axum::Router::new()
        .route("/image", get(|| async { IMAGE }))
        .route(
            "/huge",
            get(|| async {
                let chunks = futures::stream::repeat_with(|| {
                    Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; 64 * 1024]))
                });
                Body::from_stream(chunks)
            }),
        )
        .route("/long", get(|| async { vec![0u8; 4096] }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                IMAGE
            }),
        )
        .route(
            "/elsewhere",
            get(|| async { Redirect::temporary("http://example.com/image") }),
        )
        .route("/again", get(|| async { Redirect::temporary("/image") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

fn fetcher(domains: &[&str], allow_private: bool, timeout_secs: u64) -> MediaFetcher {
    MediaFetcher::new(MediaFetchConfig {
        allowed_domains: domains.iter().map(|domain| (*domain).to_owned()).collect(),
        timeout_secs,
        allow_private_addresses: allow_private,
    })
    .expect("a client")
}

fn url(address: SocketAddr, path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", address.port())
}

fn refusal(result: Result<bytes::Bytes, ImageError>) -> ImageError {
    result.expect_err("refused")
}

#[tokio::test]
async fn an_allowed_host_serves_its_image_and_follows_same_host_redirects() {
    let server = stand_in().await;
    let fetcher = fetcher(&["127.0.0.1"], true, 5);
    let image = fetcher.fetch(&url(server, "/image"), 1024).await.unwrap();
    assert_eq!(&image[..], IMAGE);
    let image = fetcher.fetch(&url(server, "/again"), 1024).await.unwrap();
    assert_eq!(&image[..], IMAGE);
}

#[tokio::test]
async fn hosts_outside_the_allow_list_are_never_contacted() {
    let server = stand_in().await;
    let error = refusal(
        fetcher(&["example.com"], true, 5)
            .fetch(&url(server, "/image"), 1024)
            .await,
    );
    assert_eq!(
        error,
        ImageError::HostNotAllowed {
            host: "127.0.0.1".to_owned()
        }
    );
    assert_eq!(
        refuse_url("https://example.com/a.png"),
        ImageError::HostNotAllowed {
            host: "example.com".to_owned()
        }
    );
}

#[tokio::test]
async fn private_addresses_are_refused_unless_allowed_by_literal_or_by_name() {
    let server = stand_in().await;
    let by_literal = fetcher(&["127.0.0.1"], false, 5);
    let error = refusal(by_literal.fetch(&url(server, "/image"), 1024).await);
    assert_eq!(
        error,
        ImageError::PrivateAddress {
            host: "127.0.0.1".to_owned()
        }
    );
    let by_name = fetcher(&["localhost"], false, 5);
    let named = format!("http://localhost:{}/image", server.port());
    let error = refusal(by_name.fetch(&named, 1024).await);
    assert!(
        error.to_string().contains("resolves to no public address"),
        "{error}"
    );
}

#[tokio::test]
async fn bodies_over_the_byte_limit_are_refused_declared_or_streamed() {
    let server = stand_in().await;
    let fetcher = fetcher(&["127.0.0.1"], true, 5);
    let error = refusal(fetcher.fetch(&url(server, "/long"), 1024).await);
    assert!(
        matches!(error, ImageError::TooLarge { max: 1024, .. }),
        "{error}"
    );
    let error = refusal(fetcher.fetch(&url(server, "/huge"), 200_000).await);
    assert!(
        matches!(error, ImageError::TooLarge { bytes, max: 200_000 } if bytes <= 200_000 + 64 * 1024),
        "{error}"
    );
}

#[tokio::test]
async fn a_slow_server_is_cut_at_the_timeout() {
    let server = stand_in().await;
    let started = std::time::Instant::now();
    let error = refusal(
        fetcher(&["127.0.0.1"], true, 1)
            .fetch(&url(server, "/slow"), 1024)
            .await,
    );
    assert!(error.to_string().contains("timed out"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_redirect_to_a_host_outside_the_allow_list_is_refused() {
    let server = stand_in().await;
    let error = refusal(
        fetcher(&["127.0.0.1"], true, 5)
            .fetch(&url(server, "/elsewhere"), 1024)
            .await,
    );
    assert!(error.to_string().contains("example.com"), "{error}");
    assert!(
        error.to_string().contains("--allowed-media-domains"),
        "{error}"
    );
}

#[test]
fn public_addresses_exclude_private_loopback_link_local_and_shared_space() {
    let private = [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "127.0.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:10.0.0.1",
    ];
    for address in private {
        assert!(!is_public(address.parse::<IpAddr>().unwrap()), "{address}");
    }
    for address in ["8.8.8.8", "1.1.1.1", "2606:4700::1111"] {
        assert!(is_public(address.parse::<IpAddr>().unwrap()), "{address}");
    }
}

#[test]
fn other_schemes_are_refused_by_name() {
    let config = MediaFetchConfig {
        allowed_domains: vec!["example.com".to_owned()],
        ..MediaFetchConfig::default()
    };
    let file = Url::parse("file:///etc/passwd").unwrap();
    assert_eq!(
        check_url(&file, &config),
        Err(ImageError::NotInline {
            scheme: "file".to_owned()
        })
    );
}
