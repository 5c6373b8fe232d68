//! The listener's sockets, handed to the router that takes over (`--upgrade`).
//!
//! Joining the SO_REUSEPORT groups with sockets of its own is not enough for a new process:
//! connections the kernel already queued on the old process's sockets are reset when that
//! process closes them. So, as nginx and Pingora do, the running router offers its
//! listening sockets themselves over a Unix socket in its data directory, and the new one
//! accepts on the very same sockets (the old one stops accepting on SIGQUIT, once the
//! operator has seen the new one take them): nothing queued is lost.
//!
//! One message: the sockets' addresses, one per line, and the descriptors in the same order
//! (`SCM_RIGHTS`); then lines that are not sockets, which a router that does not know
//! them leaves unread, as it pairs lines with descriptors: `pid N`, the offering router's
//! process (for `--quit-predecessor`), and when it serves HTTP/3 `quic-cid-generation N`
//! (see `quic_steering`).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::quic_steering::CidGeneration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The Unix socket, in the data directory, where a running router offers its sockets.
const OFFER_SOCKET: &str = "switchyard-hyper-upgrade.sock";

/// Most sockets one hand-over carries: two addresses on up to 64 threads, with room to spare
/// (the kernel's own limit per message is 253).
const MOST_SOCKETS: usize = 200;

/// Largest list of addresses a hand-over carries.
const MOST_ADDRESS_BYTES: usize = 16 * 1024;

/// The line of an offer from a router serving HTTP/3.
const QUIC_GENERATION_LINE: &str = "quic-cid-generation ";
/// The line naming the offering router's process.
const PID_LINE: &str = "pid ";

/// Listening sockets taken over from the router this one replaces, by address, and what
/// that router said of itself: its process, and the generation of its QUIC connection IDs
/// when it serves HTTP/3.
#[derive(Debug, Default)]
pub struct InheritedSockets {
    sockets: HashMap<SocketAddr, Vec<TcpListener>>,
    quic_generation: Option<CidGeneration>,
    predecessor: Option<u32>,
}

impl InheritedSockets {
    /// [`take_over`](Self::take_over), where having nothing to take over is an error: on
    /// the hyper engine these sockets are all a new process takes from the running one.
    pub fn take_over_required(data_dir: &Path) -> std::io::Result<Self> {
        let taken = Self::take_over(data_dir)?;
        if taken.sockets.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "no running router offers its listening sockets at {}",
                    offer_path(data_dir).display()
                ),
            ));
        }
        Ok(taken)
    }

    /// How many sockets were taken over.
    pub fn count(&self) -> usize {
        self.sockets.values().map(Vec::len).sum()
    }

    /// Asks the router running on `data_dir` for its sockets. A router with no hyper
    /// listener offers none: nothing is inherited, and this one binds its own.
    pub fn take_over(data_dir: &Path) -> std::io::Result<Self> {
        let path = offer_path(data_dir);
        let stream = match UnixStream::connect(&path) {
            Ok(stream) => stream,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Ok(Self::default())
            }
            Err(e) => return Err(e),
        };
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        let mut addresses = vec![0u8; MOST_ADDRESS_BYTES];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MOST_SOCKETS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let length = {
            let mut iov = [IoSliceMut::new(&mut addresses)];
            recvmsg(&stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?.bytes
        };
        let mut sockets = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(descriptors) = message {
                sockets.extend(descriptors.map(TcpListener::from));
            }
        }
        let text = String::from_utf8_lossy(&addresses[..length]).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        let (paired, rest) = lines.split_at(sockets.len().min(lines.len()));
        let mut inherited = HashMap::<SocketAddr, Vec<TcpListener>>::new();
        for (line, socket) in paired.iter().zip(sockets) {
            match line.parse::<SocketAddr>() {
                Ok(address) => inherited.entry(address).or_default().push(socket),
                // Dropped (closed): what it queued is lost, as with no hand-over at all.
                Err(_) => log::warn!("hand-over: {line:?} is not an address; socket closed"),
            }
        }
        let quic_generation = rest.iter().find_map(|line| {
            let generation = line.strip_prefix(QUIC_GENERATION_LINE)?.parse().ok()?;
            Some(CidGeneration(generation))
        });
        let predecessor = rest
            .iter()
            .find_map(|line| line.strip_prefix(PID_LINE)?.parse().ok());
        Ok(Self {
            sockets: inherited,
            quic_generation,
            predecessor,
        })
    }

    /// The sockets inherited for `address`, if any (then left nonblocking, as tokio needs).
    pub(super) fn take(&mut self, address: SocketAddr) -> std::io::Result<Vec<TcpListener>> {
        let sockets = self.sockets.remove(&address).unwrap_or_default();
        for socket in &sockets {
            socket.set_nonblocking(true)?;
        }
        Ok(sockets)
    }

    /// Sockets inherited for addresses this router no longer listens on.
    pub fn unused(&self) -> Vec<SocketAddr> {
        self.sockets.keys().copied().collect()
    }

    /// The process of the router taken over from, if it said.
    pub fn predecessor(&self) -> Option<u32> {
        self.predecessor
    }

    /// The generation of the QUIC connection IDs of the router taken over from, if it
    /// serves HTTP/3 (and says so).
    pub(super) fn quic_generation(&self) -> Option<CidGeneration> {
        self.quic_generation
    }
}

/// The sockets on offer. The offer holds copies of the listening sockets: withdrawn when
/// the listener stops, or a stopped router would keep them open, and connections would
/// queue where nobody accepts.
#[derive(Clone, Default)]
pub(super) struct Offer {
    sockets: Arc<Mutex<Vec<(SocketAddr, TcpListener)>>>,
    quic_generation: Option<CidGeneration>,
}

impl Offer {
    /// Closes the copies: from now on a router asking gets none.
    pub(super) fn withdraw(&self) {
        self.sockets.lock().clear();
    }
}

/// Offers `sockets` to whichever router takes over from this one, from a thread of its own
/// for the life of the process, until withdrawn. Replaces the offer of the router this one
/// took over from.
pub(super) fn offer(
    data_dir: &Path,
    sockets: Vec<(SocketAddr, TcpListener)>,
    quic_generation: Option<CidGeneration>,
) -> std::io::Result<Offer> {
    let path = offer_path(data_dir);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let offer = Offer {
        sockets: Arc::new(Mutex::new(sockets)),
        quic_generation,
    };
    let offered = offer.clone();
    std::thread::Builder::new()
        .name("hyper-handover".into())
        .spawn(move || serve_offer(&listener, &path, &offered))?;
    Ok(offer)
}

fn serve_offer(listener: &UnixListener, path: &Path, offer: &Offer) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                log::warn!("hand-over socket {}: {e}", path.display());
                continue;
            }
        };
        let sockets = offer.sockets.lock();
        if sockets.is_empty() {
            // Withdrawn: the asking router binds its own.
            continue;
        }
        let mut addresses: String = sockets
            .iter()
            .map(|(address, _)| format!("{address}\n"))
            .collect();
        addresses.push_str(&format!("{PID_LINE}{}\n", std::process::id()));
        if let Some(CidGeneration(generation)) = offer.quic_generation {
            addresses.push_str(&format!("{QUIC_GENERATION_LINE}{generation}\n"));
        }
        let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, s)| s.as_fd()).collect();
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let sent = if control.push(SendAncillaryMessage::ScmRights(&fds)) {
            sendmsg(
                &stream,
                &[IoSlice::new(addresses.as_bytes())],
                &mut control,
                SendFlags::empty(),
            )
            .map_err(std::io::Error::from)
        } else {
            Err(std::io::Error::other("too many sockets for one message"))
        };
        match sent {
            Ok(_) => log::info!(
                "listener sockets ({}) handed to the router taking over",
                fds.len()
            ),
            Err(e) => log::warn!("listener sockets not handed over: {e}"),
        }
    }
}

fn offer_path(data_dir: &Path) -> PathBuf {
    data_dir.join(OFFER_SOCKET)
}
