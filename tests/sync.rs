//! Declarative sync, end to end (issue 68, step 4): the real router and CLI make the store
//! match a desired set — plan, apply, idempotence, prune, the revision precondition, a batch
//! refused whole — on the embedded store, and on a Redis store a fleet shares.

use switchyard_test_support as support;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use support::{Backend, RedisServer, RouterProcess};

fn spec(name: &str, backend: &Backend) -> Value {
    json!({"name": name, "domains": [format!("{name}.sync.test")], "backends": [backend.addr.to_string()]})
}

fn lines(apps: &[Value]) -> String {
    apps.iter().map(|a| format!("{a}\n")).collect()
}

fn cli(router: &RouterProcess, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(RouterProcess::binary())
        .args(args)
        .args(["--admin", &router.admin.to_string()])
        .output()
        .expect("run the CLI");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path.to_string_lossy().into_owned()
}

fn backend_of(router: &RouterProcess, app: &str) -> Option<String> {
    let (status, app) = router.admin_call("GET", &format!("/v1/apps/{app}"), None);
    (status == 200).then(|| {
        app["backends"][0]["address"]
            .as_str()
            .unwrap_or("")
            .to_string()
    })
}

/// The sync of one store: plan, apply, again, prune.
fn plan_apply_and_prune(router: &RouterProcess) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (one, two) = (Backend::start("one"), Backend::start("two"));
    for name in ["a", "b", "c"] {
        router.put_app(name, spec(name, &one));
    }
    let desired = [spec("a", &one), spec("b", &two), spec("d", &two)];
    let file = write(dir.path(), "apps.jsonl", &lines(&desired));

    let (ok, plan, err) = cli(router, &["apps", "sync", &file, "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        plan.contains("~ b (backends)") && plan.contains("+ d"),
        "{plan}"
    );
    assert!(
        plan.contains("1 to create, 1 to update, 0 to delete, 1 unchanged"),
        "{plan}"
    );
    assert!(plan.contains("1 stored apps not in the set kept"), "{plan}");
    assert!(plan.contains("dry run: nothing applied"), "{plan}");
    assert_eq!(
        backend_of(router, "b"),
        Some(one.addr.to_string()),
        "a dry run writes nothing"
    );
    assert_eq!(backend_of(router, "d"), None);

    let (ok, out, err) = cli(router, &["apps", "sync", &file]);
    assert!(ok, "{err}");
    assert!(out.contains("applied: 2 writes in 1 batches"), "{out}");
    assert_eq!(backend_of(router, "b"), Some(two.addr.to_string()));
    assert_eq!(router.get("d.sync.test", "/").status, 200, "routed at once");
    assert!(backend_of(router, "c").is_some(), "kept without --prune");

    // Idempotent: the same set again changes nothing and says so.
    let (ok, again, err) = cli(router, &["apps", "sync", &file]);
    assert!(ok, "{err}");
    assert!(again.contains("nothing to change"), "{again}");

    // Pruned; the set as a JSON array, from a directory of app files too.
    let (ok, out, err) = cli(router, &["apps", "sync", &file, "--prune"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("- c") && out.contains("applied: 1 writes"),
        "{out}"
    );
    assert_eq!(backend_of(router, "c"), None);
    let apps_dir = dir.path().join("apps");
    std::fs::create_dir(&apps_dir).expect("dir");
    for app in &desired {
        let name = app["name"].as_str().unwrap_or_default();
        let mut file_app = app.clone();
        file_app.as_object_mut().map(|o| o.remove("name"));
        write(&apps_dir, &format!("{name}.json"), &file_app.to_string());
    }
    let (ok, same, err) = cli(router, &["apps", "sync", &apps_dir.to_string_lossy()]);
    assert!(ok && same.contains("nothing to change"), "{same}{err}");
    let array = Value::Array(desired.to_vec()).to_string();
    let (status, plan) = router.admin_call("PUT", "/v1/apps?dry_run=true", Some(&array));
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["unchanged"], 3);
}

#[test]
fn sync_plans_applies_prunes_and_is_idempotent_on_the_embedded_store() {
    let router = RouterProcess::start();
    plan_apply_and_prune(&router);
    // Recorded in the audit log as one write.
    let (_, audit) = router.admin_call("GET", "/v1/audit?limit=1", None);
    let record = &audit["records"][0];
    assert_eq!(
        (record["method"].as_str(), record["path"].as_str()),
        (Some("PUT"), Some("/v1/apps?dry_run=true"))
    );
}

#[test]
fn sync_plans_applies_prunes_and_is_idempotent_on_a_redis_store() {
    let redis = RedisServer::start();
    let router = RouterProcess::start_with(&["--store", &redis.url()]);
    plan_apply_and_prune(&router);
}

#[test]
fn a_plan_applies_only_to_the_store_it_was_made_from_and_a_batch_lands_whole() {
    preconditions_and_whole_batches(&RouterProcess::start());
    let redis = RedisServer::start();
    preconditions_and_whole_batches(&RouterProcess::start_with(&["--store", &redis.url()]));
}

fn preconditions_and_whole_batches(router: &RouterProcess) {
    let (one, two) = (Backend::start("one"), Backend::start("two"));
    router.put_app("a", spec("a", &one));
    router.put_app("b", spec("b", &one));
    let desired = lines(&[spec("a", &two), spec("b", &one)]);
    let (status, plan) = router.admin_call("PUT", "/v1/apps?dry_run=true", Some(&desired));
    assert_eq!(status, 200, "{plan}");
    let revision = plan["revision"].as_str().expect("a revision").to_string();

    // Another writer moves b meanwhile: the plan no longer applies.
    router.put_app("b", spec("b", &two));
    let raw = format!(
        "PUT /v1/apps HTTP/1.1\r\nHost: admin\r\nIf-Match: {revision}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{desired}",
        desired.len()
    );
    let refused = support::request(router.admin, &raw).expect("answer");
    assert_eq!(refused.status, 412, "{}", refused.text());
    assert_eq!(
        backend_of(router, "a"),
        Some(one.addr.to_string()),
        "nothing applied"
    );

    // A batch whose last write is refused (a domain b still owns) lands not at all.
    let mut thief = spec("z", &two);
    thief["domains"] = json!(["b.sync.test"]);
    let clash = lines(&[spec("a", &two), thief]);
    let (status, answer) = router.admin_call("PUT", "/v1/apps", Some(&clash));
    assert_eq!(
        (status, answer["field"].as_str()),
        (409, Some("domains")),
        "{answer}"
    );
    assert_eq!(
        backend_of(router, "a"),
        Some(one.addr.to_string()),
        "the update before it in the batch was not kept"
    );
    // A bad line: 422 naming it, nothing compared.
    let bad = "{\"name\": \"x\", \"domains\": [\"not a domain\"]}\n";
    let (status, answer) = router.admin_call("PUT", "/v1/apps", Some(bad));
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["lines"][0]["line"], 1);
}

/// Runs the CLI on a pseudo-terminal (`script`), as a person would: what the terminal
/// showed, and whether it succeeded.
fn cli_on_a_terminal(router: &RouterProcess, args: &[&str]) -> (bool, String) {
    let binary = RouterProcess::binary();
    let mut command = format!("{} ", binary.display());
    for arg in args
        .iter()
        .copied()
        .chain(["--admin", &router.admin.to_string()])
    {
        command.push_str(&format!("'{arg}' "));
    }
    let output = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("run script(1)");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn sync_and_import_show_their_progress_on_a_terminal_and_stream_it_to_who_asks() {
    let router = RouterProcess::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = Backend::start("one");
    let many = |prefix: &str, n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| spec(&format!("{prefix}{i}"), &backend))
            .collect()
    };
    // The API: steps as JSON lines, the answer last; the audit record has the outcome.
    let desired = lines(&many("s", 2500));
    let raw = format!(
        "PUT /v1/apps HTTP/1.1\r\nHost: admin\r\nAccept: application/x-ndjson\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{desired}",
        desired.len()
    );
    let streamed = support::request(router.admin, &raw).expect("answer");
    assert_eq!(streamed.status, 200);
    let steps: Vec<Value> = streamed
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(steps[0], json!({"compared": 2500, "writes": 2500}));
    let written: Vec<u64> = steps.iter().filter_map(|s| s["written"].as_u64()).collect();
    assert_eq!(written, [1000, 2000, 2500]);
    let last = steps.last().expect("the answer");
    assert_eq!(last["status"], 200);
    assert_eq!(
        last["answer"]["create"].as_array().map(Vec::len),
        Some(2500)
    );
    support::eventually(
        std::time::Duration::from_secs(5),
        "the sync's audit record",
        || {
            let (_, audit) = router.admin_call("GET", "/v1/audit?limit=1", None);
            audit["records"][0]["change"]["counts"] == json!([2500, 0, 0])
        },
    );

    // The CLI on a terminal draws a bar for the sync and for an import.
    let file = write(dir.path(), "apps.jsonl", &lines(&many("t", 1500)));
    let (ok, shown) = cli_on_a_terminal(&router, &["apps", "sync", &file]);
    assert!(ok, "{shown}");
    assert!(
        shown.contains("comparing: 4000 apps compared, 1500 to write"),
        "{shown}"
    );
    assert!(shown.contains("1000 written, 500 left"), "{shown}");
    assert!(
        shown.contains("1500 written, 0 left") && shown.contains("applied: 1500 writes"),
        "{shown}"
    );
    let file = write(dir.path(), "more.jsonl", &lines(&many("u", 1200)));
    let (ok, shown) = cli_on_a_terminal(&router, &["apps", "import", &file]);
    assert!(ok, "{shown}");
    assert!(
        shown.contains("importing [") && shown.contains("1200 written, 0 left"),
        "{shown}"
    );
    assert!(shown.contains("1200 apps applied"), "{shown}");
}
