//! What the router watches on a client connection beyond one request: HTTP/2 clients that
//! cancel the streams it took on (`h2_resets`), and the close frame a WebSocket the router
//! ends gets between two of the backend's frames (`websocket_close`).

pub(crate) mod h2_resets;
pub(crate) mod websocket_close;
