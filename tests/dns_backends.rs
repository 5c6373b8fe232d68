//! Backends given by DNS name, resolved against a real DNS server the harness starts on a
//! free UDP port (support::dns) or a hosts file the test rewrites: addresses that move,
//! names that stop resolving, SRV records. The backends listen on 127.0.0.2 and 127.0.0.3
//! (loopback addresses all), so a name can move from one to the other on the same port.

use switchyard_test_support as support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::dns::DnsServer;
use support::websocket::{exchange, open_websocket};
use support::{eventually, Backend, RouterProcess};

const OLD_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const NEW_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// A router asking `dns` (and the hosts file `hosts`) with TTLs bounded to 1..2 s.
fn router_with(dns: &DnsServer, dir: &Path, hosts: &Path) -> RouterProcess {
    // Neither the machine's nameservers nor its search domains take part.
    let resolv_conf = dir.join("resolv.conf");
    std::fs::write(&resolv_conf, "options ndots:1\n").expect("resolv.conf");
    RouterProcess::start_with(&[
        "--dns-servers",
        &dns.addr.to_string(),
        "--dns-resolv-conf",
        resolv_conf.to_str().expect("path"),
        "--dns-hosts-file",
        hosts.to_str().expect("path"),
        "--dns-min-ttl-s",
        "1",
        "--dns-max-ttl-s",
        "2",
        "--dns-timeout-ms",
        "500",
    ])
}

/// Two backends on the same port, one on each loopback address.
fn backends_on_both_addresses() -> (Backend, Backend) {
    let old = Backend::start_on(SocketAddr::from((OLD_IP, 0)), "old");
    let new = Backend::start_on(SocketAddr::from((NEW_IP, old.addr.port())), "new");
    (old, new)
}

fn backend_name(router: &RouterProcess, host: &str) -> Option<String> {
    let response = support::get(router.http, host, "/").ok()?;
    (response.status == 200).then(|| response.json()["backend"].as_str().unwrap_or("").into())
}

fn resolved(router: &RouterProcess, app: &str) -> Value {
    let (status, shown) = router.admin_call("GET", &format!("/v1/apps/{app}"), None);
    assert_eq!(status, 200, "{shown}");
    shown["resolved_backends"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_whose_address_changes_moves_new_requests_and_keeps_the_open_websocket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "").expect("hosts");
    let dns = DnsServer::start();
    let router = router_with(&dns, dir.path(), &hosts);
    let (old, new) = backends_on_both_addresses();
    dns.set_a("web.test.internal", &[OLD_IP]);
    let name = format!("web.test.internal:{}", old.addr.port());
    router.put_app(
        "named",
        json!({"domains": ["named.test"], "backends": [name]}),
    );
    assert_eq!(backend_name(&router, "named.test").as_deref(), Some("old"));
    let mut socket = open_websocket(router.http, "named.test").await;
    assert_eq!(exchange(&mut socket, "hello").await, "old:hello");

    dns.set_a("web.test.internal", &[NEW_IP]);
    let took = eventually(
        Duration::from_secs(4),
        "new requests to reach the new address",
        || backend_name(&router, "named.test").as_deref() == Some("new"),
    );
    eprintln!("the new address took requests {took:?} after the DNS change");
    for _ in 0..20 {
        assert_eq!(backend_name(&router, "named.test").as_deref(), Some("new"));
    }
    // The WebSocket opened on the old address keeps going, past the drain grace too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        exchange(&mut socket, "still there").await,
        "old:still there"
    );
    assert_eq!(old.open_websockets(), 1);
    assert_eq!(
        router.metric("switchyard_connections_to_removed_backends"),
        1.0
    );
    assert!(new.requests() >= 21);

    let shown = resolved(&router, "named");
    assert_eq!(shown["backend"], name.as_str(), "{shown}");
    assert_eq!(shown["state"], "resolved", "{shown}");
    assert_eq!(
        shown["addresses"],
        json!([format!("{NEW_IP}:{}", old.addr.port())]),
        "{shown}"
    );
    assert!(router.metric("switchyard_dns_resolutions_total{result=\"changed\"}") >= 2.0);
    // Never on the request path: the requests above did not each cost a query.
    assert!(dns.queries() < 40, "{} queries", dns.queries());
}

#[test]
fn a_name_that_stops_resolving_keeps_its_last_addresses_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "").expect("hosts");
    let dns = DnsServer::start();
    let router = router_with(&dns, dir.path(), &hosts);
    let (old, _new) = backends_on_both_addresses();
    dns.set_a("api.test.internal", &[OLD_IP]);
    router.put_app(
        "kept",
        json!({"domains": ["kept.test"],
               "backends": [format!("api.test.internal:{}", old.addr.port())]}),
    );
    assert_eq!(backend_name(&router, "kept.test").as_deref(), Some("old"));

    // The name disappears (NXDOMAIN), then the server fails (SERVFAIL): the last good
    // address keeps serving, and the admin view and the metrics say the name is stale.
    dns.remove("api.test.internal");
    eventually(Duration::from_secs(5), "the name seen stale", || {
        resolved(&router, "kept")["state"] == "stale"
    });
    let shown = resolved(&router, "kept");
    assert!(
        shown["error"].as_str().unwrap_or("").contains("NXDOMAIN"),
        "{shown}"
    );
    assert_eq!(
        shown["addresses"],
        json!([format!("{OLD_IP}:{}", old.addr.port())])
    );
    dns.set_failing(true);
    let failed_before = router.metric("switchyard_dns_resolutions_total{result=\"failed\"}");
    eventually(Duration::from_secs(6), "a SERVFAIL answer", || {
        router.metric("switchyard_dns_resolutions_total{result=\"failed\"}") > failed_before
    });
    for _ in 0..20 {
        assert_eq!(backend_name(&router, "kept.test").as_deref(), Some("old"));
    }
    assert_eq!(router.metric("switchyard_dns_names{state=\"stale\"}"), 1.0);

    dns.set_failing(false);
    dns.set_a("api.test.internal", &[OLD_IP]);
    eventually(Duration::from_secs(6), "the name resolved again", || {
        resolved(&router, "kept")["state"] == "resolved"
    });

    // A name that never resolved has no address: 503 at once, and the view says why.
    router.put_app(
        "ghost",
        json!({"domains": ["ghost.test"], "backends": ["ghost.test.internal:80"]}),
    );
    let response = support::get(router.http, "ghost.test", "/").expect("answer");
    assert_eq!(response.status, 503);
    let shown = resolved(&router, "ghost");
    assert_eq!(shown["state"], "unresolved", "{shown}");
    assert!(
        shown["error"].as_str().unwrap_or("").contains("NXDOMAIN"),
        "{shown}"
    );
}

#[test]
fn srv_records_give_addresses_ports_and_weights_of_the_best_priority() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "").expect("hosts");
    let dns = DnsServer::start();
    let router = router_with(&dns, dir.path(), &hosts);
    let heavy = Backend::start_on(SocketAddr::from((OLD_IP, 0)), "heavy");
    let light = Backend::start_on(SocketAddr::from((NEW_IP, 0)), "light");
    let backup = Backend::start("backup");
    dns.set_a("heavy.test.internal", &[OLD_IP]);
    dns.set_a("light.test.internal", &[NEW_IP]);
    dns.set_a("backup.test.internal", &[Ipv4Addr::LOCALHOST]);
    dns.set_srv(
        "_http._tcp.web.test.internal",
        &[
            (10, 300, heavy.addr.port(), "heavy.test.internal"),
            (10, 100, light.addr.port(), "light.test.internal"),
            (20, 100, backup.addr.port(), "backup.test.internal"),
        ],
    );
    router.put_app(
        "srv",
        json!({"domains": ["srv.test"], "backends": ["srv:_http._tcp.web.test.internal"]}),
    );
    let mut counts = std::collections::HashMap::new();
    for _ in 0..40 {
        let name = backend_name(&router, "srv.test").expect("served");
        *counts.entry(name).or_insert(0) += 1;
    }
    // Weights 300:100 become 100:33 — the round robin gives 30 and 10 of 40.
    assert_eq!(counts.get("heavy"), Some(&30), "{counts:?}");
    assert_eq!(counts.get("light"), Some(&10), "{counts:?}");
    assert_eq!(backup.requests(), 0, "the backup priority gets nothing");
    let shown = resolved(&router, "srv");
    assert_eq!(shown["state"], "resolved", "{shown}");
    assert_eq!(
        shown["addresses"].as_array().map(Vec::len),
        Some(2),
        "{shown}"
    );
}

#[test]
fn a_name_in_the_hosts_file_moves_when_the_file_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, format!("{OLD_IP} files.test.internal\n")).expect("hosts");
    let dns = DnsServer::start();
    let router = router_with(&dns, dir.path(), &hosts);
    let (old, _new) = backends_on_both_addresses();
    router.put_app(
        "files",
        json!({"domains": ["files.test"],
               "backends": [format!("files.test.internal:{}=5", old.addr.port())]}),
    );
    assert_eq!(backend_name(&router, "files.test").as_deref(), Some("old"));
    std::fs::write(&hosts, format!("{NEW_IP} files.test.internal\n")).expect("hosts");
    eventually(
        Duration::from_secs(4),
        "the hosts file's new address",
        || backend_name(&router, "files.test").as_deref() == Some("new"),
    );
    assert_eq!(dns.queries(), 0, "a name in the hosts file asks no server");
}
