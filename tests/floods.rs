//! Floods a router must shrug off without help: HTTP/2 streams opened and reset as fast as a
//! client can write them (CVE-2023-44487, "rapid reset"), and Host headers and TLS server
//! names that no app owns, each new.

use switchyard_test_support as support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use support::h2_raw::{
    frame, request_block, Connection, CANCEL, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM,
};
use support::{tls, Backend, RouterProcess};

/// GOAWAY error code for a peer that generates excessive load (RFC 9113 §7).
const ENHANCE_YOUR_CALM: u32 = 0xb;

#[test]
fn http2_rapid_reset_is_cut_off_with_goaway_and_the_router_keeps_serving() {
    let router = RouterProcess::start();
    let backend = Backend::start("flooded");
    router.put_app(
        "flooded",
        json!({"domains": ["flood.test"], "backends": [backend.addr.to_string()]}),
    );
    rapid_reset(&router, &backend, router.http);
}

fn rapid_reset(router: &RouterProcess, backend: &Backend, at: SocketAddr) {
    let request = request_block("GET", "flood.test", b"/slow?ms=300", &[]);
    let before = backend.requests();
    let mut connection = Connection::open(at);
    // Streams written back to back, each reset right after it is opened: reset before the
    // router has even accepted them, which is what makes the attack cheap for the client.
    const BATCH: u32 = 500;
    const MOST_STREAMS: u32 = 50_000;
    let mut opened = 0;
    let mut goaway = None;
    'flood: while opened < MOST_STREAMS {
        let mut bytes = Vec::new();
        for _ in 0..BATCH {
            let stream = 1 + 2 * opened;
            bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream, &request));
            bytes.extend(frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
            opened += 1;
        }
        if connection.send(&bytes).is_err() {
            break;
        }
        while let Some(frame) = connection.next_frame(Instant::now()) {
            if frame.kind == GOAWAY {
                goaway = Some(frame.error_code());
                break 'flood;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while goaway.is_none() {
        let Some(frame) = connection.next_frame(deadline) else {
            break;
        };
        if frame.kind == GOAWAY {
            goaway = Some(frame.error_code());
        }
    }
    assert_eq!(
        goaway,
        Some(ENHANCE_YOUR_CALM),
        "after {opened} streams opened and reset"
    );
    assert!(opened < MOST_STREAMS, "cut off only after {opened} streams");
    // The streams were reset before they were accepted: almost none became backend work.
    let amplified = backend.requests() - before;
    assert!(
        amplified <= 100,
        "{amplified} backend requests for {opened} reset streams"
    );
    eprintln!("GOAWAY after {opened} streams written; the backend saw {amplified} requests");
    assert_eq!(router.get("flood.test", "/").status, 200);
}

#[test]
fn an_http2_client_cancelling_streams_the_router_took_on_is_cut_off() {
    let router = RouterProcess::start();
    let backend = Backend::start("cancelled");
    router.put_app(
        "cancelled",
        json!({"domains": ["cancel.test"], "backends": [backend.addr.to_string()]}),
    );
    cancel_taken_streams(&backend, router.http);
    assert_eq!(
        router.metric("switchyard_h2_connections_closed_for_resets_total"),
        1.0
    );
    assert_eq!(router.get("cancel.test", "/").status, 200);
}

fn cancel_taken_streams(backend: &Backend, at: SocketAddr) {
    let request = request_block("GET", "cancel.test", b"/slow?ms=3000", &[]);
    let mut connection = Connection::open(at);
    // Batches within the router's concurrent streams (128); each stream is reset only once the
    // backend has its request, so none is the cheap, pre-accept kind h2 itself refuses.
    const BATCH: u32 = 50;
    let mut next_stream = 1;
    let mut cancelled = 0;
    let started = Instant::now();
    while !connection.closed() && started.elapsed() < Duration::from_secs(30) {
        let seen = backend.requests();
        let streams: Vec<u32> = (0..BATCH).map(|i| next_stream + 2 * i).collect();
        next_stream += 2 * BATCH;
        let opening: Vec<u8> = streams
            .iter()
            .flat_map(|&s| frame(HEADERS, END_HEADERS | END_STREAM, s, &request))
            .collect();
        if connection.send(&opening).is_err() {
            break;
        }
        let accepted_by = Instant::now() + Duration::from_secs(5);
        while backend.requests() < seen + BATCH as usize && Instant::now() < accepted_by {
            connection.next_frame(Instant::now() + Duration::from_millis(20));
        }
        assert!(
            connection.closed() || backend.requests() >= seen + BATCH as usize,
            "the router did not take the streams on"
        );
        let resets: Vec<u8> = streams
            .iter()
            .flat_map(|&s| frame(RST_STREAM, 0, s, &CANCEL.to_be_bytes()))
            .collect();
        if connection.send(&resets).is_err() {
            break;
        }
        cancelled += BATCH;
        let settle = Instant::now() + Duration::from_millis(200);
        while !connection.closed() && connection.next_frame(settle).is_some() {}
    }
    let closed_after = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !connection.closed() && connection.next_frame(deadline).is_some() {}
    assert!(
        connection.closed(),
        "still open after {cancelled} cancelled streams"
    );
    eprintln!("closed after {cancelled} cancelled streams, {closed_after:?}");
    // Closed in the batch that crossed 200, or (on a loaded machine) a batch or two later.
    assert!(
        cancelled > 200 && cancelled <= 350,
        "closed after {cancelled} cancelled streams"
    );
}

#[test]
fn floods_of_unknown_hosts_and_server_names_stay_within_the_caches_bounds() {
    // Small caches, so that the flood overflows them many times: 50 apps (200 domain answers,
    // "no such domain" included) and 10 certificates (100 absent names).
    let router =
        RouterProcess::start_with(&["--route-cache-apps", "50", "--cert-cache-size", "10"]);
    let backend = Backend::start("real");
    router.put_app(
        "real",
        json!({"domains": ["real.test"], "backends": [backend.addr.to_string()]}),
    );
    const HOSTS: usize = 1_500;
    for i in 0..HOSTS {
        let host = format!("nobody-{i}.flood.test");
        assert_eq!(router.get(&host, "/").status, 404, "{host}");
    }
    const NAMES: usize = 400;
    for i in 0..NAMES {
        let name = format!("nobody-{i}.tls-flood.test");
        assert!(
            tls::connect(router.https, Some(&name), &[]).is_err(),
            "{name}"
        );
    }
    let domains = router.metric("switchyard_route_cache_entries{table=\"domains\"}");
    assert!(
        domains <= 200.0,
        "{domains} domain answers kept after {HOSTS} unknown hosts"
    );
    let names = router.metric("switchyard_cert_cache_entries");
    assert!(
        names <= 110.0,
        "{names} names kept after {NAMES} unknown ones"
    );
    // Absences are cached (a repeated unknown name costs no store read), so the bound is
    // what holds them: both caches are full, not empty.
    assert!(
        domains >= 100.0 && names >= 50.0,
        "{domains} domains, {names} names"
    );
    assert!(
        router.metric("switchyard_route_cache_misses_total") >= HOSTS as f64,
        "every new host was looked up"
    );
    // The flood cost nothing to the app that exists.
    assert_eq!(router.get("real.test", "/").status, 200);
    assert_eq!(backend.requests(), 1);
}
