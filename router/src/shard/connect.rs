//! Opens a tonic channel over a Unix domain socket, retrying until the shard listens.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use super::ShardError;

const RETRY_INTERVAL: Duration = Duration::from_millis(200);

/// Connects to the shard of `rank` listening on `path`, retrying until `timeout`.
pub async fn connect_unix(
    rank: usize,
    path: &Path,
    timeout: Duration,
) -> Result<Channel, ShardError> {
    let deadline = Instant::now() + timeout;
    loop {
        match try_connect(path).await {
            Ok(channel) => return Ok(channel),
            Err(message) if Instant::now() >= deadline => {
                return Err(ShardError::Connect {
                    rank,
                    path: path.display().to_string(),
                    message,
                })
            }
            Err(_) => tokio::time::sleep(RETRY_INTERVAL).await,
        }
    }
}

async fn try_connect(path: &Path) -> Result<Channel, String> {
    let socket: PathBuf = path.to_path_buf();
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
