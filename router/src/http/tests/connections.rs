//! The accept loop over real sockets: slow and idle clients are closed after the header-read
//! timeout, connections beyond the cap are closed at once, and shutdown waits for requests.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::*;
use crate::http::transport::connections::serve;
use crate::limits::ConnectionLimits;

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: tandem\r\n\r\n";

/// A served app on a free port; dropping the sender shuts it down.
async fn serving(limits: ConnectionLimits) -> (std::net::SocketAddr, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let app = test_app(ok_backend(), 8);
    tokio::spawn(serve(listener, app, limits, async {
        let _ = stopped.await;
    }));
    (address, stop)
}

/// Seconds until the server closes `client`, discarding what it sends first.
async fn closed_after(client: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, client.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection is still open after {limit:?}"),
        }
    }
}

/// Reads until one whole `/health` answer (headers and its small body) arrived.
async fn read_answer(client: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("\"status\"") {
        let read = client.read(&mut buffer).await.unwrap();
        assert!(read > 0, "closed before answering");
        answer.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn slow_silent_and_idle_clients_are_closed_after_the_header_read_timeout() {
    let limits = ConnectionLimits {
        max_connections: 8,
        header_read_timeout: 1,
    };
    let (address, _stop) = serving(limits).await;
    let mut silent = TcpStream::connect(address).await.unwrap();
    let mut slow = TcpStream::connect(address).await.unwrap();
    slow.write_all(b"POST /generate HTTP/1.1\r\nHost: t")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(address).await.unwrap();
    idle.write_all(HEALTH).await.unwrap();
    assert!(read_answer(&mut idle).await.starts_with("HTTP/1.1 200"));
    for (name, client) in [
        ("silent", &mut silent),
        ("slow", &mut slow),
        ("idle", &mut idle),
    ] {
        let waited = closed_after(client, Duration::from_secs(5)).await;
        assert!(waited < Duration::from_secs(3), "{name}: {waited:?}");
    }
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_until_one_ends() {
    let limits = ConnectionLimits {
        max_connections: 2,
        header_read_timeout: 30,
    };
    let (address, _stop) = serving(limits).await;
    let mut first = TcpStream::connect(address).await.unwrap();
    let mut second = TcpStream::connect(address).await.unwrap();
    first.write_all(HEALTH).await.unwrap();
    second.write_all(HEALTH).await.unwrap();
    read_answer(&mut first).await;
    read_answer(&mut second).await;
    let mut third = TcpStream::connect(address).await.unwrap();
    let waited = closed_after(&mut third, Duration::from_secs(5)).await;
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    drop(first);
    // The slot frees once the server has seen the first connection end.
    let started = Instant::now();
    loop {
        let mut next = TcpStream::connect(address).await.unwrap();
        next.write_all(HEALTH).await.unwrap();
        let mut buffer = [0u8; 64];
        if let Ok(read) = next.read(&mut buffer).await {
            if read > 0 {
                assert!(buffer.starts_with(b"HTTP/1.1 200"));
                return;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(5), "no slot freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn shutdown_stops_accepting_and_ends_once_open_requests_finish() {
    let limits = ConnectionLimits {
        max_connections: 8,
        header_read_timeout: 30,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, test_app(ok_backend(), 8), limits, async {
        let _ = stopped.await;
    }));
    let mut open = TcpStream::connect(address).await.unwrap();
    open.write_all(HEALTH).await.unwrap();
    read_answer(&mut open).await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server ends once its idle connection is closed")
        .unwrap();
    assert!(TcpStream::connect(address).await.is_err());
}
