//! What each app costs the router, through the real binary: CPU measured around the polls
//! made for it (and the pool's jobs), billed through `GET /v1/usage`, exported per app
//! for the costliest and as `_other` for the rest, and carried by the access log.

use switchyard_test_support as support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Backend, RouterProcess};

/// The process's CPU seconds (utime + stime) from /proc.
fn process_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

fn usage_of<'a>(report: &'a Value, app: &str) -> &'a Value {
    report["apps"]
        .as_array()
        .expect("apps")
        .iter()
        .find(|a| a["app"] == app)
        .unwrap_or_else(|| panic!("{app} in {report}"))
}

#[test]
fn each_apps_cpu_is_charged_to_it_billed_and_adds_up_to_the_processs() {
    let router = RouterProcess::start_with(&["--usage-top-apps", "1"]);
    let backend = Backend::start("light");
    router.put_app(
        "light",
        json!({"domains": ["light.test"], "backends": [backend.addr.to_string()]}),
    );
    // 2 MB relayed on every request: the costly app.
    router.put_app(
        "heavy",
        json!({"domains": ["heavy.test"], "backends": [backend.addr.to_string()]}),
    );
    router.put_app(
        "idle",
        json!({"domains": ["idle.test"], "backends": [backend.addr.to_string()]}),
    );
    let cpu_before = process_cpu_s(router.pid());
    for _ in 0..50 {
        assert_eq!(router.get("light.test", "/").status, 200);
    }
    for _ in 0..60 {
        let answer = router.get("heavy.test", "/bytes?n=2000000");
        assert_eq!(answer.status, 200);
    }
    // Right away (the history's sample in progress counts), the costliest app first.
    let (status, stats) = router.admin_call("GET", "/v1/stats/apps?sort=cpu", None);
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["apps"][0]["app"], "heavy", "{stats}");
    assert!(stats["apps"][0]["cpu_ms_per_s_1m"].as_f64().expect("cpu") > 0.0);
    assert_eq!(stats["apps"][1]["app"], "light", "{stats}");
    let top = std::process::Command::new(RouterProcess::binary())
        .args(["top", "--sort", "cpu", "--once", "--admin"])
        .arg(router.admin.to_string())
        .output()
        .expect("switchyard top");
    let shown = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{shown}");
    let order: Vec<&str> = (shown.lines())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| ["heavy", "light"].contains(name))
        .collect();
    assert_eq!(order, ["heavy", "light"], "{shown}");
    assert!(shown.contains("CPU ms/s"), "{shown}");

    // Each event loop reconciles its CPU clock with its polls once a second.
    std::thread::sleep(Duration::from_millis(2200));
    let cpu_used = process_cpu_s(router.pid()) - cpu_before;

    let (status, report) = router.admin_call("GET", "/v1/usage", None);
    assert_eq!(status, 200, "{report}");
    let (light, heavy) = (usage_of(&report, "light"), usage_of(&report, "heavy"));
    assert_eq!(light["requests"], 50);
    assert_eq!(heavy["requests"], 60);
    let per_request = |app: &Value| {
        app["cpu_seconds"].as_f64().expect("cpu") / app["requests"].as_f64().expect("requests")
    };
    assert!(per_request(light) > 0.0, "{light}");
    assert!(
        per_request(heavy) > 3.0 * per_request(light),
        "a 2 MB answer costs more than a small one: {heavy} against {light}"
    );
    assert!(heavy["client_bytes_out"].as_u64().expect("bytes") > 60 * 1_000_000);
    assert!(
        report["apps"]
            .as_array()
            .expect("apps")
            .iter()
            .all(|a| a["app"] != "idle"),
        "an app that used nothing is not billed: {report}"
    );
    // What was charged (apps and unattributed) against the process's own clock over the
    // same requests: a margin for the admin calls, the other threads and /proc's 10 ms ticks
    // (bench/USAGE.md measures it over a longer run).
    let charged: f64 = report["apps"]
        .as_array()
        .expect("apps")
        .iter()
        .map(|a| a["cpu_seconds"].as_f64().expect("cpu"))
        .sum::<f64>()
        + report["unattributed_cpu_seconds"]
            .as_f64()
            .expect("unattributed");
    eprintln!(
        "charged {charged:.3} s (light {:.1} µs, heavy {:.1} µs a request), process {cpu_used:.3} s",
        per_request(light) * 1e6,
        per_request(heavy) * 1e6
    );
    assert!(
        (charged - cpu_used).abs() <= 0.2 * cpu_used + 0.03,
        "charged {charged} s against {cpu_used} s of process CPU"
    );

    // The access log carries each request's CPU.
    let mut records = Vec::new();
    eventually(Duration::from_secs(5), "the access log's lines", || {
        records = router.access_records();
        records.len() >= 110
    });
    let heavy_line = records
        .iter()
        .find(|r| r["app"] == "heavy")
        .expect("a heavy line");
    assert!(
        heavy_line["cpu_us"].as_u64().expect("cpu_us") > 0,
        "{heavy_line}"
    );

    // The costliest app by name, the others summed (top 1).
    let heavy_cpu = router.metric("switchyard_app_cpu_seconds_total{app=\"heavy\"}");
    let other_cpu = router.metric("switchyard_app_cpu_seconds_total{app=\"_other\"}");
    assert!(heavy_cpu > 0.0, "{heavy_cpu}");
    assert!(other_cpu > 0.0, "the light app is in _other: {other_cpu}");
    assert_eq!(
        router.metric("switchyard_app_cpu_seconds_total{app=\"light\"}"),
        0.0,
        "only the top app is named"
    );
    assert!(router.metric("switchyard_unattributed_cpu_seconds_total") >= 0.0);
}

#[test]
fn usage_since_is_checked_and_pages_follow_by_name() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    for name in ["page-a", "page-b", "page-c"] {
        router.put_app(
            name,
            json!({"domains": [format!("{name}.test")], "backends": [backend.addr.to_string()]}),
        );
        assert_eq!(router.get(&format!("{name}.test"), "/").status, 200);
    }
    let (status, error) = router.admin_call("GET", "/v1/usage?since=yesterday", None);
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("since")),
        "{error}"
    );
    let (status, error) = router.admin_call("GET", "/v1/usage?limit=0", None);
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("limit")),
        "{error}"
    );

    // Since before the router started: the totals since it did.
    let (status, first) = router.admin_call("GET", "/v1/usage?since=1&limit=2", None);
    assert_eq!(status, 200, "{first}");
    let names: Vec<&str> = (first["apps"].as_array().expect("apps").iter())
        .map(|a| a["app"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["page-a", "page-b"]);
    assert_eq!(first["since_unix"], first["started_unix"]);
    let next = first["next"].as_str().expect("a next page");
    let (_, second) = router.admin_call("GET", &format!("/v1/usage?after={next}"), None);
    assert_eq!(second["apps"][0]["app"], "page-c", "{second}");
    assert!(second["next"].is_null());

    // Since a moment ago: only what was used since (within the current minute here).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let (status, recent) = router.admin_call("GET", &format!("/v1/usage?since={now}"), None);
    assert_eq!(status, 200, "{recent}");
    assert!(
        recent["since_unix"].as_u64().expect("since")
            >= first["started_unix"].as_u64().expect("start")
    );
}
