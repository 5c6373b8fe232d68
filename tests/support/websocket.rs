//! A WebSocket client through the router, for the suites that hold WebSockets open across
//! changes: open one by Host, and send a text the test backend echoes back with its name.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
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
