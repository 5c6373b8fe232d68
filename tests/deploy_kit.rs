//! The deploy kit (deploy/) checked by the tools that run it: the systemd unit by
//! `systemd-analyze verify`, the alert rules by `promtool check rules` and by their unit
//! tests (`promtool test rules`), and every metric the alert rules and the Grafana
//! dashboard name is one the router exports (its own reference, `switchyard reference`).
//! scripts/test installs systemd and promtool (Debian's prometheus package).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use switchyard_test_support::RouterProcess;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} (scripts/test installs it): {e}"))
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_systemd_units_verify() {
    let router = std::fs::read_to_string(deploy().join("systemd/switchyard.service"))
        .expect("deploy/systemd/switchyard.service");
    assert!(router.contains("ExecReload=") && router.contains("--quit-predecessor"));
    for name in ["switchyard.service", "switchyard-logd.service"] {
        // Verified as installed, with the binary where the unit names it: this build's.
        let unit = std::fs::read_to_string(deploy().join("systemd").join(name)).expect(name);
        let binary = RouterProcess::binary();
        let installed = unit.replace("/usr/bin/switchyard", binary.to_str().expect("a path"));
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join(name);
        std::fs::write(&path, installed).expect("write the unit");
        let output = run(
            "systemd-analyze",
            &["verify", path.to_str().expect("a path")],
            dir.path(),
        );
        // Unknown keys are only warned about: any word from the tool about this unit is a
        // failure here (the units it names, such as redis-server's, are not ours to judge).
        let said = said(&output);
        assert!(
            output.status.success() && !said.lines().any(|line| line.contains("switchyard")),
            "systemd-analyze verify {name}: {said}"
        );
    }
}

/// promtool: on the PATH, or where scripts/test unpacks Debian's package.
fn promtool() -> String {
    let unpacked = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/promtool/usr/bin/promtool");
    if unpacked.exists() {
        return unpacked.display().to_string();
    }
    "promtool".to_string()
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let dir = deploy().join("prometheus");
    let promtool = promtool();
    let checked = run(
        &promtool,
        &["check", "rules", "switchyard-alerts.yml"],
        &dir,
    );
    assert!(checked.status.success(), "{}", said(&checked));
    let tested = run(
        &promtool,
        &["test", "rules", "switchyard-alerts.test.yml"],
        &dir,
    );
    assert!(tested.status.success(), "{}", said(&tested));
}

/// Every metric name the router exports, from the reference it writes.
fn exported_metrics() -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("a directory");
    let output = run(
        RouterProcess::binary().to_str().expect("a path"),
        &["reference", dir.path().to_str().expect("a path")],
        dir.path(),
    );
    assert!(output.status.success(), "{}", said(&output));
    let reference = std::fs::read_to_string(dir.path().join("metrics.md")).expect("metrics.md");
    reference
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split('`').next())
        .map(str::to_string)
        .collect()
}

/// The `switchyard_…` names in a query; a histogram's series name its family.
fn named_metrics(query: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = query;
    while let Some(start) = rest.find("switchyard_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(family.to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_dashboard_and_the_alerts_name_only_exported_metrics() {
    let exported = exported_metrics();
    assert!(
        exported.contains("switchyard_requests_total"),
        "{exported:?}"
    );
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/switchyard.json"))
            .expect("deploy/grafana/switchyard.json"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut queried = BTreeSet::new();
    for panel in panels {
        let targets = panel["targets"].as_array().expect("a panel's queries");
        assert!(
            !targets.is_empty(),
            "panel {} queries nothing",
            panel["title"]
        );
        for target in targets {
            let expr = target["expr"].as_str().expect("a PromQL query");
            let named = named_metrics(expr);
            assert!(!named.is_empty(), "{expr} names no metric of ours");
            queried.extend(named);
        }
    }
    let rules = std::fs::read_to_string(deploy().join("prometheus/switchyard-alerts.yml"))
        .expect("the alert rules");
    let alerted = named_metrics(&rules);
    let unknown: Vec<_> = queried
        .union(&alerted)
        .filter(|name| !exported.contains(*name))
        .collect();
    assert!(
        unknown.is_empty(),
        "not exported by the router: {unknown:?}"
    );
}
