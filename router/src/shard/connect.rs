//! Opens a tonic channel to a rank (Unix socket or TCP), retrying until the shard listens.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use super::address::ShardAddress;
use super::error::ShardError;

const RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// Connects to the shard of `rank` at `address`, retrying until `timeout`.
pub async fn connect(
    rank: usize,
    address: &ShardAddress,
    timeout: Duration,
) -> Result<Channel, ShardError> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = match address {
            ShardAddress::Unix(path) => try_connect_unix(path.clone()).await,
            ShardAddress::Tcp(uri) => try_connect_tcp(uri).await,
        };
        match attempt {
            Ok(channel) => return Ok(channel),
            Err(message) if Instant::now() >= deadline => {
                return Err(ShardError::Connect {
                    rank,
                    path: address.to_string(),
                    message,
                })
            }
            Err(_) => tokio::time::sleep(RETRY_INTERVAL).await,
        }
    }
}

async fn try_connect_unix(socket: PathBuf) -> Result<Channel, String> {
    // The URI is required by tonic but unused: every connection goes to `socket`.
    let endpoint = Endpoint::try_from("http://[::]:50051").map_err(|error| error.to_string())?;
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|error| format!("{error:?}"))
}

async fn try_connect_tcp(uri: &str) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(uri.to_owned())
        .map_err(|error| error.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    endpoint
        .connect()
        .await
        .map_err(|error| format!("{error:?}"))
}
