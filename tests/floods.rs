//! Floods a router must shrug off without help: HTTP/2 streams opened and reset as fast as a
//! client can write them (CVE-2023-44487, "rapid reset"), and Host headers and TLS server
//! names that no app owns, each new.

mod support;

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
    let request = request_block("GET", "flood.test", b"/slow?ms=300", &[]);
    let mut connection = Connection::open(router.http);
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
    let amplified = backend.requests();
    assert!(
        amplified <= 100,
        "{amplified} backend requests for {opened} reset streams"
    );
    eprintln!("GOAWAY after {opened} streams written; the backend saw {amplified} requests");
    assert_eq!(router.get("flood.test", "/").status, 200);
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
