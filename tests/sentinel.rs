//! The fleet store behind Redis Sentinel: one primary, one replica and three
//! `redis-sentinel` processes, all real and on free ports of 127.0.0.1. Killing the primary
//! under load must fail no request for a known host; admin writes fail fast (503) while
//! the Sentinels fail over and succeed after; a change written after the failover reaches
//! both routers.

use switchyard_test_support as support;

use std::io::{Read, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{eventually, Backend, RedisSentinel, RedisServer, RouterProcess};

const MASTER: &str = "main";

/// A primary, its replica and three Sentinels (quorum 2) that all know one another.
struct SentinelSet {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisSentinel>,
}

impl SentinelSet {
    fn start() -> Self {
        Self::start_replicating_through(|primary| primary)
    }

    /// A set whose replica reaches its primary at the address `link` gives for the
    /// primary's (a [`Relay`] the test controls).
    fn start_replicating_through(link: impl FnOnce(SocketAddr) -> SocketAddr) -> Self {
        let primary = RedisServer::start();
        let replica = RedisServer::start_replica_of(link(primary.addr));
        let sentinels: Vec<RedisSentinel> = (0..3)
            .map(|_| RedisSentinel::start(MASTER, primary.addr, 2))
            .collect();
        // A failover needs each Sentinel to know the replica and the other two.
        eventually(Duration::from_secs(30), "the Sentinels to meet", || {
            sentinels.iter().all(|s| {
                s.master_field(MASTER, "num-slaves").as_deref() == Some("1")
                    && s.master_field(MASTER, "num-other-sentinels").as_deref() == Some("2")
            })
        });
        Self {
            primary,
            replica,
            sentinels,
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| s.addr.to_string()).collect();
        format!("redis+sentinel://{}/{MASTER}/0", hosts.join(","))
    }

    /// Waits until the replica has every write the primary took, so killing the primary
    /// loses nothing the test relies on.
    fn wait_replicated(&self) {
        let mut connection = self.primary.connection().expect("primary");
        let replicas: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query(&mut connection)
            .expect("WAIT");
        assert_eq!(replicas, 1, "the replica did not acknowledge the writes");
    }
}

fn subscribed_router(url: &str) -> RouterProcess {
    let router = RouterProcess::start_with(&["--store", url, "--redis-timeout-ms", "300"]);
    eventually(Duration::from_secs(10), "the change subscription", || {
        router.metric("switchyard_store_subscription_connected") == 1.0
    });
    router
}

fn backend_name(router: &RouterProcess, host: &str) -> Option<String> {
    let response = support::get(router.http, host, "/").ok()?;
    (response.status == 200).then(|| response.json()["backend"].as_str().unwrap_or("").into())
}

/// One admin write during the test: when it was sent (from the kill), its status, how
/// long it took and what it answered.
#[derive(Debug)]
struct Write {
    sent_after_kill: Option<Duration>,
    status: u16,
    took: Duration,
    body: serde_json::Value,
}

/// Clients asking each router for the known hosts in turn, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(routers: [Arc<RouterProcess>; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::<String>::new()));
        let threads = routers
            .into_iter()
            .map(|router| {
                let (stop, served, failures) = (stop.clone(), served.clone(), failures.clone());
                std::thread::spawn(move || {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let host = format!("shop{}.test", n % 5);
                        n += 1;
                        match support::get(router.http, &host, "/") {
                            Ok(response) if response.status == 200 => {
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(response) => failures.lock().expect("lock").push(format!(
                                "{host}: {} {}",
                                response.status,
                                response.text()
                            )),
                            Err(e) => failures.lock().expect("lock").push(format!("{host}: {e}")),
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            served,
            failures,
            threads,
        }
    }

    fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }

    /// Stops the clients: how many requests were served, and the failures.
    fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("load thread");
        }
        let failures = self.failures.lock().expect("lock").clone();
        (self.served.load(Ordering::Relaxed), failures)
    }
}

/// An operator's tool writing every 100 ms through one router, each write noted with when
/// it was sent relative to the primary's death.
struct Writer {
    stop: Arc<AtomicBool>,
    writes: Arc<Mutex<Vec<Write>>>,
    killed_at: Arc<Mutex<Option<Instant>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    fn start(router: Arc<RouterProcess>, backends: [String; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let writes = Arc::new(Mutex::new(Vec::<Write>::new()));
        let killed_at = Arc::new(Mutex::new(None::<Instant>));
        let thread = {
            let (stop, writes, killed_at) = (stop.clone(), writes.clone(), killed_at.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"backends": [backends[n % 2].clone()]}).to_string();
                    n += 1;
                    let sent = Instant::now();
                    let sent_after_kill = killed_at.lock().expect("lock").map(|k| sent - k);
                    let (status, answer) =
                        router.admin_call("PUT", "/v1/apps/probe/backends", Some(&body));
                    writes.lock().expect("lock").push(Write {
                        sent_after_kill,
                        status,
                        took: sent.elapsed(),
                        body: answer,
                    });
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self {
            stop,
            writes,
            killed_at,
            thread,
        }
    }

    /// Writes that succeeded, before the kill or after it.
    fn succeeded(&self, after_kill: bool) -> usize {
        let writes = self.writes.lock().expect("lock");
        writes
            .iter()
            .filter(|w| w.status == 200 && w.sent_after_kill.is_some() == after_kill)
            .count()
    }

    fn primary_killed(&self, at: Instant) {
        *self.killed_at.lock().expect("lock") = Some(at);
    }

    fn stop(self) -> Vec<Write> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("writer thread");
        std::mem::take(&mut *self.writes.lock().expect("lock"))
    }
}

/// Some writes were refused during the failover, each fast and with a JSON error; the
/// number refused.
fn assert_writes_refused_fast(writes: &[Write]) -> usize {
    let refused = writes.iter().filter(|w| w.status != 200).count();
    assert!(
        refused > 0,
        "no write was refused while the Sentinels failed over: {writes:?}"
    );
    for write in writes {
        assert!(
            write.status == 200 || write.status == 503,
            "a write answered neither 200 nor 503: {write:?}"
        );
        if write.status == 503 {
            assert!(
                write.body["error"].is_string(),
                "503 without a JSON error: {write:?}"
            );
        }
        assert!(
            write.took < Duration::from_millis(1500),
            "a write waited instead of failing fast: {write:?}"
        );
    }
    refused
}

/// Both routers agree with the store on the app written through the failover, and show
/// the promoted replica as their primary.
fn assert_routers_agree_with_the_store(
    routers: [&RouterProcess; 2],
    first: &Backend,
    promoted: &str,
) {
    let (_, stored) = routers[0].admin_call("GET", "/v1/apps/probe", None);
    let stored_backend = stored["backends"][0]["address"]
        .as_str()
        .or(stored["backends"][0].as_str())
        .unwrap_or("?")
        .to_string();
    let expected = if stored_backend.starts_with(&first.addr.to_string()) {
        "first"
    } else {
        "second"
    };
    for router in routers {
        eventually(
            Duration::from_secs(2),
            "the routers to agree with the store",
            || backend_name(router, "probe.test").as_deref() == Some(expected),
        );
        let (status, shown) = router.admin_call("GET", "/v1/store", None);
        assert_eq!(status, 200);
        assert_eq!(shown["kind"], "redis+sentinel", "{shown}");
        assert_eq!(shown["primary"], promoted, "{shown}");
        assert_eq!(shown["subscribed"], true, "{shown}");
        assert!(
            router.metric("switchyard_redis_primary_moves_total{role=\"route store\"}") >= 1.0,
            "{}",
            router.logs()
        );
    }
}

#[test]
fn killing_the_primary_fails_no_request_and_writes_resume_on_the_promoted_replica() {
    let mut set = SentinelSet::start();
    let url = set.url();
    let a = Arc::new(subscribed_router(&url));
    let b = Arc::new(subscribed_router(&url));
    let first = Backend::start("first");
    let second = Backend::start("second");

    for n in 0..5 {
        a.put_app(
            &format!("shop{n}"),
            json!({"domains": [format!("shop{n}.test")], "backends": [first.addr.to_string()]}),
        );
    }
    a.put_app(
        "probe",
        json!({"domains": ["probe.test"], "backends": [first.addr.to_string()]}),
    );
    for router in [&a, &b] {
        eventually(Duration::from_secs(2), "both routers to serve", || {
            (0..5).all(|n| backend_name(router, &format!("shop{n}.test")).is_some())
        });
    }
    set.wait_replicated();

    let load = Load::start([a.clone(), b.clone()]);
    let writer = Writer::start(a.clone(), [first.addr.to_string(), second.addr.to_string()]);
    eventually(
        Duration::from_secs(10),
        "the load and the writes under way",
        || load.served() >= 50 && writer.succeeded(false) >= 3,
    );
    let kill = Instant::now();
    writer.primary_killed(kill);
    set.primary.stop();
    let first_write = eventually(
        Duration::from_secs(30),
        "an admin write to succeed after the failover",
        || writer.succeeded(true) > 0,
    );
    // Load goes on after the failover until a share of it is served by the routers as
    // they resync: that must not fail requests either.
    let served_at_first_write = load.served();
    eventually(
        Duration::from_secs(10),
        "load served after the failover",
        || load.served() >= served_at_first_write + 100,
    );
    let (served, failures) = load.stop();
    let writes = writer.stop();

    assert!(
        failures.is_empty(),
        "{} requests for known hosts failed during the failover (of {served} served): {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
    let refused = assert_writes_refused_fast(&writes);
    eprintln!(
        "primary killed -> first successful write: {first_write:?}; {refused} writes refused; \
         {served} requests served, none failed"
    );

    // A change written after the failover reaches both routers, whichever one took it.
    a.scale("shop0", &[second.addr]);
    let seen = eventually(Duration::from_secs(2), "router B to see A's change", || {
        backend_name(&b, "shop0.test").as_deref() == Some("second")
    });
    eprintln!(
        "primary killed -> change seen on the other router: {:?}",
        kill.elapsed()
    );
    eprintln!("(the change itself reached router B {seen:?} after it was written)");
    b.scale("shop1", &[second.addr]);
    eventually(Duration::from_secs(2), "router A to see B's change", || {
        backend_name(&a, "shop1.test").as_deref() == Some("second")
    });
    // No router keeps a route the store no longer has.
    assert_routers_agree_with_the_store([&a, &b], &first, &set.replica.addr.to_string());
    assert!(set.replica.info_has("role:master"));
}

#[test]
fn a_router_started_on_sentinels_finds_the_primary_and_refuses_a_name_they_do_not_know() {
    let set = SentinelSet::start();
    let router = subscribed_router(&set.url());
    let (_, shown) = router.admin_call("GET", "/v1/store", None);
    assert_eq!(
        shown["primary"],
        set.primary.addr.to_string().as_str(),
        "{shown}"
    );
    assert!(
        shown["location"]
            .as_str()
            .unwrap_or("")
            .starts_with(&format!("sentinel:{MASTER}@")),
        "{shown}"
    );
    let backend = Backend::start("only");
    router.put_app(
        "one",
        json!({"domains": ["one.test"], "backends": [backend.addr.to_string()]}),
    );
    assert_eq!(backend_name(&router, "one.test").as_deref(), Some("only"));

    // Sentinels that monitor no primary of that name: the router still starts (it serves
    // what it has), writes answer 503 naming the reason, and the status says unavailable.
    let hosts: Vec<String> = set.sentinels.iter().map(|s| s.addr.to_string()).collect();
    let unknown = RouterProcess::start_with(&[
        "--store",
        &format!("redis+sentinel://{}/elsewhere/0", hosts.join(",")),
        "--redis-timeout-ms",
        "300",
    ]);
    let (status, answer) = unknown.admin_call(
        "PUT",
        "/v1/apps/two",
        Some(&json!({"domains": ["two.test"], "backends": []}).to_string()),
    );
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"].as_str().unwrap_or("").contains("elsewhere"),
        "{answer}"
    );
}

#[test]
fn every_acknowledged_write_survives_a_failover_and_one_no_replica_holds_is_refused() {
    let mut set = SentinelSet::start();
    let router = Arc::new(RouterProcess::start_with(&[
        "--store",
        &set.url(),
        "--redis-timeout-ms",
        "300",
        "--store-ack-timeout-ms",
        "300",
    ]));
    eventually(Duration::from_secs(10), "the change subscription", || {
        router.metric("switchyard_store_subscription_connected") == 1.0
    });
    // A deploy pipeline writing without pause: each app once, its answer kept.
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::<(String, u16)>::new()));
    let writer = {
        let (router, stop, answers) = (router.clone(), stop.clone(), answers.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("deploy{n}");
                let spec = json!({"domains": [format!("{name}.test")]}).to_string();
                let (status, _) =
                    router.admin_call("PUT", &format!("/v1/apps/{name}"), Some(&spec));
                answers.lock().expect("lock").push((name, status));
                n += 1;
                if status != 200 {
                    // Refused fast while the store is away: no need to spin.
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })
    };
    let acknowledged = |answers: &Mutex<Vec<(String, u16)>>| {
        answers
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, s)| *s == 200)
            .count()
    };
    eventually(Duration::from_secs(10), "writes acknowledged", || {
        acknowledged(&answers) >= 20
    });

    // The replica falls behind (stopped): writes are not acknowledged, and say why.
    set.replica.signal("STOP");
    eventually(
        Duration::from_secs(10),
        "a write refused as not yet safe",
        || router.metric("switchyard_store_writes_not_durable_total") >= 1.0,
    );
    set.primary.stop();
    set.replica.signal("CONT");
    let before_failover = answers.lock().expect("lock").len();
    eventually(
        Duration::from_secs(40),
        "writes acknowledged after the failover",
        || {
            answers.lock().expect("lock")[before_failover..]
                .iter()
                .filter(|(_, s)| *s == 200)
                .count()
                >= 5
        },
    );
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");

    let answers = answers.lock().expect("lock").clone();
    let lost: Vec<&String> = answers
        .iter()
        .filter(|(_, status)| *status == 200)
        .map(|(name, _)| name)
        .filter(|name| {
            router
                .admin_call("GET", &format!("/v1/apps/{name}"), None)
                .0
                != 200
        })
        .collect();
    let refused = answers.iter().filter(|(_, status)| *status == 503).count();
    eprintln!(
        "{} writes, {} acknowledged, {refused} refused (503), {} acknowledged and lost",
        answers.len(),
        answers.iter().filter(|(_, s)| *s == 200).count(),
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged writes lost in the failover: {lost:?}"
    );
    assert!(
        answers
            .iter()
            .all(|(_, status)| [200, 503].contains(status)),
        "every write answered as done or as not done: {answers:?}"
    );
}

/// A TCP relay on the replication link, between the replica and its primary: held, nothing
/// passes either way (what the primary sends waits in the relay); cut, what it held is
/// dropped with the connections. A link that falls behind, as a congested network makes.
struct Relay {
    addr: SocketAddr,
    held: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
}

impl Relay {
    fn start(to: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (held, cut) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (held_in, cut_in) = (held.clone(), cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                for (from, into) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(from), Ok(into)) = (from, into) else {
                        continue;
                    };
                    let (held, cut) = (held_in.clone(), cut_in.clone());
                    std::thread::spawn(move || pump(from, into, &held, &cut));
                }
            }
        });
        Self { addr, held, cut }
    }
}

fn pump(mut from: TcpStream, mut into: TcpStream, held: &AtomicBool, cut: &AtomicBool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if cut.load(Ordering::SeqCst) {
            let _ = from.shutdown(Shutdown::Both);
            let _ = into.shutdown(Shutdown::Both);
            return;
        }
        if held.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => {
                let _ = into.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if into.write_all(&buffer[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// Writes through a router on a Sentinel set whose replication link is held back, then
/// kills the primary and cuts the link, and waits for the promoted replica to take writes:
/// the status each held write was answered with, and whether it is stored after the
/// failover.
fn held_writes_across_a_failover(acks: &str) -> Vec<(u16, bool)> {
    let mut relay = None;
    let mut set = SentinelSet::start_replicating_through(|primary| {
        let started = Relay::start(primary);
        let addr = started.addr;
        relay = Some(started);
        addr
    });
    let relay = relay.expect("the relay");
    let router = RouterProcess::start_with(&[
        "--store",
        &set.url(),
        "--redis-timeout-ms",
        "300",
        "--store-ack-replicas",
        acks,
        "--store-ack-timeout-ms",
        "300",
    ]);
    router.put_app("before", json!({"domains": ["before.test"]}));
    set.wait_replicated();
    relay.held.store(true, Ordering::SeqCst);
    // Past the pumps' read in progress (20 ms): from here nothing passes.
    std::thread::sleep(Duration::from_millis(100));
    let held: Vec<u16> = (0..5)
        .map(|n| {
            let spec = json!({"domains": [format!("held{n}.test")]}).to_string();
            router
                .admin_call("PUT", &format!("/v1/apps/held{n}"), Some(&spec))
                .0
        })
        .collect();
    set.primary.stop();
    relay.cut.store(true, Ordering::SeqCst);
    eventually(
        Duration::from_secs(40),
        "a write on the promoted replica",
        || {
            let spec = json!({"domains": ["after.test"]}).to_string();
            router.admin_call("PUT", "/v1/apps/after", Some(&spec)).0 == 200
        },
    );
    assert_eq!(router.admin_call("GET", "/v1/apps/before", None).0, 200);
    held.into_iter()
        .enumerate()
        .map(|(n, status)| {
            let stored = router
                .admin_call("GET", &format!("/v1/apps/held{n}"), None)
                .0
                == 200;
            (status, stored)
        })
        .collect()
}

#[test]
fn a_write_the_replicas_never_got_is_lost_in_a_failover_unless_acknowledgements_refuse_it() {
    // Without acknowledgements: each held write is answered 200, and the failover loses it.
    let unacknowledged = held_writes_across_a_failover("0");
    assert!(
        unacknowledged
            .iter()
            .all(|&(status, stored)| status == 200 && !stored),
        "answered done, then lost: {unacknowledged:?}"
    );
    // With them (the default): none is answered done, so none that was is lost.
    let acknowledged = held_writes_across_a_failover("auto");
    assert!(
        acknowledged.iter().all(|&(status, _)| status == 503),
        "refused as not yet safe: {acknowledged:?}"
    );
}
