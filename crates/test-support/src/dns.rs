//! A small authoritative DNS server on a free UDP port of 127.0.0.1, answering A and SRV
//! queries from a table the test changes while the router runs: addresses that move, names
//! that disappear (NXDOMAIN), a server that fails (SERVFAIL). Every other query of a known
//! name gets an empty NOERROR answer; of an unknown one, NXDOMAIN.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// One SRV record: priority, weight, port, target.
pub type SrvRecord = (u16, u16, u16, &'static str);

#[derive(Default)]
struct Zone {
    a: HashMap<String, Vec<Ipv4Addr>>,
    srv: HashMap<String, Vec<(u16, u16, u16, String)>>,
    ttl: u32,
    failing: bool,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsServer {
    /// Answers with a TTL of 1 s unless told otherwise.
    pub fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP port");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let addr = socket.local_addr().expect("address");
        let zone = Arc::new(Mutex::new(Zone {
            ttl: 1,
            ..Zone::default()
        }));
        let queries = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (zone, queries, stop) = (zone.clone(), queries.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buffer = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((length, peer)) = socket.recv_from(&mut buffer) else {
                        continue;
                    };
                    let Ok(query) = Message::from_vec(&buffer[..length]) else {
                        continue;
                    };
                    queries.fetch_add(1, Ordering::Relaxed);
                    let answer = answer(&query, &zone.lock().expect("zone"));
                    if let Ok(bytes) = answer.to_vec() {
                        let _ = socket.send_to(&bytes, peer);
                    }
                }
            })
        };
        Self {
            addr,
            zone,
            queries,
            stop,
            thread: Some(thread),
        }
    }

    /// `name` answers these A records.
    pub fn set_a(&self, name: &str, addresses: &[Ipv4Addr]) {
        self.zone
            .lock()
            .expect("zone")
            .a
            .insert(key(name), addresses.to_vec());
    }

    /// `name` answers these SRV records.
    pub fn set_srv(&self, name: &str, records: &[SrvRecord]) {
        self.zone.lock().expect("zone").srv.insert(
            key(name),
            records
                .iter()
                .map(|(p, w, port, target)| (*p, *w, *port, target.to_string()))
                .collect(),
        );
    }

    /// `name` no longer exists: NXDOMAIN.
    pub fn remove(&self, name: &str) {
        let mut zone = self.zone.lock().expect("zone");
        zone.a.remove(&key(name));
        zone.srv.remove(&key(name));
    }

    /// Every query answers SERVFAIL while set.
    pub fn set_failing(&self, failing: bool) {
        self.zone.lock().expect("zone").failing = failing;
    }

    /// Queries received so far.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }
}

fn answer(query: &Message, zone: &Zone) -> Message {
    let mut response = Message::new();
    response
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    let Some(question) = query.queries().first() else {
        response.set_response_code(ResponseCode::FormErr);
        return response;
    };
    response.add_query(question.clone());
    if zone.failing {
        response.set_response_code(ResponseCode::ServFail);
        return response;
    }
    let name = key(&question.name().to_string());
    let known = zone.a.contains_key(&name) || zone.srv.contains_key(&name);
    if !known {
        response.set_response_code(ResponseCode::NXDomain);
        return response;
    }
    match question.query_type() {
        RecordType::A => {
            for ip in zone.a.get(&name).into_iter().flatten() {
                response.add_answer(Record::from_rdata(
                    question.name().clone(),
                    zone.ttl,
                    RData::A(A(*ip)),
                ));
            }
        }
        RecordType::SRV => {
            for (priority, weight, port, target) in zone.srv.get(&name).into_iter().flatten() {
                let Ok(target) = Name::from_str(&format!("{}.", key(target))) else {
                    continue;
                };
                response.add_answer(Record::from_rdata(
                    question.name().clone(),
                    zone.ttl,
                    RData::SRV(SRV::new(*priority, *weight, *port, target)),
                ));
            }
        }
        _ => {}
    }
    response
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
