//! The manual holds together: every relative link of README.md and docs/ names a file that
//! exists (and a heading of it, when it names one), and every app example in docs/ — the
//! files of docs/examples and the blocks fenced as "```json app" or "```toml app" — is an
//! app the admin API would take, as `switchyard apps check` says.

use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard_test_support as support;
use switchyard_test_support::RouterProcess;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown file under docs/.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a docs directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    let mut found = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut found);
    found
}

/// The targets of the page's Markdown links `[text](target)`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let tail = &rest[start + 2..];
            let Some(end) = tail.find(')') else { break };
            found.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    found
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_relative_link_of_the_manual_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a directory").join(path)
            };
            if !file.exists() {
                broken.push(format!("{}: {target}", page.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let headings = std::fs::read_to_string(&file).unwrap_or_default();
                let found = headings
                    .lines()
                    .filter_map(|line| line.strip_prefix('#'))
                    .map(|line| anchor(line.trim_start_matches('#')))
                    .any(|a| a == fragment);
                if !found {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The app examples of the manual: docs/examples' files, and each fenced block written
/// into `work`.
fn app_examples(work: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs/examples"))
        .expect("docs/examples")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        let mut block: Option<(String, Vec<&str>)> = None;
        for line in text.lines() {
            match &mut block {
                None => {
                    let fence = line.trim_start();
                    for kind in ["json", "toml"] {
                        if fence == format!("```{kind} app") {
                            block = Some((kind.to_string(), Vec::new()));
                        }
                    }
                }
                Some((kind, lines)) => {
                    if line.trim_start().starts_with("```") {
                        let path = work.join(format!("example-{}.{kind}", files.len()));
                        std::fs::write(&path, lines.join("\n")).expect("write the example");
                        files.push(path);
                        block = None;
                    } else {
                        lines.push(line);
                    }
                }
            }
        }
    }
    files
}

#[test]
fn every_app_example_of_the_manual_is_valid() {
    let work = tempfile::tempdir().expect("a directory");
    let files = app_examples(work.path());
    assert!(files.len() >= 3, "examples found: {files:?}");
    let output = Command::new(RouterProcess::binary())
        .args(["apps", "check"])
        .args(&files)
        .output()
        .expect("run switchyard apps check");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Checks JSON or TOML app files against a JSON Schema, as an editor would (Python's
/// jsonschema, draft 2020-12): one line per error.
const VALIDATE: &str = r#"
import json, sys, tomllib, jsonschema
schema = json.load(open(sys.argv[1]))
validator = jsonschema.Draft202012Validator(schema)
failed = False
for path in sys.argv[2:]:
    if path.endswith(".json"):
        app = json.load(open(path))
    else:
        app = tomllib.load(open(path, "rb"))
    for error in validator.iter_errors(app):
        failed = True
        print(f"{path}: {'/'.join(map(str, error.path))}: {error.message}")
sys.exit(1 if failed else 0)
"#;

fn validate(files: &[PathBuf]) -> std::process::Output {
    let schema = root().join("docs/reference/app.schema.json");
    Command::new("python3")
        .args(["-c", VALIDATE])
        .arg(&schema)
        .args(files)
        .output()
        .expect("python3 with jsonschema (scripts/test installs python3-jsonschema)")
}

#[test]
fn the_app_schema_takes_every_example_and_flags_a_typo() {
    let work = tempfile::tempdir().expect("a directory");
    let mut files = app_examples(work.path());
    // And an app as the API stores it and `apps get --output json` writes it back, `name`
    // included.
    let stored = switchyard_model::parse_app_spec(
        "shop",
        &serde_json::json!({
            "domains": ["shop.example.com"],
            "backends": ["10.0.0.5:8080=3"],
            "limits": {"requests_per_s": 10},
        }),
    )
    .expect("a valid app");
    let written_back = work.path().join("written-back.json");
    std::fs::write(&written_back, serde_json::to_string(&stored).expect("JSON"))
        .expect("write the file");
    files.push(written_back);
    let output = validate(&files);
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let typo = work.path().join("typo.json");
    std::fs::write(
        &typo,
        r#"{"domains": ["a.example"], "backends": ["10.0.0.1:80"], "healthcheck": {"path": "/"}, "balancer": "fastest"}"#,
    )
    .expect("write the file");
    let output = validate(&[typo]);
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("'healthcheck' was unexpected"), "{said}");
    assert!(said.contains("balancer: 'fastest'"), "{said}");
}

/// The README's quickstart block, as a shell script: its first ```sh block under
/// `## Quickstart`.
fn quickstart() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Quickstart\n")
        .nth(1)
        .expect("a Quickstart section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a sh block");
    block.to_string()
}

#[test]
fn the_readme_quickstart_runs_as_written() {
    let script = quickstart();
    assert!(script.contains("scripts/run &"), "{script}");
    // As pasted, but on free ports, with the binary the suite built (`scripts/run` is that
    // build, then `switchyard serve` with its defaults), in a directory of its own.
    let work = tempfile::tempdir().expect("a directory");
    let binary = RouterProcess::binary();
    let ports: Vec<(String, String)> = ["8080", "8081", "9001", "9002"]
        .into_iter()
        .map(|port| (port.to_string(), support::free_port().to_string()))
        .collect();
    let mut runnable = script.replace(
        "scripts/run &",
        "\"$SWITCHYARD_BIN\" serve --https off --access-log off --data-dir \"$WORK/data\" &",
    );
    runnable = runnable.replace("./target/release/switchyard", "\"$SWITCHYARD_BIN\"");
    for (port, free) in &ports {
        runnable = runnable.replace(&format!(":{port}"), &format!(":{free}"));
        runnable = runnable.replace(&format!(" {port} "), &format!(" {free} "));
    }
    let (http, admin) = (&ports[0].1, &ports[1].1);
    let wrapped = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n\
         export SWITCHYARD_HTTP=127.0.0.1:{http} SWITCHYARD_ADMIN=127.0.0.1:{admin}\n\
         cd \"$WORK\"\n{runnable}\n"
    );
    let output = Command::new("timeout")
        .args(["60", "bash", "-c", &wrapped])
        .env("SWITCHYARD_BIN", &binary)
        .env("WORK", work.path())
        .output()
        .expect("bash");
    let said = format!(
        "{}\n{}\n--- the script ---\n{wrapped}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    // The container answered through the router (http.server's listing of the directory),
    // and explain named the app.
    assert!(said.contains("Directory listing"), "{said}");
    assert!(said.contains("web"), "{said}");
}
