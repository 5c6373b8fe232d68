//! The operator's tools against the real binary: the bulk import (`POST /v1/import/apps`,
//! `switchyard apps import`), apps as files (`apps put -f`, `apps get --output`,
//! `apps edit`), and `GET /v1/explain` / `switchyard explain`.

use switchyard_test_support as support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Backend, RouterProcess};

/// Runs the CLI against `router`: success, stdout, stderr.
fn cli(router: &RouterProcess, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let admin = router.admin.to_string();
    let mut command = Command::new(RouterProcess::binary());
    command.args(args).args(["--admin", &admin]);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("run the switchyard CLI");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn app_count(router: &RouterProcess) -> usize {
    let (status, page) = router.admin_call("GET", "/v1/apps?limit=1000", None);
    assert_eq!(status, 200, "{page}");
    page["apps"].as_array().map_or(0, Vec::len)
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_string_lossy().into_owned()
}

#[test]
fn a_bulk_import_is_refused_whole_for_a_bad_line_and_applied_per_app_otherwise() {
    let router = RouterProcess::start();
    let backend = Backend::start("imported");
    let files = tempfile::tempdir().expect("temp dir");
    let line = |name: &str, domain: &str| {
        json!({"name": name, "domains": [domain], "backends": [backend.addr.to_string()]})
            .to_string()
    };

    // One bad line among good ones: every bad line named, nothing applied.
    let bad = [
        line("one", "one.import.test"),
        line("two", "two.import.test"),
        r#"{"name": "three", "domains": ["bad..test"]}"#.to_string(),
        line("one", "again.import.test"),
    ]
    .join("\n");
    let (status, answer) = router.admin_call("POST", "/v1/import/apps", Some(&bad));
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["problems"], 2, "{answer}");
    assert_eq!(answer["lines"][0]["line"], 3);
    assert_eq!(answer["lines"][0]["field"], "domains[0]");
    assert_eq!(answer["lines"][1]["line"], 4);
    assert_eq!(answer["lines"][1]["field"], "name");
    assert_eq!(
        app_count(&router),
        0,
        "nothing of a refused import is applied"
    );
    let (ok, _, err) = cli(
        &router,
        &["apps", "import", &write(files.path(), "bad.jsonl", &bad)],
        &[],
    );
    assert!(!ok, "a refused import fails the command");
    assert!(
        err.contains("line 3 (app three): domains[0]:") && err.contains("line 4 (app one): name:"),
        "{err}"
    );

    // A good file through the CLI: applied, routed at once.
    let good: Vec<String> = (0..200)
        .map(|i| line(&format!("bulk-{i}"), &format!("bulk-{i}.import.test")))
        .collect();
    let (ok, out, err) = cli(
        &router,
        &[
            "apps",
            "import",
            &write(files.path(), "good.jsonl", &good.join("\n")),
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.contains("200 apps applied, 0 refused"), "{out}");
    assert_eq!(app_count(&router), 200);
    let answer = router.get("bulk-137.import.test", "/");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["backend"], "imported");

    // An app whose domain another app owns is refused on its line; the others land.
    router.put_app("owner", json!({"domains": ["taken.import.test"]}));
    let mixed = [
        line("fresh", "fresh.import.test"),
        line("thief", "taken.import.test"),
    ]
    .join("\n");
    let (status, answer) = router.admin_call("POST", "/v1/import/apps", Some(&mixed));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["applied"], 1);
    assert_eq!(answer["results"][1]["result"], "refused");
    assert!(
        answer["results"][1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("owner")),
        "{answer}"
    );
    assert_eq!(router.get("fresh.import.test", "/").status, 200);
    let (status, _) = router.admin_call("GET", "/v1/apps/thief", None);
    assert_eq!(status, 404, "the refused app was not half-written");
    let (status, owner) = router.admin_call("GET", "/v1/apps/owner", None);
    assert_eq!(
        (status, owner["domains"].clone()),
        (200, json!(["taken.import.test"]))
    );
}

#[test]
fn apps_round_trip_through_toml_and_json_files_and_the_editor() {
    let router = RouterProcess::start();
    let first = Backend::start("first");
    let second = Backend::start("second");
    let files = tempfile::tempdir().expect("temp dir");
    let toml = format!(
        "domains = [\"files.test\"]\nbackends = [\"{}\"]\nhttps_redirect = false\n\n[health_check]\npath = \"/health\"\n",
        first.addr
    );
    let (ok, out, err) = cli(
        &router,
        &[
            "apps",
            "put",
            "files",
            "-f",
            &write(files.path(), "app.toml", &toml),
        ],
        &[],
    );
    assert!(ok && out.contains("app files stored"), "{out}{err}");
    assert_eq!(router.get("files.test", "/").json()["backend"], "first");

    // get --output toml is what put -f reads back: a round trip changes nothing.
    let (ok, printed, err) = cli(&router, &["apps", "get", "files", "--output", "toml"], &[]);
    assert!(ok, "{err}");
    assert!(
        printed.contains("files.test") && printed.contains("[health_check]"),
        "{printed}"
    );
    let (_, before) = router.admin_call("GET", "/v1/apps/files", None);
    let (ok, _, err) = cli(
        &router,
        &[
            "apps",
            "put",
            "files",
            "-f",
            &write(files.path(), "back.toml", &printed),
        ],
        &[],
    );
    assert!(ok, "{err}");
    let (_, after) = router.admin_call("GET", "/v1/apps/files", None);
    assert_eq!(before, after);
    let (ok, printed, _) = cli(&router, &["apps", "get", "files", "-o", "json"], &[]);
    assert!(ok);
    let parsed: Value = serde_json::from_str(&printed).expect("JSON output");
    assert_eq!(parsed["domains"], json!(["files.test"]));

    // apps edit: the editor's change is stored; an edit that does not parse is kept.
    let editor = write(
        files.path(),
        "editor.sh",
        &format!(
            "#!/bin/sh\nsed -i 's/{}/{}/' \"$1\"\n",
            first.addr, second.addr
        ),
    );
    make_executable(&editor);
    let (ok, out, err) = cli(&router, &["apps", "edit", "files"], &[("EDITOR", &editor)]);
    assert!(ok && out.contains("app files stored"), "{out}{err}");
    assert_eq!(router.get("files.test", "/").json()["backend"], "second");
    let breaker = write(
        files.path(),
        "breaker.sh",
        "#!/bin/sh\necho 'domains = [' >> \"$1\"\n",
    );
    make_executable(&breaker);
    let (ok, _, err) = cli(&router, &["apps", "edit", "files"], &[("EDITOR", &breaker)]);
    assert!(
        !ok && err.contains("invalid TOML") && err.contains("your edit is kept in"),
        "{err}"
    );
    let kept = err
        .split("your edit is kept in ")
        .nth(1)
        .map(str::trim)
        .expect("a path");
    assert!(std::fs::read_to_string(kept)
        .expect("the edit is kept")
        .contains("domains = ["));
    let _ = std::fs::remove_file(kept);
    let unchanged = write(files.path(), "true.sh", "#!/bin/sh\nexit 0\n");
    make_executable(&unchanged);
    let (ok, out, _) = cli(
        &router,
        &["apps", "edit", "files"],
        &[("EDITOR", &unchanged)],
    );
    assert!(ok && out.contains("unchanged"), "{out}");

    // Another write lands while the app is being edited: the edit is refused, not laid over
    // it, and the other write stays.
    let racer = write(
        files.path(),
        "racer.sh",
        &format!(
            "#!/bin/sh
\"{binary}\" apps scale files --backend {first} --admin {admin} >/dev/null
             sed -i 's/{second}/{first}/; s/retries = 2/retries = 1/' \"$1\"
",
            binary = RouterProcess::binary().display(),
            first = first.addr,
            second = second.addr,
            admin = router.admin,
        ),
    );
    make_executable(&racer);
    let (ok, out, err) = cli(&router, &["apps", "edit", "files"], &[("EDITOR", &racer)]);
    assert!(
        !ok && err.contains("changed while you edited it") && err.contains("HTTP 412"),
        "{out}{err}"
    );
    let (_, stored) = router.admin_call("GET", "/v1/apps/files", None);
    assert_eq!(stored["retries"], 2, "the edit was not stored: {stored}");
    assert_eq!(router.get("files.test", "/").json()["backend"], "first");
}

fn make_executable(path: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn explain_names_the_app_the_rule_the_stages_and_the_next_backend() {
    let router = RouterProcess::start();
    let up = Backend::start("up");
    let other = Backend::start("other");
    router.put_app(
        "shop",
        json!({
            "domains": ["shop.test", "*.shop.test"],
            "backends": [up.addr.to_string(), other.addr.to_string()],
            "cache": {"paths": ["/static/*"], "default_ttl_s": 60},
            "hsts": {"max_age_s": 600},
        }),
    );
    let (status, exact) = router.admin_call("GET", "/v1/explain?host=shop.test", None);
    assert_eq!(status, 200, "{exact}");
    assert_eq!(
        (exact["app"].clone(), exact["rule"].clone()),
        (json!("shop"), json!("exact"))
    );

    let (_, wildcard) = router.admin_call(
        "GET",
        "/v1/explain?host=eu.api.shop.test:8080&path=/static/a.css",
        None,
    );
    assert_eq!(wildcard["rule"], "wildcard", "{wildcard}");
    assert_eq!(wildcard["domain"], "*.shop.test");
    assert_eq!(
        wildcard["tried"],
        json!(["eu.api.shop.test", "*.api.shop.test", "*.shop.test"])
    );
    let applies = |answer: &Value, stage: &str| {
        answer["stages"]
            .as_array()
            .and_then(|stages| stages.iter().find(|s| s["stage"] == stage))
            .map(|s| s["applies"].clone())
    };
    assert_eq!(applies(&wildcard, "cache"), Some(json!(true)));
    assert_eq!(applies(&wildcard, "https_redirect"), Some(json!(false)));
    assert_eq!(applies(&wildcard, "waf"), Some(json!(false)));
    let (_, post) = router.admin_call(
        "GET",
        "/v1/explain?host=shop.test&path=/static/a.css&method=POST",
        None,
    );
    assert_eq!(
        applies(&post, "cache"),
        Some(json!(false)),
        "POST is not cached"
    );

    // The next backend is the one the next request takes, and explaining does not move it.
    let (_, first) = router.admin_call("GET", "/v1/explain?host=shop.test", None);
    let (_, again) = router.admin_call("GET", "/v1/explain?host=shop.test", None);
    assert_eq!(first["backend"]["next"], again["backend"]["next"]);
    let next = first["backend"]["next"]
        .as_str()
        .expect("a next backend")
        .to_string();
    let served = router.get("shop.test", "/").json()["backend"].clone();
    let expected = if next == up.addr.to_string() {
        "up"
    } else {
        "other"
    };
    assert_eq!(served, expected, "explained {next}");

    let (status, nobody) = router.admin_call("GET", "/v1/explain?host=nobody.test", None);
    assert_eq!((status, nobody["app"].clone()), (200, Value::Null));
    let (status, missing) = router.admin_call("GET", "/v1/explain", None);
    assert_eq!((status, missing["field"].clone()), (400, json!("host")));

    let (ok, out, err) = cli(&router, &["explain", "a.shop.test", "/static/x.png"], &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("→ app shop")
            && out.contains("wildcard domain *.shop.test")
            && out.contains("next backend:"),
        "{out}"
    );
}

#[test]
fn top_shows_the_busiest_apps_from_the_traffic_history() {
    let router = RouterProcess::start();
    let backend = Backend::start("busy");
    router.put_app(
        "quiet",
        json!({"domains": ["quiet.top.test"], "backends": [backend.addr.to_string()]}),
    );
    router.put_app(
        "busy",
        json!({"domains": ["busy.top.test"], "backends": [backend.addr.to_string()]}),
    );
    for _ in 0..30 {
        assert_eq!(router.get("busy.top.test", "/").status, 200);
    }
    assert_eq!(router.get("quiet.top.test", "/").status, 200);
    // Listed at once (the interval in progress counts in the last minute's figures)...
    let stats = router.admin_call("GET", "/v1/stats/apps?limit=5", None).1;
    assert_eq!(stats["apps"].as_array().map(Vec::len), Some(2), "{stats}");
    assert_eq!(stats["apps"][0]["app"], "busy", "{stats}");
    assert!(stats["apps"][0]["rps_1m"].as_f64() > Some(0.0), "{stats}");
    // ...and in the series once sampled, every 10 s: within one interval or two.
    let mut stats = Value::Null;
    let sampled = |stats: &Value| {
        stats["apps"][0]["requests"]
            .as_array()
            .map(|s| s.iter().filter_map(Value::as_u64).sum::<u64>())
    };
    support::eventually(
        std::time::Duration::from_secs(25),
        "the history samples",
        || {
            stats = router.admin_call("GET", "/v1/stats/apps?limit=5", None).1;
            sampled(&stats) == Some(30)
        },
    );
    assert_eq!(stats["apps"][0]["app"], "busy", "{stats}");
    assert_eq!(stats["resolution_s"], 10);
    let p99 = stats["apps"][0]["p99_ms_1m"].as_u64().expect("a p99 bound");
    assert!((1..=10_000).contains(&p99), "{stats}");
    assert!(router.metric("switchyard_history_apps") >= 2.0);
    let (status, refused) = router.admin_call("GET", "/v1/stats/apps?sort=slowest", None);
    assert_eq!((status, refused["field"].clone()), (400, json!("sort")));

    let (ok, out, err) = cli(&router, &["top", "--once"], &[]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let busy = lines
        .iter()
        .position(|l| l.starts_with("busy "))
        .expect("busy listed");
    let quiet = lines
        .iter()
        .position(|l| l.starts_with("quiet "))
        .expect("quiet listed");
    assert!(busy < quiet, "{out}");
}

/// Puts `count` apps named `{prefix}-{n}` in order, each acknowledged before the next.
fn put_apps_in_order(router: &RouterProcess, prefix: &str, count: usize, backend: &str) {
    for n in 0..count {
        let spec = json!({"domains": [format!("{prefix}-{n}.backup.test")], "backends": [backend]});
        router.put_app(&format!("{prefix}-{n}"), spec);
    }
}

#[test]
fn a_backup_taken_under_writes_is_consistent_and_restores_into_a_stopped_router() {
    let mut router = RouterProcess::start();
    let backend = Backend::start("kept");
    let backend_addr = backend.addr.to_string();
    put_apps_in_order(&router, "before", 40, &backend_addr);
    let files = tempfile::tempdir().expect("temp dir");
    let copy = files.path().join("store.redb");
    let copy_arg = copy.to_string_lossy().into_owned();

    // Writes go on, one after another, while the copy is taken: a consistent copy holds
    // an unbroken run of them, never a later one without an earlier.
    let acknowledged = AtomicUsize::new(0);
    let copying = AtomicBool::new(true);
    let (backup, seen_before, seen_after) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut n = 0;
            while copying.load(Ordering::SeqCst) || n < 5 {
                let spec = json!({"domains": [format!("during-{n}.backup.test")], "backends": [backend_addr]});
                router.put_app(&format!("during-{n}"), spec);
                n += 1;
                acknowledged.store(n, Ordering::SeqCst);
            }
        });
        eventually(Duration::from_secs(5), "writes under way", || {
            acknowledged.load(Ordering::SeqCst) >= 5
        });
        let seen_before = acknowledged.load(Ordering::SeqCst);
        let backup = cli(&router, &["store", "backup", &copy_arg, "--json"], &[]);
        let seen_after = acknowledged.load(Ordering::SeqCst);
        copying.store(false, Ordering::SeqCst);
        (backup, seen_before, seen_after)
    });
    let written = app_count(&router);
    let (ok, out, err) = backup;
    assert!(ok, "{out}{err}");
    let reported: Value = serde_json::from_str(&out).expect("JSON");
    let apps_in_copy = reported["apps"].as_u64().expect("apps") as usize;
    // Every write acknowledged before the copy began is in it; none made after it ended.
    assert!(
        (40 + seen_before..=40 + seen_after + 1).contains(&apps_in_copy),
        "{reported}: {seen_before}..{seen_after} writes acknowledged around the copy"
    );
    assert!(written > apps_in_copy, "writes went on after the copy");

    // Refused while a router serves from the data directory; nothing replaced.
    let data_dir = router.data_dir();
    let data_arg = data_dir.to_string_lossy().into_owned();
    let (ok, _, err) = cli(
        &router,
        &["store", "restore", &copy_arg, "--data-dir", &data_arg],
        &[],
    );
    assert!(!ok && err.contains("stop it first"), "{err}");
    assert_eq!(app_count(&router), written);

    // A file that is no backup is refused before anything is touched.
    let garbage = write(files.path(), "notes.txt", "not a store");
    router.terminate();
    let (ok, _, err) = cli(
        &router,
        &["store", "restore", &garbage, "--data-dir", &data_arg],
        &[],
    );
    assert!(!ok && err.contains("is not a Switchyard store"), "{err}");

    let (ok, out, err) = cli(
        &router,
        &["store", "restore", &copy_arg, "--data-dir", &data_arg],
        &[],
    );
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("restored {apps_in_copy} apps")),
        "{out}"
    );
    router.restart();
    let (status, page) = router.admin_call("GET", "/v1/apps?limit=1000", None);
    assert_eq!(status, 200, "{page}");
    let names: Vec<&str> = page["apps"]
        .as_array()
        .expect("apps")
        .iter()
        .filter_map(|app| app["name"].as_str())
        .collect();
    assert_eq!(names.len(), apps_in_copy, "{names:?}");
    let during = apps_in_copy - 40;
    for n in 0..during {
        assert!(
            names.contains(&format!("during-{n}").as_str()),
            "during-{n} in {names:?}"
        );
    }
    assert!(!names.contains(&format!("during-{during}").as_str()));
    // The restored store routes.
    let response = router.get("before-7.backup.test", "/");
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["backend"], "kept");
    // The store it replaced is kept beside it.
    let kept = std::fs::read_dir(&data_dir)
        .expect("data dir")
        .filter_map(Result::ok)
        .any(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("switchyard.redb.before-restore-")
        });
    assert!(kept, "the replaced store is kept");
}
