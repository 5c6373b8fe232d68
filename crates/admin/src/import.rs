//! `POST /v1/import/apps`: many apps at once, one JSON object per line (each with its
//! `name`), as `switchyard apps import` sends them.
//!
//! Every line is parsed and validated before anything is written: a file with one bad line
//! is refused whole, each bad line named with its number, field and reason, and nothing of
//! it is applied. A valid file is written in one bulk store call where each app lands wholly
//! or not at all; an app refused by the store (a domain another app owns) is reported on its
//! line and the others are applied.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;
use switchyard_model::{parse_app_spec, App, ValidationError};

use crate::api_doc::AppLines;
use crate::audit::AuditDetail;
use crate::progress::WRITE_BATCH;
use crate::{AdminState, ApiError};

/// Largest import body: 100,000 apps of a few hundred bytes each.
pub(crate) const MAX_IMPORT_BYTES: usize = 64 * 1024 * 1024;
/// Most apps one import may hold (the response lists each).
const MAX_IMPORT_APPS: usize = 100_000;
/// Most bad lines listed in a refusal; the count says how many there were.
const MAX_LISTED_PROBLEMS: usize = 1_000;

/// One line that cannot be imported.
pub(crate) struct LineProblem {
    pub(crate) line: usize,
    pub(crate) app: Option<String>,
    pub(crate) error: ValidationError,
}

impl LineProblem {
    fn shown(&self) -> ShownProblem {
        ShownProblem {
            line: self.line,
            error: self.error.message.clone(),
            field: Some(self.error.field.clone()).filter(|field| !field.is_empty()),
            app: self.app.clone(),
        }
    }
}

/// A line that cannot be imported, as the refusal lists it.
#[derive(Serialize, JsonSchema)]
pub(crate) struct ShownProblem {
    /// Its number, from 1.
    line: usize,
    /// Why.
    error: String,
    /// The field at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    /// The app it names, when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    app: Option<String>,
}

/// 422: nothing was applied.
#[derive(Serialize, JsonSchema)]
pub(crate) struct ImportRefused {
    /// How many lines, and the first one's reason.
    error: String,
    /// Always `body`.
    field: &'static str,
    /// Lines that cannot be imported.
    problems: usize,
    /// The first 1,000 of them.
    lines: Vec<ShownProblem>,
}

/// What became of each app of an import that was applied (200), or partly (409).
#[derive(Serialize, JsonSchema)]
pub(crate) struct Imported {
    /// Apps written.
    applied: usize,
    /// Apps the store refused (a domain another app owns).
    refused: usize,
    /// One per app, in the file's order.
    results: Vec<ImportResult>,
}

/// One app of an import.
#[derive(Serialize, JsonSchema)]
pub(crate) struct ImportResult {
    /// Its line.
    line: usize,
    /// Its name.
    app: String,
    /// `applied` or `refused`.
    #[schemars(extend("enum" = ["applied", "refused"]))]
    result: &'static str,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The field at fault (`domains`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    field: Option<&'static str>,
}

pub(crate) async fn import_apps(
    State(state): State<AdminState>,
    headers: axum::http::HeaderMap,
    AppLines(body): AppLines,
) -> Response {
    crate::progress::answer(&headers, move |progress| import(state, body, progress)).await
}

async fn import(
    state: AdminState,
    body: bytes::Bytes,
    progress: crate::progress::Progress,
) -> Result<Response, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|e| ValidationError::new("body", format!("not UTF-8: {e}")))?;
    let apps = match valid_apps(text).await {
        Ok(apps) => apps,
        Err(problems) => return Ok(refusal(&problems)),
    };
    if apps.is_empty() {
        return Err(
            ValidationError::new("body", "no app to import (one JSON object per line)").into(),
        );
    }
    let (lines, apps): (Vec<usize>, Vec<App>) = apps.into_iter().unzip();
    let names: Vec<String> = apps.iter().map(|app| app.name.to_string()).collect();
    let total = apps.len();
    let mut results = Vec::with_capacity(total);
    let mut apps = apps.into_iter().peekable();
    while apps.peek().is_some() {
        let batch: Vec<App> = apps.by_ref().take(WRITE_BATCH).collect();
        results.extend(state.store.put_apps(batch).await?);
        let step = serde_json::json!({"written": results.len(), "left": total - results.len()});
        crate::progress::report(&progress, step).await;
    }
    state.applied_locally().await;
    let mut applied = 0usize;
    let shown: Vec<ImportResult> = results
        .iter()
        .zip(lines.into_iter().zip(names))
        .map(|(result, (line, app))| match result {
            Ok(()) => {
                applied += 1;
                ImportResult {
                    line,
                    app,
                    result: "applied",
                    error: None,
                    field: None,
                }
            }
            Err(refused) => ImportResult {
                line,
                app,
                result: "refused",
                error: Some(refused.to_string()),
                field: Some("domains"),
            },
        })
        .collect();
    let refused = shown.len() - applied;
    let status = if refused == 0 {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    // The audit record names the apps written (the first of them, for a large import)
    // rather than a diff of each: a bulk write must not flood the log it is recorded in.
    let written: Vec<&str> = shown
        .iter()
        .filter(|r| r.result == "applied")
        .take(AUDITED_NAMES)
        .map(|r| r.app.as_str())
        .collect();
    let detail = AuditDetail(serde_json::json!({
        "applied": applied,
        "refused": refused,
        "apps": written,
    }));
    let answer = Imported {
        applied,
        refused,
        results: shown,
    };
    Ok((status, axum::Extension(detail), Json(answer)).into_response())
}

/// Most app names an import's audit record lists.
const AUDITED_NAMES: usize = 100;

/// The apps of `text` with their line numbers, each valid and its maintenance page by URL
/// fetched; or every line that cannot be one.
pub(crate) async fn valid_apps(text: &str) -> Result<Vec<(usize, App)>, Vec<LineProblem>> {
    let (mut apps, mut problems) = parse_lines(text);
    if problems.is_empty() {
        // One after another: apps with pages by URL are rare and few.
        for (line, app) in &mut apps {
            if let Err(error) = crate::page_fetch::fill_maintenance_page(app).await {
                problems.push(LineProblem {
                    line: *line,
                    app: Some(app.name.to_string()),
                    error,
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(apps)
    } else {
        Err(problems)
    }
}

/// The apps of `text` with their line numbers, and every line that cannot be one.
fn parse_lines(text: &str) -> (Vec<(usize, App)>, Vec<LineProblem>) {
    let mut apps = Vec::new();
    let mut problems = Vec::new();
    // Within one import a name or a domain may appear once: the store would otherwise
    // apply whichever came last, or refuse the second owner after the first was written.
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut domains: HashMap<String, usize> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        if apps.len() + problems.len() >= MAX_IMPORT_APPS {
            problems.push(LineProblem {
                line: number,
                app: None,
                error: ValidationError::new(
                    "body",
                    format!("more than {MAX_IMPORT_APPS} apps in one import; split the file"),
                ),
            });
            break;
        }
        let app = match parse_line(line) {
            Ok(app) => app,
            Err((app, error)) => {
                problems.push(LineProblem {
                    line: number,
                    app,
                    error,
                });
                continue;
            }
        };
        let name = app.name.to_string();
        if let Some(first) = names.insert(name.clone(), number) {
            problems.push(LineProblem {
                line: number,
                app: Some(name),
                error: ValidationError::new("name", format!("also on line {first}")),
            });
            continue;
        }
        let repeated = app.domains.iter().enumerate().find_map(|(at, domain)| {
            domains
                .insert(domain.to_string(), number)
                .filter(|&first| first != number)
                .map(|first| (at, domain.to_string(), first))
        });
        if let Some((at, domain, first)) = repeated {
            problems.push(LineProblem {
                line: number,
                app: Some(name),
                error: ValidationError::new(
                    format!("domains[{at}]"),
                    format!("'{domain}' is also claimed on line {first}"),
                ),
            });
            continue;
        }
        apps.push((number, app));
    }
    (apps, problems)
}

/// One line: a JSON object naming its app; the app's fields are validated as a PUT's are.
fn parse_line(line: &str) -> Result<App, (Option<String>, ValidationError)> {
    let spec: Value = serde_json::from_str(line)
        .map_err(|e| (None, ValidationError::new("", format!("invalid JSON: {e}"))))?;
    let name = spec
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            (
                None,
                ValidationError::new("name", "missing: each line names its app"),
            )
        })?;
    parse_app_spec(&name, &spec).map_err(|e| (Some(name), e))
}

/// 422: the lines that cannot be imported; nothing was written.
pub(crate) fn refusal(problems: &[LineProblem]) -> Response {
    let lines: Vec<ShownProblem> = problems
        .iter()
        .take(MAX_LISTED_PROBLEMS)
        .map(LineProblem::shown)
        .collect();
    let first = &problems[0];
    let body = ImportRefused {
        error: format!(
            "{} line(s) cannot be imported, nothing was applied; the first, line {}: {}",
            problems.len(),
            first.line,
            first.error.message
        ),
        field: "body",
        problems: problems.len(),
        lines,
    };
    (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_line_is_named_and_good_lines_are_kept_in_order() {
        let text = concat!(
            r#"{"name": "shop", "domains": ["shop.example"], "backends": ["10.0.0.1:80"]}"#,
            "\n\n",
            r#"{"name": "blog", "domains": ["blog.example"]}"#,
            "\n",
            r#"{"name": "bad", "backends": ["nowhere"]}"#,
            "\n",
            r#"{"domains": ["x.example"]}"#,
            "\n",
            "not json\n",
            r#"{"name": "shop"}"#,
            "\n",
            r#"{"name": "copy", "domains": ["www.x.example", "blog.example"]}"#,
            "\n",
        );
        let (apps, problems) = parse_lines(text);
        let names: Vec<(usize, String)> = apps
            .iter()
            .map(|(line, app)| (*line, app.name.to_string()))
            .collect();
        assert_eq!(names, vec![(1, "shop".into()), (3, "blog".into())]);
        let shown: Vec<(usize, String)> = problems
            .iter()
            .map(|p| (p.line, p.error.field.clone()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (4, "backends[0]".into()),
                (5, "name".into()),
                (6, "".into()),
                (7, "name".into()),
                (8, "domains[1]".into()),
            ]
        );
        assert!(problems[4].error.message.contains("line 3"));
    }
}
