//! `switchyard explain HOST [PATH]`: the router's own account of where a request goes —
//! the same answer as `GET /v1/explain`.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::{AdminClient, AdminOptions};

/// `switchyard explain`.
#[derive(Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    admin: AdminOptions,
    /// The Host a client sends (a port is allowed).
    host: String,
    /// The request path.
    #[arg(default_value = "/")]
    path: String,
    /// The request method.
    #[arg(long, short = 'X', default_value = "GET")]
    method: String,
}

pub(crate) fn run(args: ExplainArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let query = [
        ("host", args.host.as_str()),
        ("path", args.path.as_str()),
        ("method", args.method.as_str()),
    ];
    let result = client
        .get_with_query("/v1/explain", &query)
        .map(|answer| (render(&answer), answer));
    args.admin.report(result)
}

/// The explanation as an on-call engineer reads it, top to bottom.
fn render(answer: &Value) -> String {
    let host = answer["host"].as_str().unwrap_or("?");
    let Some(app) = answer["app"].as_str() else {
        let tried = tried(answer);
        return format!(
            "{host}: no app\n  {}{tried}",
            answer["why"].as_str().unwrap_or("no app owns it")
        );
    };
    let mut text = format!(
        "{host}{} → app {app}\n  rule:     {} domain {}{}\n",
        answer["path"].as_str().unwrap_or(""),
        answer["rule"].as_str().unwrap_or("?"),
        answer["domain"].as_str().unwrap_or("?"),
        tried(answer)
    );
    text.push_str("  stages:\n");
    for stage in answer["stages"].as_array().into_iter().flatten() {
        text.push_str(&format!(
            "    {} {:<15} {}\n",
            if stage["applies"] == true {
                "✔"
            } else {
                "·"
            },
            stage["stage"].as_str().unwrap_or("?"),
            stage["why"].as_str().unwrap_or("")
        ));
    }
    if let Some(stored) = answer["stored"].as_array() {
        text.push_str(&stored_copies(stored));
    }
    let backend = &answer["backend"];
    text.push_str(&format!(
        "  next backend: {} ({})\n",
        backend["next"].as_str().unwrap_or("none"),
        backend["why"].as_str().unwrap_or("")
    ));
    for b in backend["backends"].as_array().into_iter().flatten() {
        let state = if b["retired"] == true {
            "retired"
        } else if b["failing_checks"] == true {
            "failing checks"
        } else if b["passively_down"] == true {
            "passively down"
        } else {
            "healthy"
        };
        text.push_str(&format!(
            "    {:<24} weight {:<4} in flight {:<5} {state}\n",
            b["address"].as_str().unwrap_or("?"),
            b["weight"],
            b["in_flight"]
        ));
    }
    text.trim_end().to_string()
}

/// The response cache's copies of the path: age, lifetime and the field that decided it.
fn stored_copies(stored: &[Value]) -> String {
    if stored.is_empty() {
        return "  cached:   nothing stored for this path\n".to_string();
    }
    let mut text = String::from("  cached:\n");
    for copy in stored {
        let url = copy["url"].as_str().unwrap_or("?");
        match copy["varies_by"].as_array() {
            Some(names) => {
                let names: Vec<&str> = names.iter().filter_map(Value::as_str).collect();
                text.push_str(&format!("    {url}: one copy per {}\n", names.join(", ")));
            }
            None => text.push_str(&format!(
                "    {url}: age {} s, fresh for {} s of {} s ({}), {}\n",
                copy["age_s"],
                copy["fresh_for_s"],
                copy["freshness_lifetime_s"],
                copy["decided_by"].as_str().unwrap_or("?"),
                copy["state"].as_str().unwrap_or("?")
            )),
        }
    }
    text
}

fn tried(answer: &Value) -> String {
    let tried: Vec<&str> = answer["tried"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if tried.len() > 1 {
        format!(" (looked up: {})", tried.join(", "))
    } else {
        String::new()
    }
}
