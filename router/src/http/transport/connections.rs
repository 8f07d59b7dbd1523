//! The accept loop: every connection costs a bounded amount. At most `max_connections` are
//! open at once (more are closed as soon as they are accepted), and a connection that does
//! not deliver a complete request head within `header_read_timeout` is closed, whether it
//! is new (a slow or silent client) or idle between two requests of a kept-alive connection.
//! Connections speak HTTP/1.1.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tracing::{debug, warn};

use crate::limits::ConnectionLimits;

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and waits for
/// open connections to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    // HTTP/1.1 only: sniffing for an HTTP/2 preface would wait on a silent client with no
    // timeout. Every client Tandem serves (OpenAI SDKs, huggingface_hub, curl) speaks HTTP/1.1.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout());
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            warn!(%peer, max = limits.max_connections, "connection refused: --max-connections reached");
            continue;
        };
        let service = TowerToHyperService::new(
            app.clone()
                .map_request(|request: hyper::Request<Incoming>| request.map(Body::new)),
        );
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%peer, %error, "connection closed");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
