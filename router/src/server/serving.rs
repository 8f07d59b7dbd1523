//! Serving HTTP until SIGINT/SIGTERM, then the drain: new requests get 503 while in-flight ones finish.

use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tracing::{info, warn};

use super::StartupError;
use crate::config::RouterConfig;
use crate::http::{self, AppState};

/// Serves until SIGINT/SIGTERM, then drains: new requests get 503 (the listener stays
/// open so clients hear why) while in-flight ones finish, for at most
/// `--graceful-termination-timeout`; then the connections close and the router exits.
pub(super) async fn serve(config: &RouterConfig, state: AppState) -> Result<(), StartupError> {
    let address = format!("{}:{}", config.hostname, config.port);
    let listener = TcpListener::bind((config.hostname.as_str(), config.port))
        .await
        .map_err(|source| StartupError::Bind {
            address: address.clone(),
            source,
        })?;
    info!("listening on http://{address}");
    let (close, closed) = tokio::sync::oneshot::channel::<()>();
    // A task of its own: the accept loop must keep running (answering 503) during the drain.
    let mut server = tokio::spawn(http::serve_connections(
        listener,
        http::app(state.clone()),
        config.connections,
        async {
            let _ = closed.await;
        },
    ));
    tokio::select! {
        result = &mut server => return served(result),
        () = shutdown_signal() => {}
    }
    state.draining.start();
    drain(&state, config.lifecycle.graceful_termination_timeout).await;
    let _ = close.send(());
    match tokio::time::timeout(CONNECTION_CLOSE_TIMEOUT, &mut server).await {
        Ok(result) => served(result)?,
        Err(_) => {
            warn!("connections still open after the drain; closing them");
            server.abort();
        }
    }
    info!("exiting");
    Ok(())
}

/// The server task's outcome as the router's.
fn served(result: Result<(), tokio::task::JoinError>) -> Result<(), StartupError> {
    result.map_err(|error| StartupError::Serve(std::io::Error::other(error)))
}

/// How long open connections get to finish sending after the drain.
const CONNECTION_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits until no request is in flight, or `timeout`.
async fn drain(state: &AppState, timeout: Duration) {
    let started = Instant::now();
    info!(
        in_flight = state.in_flight(),
        timeout_s = timeout.as_secs(),
        "draining: refusing new requests, finishing in-flight ones"
    );
    while state.in_flight() > 0 {
        if started.elapsed() >= timeout {
            warn!(
                in_flight = state.in_flight(),
                "graceful termination timeout reached; cutting off the remaining requests"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    info!(elapsed_ms = started.elapsed().as_millis(), "drained");
}

/// Resolves on SIGINT or SIGTERM; the server then stops accepting and drains.
async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            warn!(%error, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = interrupt => info!("SIGINT received"),
        () = terminate => info!("SIGTERM received"),
    }
}
