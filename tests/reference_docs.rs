//! The references in docs/reference are the code's own: the binary writes them again here
//! and each must equal the committed copy (scripts/docs regenerates them).

use std::path::Path;
use std::process::Command;

use switchyard_test_support::RouterProcess;

#[test]
fn the_committed_references_are_what_the_code_says() {
    let fresh = tempfile::tempdir().expect("a directory");
    let output = Command::new(RouterProcess::binary())
        .args(["reference", fresh.path().to_str().expect("a path")])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("run switchyard reference");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference");
    for name in [
        "settings.md",
        "metrics.md",
        "stages.md",
        "refusals.md",
        "cli.md",
        "app.schema.json",
        "openapi.json",
    ] {
        let made = std::fs::read_to_string(fresh.path().join(name)).expect("a reference made");
        let kept = std::fs::read_to_string(committed.join(name)).unwrap_or_default();
        if made != kept {
            let first = made
                .lines()
                .zip(kept.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(made.lines().count().min(kept.lines().count()));
            panic!(
                "docs/reference/{name} differs from what the code says (first at line {}): \
                 run scripts/docs and commit the result",
                first + 1
            );
        }
    }
}

/// The router's answer to `GET path`, which must equal docs/reference/`name`.
fn served_as_committed(path: &str, name: &str) -> serde_json::Value {
    let router = RouterProcess::start();
    let (status, served) = router.admin_call("GET", path, None);
    assert_eq!(status, 200);
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs/reference")
                .join(name),
        )
        .expect("a committed reference"),
    )
    .expect("JSON");
    assert_eq!(served, committed, "{path} is not docs/reference/{name}");
    committed
}

#[test]
fn the_router_serves_the_app_schema_that_is_committed() {
    let committed = served_as_committed("/v1/schema/app.json", "app.schema.json");
    let printed = Command::new(RouterProcess::binary())
        .args(["apps", "schema"])
        .output()
        .expect("switchyard apps schema");
    let printed: serde_json::Value =
        serde_json::from_slice(&printed.stdout).expect("the schema printed");
    assert_eq!(printed, committed);
}

#[test]
fn the_router_serves_the_openapi_document_that_is_committed() {
    served_as_committed("/v1/openapi.json", "openapi.json");
}

/// ARCHITECTURE.md's stage table is the generated reference's, row for row: the order is
/// written once, in the stage list.
#[test]
fn the_architecture_page_shows_the_stage_list_as_generated() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| line.starts_with('|'))
            .map(str::to_string)
            .collect()
    };
    let reference = std::fs::read_to_string(root.join("docs/reference/stages.md"))
        .expect("docs/reference/stages.md");
    let architecture =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = architecture
        .split("<!-- stages: from docs/reference/stages.md -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- /stages -->").next())
        .expect("ARCHITECTURE.md marks its stage table");
    let expected = table(&reference);
    assert!(expected.len() > 2, "the reference has a table");
    assert_eq!(
        table(section),
        expected,
        "ARCHITECTURE.md's stage table differs from docs/reference/stages.md: copy it over"
    );
}
