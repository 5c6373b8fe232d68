//! Apps as files: `apps put -f`, `apps get --output`, `apps edit` and `apps import`. The
//! API speaks JSON; TOML is read and written here by converting to and from the same JSON.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Map, Value};

use super::AdminClient;

/// Reads an app from `path` (`-`: stdin): JSON, or TOML when it is not JSON.
pub(super) fn read_app(path: &str) -> Result<Value, String> {
    let text = read_text(path)?;
    parse_app(&text).map_err(|e| format!("{path}: {e}"))
}

/// Checks each app file as the admin API would check its body (`apps check`): a summary
/// of the files found valid, or every file's error.
pub(super) fn check_apps(paths: &[String]) -> Result<(String, Value), String> {
    let mut errors = Vec::new();
    let mut valid = Vec::new();
    for path in paths {
        let checked = read_app(path).and_then(|app| {
            let name = app
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| {
                    Path::new(path)
                        .file_stem()
                        .map(|stem| stem.to_string_lossy().into_owned())
                        .unwrap_or_default()
                });
            // The API's own parser: it takes a `name` equal to the app's, and leaves the
            // read-only fields `apps get --output` prints.
            switchyard_model::parse_app_spec(&name, &app)
                .map(|_| name)
                .map_err(|e| format!("{path}: {e}"))
        });
        match checked {
            Ok(name) => valid.push(Value::String(name)),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        let summary = format!("{} app files valid", valid.len());
        Ok((summary, serde_json::json!({"valid": valid})))
    } else {
        Err(errors.join("\n"))
    }
}

/// The app in `text`, JSON or TOML, as the JSON the API takes.
fn parse_app(text: &str) -> Result<Value, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        return serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"));
    }
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("invalid TOML: {e}"))?;
    serde_json::to_value(table).map_err(|e| format!("cannot convert TOML to JSON: {e}"))
}

/// `app` as `json` or `toml`, the fields `apps put -f` reads back (the resolved addresses
/// of named backends are this router's view, not part of the app, and are left out).
pub(super) fn render_app(app: &Value, format: &str) -> Result<String, String> {
    let mut app = app.clone();
    if let Some(fields) = app.as_object_mut() {
        fields.remove("resolved_backends");
    }
    match format {
        "json" => serde_json::to_string_pretty(&app).map_err(|e| e.to_string()),
        _ => {
            // TOML has no null: an absent key means the same to the API.
            let app = without_nulls(app);
            toml::to_string_pretty(&app).map_err(|e| format!("cannot write TOML: {e}"))
        }
    }
}

fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// Opens the app in `$EDITOR` (then `$VISUAL`, then `vi`) as TOML; `None` when it comes
/// back unchanged. A file that does not parse keeps its path in the error, so no edit is
/// lost.
/// An app edited in `$EDITOR`: what to store, and the `ETag` it was read with.
pub(super) struct Edited {
    pub(super) app: Value,
    pub(super) read_as: Option<String>,
}

pub(super) fn edit_app(client: &AdminClient, name: &str) -> Result<Option<Edited>, String> {
    let (app, read_as) = client.get_tagged(&format!("/v1/apps/{name}"))?;
    let original = render_app(&app, "toml")?;
    let path = edit_path(name);
    std::fs::write(&path, &original).map_err(|e| format!("{}: {e}", path.display()))?;
    let editor = std::env::var("EDITOR")
        .or_else(|_| std::env::var("VISUAL"))
        .unwrap_or_else(|_| "vi".to_string());
    // Through the shell, so an editor with arguments ("code --wait") works.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .map_err(|e| format!("cannot start the editor '{editor}': {e}"))?;
    let kept = |why: String| format!("{why}; your edit is kept in {}", path.display());
    if !status.success() {
        return Err(kept(format!("the editor '{editor}' exited with {status}")));
    }
    let edited = std::fs::read_to_string(&path).map_err(|e| kept(e.to_string()))?;
    if edited == original {
        let _ = std::fs::remove_file(&path);
        return Ok(None);
    }
    let app = parse_app(&edited).map_err(kept)?;
    // Removed only once parsed: a refusal by the API below prints the path too.
    Ok(Some(Edited { app, read_as })).inspect(|_| {
        eprintln!("(the edit is in {} until it is stored)", path.display());
    })
}

fn edit_path(name: &str) -> PathBuf {
    let unique = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!(
        "switchyard-{name}-{}-{unique}.toml",
        std::process::id()
    ))
}

/// Sends a JSON-lines file to the bulk endpoint and summarises its answer: every applied
/// app counted, every refused or bad line printed with its number.
pub(super) fn import_apps(client: &AdminClient, path: &str) -> Result<(String, Value), String> {
    let text = read_text(path)?;
    let started = Instant::now();
    let (status, answer) =
        client.send_with_progress("importing", "POST", "/v1/import/apps", text, None)?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut summary = String::new();
    if let Some(lines) = answer["lines"].as_array() {
        for line in lines {
            summary.push_str(&line_problem(line));
        }
        summary.push_str(answer["error"].as_str().unwrap_or("the import was refused"));
        return Err(summary);
    }
    let Some(results) = answer["results"].as_array() else {
        let message = answer["error"].as_str().unwrap_or("the import was refused");
        return Err(format!("{message} (HTTP {status})"));
    };
    for refused in results.iter().filter(|r| r["result"] == "refused") {
        summary.push_str(&line_problem(refused));
    }
    let applied = answer["applied"].as_u64().unwrap_or(0);
    let refused = answer["refused"].as_u64().unwrap_or(0);
    summary.push_str(&format!(
        "{applied} apps applied, {refused} refused, in {elapsed:.1} s"
    ));
    if refused > 0 {
        return Err(summary);
    }
    Ok((summary, answer))
}

pub(super) fn line_problem(line: &Value) -> String {
    let number = line["line"].as_u64().unwrap_or(0);
    let app = line["app"]
        .as_str()
        .map(|app| format!(" (app {app})"))
        .unwrap_or_default();
    let field = line["field"]
        .as_str()
        .filter(|f| !f.is_empty())
        .map(|f| format!("{f}: "))
        .unwrap_or_default();
    let error = line["error"].as_str().unwrap_or("refused");
    format!("line {number}{app}: {field}{error}\n")
}

pub(super) fn read_text(path: &str) -> Result<String, String> {
    if path == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("stdin: {e}"))?;
        return Ok(text);
    }
    std::fs::read_to_string(Path::new(path)).map_err(|e| format!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_app_written_as_toml_reads_back_as_the_same_json() {
        let app = json!({
            "name": "shop",
            "domains": ["shop.example", "*.shop.example"],
            "backends": [{"address": "10.0.0.1:80", "weight": 2}, {"address": "api:8080", "weight": 1}],
            "balancer": "round_robin",
            "mirror": null,
            "health_check": {"path": "/health", "interval_ms": 2000},
            "resolved_backends": [{"name": "api:8080"}],
            "hsts": {"max_age_s": 31536000, "include_subdomains": false},
        });
        let toml = render_app(&app, "toml").expect("toml");
        let back = parse_app(&toml).expect("parses");
        let mut expected = app.clone();
        let fields = expected.as_object_mut().expect("object");
        fields.remove("mirror");
        fields.remove("resolved_backends");
        assert_eq!(back, expected);
        let json = render_app(&app, "json").expect("json");
        assert_eq!(parse_app(&json).expect("parses")["mirror"], Value::Null);
        assert!(parse_app("domains = [").is_err());
    }
}
