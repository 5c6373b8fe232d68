//! What the shared-nothing floors (hyper-floor, h1-floor) are told on their command line,
//! and the listening socket each of their threads opens: one definition, so the two
//! differ only in their HTTP/1 path.
//!
//! `NAME --listen 127.0.0.1:8080 [--tls-listen ADDR --cert PEM --key PEM] --threads 2
//!  --route app7.bench=127.0.0.1:9001 …`

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use openssl::ssl::{SslAcceptor, SslFiletype, SslMethod};
use socket2::{Domain, Socket, Type};

/// A floor's settings.
pub struct Options {
    pub listen: SocketAddr,
    /// HTTPS: the address and one acceptor shared by every thread, so that session
    /// tickets resume on any of them.
    pub tls: Option<(SocketAddr, Arc<SslAcceptor>)>,
    pub threads: usize,
    /// Lower-case host → backend.
    pub routes: HashMap<String, SocketAddr>,
}

/// Reads the command line; on a bad flag, says which and exits with status 2.
pub fn from_command_line(program: &str) -> Options {
    let mut listen: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let mut tls_listen: Option<SocketAddr> = None;
    let (mut cert, mut key) = (None, None);
    let mut threads = 2;
    let mut routes = HashMap::new();
    let fail = |message: String| -> ! {
        eprintln!("{program}: {message}");
        std::process::exit(2);
    };
    let mut given = std::env::args().skip(1);
    while let (Some(flag), Some(value)) = (given.next(), given.next()) {
        let parsed = match flag.as_str() {
            "--listen" => value.parse().map(|a| listen = a).map_err(|e| e.to_string()),
            "--tls-listen" => value
                .parse()
                .map(|a| tls_listen = Some(a))
                .map_err(|e| e.to_string()),
            "--cert" => {
                cert = Some(PathBuf::from(&value));
                Ok(())
            }
            "--key" => {
                key = Some(PathBuf::from(&value));
                Ok(())
            }
            "--threads" => value
                .parse::<usize>()
                .map(|n| threads = n)
                .map_err(|e| e.to_string()),
            "--route" => match value.split_once('=').map(|(h, a)| (h, a.parse())) {
                Some((host, Ok(address))) => {
                    routes.insert(host.to_ascii_lowercase(), address);
                    Ok(())
                }
                _ => Err("expected HOST=IP:PORT".to_string()),
            },
            _ => Err("unknown flag".to_string()),
        };
        if let Err(e) = parsed {
            fail(format!("{flag} {value}: {e}"));
        }
    }
    let tls = match (tls_listen, cert, key) {
        (None, _, _) => None,
        (Some(address), Some(cert), Some(key)) => match tls_acceptor(&cert, &key) {
            Ok(acceptor) => Some((address, Arc::new(acceptor))),
            Err(e) => fail(e),
        },
        (Some(_), _, _) => fail("--tls-listen needs --cert and --key".to_string()),
    };
    Options {
        listen,
        tls,
        threads,
        routes,
    }
}

fn tls_acceptor(cert: &PathBuf, key: &PathBuf) -> Result<SslAcceptor, String> {
    let mut acceptor =
        SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(|e| e.to_string())?;
    acceptor
        .set_certificate_chain_file(cert)
        .map_err(|e| format!("--cert {}: {e}", cert.display()))?;
    acceptor
        .set_private_key_file(key, SslFiletype::PEM)
        .map_err(|e| format!("--key {}: {e}", key.display()))?;
    Ok(acceptor.build())
}

/// One thread's listening socket: SO_REUSEPORT spreads connections over the threads in the
/// kernel, as nginx's `reuseport`.
pub fn reuse_port_listener(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Runs `worker` on `threads` threads and waits for them; a worker's error ends the process.
pub fn run_workers<F>(program: &str, threads: usize, worker: F)
where
    F: Fn() -> std::io::Result<()> + Send + Sync + 'static,
{
    let worker = Arc::new(worker);
    let running: Vec<_> = (0..threads)
        .map(|_| {
            let worker = worker.clone();
            std::thread::spawn(move || worker())
        })
        .collect();
    for thread in running {
        if let Ok(Err(e)) = thread.join() {
            eprintln!("{program}: worker stopped: {e}");
            std::process::exit(1);
        }
    }
}
