//! The admin API refuses bad input with a JSON error naming the field and stores nothing;
//! auth and start-up checks protect it; the CLI drives it with readable output.

use switchyard_test_support as support;

use std::net::SocketAddr;
use std::process::Command;

use serde_json::{json, Value};
use support::pki::Ca;
use support::{Backend, RedisServer, RouterProcess};

/// `PUT /v1/apps/{name}` as a browser sends it (with `Origin`), or as a tool does (without).
fn put_app_from(
    router: &RouterProcess,
    name: &str,
    body: &Value,
    origin: Option<&str>,
) -> (u16, Value) {
    let body = body.to_string();
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    let response = support::request(
        router.admin,
        &format!(
            "PUT /v1/apps/{name} HTTP/1.1\r\nHost: admin\r\n{origin}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .expect("admin answers");
    (response.status, response.json())
}

#[test]
fn the_dashboard_writes_only_when_allowed_and_applied_changes_are_listed() {
    let backend = Backend::start("shop");
    let spec =
        json!({"domains": ["shop.test", "www.shop.test"], "backends": [backend.addr.to_string()]});
    let read_only = RouterProcess::start();
    assert_eq!(
        read_only.admin_call("GET", "/v1/ui/settings", None),
        (200, json!({"writes": false}))
    );
    let (status, refused) = put_app_from(&read_only, "shop", &spec, Some("http://admin.example"));
    assert_eq!(
        (status, refused["field"].clone()),
        (403, json!("origin")),
        "{refused}"
    );
    assert_eq!(
        read_only.admin_call("GET", "/v1/apps/shop", None).0,
        404,
        "nothing stored"
    );
    let (status, stored) = put_app_from(&read_only, "shop", &spec, None);
    assert_eq!(status, 200, "a tool without Origin writes: {stored}");
    assert_eq!(read_only.get("www.shop.test", "/").status, 200);

    // The change the follower applied, newest first, with its domains and timing.
    read_only.admin_call("DELETE", "/v1/apps/shop", None);
    let (status, log) = read_only.admin_call("GET", "/v1/changes?limit=2", None);
    assert_eq!(status, 200, "{log}");
    let changes = log["changes"].as_array().expect("changes");
    assert_eq!(changes.len(), 2, "{log}");
    assert_eq!(
        (changes[0]["kind"].clone(), changes[0]["subject"].clone()),
        (json!("app"), json!("shop"))
    );
    let mut domains: Vec<&str> = changes[1]["domains"]
        .as_array()
        .expect("the put's domains")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    domains.sort();
    assert_eq!(domains, ["shop.test", "www.shop.test"], "{log}");
    assert!(changes[0]["at_unix_ms"].as_u64() >= changes[1]["at_unix_ms"].as_u64());
    assert!(changes[0]["apply_us"].is_u64());
    assert_eq!(log["kept_at_most"], 500);
    for (path, field) in [
        ("/v1/changes?limit=0", "limit"),
        ("/v1/changes?limit=5000", "limit"),
        ("/v1/certs?order=size", "order"),
        ("/v1/certs?order=expiry&limit=5000", "limit"),
        ("/v1/acme?status=failed,lost", "status"),
    ] {
        let (status, answer) = read_only.admin_call("GET", path, None);
        assert_eq!(
            (status, answer["field"].clone()),
            (400, json!(field)),
            "{path}: {answer}"
        );
    }

    let writable = RouterProcess::start_with(&["--admin-ui-writes", "on"]);
    assert_eq!(
        writable.admin_call("GET", "/v1/ui/settings", None).1,
        json!({"writes": true})
    );
    let (status, stored) = put_app_from(&writable, "shop", &spec, Some("http://admin.example"));
    assert_eq!(status, 200, "{stored}");
    let (_, refusal) = RouterProcess::refused_start(["--admin-ui-writes", "sometimes"]);
    assert!(
        refusal.contains("'sometimes' is not one of `off`, `on`"),
        "{refusal}"
    );
}

/// The domains of every certificate, a page of `page` at a time, in expiry order.
fn listed_by_expiry(router: &RouterProcess, page: usize) -> Vec<String> {
    let mut domains = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(after) => format!("/v1/certs?order=expiry&limit={page}&after={after}"),
            None => format!("/v1/certs?order=expiry&limit={page}"),
        };
        let (status, answer) = router.admin_call("GET", &path.replace('|', "%7C"), None);
        assert_eq!(status, 200, "{answer}");
        for cert in answer["certs"].as_array().expect("certs") {
            assert!(
                cert.get("acme").is_some_and(Value::is_null),
                "uploaded, no ACME: {cert}"
            );
            domains.push(cert["domain"].as_str().expect("domain").to_string());
        }
        match answer["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return domains,
        }
    }
}

#[test]
fn certificates_list_by_expiry_on_both_stores_and_after_an_upgrade() {
    let ca = Ca::root("Expiry Root");
    let redis = RedisServer::start();
    let embedded = RouterProcess::start();
    let fleet = RouterProcess::start_with(&["--store", &redis.url()]);
    for router in [&embedded, &fleet] {
        for (domain, days) in [
            ("d50.test", 50),
            ("d5.test", 5),
            ("d30.test", 30),
            ("d90.test", 90),
            ("d10.test", 10),
        ] {
            router.store_cert(domain, &ca.issue(&[domain], -1, days));
        }
        assert_eq!(
            listed_by_expiry(router, 2),
            ["d5.test", "d10.test", "d30.test", "d50.test", "d90.test"]
        );
        // Renewed: it moves to its new place, its old one is gone; deleted: it is gone.
        router.store_cert("d5.test", &ca.issue(&["d5.test"], -1, 120));
        assert_eq!(
            router.admin_call("DELETE", "/v1/certs/d30.test", None).0,
            204
        );
        assert_eq!(
            listed_by_expiry(router, 3),
            ["d10.test", "d50.test", "d90.test", "d5.test"]
        );
    }

    // Certificates stored by a router older than the index: the next router indexes them.
    let mut connection = redis.connection().expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("switchyard:certexpiry:*")
        .query(&mut connection)
        .expect("keys");
    assert_eq!(keys.len(), 4);
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .arg("switchyard:certs:expiry")
        .query(&mut connection)
        .expect("drop the index");
    let upgraded = RouterProcess::start_with(&["--store", &redis.url()]);
    assert_eq!(
        listed_by_expiry(&upgraded, 10),
        ["d10.test", "d50.test", "d90.test", "d5.test"]
    );
}

#[test]
fn every_validation_error_names_the_field_and_stores_nothing() {
    let router = RouterProcess::start();
    let cases: &[(&str, &str, &str)] = &[
        ("Bad_Name", r#"{"domains": ["a.test"]}"#, "name"),
        ("bad-json", r#"{"domains": ["a.test"]"#, "body"),
        ("not-object", r#"["a.test"]"#, ""),
        (
            "unknown-field",
            r#"{"domains": ["a.test"], "backend": []}"#,
            "backend",
        ),
        (
            "bad-domain",
            r#"{"domains": ["ok.test", "bad..test"]}"#,
            "domains[1]",
        ),
        ("bad-wildcard", r#"{"domains": ["*.test"]}"#, "domains[0]"),
        (
            "bad-backend",
            r#"{"domains": ["b.test"], "backends": ["127.0.0.1:80", "db.internal:99999"]}"#,
            "backends[1]",
        ),
        (
            "bad-weight",
            r#"{"backends": [{"address": "127.0.0.1:80", "weight": 1000}]}"#,
            "backends[0].weight",
        ),
        ("bad-balancer", r#"{"balancer": "fastest"}"#, "balancer"),
        (
            "bad-check",
            r#"{"health_check": {"path": "no-slash"}}"#,
            "health_check.path",
        ),
    ];
    for (name, body, field) in cases {
        let (status, error) = router.admin_call("PUT", &format!("/v1/apps/{name}"), Some(body));
        assert_eq!(status, 400, "{name}: {error}");
        assert!(
            error["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{name}: {error}"
        );
        if field.is_empty() {
            assert!(
                error.get("field").is_none() || error["field"] == "",
                "{name}: {error}"
            );
        } else {
            assert_eq!(error["field"], *field, "{name}: {error}");
        }
    }
    let (status, page) = router.admin_call("GET", "/v1/apps", None);
    assert_eq!(status, 200);
    assert_eq!(page["apps"], json!([]), "nothing was stored");
    for domain in ["a.test", "ok.test", "b.test"] {
        assert_eq!(
            router.get(domain, "/").status,
            404,
            "{domain} routes nowhere"
        );
    }
}

#[test]
fn wrong_methods_paths_and_oversized_bodies_get_json_errors() {
    let router = RouterProcess::start();
    let (status, error) = router.admin_call("POST", "/v1/apps/x", Some("{}"));
    assert_eq!(
        (status, error["field"].as_str()),
        (405, Some("method")),
        "{error}"
    );
    let (status, error) = router.admin_call("GET", "/v2/nothing", None);
    assert_eq!(
        (status, error["field"].as_str()),
        (404, Some("path")),
        "{error}"
    );
    let huge = format!(r#"{{"domains": ["{}.test"]}}"#, "a".repeat(2 * 1024 * 1024));
    let (status, error) = router.admin_call("PUT", "/v1/apps/big", Some(&huge));
    assert_eq!(
        (status, error["field"].as_str()),
        (413, Some("body")),
        "{error}"
    );
    assert_eq!(
        router.admin_call("GET", "/v1/apps/big", None).0,
        404,
        "nothing stored"
    );
    // Queries the HTTP layer cannot parse get the same JSON shape.
    for path in ["/v1/apps?limit=many", "/v1/certs?limit=-1"] {
        let (status, error) = router.admin_call("GET", path, None);
        assert_eq!(
            (status, error["field"].as_str()),
            (400, Some("request")),
            "{path}: {error}"
        );
        assert!(error["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
}

#[test]
fn the_openapi_document_describes_every_route_that_answers() {
    let router = RouterProcess::start_with(&["--admin-token", "t0ken-for-openapi"]);
    let document = support::get(router.admin, "admin", "/v1/openapi.json").expect("response");
    assert_eq!(document.status, 200, "served without the token");
    let document = document.json();
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().expect("paths");
    let mut operations = 0;
    for (path, item) in paths {
        let concrete = path
            .replace("{name}", "shop")
            .replace("{domain}", "shop.test")
            .replace("{id}", "0123456789abcdef");
        for method in ["get", "put", "post", "delete"] {
            let Some(operation) = item.get(method) else {
                continue;
            };
            operations += 1;
            let (status, answer) = router.admin_call(&method.to_uppercase(), &concrete, Some("{}"));
            assert!(
                operation["responses"].get(status.to_string()).is_some(),
                "{method} {path} answered {status}, which the document does not list: {answer}"
            );
            assert_ne!(
                answer["error"], "no such admin endpoint",
                "{method} {path} is not routed"
            );
        }
    }
    // Every method of every route in crates/admin's router.
    assert_eq!(operations, 34, "operations documented");
}

#[test]
fn crud_round_trips_and_conflicts_are_refused() {
    let router = RouterProcess::start();
    let stored = router.put_app(
        "one",
        json!({"domains": ["One.Test"], "backends": ["127.0.0.1:9001"]}),
    );
    assert_eq!(
        stored["domains"],
        json!(["one.test"]),
        "domains are stored normalised"
    );
    assert_eq!(stored["balancer"], "round_robin");

    let (status, conflict) = router.admin_call(
        "PUT",
        "/v1/apps/two",
        Some(r#"{"domains": ["two.test", "one.test"]}"#),
    );
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["field"], "domains");
    assert_eq!(
        router.admin_call("GET", "/v1/apps/two", None).0,
        404,
        "the refused app was not stored"
    );

    let (status, scaled) = router.admin_call(
        "PUT",
        "/v1/apps/one/backends",
        Some(r#"{"backends": ["127.0.0.1:9002", "127.0.0.1:9003"]}"#),
    );
    assert_eq!(status, 200);
    assert_eq!(scaled["backends"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        scaled["domains"],
        json!(["one.test"]),
        "scaling keeps the domains"
    );
    let (status, error) = router.admin_call(
        "PUT",
        "/v1/apps/ghost/backends",
        Some(r#"{"backends": []}"#),
    );
    assert_eq!((status, error["field"].as_str()), (404, Some("name")));
    let (status, error) = router.admin_call(
        "PUT",
        "/v1/apps/one/backends",
        Some(r#"{"backends": ["nope"]}"#),
    );
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("backends[0]"))
    );

    assert_eq!(router.admin_call("DELETE", "/v1/apps/one", None).0, 204);
    assert_eq!(router.admin_call("DELETE", "/v1/apps/one", None).0, 404);
    assert_eq!(router.admin_call("GET", "/v1/apps/one", None).0, 404);
    // The domain is free again once its app is gone.
    router.put_app("two", json!({"domains": ["one.test"]}));
}

#[test]
fn listing_pages_through_many_apps() {
    let router = RouterProcess::start();
    for i in 0..25 {
        router.put_app(
            &format!("app-{i:02}"),
            json!({"domains": [format!("app{i}.test")]}),
        );
    }
    let (status, first) = router.admin_call("GET", "/v1/apps?limit=10", None);
    assert_eq!(status, 200);
    assert_eq!(first["apps"].as_array().map(Vec::len), Some(10));
    assert_eq!(first["next_after"], "app-09");
    let (_, last) = router.admin_call("GET", "/v1/apps?limit=10&after=app-19", None);
    assert_eq!(last["apps"].as_array().map(Vec::len), Some(5));
    assert!(last["next_after"].is_null());
    let (status, error) = router.admin_call("GET", "/v1/apps?limit=0", None);
    assert_eq!((status, error["field"].as_str()), (400, Some("limit")));
}

#[test]
fn a_configured_token_guards_everything_but_healthz() {
    let router = RouterProcess::start_with(&["--admin-token", "s3cret-token"]);
    let (status, _) = router.admin_call("GET", "/v1/apps", None);
    assert_eq!(status, 200, "the harness sends the token");
    for path in ["/v1/apps", "/metrics", "/v1/apps/x"] {
        let unauthenticated = support::get(router.admin, "admin", path).expect("response");
        assert_eq!(unauthenticated.status, 401, "{path}");
        assert_eq!(unauthenticated.json()["field"], "authorization");
    }
    let wrong = support::request(
        router.admin,
        "GET /v1/apps HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s3cret-tokeX\r\nConnection: close\r\n\r\n",
    )
    .expect("response");
    assert_eq!(wrong.status, 401);
    assert_eq!(
        support::get(router.admin, "admin", "/healthz")
            .expect("response")
            .status,
        200
    );
}

#[test]
fn the_metrics_listener_serves_metrics_and_health_without_the_token_and_nothing_else() {
    let metrics_port = support::free_port();
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let address = metrics.to_string();
    let router =
        RouterProcess::start_with(&["--admin-token", "s3cret-token", "--metrics", &address]);
    let backend = support::Backend::start("web");
    router.put_app(
        "shop",
        json!({"domains": ["shop.test"], "backends": [backend.addr.to_string()]}),
    );
    assert_eq!(router.get("shop.test", "/").status, 200);
    let scraped = support::get(metrics, "scraper", "/metrics").expect("a scrape");
    assert_eq!(scraped.status, 200);
    assert!(
        scraped
            .text()
            .contains("switchyard_requests_total{app=\"shop\",class=\"2xx\"}"),
        "{}",
        scraped.text()
    );
    let one_app = support::get(metrics, "scraper", "/metrics?app=shop").expect("a scrape");
    assert_eq!(one_app.status, 200);
    assert_eq!(
        support::get(metrics, "scraper", "/healthz")
            .expect("response")
            .status,
        200
    );
    let ready = support::get(metrics, "balancer", "/readyz").expect("response");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(ready.json()["status"], "ready");
    assert_eq!(ready.json()["store"], "embedded");
    // Nothing of the admin API, with or without the token.
    for path in ["/v1/apps", "/v1/apps/shop", "/ui/", "/v1/openapi.json"] {
        let refused = support::request(
            metrics,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s3cret-token\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
        .expect("response");
        assert_eq!(refused.status, 404, "{path} on the metrics listener");
    }
    let delete = support::request(
        metrics,
        "DELETE /v1/apps/shop HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s3cret-token\r\n\
         Connection: close\r\n\r\n",
    )
    .expect("response");
    assert_eq!(delete.status, 404);
    // The admin listener keeps its token for /metrics.
    let unauthenticated = support::get(router.admin, "admin", "/metrics").expect("response");
    assert_eq!(unauthenticated.status, 401);
    assert_eq!(
        router.get("shop.test", "/").status,
        200,
        "the app is still there"
    );
}

#[test]
fn start_up_refuses_unsafe_or_invalid_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (public_admin, stderr) = RouterProcess::refused_start([
        "--admin".as_ref(),
        "0.0.0.0:0".as_ref(),
        "--http".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--data-dir".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(!public_admin.success());
    assert!(stderr.contains("token"), "{stderr}");

    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        "http = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nthreads = \"many\"\n",
    )
    .expect("write config");
    let (bad_config, stderr) =
        RouterProcess::refused_start(["--config".as_ref(), config.as_os_str()]);
    assert!(!bad_config.success());
    assert!(
        stderr.contains("line 3"),
        "the error names the line: {stderr}"
    );
}

#[test]
fn the_environment_overrides_the_config_file() {
    let backend = Backend::start("configured");
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, admin, env_admin) = (
        support::free_port(),
        support::free_port(),
        support::free_port(),
    );
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        format!("http = \"127.0.0.1:{http}\"\nhttps = \"off\"\nadmin = \"127.0.0.1:{admin}\"\naccess_log = \"off\"\nshutdown_grace_s = 0\n"),
    )
    .expect("write config");
    let mut child = Command::new(RouterProcess::binary())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("SWITCHYARD_ADMIN", format!("127.0.0.1:{env_admin}"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start switchyard");
    let admin_addr = std::net::SocketAddr::from(([127, 0, 0, 1], env_admin));
    support::eventually(
        std::time::Duration::from_secs(10),
        "the admin API on the env address",
        || support::get(admin_addr, "a", "/healthz").is_ok_and(|r| r.status == 200),
    );
    let body = json!({"domains": ["cfg.test"], "backends": [backend.addr.to_string()]}).to_string();
    let put = support::request(
        admin_addr,
        &format!("PUT /v1/apps/cfg HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()),
    )
    .expect("put");
    assert_eq!(put.status, 200);
    let http_addr = std::net::SocketAddr::from(([127, 0, 0, 1], http));
    assert_eq!(
        support::get(http_addr, "cfg.test", "/")
            .expect("proxied")
            .status,
        200,
        "http from the file"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_cli_manages_apps_with_readable_output_and_exit_codes() {
    let router = RouterProcess::start();
    let backend = Backend::start("cli");
    let admin = router.admin.to_string();
    let cli = |args: &[&str]| {
        let output = Command::new(RouterProcess::binary())
            .arg("apps")
            .args(["--admin", &admin])
            .args(args)
            .output()
            .expect("run switchyard apps");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let backend_addr = backend.addr.to_string();
    let (ok, out, err) = cli(&["put", "cli-app", "-d", "cli.test", "-b", &backend_addr]);
    assert!(ok, "{err}");
    assert!(
        out.contains("app cli-app stored") && out.contains("cli.test"),
        "{out}"
    );
    assert_eq!(router.get("cli.test", "/").status, 200);

    let (ok, out, _) = cli(&["list"]);
    assert!(
        ok && out.contains("cli-app") && out.contains("1 apps"),
        "{out}"
    );
    let (ok, out, _) = cli(&["get", "cli-app", "--json"]);
    assert!(ok);
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(json["domains"], json!(["cli.test"]));

    let weighted = format!("{backend_addr}=5");
    let (ok, out, err) = cli(&["scale", "cli-app", "-b", &weighted]);
    assert!(ok, "{err}");
    assert!(out.contains("weight 5"), "{out}");

    let (ok, _, err) = cli(&["put", "cli-app", "-d", "bad..test"]);
    assert!(!ok, "an invalid domain fails the command");
    assert!(
        err.contains("domains[0]") && err.contains("HTTP 400"),
        "{err}"
    );
    let (ok, _, err) = cli(&["get", "ghost"]);
    assert!(!ok && err.contains("does not exist"), "{err}");

    let (ok, out, _) = cli(&["delete", "cli-app"]);
    assert!(ok && out.contains("deleted"), "{out}");
    assert_eq!(router.get("cli.test", "/").status, 404);

    let (ok, _, err) = Command::new(RouterProcess::binary())
        .args(["apps", "--admin", "127.0.0.1:1", "list"])
        .output()
        .map(|o| {
            (
                o.status.success(),
                (),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .expect("run");
    assert!(!ok && err.contains("cannot reach"), "{err}");
}

#[test]
fn the_token_can_come_from_a_systemd_credential() {
    let credentials = tempfile::tempdir().expect("temp dir");
    std::fs::write(credentials.path().join("admin_token"), "from-credential\n").expect("write");
    let directory = credentials.path().to_str().expect("utf-8 path");
    let router = RouterProcess::start_with_env(&[], &[("CREDENTIALS_DIRECTORY", directory)]);
    let call = |token: &str| {
        support::request(
            router.admin,
            &format!(
                "GET /v1/apps HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
        .expect("response")
        .status
    };
    assert_eq!(
        call("from-credential"),
        200,
        "the line break is not part of it"
    );
    assert_eq!(call("other"), 401);
}

/// An `If-Match` write on `router`'s app `name`: the status and the answer's ETag.
fn write_if_match(
    router: &RouterProcess,
    method: &str,
    path: &str,
    if_match: &str,
    body: &str,
) -> (u16, Option<String>, serde_json::Value) {
    let response = support::request(
        router.admin,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: a\r\nIf-Match: {if_match}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .expect("response");
    let tag = response.header("etag").map(str::to_string);
    let json = serde_json::from_slice(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status, tag, json)
}

#[test]
fn writes_with_if_match_never_overwrite_a_change_they_did_not_see() {
    let router = RouterProcess::start();
    let spec = |retries: u8| json!({"domains": ["tagged.test"], "retries": retries}).to_string();
    let (status, _) = router.admin_call("PUT", "/v1/apps/tagged", Some(&spec(1)));
    assert_eq!(status, 200);
    let read = support::get(router.admin, "admin", "/v1/apps/tagged").expect("response");
    let first = read.header("etag").expect("an ETag").to_string();
    assert!(first.starts_with('"') && first.len() == 34, "{first}");

    // Another writer moves the app on; a write made from the first read is refused.
    let (status, second, _) = write_if_match(&router, "PUT", "/v1/apps/tagged", &first, &spec(2));
    assert_eq!(status, 200);
    let second = second.expect("the new ETag");
    assert_ne!(second, first);
    let (status, _, refused) = write_if_match(&router, "PUT", "/v1/apps/tagged", &first, &spec(3));
    assert_eq!(
        (status, &refused["field"]),
        (412, &json!("if-match")),
        "{refused}"
    );
    let backends = r#"{"backends": ["127.0.0.1:9"]}"#;
    let path = "/v1/apps/tagged/backends";
    assert_eq!(
        write_if_match(&router, "PUT", path, &first, backends).0,
        412
    );
    assert_eq!(
        write_if_match(&router, "DELETE", "/v1/apps/tagged", &first, "").0,
        412
    );
    assert_eq!(
        router.admin_call("GET", "/v1/apps/tagged", None).1["retries"],
        2
    );

    // The current tag, or `*`, lets each write through.
    let (status, third, _) = write_if_match(&router, "PUT", path, &second, backends);
    assert_eq!(status, 200);
    let third = third.expect("the new ETag");
    assert_eq!(
        write_if_match(&router, "PUT", "/v1/apps/tagged", "*", &spec(4)).0,
        200
    );
    assert_eq!(
        write_if_match(&router, "DELETE", "/v1/apps/tagged", &third, "").0,
        412
    );
    let current = support::get(router.admin, "admin", "/v1/apps/tagged").expect("response");
    let current = current.header("etag").expect("an ETag").to_string();
    assert_eq!(
        write_if_match(&router, "DELETE", "/v1/apps/tagged", &current, "").0,
        204
    );
    // No app, no match: `*` does not create one.
    assert_eq!(
        write_if_match(&router, "PUT", "/v1/apps/tagged", "*", &spec(5)).0,
        412
    );
    assert_eq!(router.admin_call("GET", "/v1/apps/tagged", None).0, 404);
}

#[test]
fn certificates_carry_an_etag_and_if_match_guards_their_writes() {
    let router = RouterProcess::start();
    let ca = Ca::root("Tagged Root");
    let (first, second) = (
        ca.issue(&["tagged.test"], -1, 30),
        ca.issue(&["tagged.test"], -1, 60),
    );
    let upload = |cert: &support::pki::Issued| {
        json!({"cert_pem": cert.cert_pem, "key_pem": cert.key_pem}).to_string()
    };
    router.store_cert("tagged.test", &first);
    let read = support::get(router.admin, "admin", "/v1/certs/tagged.test").expect("response");
    let old = read.header("etag").expect("an ETag").to_string();
    // Renewed meanwhile by another writer: a write or delete made from the first read loses.
    let path = "/v1/certs/tagged.test";
    let (status, renewed, _) = write_if_match(&router, "PUT", path, &old, &upload(&second));
    assert_eq!(status, 200);
    let renewed = renewed.expect("the new ETag");
    assert_ne!(renewed, old);
    let (status, _, refused) = write_if_match(&router, "PUT", path, &old, &upload(&first));
    assert_eq!(
        (status, &refused["field"]),
        (412, &json!("if-match")),
        "{refused}"
    );
    assert_eq!(write_if_match(&router, "DELETE", path, &old, "").0, 412);
    let (_, shown) = router.admin_call("GET", path, None);
    let second_sha256: String = second
        .fingerprint
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(shown["sha256"], json!(second_sha256), "{shown}");
    assert_eq!(write_if_match(&router, "DELETE", path, &renewed, "").0, 204);
}
