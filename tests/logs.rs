//! Access-log shipping end to end: the real router batching to the real `switchyard logd`,
//! which writes one file per app. Every request is one line in its app's file, through a
//! `kill -9` of logd, an outage of it, rotation and an external logrotate.

use switchyard_test_support as support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::logd::count_by;
use support::{eventually, Backend, LogdProcess, RouterProcess};

const DELIVERY: Duration = Duration::from_secs(20);

fn shipping_router(logd: &LogdProcess) -> RouterProcess {
    RouterProcess::start_with(&[
        "--log-to",
        &logd.addr.to_string(),
        "--log-batch-delay-ms",
        "50",
    ])
}

fn app(router: &RouterProcess, name: &str, backend: &Backend) {
    router.put_app(
        name,
        json!({"domains": [format!("{name}.test")], "backends": [backend.addr.to_string()]}),
    );
}

/// Sends `GET /{tag}/{n}` to `host` for each n; every request must be answered.
fn send(router: &RouterProcess, host: &str, tag: &str, count: usize) {
    for n in 0..count {
        let response = router.get(host, &format!("/{tag}/{n}"));
        assert!(response.status == 200 || response.status == 404, "{n}");
    }
}

/// Paths logged for `app_dir`, with how often each appears.
fn logged_paths(logd: &LogdProcess, app_dir: &str) -> std::collections::HashMap<String, usize> {
    count_by(&logd.lines_of(app_dir), "path")
}

/// `GET /{tag}/{n}` to `shop.test`, n = 0, 1, 2…, one after the other until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Traffic {
    fn start(router: &Arc<RouterProcess>, tag: &str) -> Self {
        let sent = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (router, sent, stop, tag) =
                (router.clone(), sent.clone(), stop.clone(), tag.to_string());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = sent.load(Ordering::Relaxed);
                    assert_eq!(router.get("shop.test", &format!("/{tag}/{n}")).status, 200);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        Self { stop, sent, thread }
    }

    /// Waits until `more` requests beyond those sent so far have been answered.
    fn wait_for_more(&self, more: usize) {
        let target = self.sent.load(Ordering::Relaxed) + more;
        eventually(DELIVERY, &format!("{more} more requests"), || {
            self.sent.load(Ordering::Relaxed) >= target
        });
    }

    /// Stops and returns how many requests were sent (each was answered with 200).
    fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("every request answered");
        self.sent.load(Ordering::Relaxed)
    }
}

fn wait_for_lines(logd: &LogdProcess, app_dir: &str, expected: usize) {
    eventually(DELIVERY, &format!("{expected} lines for {app_dir}"), || {
        logd.lines_of(app_dir).len() >= expected
    });
}

#[test]
fn every_request_is_exactly_one_line_in_its_apps_file() {
    let logd = LogdProcess::start_with(&[]);
    let router = shipping_router(&logd);
    let backend = Backend::start("web");
    app(&router, "shop", &backend);
    app(&router, "blog", &backend);

    send(&router, "shop.test", "s", 150);
    send(&router, "blog.test", "b", 100);
    send(&router, "nobody.test", "n", 20);
    wait_for_lines(&logd, "shop", 150);
    wait_for_lines(&logd, "blog", 100);
    wait_for_lines(&logd, "_unrouted", 20);
    // The two app writes' audit records travel with the access logs, to `_audit/`.
    wait_for_lines(&logd, "_audit", 2);
    // Once logd has acknowledged every record nothing is on its way that could come late.
    eventually(DELIVERY, "every record acknowledged", || {
        router.metric("switchyard_log_ship_acknowledged_records_total") >= 272.0
    });

    for (dir, tag, count, app) in [
        ("shop", "s", 150, "shop"),
        ("blog", "b", 100, "blog"),
        ("_unrouted", "n", 20, ""),
    ] {
        let lines = logd.lines_of(dir);
        assert_eq!(lines.len(), count, "{dir}");
        let paths = count_by(&lines, "path");
        let expected: HashSet<String> = (0..count).map(|n| format!("/{tag}/{n}")).collect();
        assert_eq!(paths.keys().cloned().collect::<HashSet<_>>(), expected);
        assert_eq!(count_by(&lines, "app").get(app), Some(&count), "{dir}");
    }
    assert_eq!(
        router.metric("switchyard_log_ship_acknowledged_records_total"),
        272.0,
        "270 requests and 2 audit records"
    );
    assert_eq!(
        logd.metric("switchyard_logd_lines_total{app=\"shop\"}"),
        150.0
    );
    assert_eq!(
        router.metric("switchyard_log_ship_dropped_records_total{reason=\"spool_full\"}"),
        0.0
    );
}

#[test]
fn logd_killed_mid_traffic_loses_no_line() {
    let mut logd = LogdProcess::start_with(&[]);
    let router = Arc::new(shipping_router(&logd));
    let backend = Backend::start("web");
    app(&router, "shop", &backend);

    let traffic = Traffic::start(&router, "k");
    let connected = || router.metric("switchyard_log_ship_connected") == 1.0;
    for _ in 0..2 {
        // Killed while shipping: connected, and lines sent since the last wait.
        traffic.wait_for_more(50);
        eventually(DELIVERY, "the router connected to logd", connected);
        logd.kill9();
        // Traffic goes on while logd is down, and the router has seen it go.
        eventually(DELIVERY, "the router to see logd gone", || !connected());
        traffic.wait_for_more(50);
        logd.spawn();
    }
    eventually(DELIVERY, "the router connected again", connected);
    traffic.wait_for_more(50);
    let total = traffic.stop();
    assert!(total > 100, "traffic ran ({total} requests)");

    let expected: HashSet<String> = (0..total).map(|n| format!("/k/{n}")).collect();
    eventually(DELIVERY, "every line after the restarts", || {
        logged_paths(&logd, "shop").len() == expected.len()
    });
    let paths = logged_paths(&logd, "shop");
    assert_eq!(paths.keys().cloned().collect::<HashSet<_>>(), expected);
    // At least once: a batch written just before a kill may be written again, never more.
    let duplicated = paths.values().filter(|&&n| n > 1).count();
    assert!(paths.values().all(|&n| n <= 2), "a line written 3 times");
    eprintln!(
        "{total} requests, 2 kills of logd: 0 lost, {duplicated} duplicated; resent batches: {}",
        router.metric("switchyard_log_ship_resent_batches_total")
    );
}

#[test]
fn with_the_log_service_down_the_router_serves_spools_across_a_restart_and_delivers() {
    let mut logd = LogdProcess::unstarted_with(&[]);
    let mut router = shipping_router(&logd);
    let backend = Backend::start("web");
    app(&router, "shop", &backend);

    send(&router, "shop.test", "a", 200);
    eventually(Duration::from_secs(5), "batches to wait in memory", || {
        router.metric("switchyard_log_ship_buffer_bytes") > 0.0
    });
    assert_eq!(router.metric("switchyard_log_ship_connected"), 0.0);
    // Stopped while the service is away: what memory held goes to the spool.
    assert!(router.terminate().success());
    let spool = router.data_dir().join("log-spool");
    let spooled: u64 = std::fs::read_dir(&spool)
        .expect("a spool directory")
        .flatten()
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();
    assert!(spooled > 0, "the backlog is on disk");

    router.restart();
    send(&router, "shop.test", "b", 50);
    logd.spawn();
    wait_for_lines(&logd, "shop", 250);
    let paths = logged_paths(&logd, "shop");
    assert_eq!(paths.len(), 250);
    assert!(paths.contains_key("/a/0") && paths.contains_key("/b/49"));
    eventually(Duration::from_secs(5), "the spool to be emptied", || {
        std::fs::read_dir(&spool).map_or(0, |d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "spool"))
                .count()
        }) == 0
    });
}

#[test]
fn rotation_and_an_external_logrotate_during_traffic_lose_nothing() {
    let logd = LogdProcess::start_with(&["--rotate-interval-s", "1", "--keep", "50", "--gzip"]);
    let router = Arc::new(shipping_router(&logd));
    let backend = Backend::start("web");
    app(&router, "shop", &backend);

    let traffic = Traffic::start(&router, "r");
    let rotations_by_age = || logd.metric("switchyard_logd_rotations_total{reason=\"time\"}");
    let shop = logd.logs_dir().join("shop");
    let current_has_lines = || {
        std::fs::metadata(shop.join("access.log"))
            .map(|m| m.len())
            .unwrap_or(0)
            > 0
    };
    eventually(DELIVERY, "a rotation by age, then lines again", || {
        rotations_by_age() >= 1.0 && current_has_lines()
    });
    // What logrotate does with `postrotate kill -HUP`: move the file, then signal.
    std::fs::rename(shop.join("access.log"), shop.join("moved-by-logrotate")).expect("rename");
    logd.signal("HUP");
    // logd reopens its file on the signal, and rotates it by age again.
    let rotations_at_hup = rotations_by_age();
    eventually(
        DELIVERY,
        "lines in a reopened file, then a rotation",
        || rotations_by_age() >= rotations_at_hup + 1.0,
    );
    traffic.wait_for_more(20);
    let total = traffic.stop();

    let expected: HashSet<String> = (0..total).map(|n| format!("/r/{n}")).collect();
    // Files are renamed under a reader while logd rotates, so a listing can miss or repeat
    // one: read only once the last line is rotated away (an empty file is never rotated).
    let current_is_empty = || {
        std::fs::metadata(shop.join("access.log"))
            .map(|m| m.len())
            .unwrap_or(0)
            == 0
    };
    eventually(DELIVERY, "every line, then the last rotation", || {
        current_is_empty() && logged_paths(&logd, "shop").len() == total
    });
    let paths = logged_paths(&logd, "shop");
    assert_eq!(paths.keys().cloned().collect::<HashSet<_>>(), expected);
    let twice = paths.values().filter(|&&n| n != 1).count();
    let files: Vec<(String, usize)> = std::fs::read_dir(&shop)
        .expect("shop dir")
        .flatten()
        .map(|e| {
            let path = e.path();
            let lines = support::logd::lines_under_file(&path);
            (
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                lines,
            )
        })
        .collect();
    assert_eq!(twice, 0, "no line twice (of {total}); files: {files:?}");
    assert!(
        logd.metric("switchyard_logd_rotations_total{reason=\"time\"}") >= 2.0,
        "rotated by age during the run"
    );
    assert!(
        shop.join("access.log.1.gz").exists(),
        "rotated files are gzipped"
    );
    assert!(
        !std::fs::read_to_string(shop.join("moved-by-logrotate"))
            .expect("the moved file")
            .is_empty(),
        "lines before the move stay in the moved file"
    );
}

#[test]
fn sighup_and_sigusr1_reopen_a_moved_access_log_and_lose_no_line() {
    let router = Arc::new(RouterProcess::start());
    let backend = Backend::start("web");
    app(&router, "shop", &backend);
    let log = router.access_log();
    let traffic = Traffic::start(&router, "h");
    traffic.wait_for_more(20);
    let has_lines = |path: &std::path::Path| std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
    // What logrotate does with `postrotate kill -HUP` (or nginx's USR1): move the file,
    // then signal. Until the signal the router writes on in the moved file.
    let moved = [log.with_extension("log.1"), log.with_extension("log.2")];
    for (signal, moved) in ["HUP", "USR1"].into_iter().zip(&moved) {
        std::fs::rename(&log, moved).expect("rename the access log");
        traffic.wait_for_more(5);
        router.signal(signal);
        eventually(
            DELIVERY,
            &format!("a new access log after SIG{signal}"),
            || has_lines(&log),
        );
        traffic.wait_for_more(20);
    }
    let total = traffic.stop();

    let paths = || {
        let mut seen: std::collections::HashMap<String, usize> = Default::default();
        for file in [&log, &moved[0], &moved[1]] {
            for line in std::fs::read_to_string(file).unwrap_or_default().lines() {
                let record: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
                if let Some(path) = record["path"].as_str() {
                    *seen.entry(path.to_string()).or_default() += 1;
                }
            }
        }
        seen
    };
    eventually(DELIVERY, "every request's line", || paths().len() >= total);
    let seen = paths();
    let expected: HashSet<String> = (0..total).map(|n| format!("/h/{n}")).collect();
    let logged: HashSet<String> = seen
        .keys()
        .filter(|p| p.starts_with("/h/"))
        .cloned()
        .collect();
    assert_eq!(logged, expected, "every request in one file or another");
    assert!(seen.values().all(|&n| n == 1), "no line twice");
    assert!(
        moved.iter().all(|m| has_lines(m)),
        "lines before each move stay in it"
    );
    // Neither signal ended the router.
    assert_eq!(router.get("shop.test", "/after-the-signals").status, 200);
}

#[test]
fn conflicting_or_bad_shipping_settings_refuse_to_start() {
    let (status, stderr) =
        RouterProcess::refused_start(["--log-to", "no-port", "--access-log", "off"]);
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains("--log-to"), "{stderr}");

    let (status, stderr) =
        RouterProcess::refused_start(["--log-to", "127.0.0.1:9", "--log-batch-kb", "65"]);
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains("log-batch-kb"), "{stderr}");
}
