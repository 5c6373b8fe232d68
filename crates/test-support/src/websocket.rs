//! A WebSocket client through the router, for the suites that hold WebSockets open across
//! changes: open one by Host, send a text the test backend echoes back with its name, and
//! wait for the close frame that ends it.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Opens `ws://host/chat` through the listener at `router`; fails unless it answers 101.
pub async fn open_websocket(router: SocketAddr, host: &str) -> Socket {
    let stream = TcpStream::connect(router)
        .await
        .expect("connect to the router");
    let url = format!("ws://{host}:{}/chat", router.port());
    let (socket, response) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream))
        .await
        .expect("WebSocket handshake through the router");
    assert_eq!(response.status(), 101);
    socket
}

/// Sends `text` and returns the reply, which must come within 5 s.
pub async fn exchange(socket: &mut Socket, text: &str) -> String {
    socket.send(Message::text(text)).await.expect("send");
    let reply = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("a reply within 5 s")
        .expect("the socket is open")
        .expect("a frame");
    reply.into_text().expect("text").to_string()
}

/// Waits for the peer's close frame, skipping other messages; fails on anything else.
pub async fn close_frame_within(socket: &mut Socket, limit: Duration) -> (CloseCode, String) {
    let waited = tokio::time::timeout(limit, async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(Some(frame)))) => {
                    return (frame.code, frame.reason.to_string())
                }
                Some(Ok(Message::Close(None))) => panic!("a close frame without a status"),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("the connection ended without a close frame: {e}"),
                None => panic!("the connection ended without a close frame"),
            }
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("no close frame within {limit:?}"))
}
