//! The floor of the Pingora engine: Host → backend and nothing else, with the settings
//! Switchyard runs Pingora with (one single-threaded service per thread, each with its own
//! SO_REUSEPORT listeners and its own pool of 4096/threads idle backend connections kept
//! 30 s; client connections read unbuffered on cleartext and through 16 KiB under TLS, and
//! write through 8 KiB). Whatever Switchyard costs above this
//! is its own; whatever this costs above nginx is the engine's.
//!
//! `pingora-floor --listen 127.0.0.1:8080 --threads 2 --route app7.bench=127.0.0.1:9001 …`
//! (`--tls-listen ADDRESS --cert PEM --key PEM` adds HTTPS).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{L4BufferSettings, ListenerConfig, TcpSocketOptions};
use pingora::prelude::*;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;

struct HostRouter {
    routes: HashMap<String, SocketAddr>,
}

#[async_trait]
impl ProxyHttp for HostRouter {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        let host = session
            .req_header()
            .headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .map(|h| h.split(':').next().unwrap_or(h).to_ascii_lowercase());
        let Some(address) = host.and_then(|h| self.routes.get(&h).copied()) else {
            return Err(Error::new(ErrorType::HTTPStatus(404)));
        };
        let mut peer = HttpPeer::new(address, false, String::new());
        peer.options.idle_timeout = Some(Duration::from_secs(30));
        Ok(Box::new(peer))
    }
}

struct Args {
    listen: SocketAddr,
    tls: Option<(SocketAddr, String, String)>,
    threads: usize,
    one_service: bool,
    work_stealing: bool,
    routes: HashMap<String, SocketAddr>,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut args = Args {
        listen: ([127, 0, 0, 1], 8080).into(),
        tls: None,
        threads: 2,
        one_service: false,
        work_stealing: false,
        routes: HashMap::new(),
    };
    let (mut tls_listen, mut cert, mut key) = (None, None, None);
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--listen" => args.listen = value.parse().map_err(|e| bad(&e))?,
            "--tls-listen" => tls_listen = Some(value.parse().map_err(|e| bad(&e))?),
            "--cert" => cert = Some(value),
            "--key" => key = Some(value),
            "--threads" => args.threads = value.parse().map_err(|e| bad(&e))?,
            "--one-service" => args.one_service = value.parse().map_err(|e| bad(&e))?,
            "--work-stealing" => args.work_stealing = value.parse().map_err(|e| bad(&e))?,
            "--route" => {
                let (host, address) = value.split_once('=').ok_or("--route HOST=IP:PORT")?;
                let address = address.parse().map_err(|e| bad(&e))?;
                args.routes.insert(host.to_ascii_lowercase(), address);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    args.tls = match (tls_listen, cert, key) {
        (None, _, _) => None,
        (Some(address), Some(cert), Some(key)) => Some((address, cert, key)),
        _ => return Err("--tls-listen needs --cert and --key".into()),
    };
    Ok(args)
}

/// Switchyard's listener for thread `thread`: its own SO_REUSEPORT socket, under a spelling
/// of the address of its own (Pingora keys inherited sockets by the address as written),
/// reading `read_buffer` bytes ahead of the parser (Switchyard: none on cleartext, 16 KiB
/// under TLS).
fn listener(address: SocketAddr, thread: usize, read_buffer: usize) -> ListenerConfig {
    let mut options = TcpSocketOptions::default();
    options.so_reuseport = Some(true);
    let host = match address {
        SocketAddr::V4(v4) => v4.ip().to_string(),
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
    };
    ListenerConfig::tcp(format!("{host}:{}{}", "0".repeat(thread), address.port()))
        .tcp_socket_options(options)
        .l4_buffer(L4BufferSettings::new(read_buffer, 8 * 1024))
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("pingora-floor: {e}");
            std::process::exit(2);
        }
    };
    // Switchyard's layout: one single-threaded service per thread, each with its own
    // listening sockets and pool. `--one-service true` is the layout it had before (one
    // service, one pool, all threads), kept to measure the difference.
    let (services, threads_each) = if args.one_service {
        (1, args.threads)
    } else {
        (args.threads, 1)
    };
    let conf = ServerConf {
        threads: args.threads,
        work_stealing: args.work_stealing,
        upstream_keepalive_pool_size: 4096 / services,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        pid_file: format!("/tmp/pingora-floor-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/pingora-floor-{}.sock", std::process::id()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    for thread in 0..services {
        let mut proxy = http_proxy_service(
            &server.configuration,
            HostRouter {
                routes: args.routes.clone(),
            },
        );
        proxy.threads = Some(threads_each);
        proxy.add_listener(listener(args.listen, thread, 0));
        if let Some((address, cert, key)) = &args.tls {
            let settings = match TlsSettings::intermediate(cert, key) {
                Ok(settings) => settings,
                Err(e) => {
                    eprintln!("pingora-floor: --cert {cert} --key {key}: {e}");
                    std::process::exit(2);
                }
            };
            proxy.add_listener(listener(*address, thread, 16 * 1024).tls(settings));
        }
        server.add_service(proxy);
    }
    server.run_forever();
}
