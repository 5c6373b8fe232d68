//! `switchyard apps sync FILE|DIR [--prune] [--dry-run]`: the plan (`PUT /v1/apps?dry_run`),
//! printed as `terraform plan` prints one, then applied with the plan's revision as
//! `If-Match`, so that what is applied is what was shown: another writer in between (a
//! second sync, a deploy) makes the apply refuse with 412 rather than interleave.

use std::path::Path;
use std::time::Instant;

use serde_json::Value;

use super::files::{line_problem, read_app, read_text};
use super::AdminClient;

/// Runs a sync: the summary to print, and the API's last answer.
pub(super) fn sync_apps(
    client: &AdminClient,
    path: &str,
    prune: bool,
    dry_run: bool,
) -> Result<(String, Value), String> {
    let lines = desired_lines(path)?;
    let started = Instant::now();
    let query = format!("/v1/apps?prune={prune}&dry_run=true");
    let plan =
        answered(client.send_with_progress("comparing", "PUT", &query, lines.clone(), None))?;
    let mut summary = describe_plan(&plan);
    let changes = ["create", "update", "delete"]
        .iter()
        .map(|kind| plan[*kind].as_array().map_or(0, Vec::len))
        .sum::<usize>();
    if changes == 0 {
        summary.push_str("nothing to change: the store already matches");
        return Ok((summary, plan));
    }
    if dry_run {
        summary.push_str("dry run: nothing applied");
        return Ok((summary, plan));
    }
    let revision = plan["revision"].as_str().unwrap_or_default().to_string();
    let query = format!("/v1/apps?prune={prune}");
    let applied =
        answered(client.send_with_progress("syncing", "PUT", &query, lines, Some(&revision)))?;
    summary.push_str(&format!(
        "applied: {changes} writes in {} batches, {:.1} s",
        applied["batches"].as_u64().unwrap_or(0),
        started.elapsed().as_secs_f64()
    ));
    Ok((summary, applied))
}

/// The answer of a 200, or the API's refusal (each bad line of a 422 named).
fn answered(sent: Result<(u16, Value), String>) -> Result<Value, String> {
    let (status, answer) = sent?;
    if status == 200 {
        return Ok(answer);
    }
    let mut message = String::new();
    for line in answer["lines"].as_array().into_iter().flatten() {
        message.push_str(&line_problem(line));
    }
    let field = answer["field"]
        .as_str()
        .map(|f| format!(" ({f})"))
        .unwrap_or_default();
    message.push_str(&format!(
        "{}{field}, HTTP {status}",
        answer["error"].as_str().unwrap_or("the sync was refused")
    ));
    Err(message)
}

/// `+ create`, `~ update (fields)`, `- delete` lines and the counts.
fn describe_plan(plan: &Value) -> String {
    let mut text = String::new();
    let names = |kind: &str| plan[kind].as_array().cloned().unwrap_or_default();
    for name in names("delete") {
        text.push_str(&format!("- {}\n", name.as_str().unwrap_or("")));
    }
    for update in names("update") {
        let fields: Vec<&str> = update["fields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        text.push_str(&format!(
            "~ {} ({})\n",
            update["app"].as_str().unwrap_or(""),
            fields.join(", ")
        ));
    }
    for name in names("create") {
        text.push_str(&format!("+ {}\n", name.as_str().unwrap_or("")));
    }
    text.push_str(&format!(
        "plan: {} to create, {} to update, {} to delete, {} unchanged{}\n",
        names("create").len(),
        names("update").len(),
        names("delete").len(),
        plan["unchanged"].as_u64().unwrap_or(0),
        match plan["not_in_desired"].as_u64().unwrap_or(0) {
            0 => String::new(),
            kept => format!(", {kept} stored apps not in the set kept (--prune deletes them)"),
        }
    ));
    text
}

/// The desired set as JSON lines: a file as it is (JSON lines or an array), or a
/// directory's app files (`*.json`, `*.toml`, each one app, named by its `name` or its file
/// name), in name order.
fn desired_lines(path: &str) -> Result<String, String> {
    let dir = Path::new(path);
    if !dir.is_dir() {
        return read_text(path);
    }
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{path}: {e}"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|file| {
            matches!(
                file.extension().and_then(|e| e.to_str()),
                Some("json" | "toml")
            )
        })
        .collect();
    files.sort();
    let mut lines = String::new();
    for file in files {
        let shown = file.display().to_string();
        let mut app = read_app(&shown)?;
        if app.get("name").is_none() {
            let stem = file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            app["name"] = Value::String(stem);
        }
        lines.push_str(&app.to_string());
        lines.push('\n');
    }
    Ok(lines)
}
