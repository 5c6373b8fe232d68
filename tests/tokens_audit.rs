//! Scoped tokens and the audit log, end to end: the real router (embedded store, and two
//! routers sharing a real Redis), tokens made, used and revoked through the API and the CLI,
//! every write recorded with its author, and the records shipped to a real logd.

use switchyard_test_support as support;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Backend, LogdProcess, RedisServer, RouterProcess};

const ADMIN_TOKEN: &str = "bootstrap-s3cret";

/// A call to `router`'s admin API with `token` (none: no Authorization).
fn call(
    router: &RouterProcess,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let body = body.map(Value::to_string).unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = support::request(router.admin, &raw).expect("admin API reachable");
    let json = if response.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&response.body).unwrap_or(Value::String(response.text()))
    };
    (response.status, json)
}

/// Makes a token of `scope` with the bootstrap token: its bearer string and id.
fn make_token(router: &RouterProcess, scope: &str) -> (String, String) {
    let (status, made) = call(
        router,
        Some(ADMIN_TOKEN),
        "POST",
        "/v1/tokens",
        Some(&json!({"scope": scope, "name": format!("{scope} pipeline")})),
    );
    assert_eq!(status, 201, "{made}");
    let token = made["token"].as_str().expect("the token, shown once");
    let id = made["id"].as_str().expect("its id");
    assert!(token.starts_with(&format!("sy_{id}_")), "{token}");
    (token.to_string(), id.to_string())
}

fn app_spec(name: &str, backend: &Backend) -> Value {
    json!({"domains": [format!("{name}.test")], "backends": [backend.addr.to_string()]})
}

fn cli(router: &RouterProcess, token: &str, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(RouterProcess::binary())
        .args(args)
        .args(["--admin", &router.admin.to_string(), "--token", token])
        .output()
        .expect("run the switchyard CLI");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn scoped_tokens_allow_what_their_scope_says_and_stop_when_revoked() {
    let router = RouterProcess::start_with(&["--admin-token", ADMIN_TOKEN]);
    let backend = Backend::start("b1");
    let (read, read_id) = make_token(&router, "read");
    let (write, _) = make_token(&router, "write");
    let (tenant, tenant_id) = make_token(&router, "apps:acme-");

    let put = |token: &str, name: &str| {
        call(
            &router,
            Some(token),
            "PUT",
            &format!("/v1/apps/{name}"),
            Some(&app_spec(name, &backend)),
        )
    };
    assert_eq!(put(&write, "shop").0, 200);
    assert_eq!(put(&tenant, "acme-web").0, 200);
    let (status, refused) = put(&tenant, "shop");
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["field"], "authorization");
    assert!(refused["error"]
        .as_str()
        .unwrap_or("")
        .contains("apps:acme-"));
    let (status, refused) = put(&read, "acme-api");
    assert_eq!(
        (status, refused["field"].as_str()),
        (403, Some("authorization"))
    );
    assert_eq!(call(&router, Some(&read), "GET", "/v1/apps", None).0, 200);
    assert_eq!(
        call(&router, Some(&tenant), "GET", "/v1/apps/acme-web", None).0,
        200
    );
    assert_eq!(call(&router, Some(&tenant), "GET", "/v1/apps", None).0, 403);
    // Only the bootstrap token manages tokens.
    for token in [&read, &write, &tenant] {
        let (status, _) = call(
            &router,
            Some(token),
            "POST",
            "/v1/tokens",
            Some(&json!({"scope": "write"})),
        );
        assert_eq!(status, 403);
    }
    // A wrong secret for a real id, an unknown id, no token: 401.
    let forged = format!("sy_{read_id}_{}", "0".repeat(64));
    for token in [Some(forged.as_str()), Some("sy_0000000000000000_x"), None] {
        assert_eq!(call(&router, token, "GET", "/v1/apps", None).0, 401);
    }
    // Listed without secrets; the store keeps only digests.
    let (status, listed) = call(&router, Some(ADMIN_TOKEN), "GET", "/v1/tokens", None);
    assert_eq!(status, 200);
    let tokens = listed["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|t| t.get("secret_sha256").is_none()));
    assert!(!listed.to_string().contains(&tenant[tenant.len() - 64..]));

    // Revoked: refused from the next call, without a restart.
    let (status, _) = call(
        &router,
        Some(ADMIN_TOKEN),
        "DELETE",
        &format!("/v1/tokens/{tenant_id}"),
        None,
    );
    assert_eq!(status, 204);
    assert_eq!(put(&tenant, "acme-web").0, 401);
    let (status, missing) = call(
        &router,
        Some(ADMIN_TOKEN),
        "DELETE",
        &format!("/v1/tokens/{tenant_id}"),
        None,
    );
    assert_eq!((status, missing["field"].as_str()), (404, Some("id")));
    let (status, bad) = call(
        &router,
        Some(ADMIN_TOKEN),
        "POST",
        "/v1/tokens",
        Some(&json!({"scope": "apps:Not Valid"})),
    );
    assert_eq!((status, bad["field"].as_str()), (400, Some("scope")));
    // A token survives a restart: it is in the store, not in the process.
    let mut router = router;
    router.terminate();
    router.restart();
    assert_eq!(call(&router, Some(&read), "GET", "/v1/apps", None).0, 200);
}

#[test]
fn every_write_is_recorded_with_its_author_its_change_and_its_result() {
    let router =
        RouterProcess::start_with(&["--admin-token", ADMIN_TOKEN, "--audit-retention", "5"]);
    let backend = Backend::start("b1");
    let other = Backend::start("b2");
    let (deployer, deployer_id) = make_token(&router, "apps:acme-");
    let spec = app_spec("acme-web", &backend);
    let path = "/v1/apps/acme-web";
    assert_eq!(
        call(&router, Some(&deployer), "PUT", path, Some(&spec)).0,
        200
    );
    let body = json!({"backends": [other.addr.to_string()]});
    let backends = "/v1/apps/acme-web/backends";
    assert_eq!(
        call(&router, Some(&deployer), "PUT", backends, Some(&body)).0,
        200
    );
    // A refused write is recorded with its answer, and changes nothing.
    let clash = json!({"domains": ["acme-web.test"], "backends": [backend.addr.to_string()]});
    assert_eq!(
        call(
            &router,
            Some(ADMIN_TOKEN),
            "PUT",
            "/v1/apps/thief",
            Some(&clash)
        )
        .0,
        409
    );

    let (status, page) = call(&router, Some(ADMIN_TOKEN), "GET", "/v1/audit", None);
    assert_eq!(status, 200, "{page}");
    let records = page["records"].as_array().expect("records");
    // Newest first: the refused PUT, the scale, the create, the token made.
    assert_eq!(records.len(), 4, "{page}");
    let refused = &records[0];
    assert_eq!(refused["token"], "admin");
    assert_eq!(refused["status"], 409);
    assert_eq!(refused["app"], "thief");
    assert_eq!(refused["change"], json!({}));
    let scaled = &records[1];
    assert_eq!(scaled["token"], deployer_id.as_str());
    assert_eq!(scaled["method"], "PUT");
    assert_eq!(scaled["path"], backends);
    assert_eq!(scaled["status"], 200);
    assert!(scaled["client"]
        .as_str()
        .unwrap_or("")
        .starts_with("127.0.0.1:"));
    let moved = scaled["change"].as_object().expect("a change");
    assert_eq!(
        moved.keys().collect::<Vec<_>>(),
        ["backends"],
        "only the field that moved"
    );
    let address = |side: &str| moved["backends"][side][0]["address"].clone();
    assert_eq!(address("before"), backend.addr.to_string().as_str());
    assert_eq!(address("after"), other.addr.to_string().as_str());
    let created = &records[2];
    assert_eq!(created["change"]["domains"]["before"], Value::Null);
    assert_eq!(
        created["change"]["domains"]["after"],
        json!(["acme-web.test"])
    );
    let made = &records[3];
    assert_eq!(
        (made["path"].as_str(), made["status"].as_u64()),
        (Some("/v1/tokens"), Some(201))
    );
    assert_eq!(made["change"]["token"], deployer_id.as_str());
    assert!(
        !page.to_string().contains(&deployer[deployer.len() - 64..]),
        "the secret is never recorded"
    );

    // Filtered by app, paged with `next`.
    let (_, by_app) = call(
        &router,
        Some(ADMIN_TOKEN),
        "GET",
        "/v1/audit?app=acme-web&limit=1",
        None,
    );
    assert_eq!(by_app["records"].as_array().map(Vec::len), Some(1));
    assert_eq!(by_app["records"][0]["path"], backends);
    let next = by_app["next"].as_str().expect("a next page");
    let (_, older) = call(
        &router,
        Some(ADMIN_TOKEN),
        "GET",
        &format!("/v1/audit?app=acme-web&limit=1&before={next}"),
        None,
    );
    assert_eq!(older["records"][0]["path"], path);
    let (_, none) = call(
        &router,
        Some(ADMIN_TOKEN),
        "GET",
        "/v1/audit?since=0s",
        None,
    );
    assert!(
        none["records"].as_array().is_some_and(Vec::is_empty),
        "{none}"
    );
    let (status, bad) = call(
        &router,
        Some(ADMIN_TOKEN),
        "GET",
        "/v1/audit?since=soon",
        None,
    );
    assert_eq!((status, bad["field"].as_str()), (400, Some("since")));

    // Bounded: three more writes, and the two oldest records go (retention 5), counted.
    for _ in 0..3 {
        call(
            &router,
            Some(ADMIN_TOKEN),
            "DELETE",
            "/v1/apps/nothing-here",
            None,
        );
    }
    let (_, all) = call(
        &router,
        Some(ADMIN_TOKEN),
        "GET",
        "/v1/audit?limit=1000",
        None,
    );
    let kept = all["records"].as_array().expect("records");
    assert_eq!(kept.len(), 5);
    assert_eq!(kept[4]["path"], backends, "the token and the create went");
    assert_eq!(router.metric("switchyard_audit_records_trimmed_total"), 2.0);
    assert_eq!(router.metric("switchyard_audit_records_total"), 7.0);

    // The CLI reads the same log (the create went with the trimming).
    let (ok, out, err) = cli(&router, ADMIN_TOKEN, &["audit", "--app", "acme-web"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(
        lines[0].contains(&deployer_id) && lines[0].contains("changed: backends"),
        "{out}"
    );
}

#[test]
fn the_cli_makes_a_token_once_and_a_fleet_shares_tokens_and_the_log() {
    let redis = RedisServer::start();
    let url = redis.url();
    let args = ["--store", &url, "--admin-token", ADMIN_TOKEN];
    let a = RouterProcess::start_with(&args);
    let b = RouterProcess::start_with(&args);
    let backend = Backend::start("b1");

    let (ok, out, err) = cli(
        &a,
        ADMIN_TOKEN,
        &[
            "tokens",
            "create",
            "--scope",
            "apps:team-",
            "--name",
            "team ci",
            "--json",
        ],
    );
    assert!(ok, "{err}");
    let made: Value = serde_json::from_str(&out).expect("JSON");
    let token = made["token"].as_str().expect("{\"token\": …}").to_string();
    let id = made["id"].as_str().expect("id").to_string();
    // Made on router A, honoured by router B at once: the tokens are in the shared store.
    let (status, _) = call(
        &b,
        Some(&token),
        "PUT",
        "/v1/apps/team-api",
        Some(&app_spec("team-api", &backend)),
    );
    assert_eq!(status, 200);
    let (ok, listed, _) = cli(&b, ADMIN_TOKEN, &["tokens", "list"]);
    assert!(
        ok && listed.contains(&id) && listed.contains("apps:team-"),
        "{listed}"
    );
    // A token without the scope: the CLI says why and exits non-zero.
    let (ok, _, err) = cli(&a, &token, &["apps", "delete", "other"]);
    assert!(!ok && err.contains("apps:team-"), "{err}");
    // Both routers' writes in one log, read from either.
    let (_, page) = call(&a, Some(ADMIN_TOKEN), "GET", "/v1/audit?app=team-api", None);
    let records = page["records"].as_array().expect("records");
    assert_eq!(records.len(), 1, "{page}");
    assert_eq!(records[0]["token"], id.as_str());
    let (ok, _, err) = cli(&a, ADMIN_TOKEN, &["tokens", "revoke", &id]);
    assert!(ok, "{err}");
    eventually(
        Duration::from_secs(2),
        "revoked on the other router",
        || call(&b, Some(&token), "GET", "/v1/apps/team-api", None).0 == 401,
    );
}

#[test]
fn audit_records_are_shipped_to_logd_beside_the_access_logs() {
    let logd = LogdProcess::start_with(&[]);
    let router = RouterProcess::start_with(&[
        "--log-to",
        &logd.addr.to_string(),
        "--log-batch-delay-ms",
        "50",
    ]);
    let backend = Backend::start("b1");
    router.put_app("shipped", app_spec("shipped", &backend));
    eventually(Duration::from_secs(20), "the audit record at logd", || {
        logd.lines_of("_audit").iter().any(|line| {
            let record: Value = serde_json::from_str(line).unwrap_or_default();
            record["app"] == "shipped" && record["token"] == "anonymous" && record["status"] == 200
        })
    });
}
