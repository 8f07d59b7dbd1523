//! Where a rank serves gRPC: a Unix socket on this node, or an `http://host:port` address on
//! another node (reached with the cluster secret).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// One rank's address, as given by `--shard-uri` (or `--shard-uds-path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardAddress {
    Unix(PathBuf),
    /// An `http://host:port` URI.
    Tcp(String),
}

/// A `--shard-uri` that names neither a Unix socket nor an `http://` address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a shard URI is unix:///absolute/path or http://host:port, got {0:?}")]
pub struct ShardAddressError(String);

impl FromStr for ShardAddress {
    type Err = ShardAddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(path) = text.strip_prefix("unix://") {
            return match path.starts_with('/') {
                true => Ok(Self::Unix(PathBuf::from(path))),
                false => Err(ShardAddressError(text.to_owned())),
            };
        }
        let authority = text
            .strip_prefix("http://")
            .ok_or_else(|| ShardAddressError(text.to_owned()))?;
        let has_port = authority
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        match has_port && !authority.contains('/') {
            true => Ok(Self::Tcp(text.to_owned())),
            false => Err(ShardAddressError(text.to_owned())),
        }
    }
}

impl fmt::Display for ShardAddress {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(formatter, "unix://{}", path.display()),
            Self::Tcp(uri) => formatter.write_str(uri),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_and_http_uris_parse_and_print_back() {
        let unix: ShardAddress = "unix:///run/tandem/shard-0.sock".parse().unwrap();
        assert_eq!(
            unix,
            ShardAddress::Unix(PathBuf::from("/run/tandem/shard-0.sock"))
        );
        let tcp: ShardAddress = "http://10.0.0.7:50051".parse().unwrap();
        assert_eq!(tcp, ShardAddress::Tcp("http://10.0.0.7:50051".to_owned()));
        assert_eq!(unix.to_string(), "unix:///run/tandem/shard-0.sock");
        assert_eq!(tcp.to_string(), "http://10.0.0.7:50051");
        let ipv6: ShardAddress = "http://[fd00::7]:50052".parse().unwrap();
        assert_eq!(ipv6, ShardAddress::Tcp("http://[fd00::7]:50052".to_owned()));
    }

    #[test]
    fn other_uris_are_refused() {
        for text in [
            "unix://relative.sock",
            "https://10.0.0.7:50051",
            "http://10.0.0.7",
            "http://:50051",
            "http://host:50051/path",
            "/run/s.sock",
        ] {
            assert!(text.parse::<ShardAddress>().is_err(), "{text} parsed");
        }
    }
}
