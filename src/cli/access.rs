//! `switchyard tokens …` (scoped tokens, made with the router's --admin-token) and
//! `switchyard audit` (who changed what, newest first).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{AdminClient, AdminOptions};

/// `switchyard tokens` and its subcommands.
#[derive(Args)]
pub(crate) struct TokensArgs {
    #[command(flatten)]
    admin: AdminOptions,
    #[command(subcommand)]
    command: TokensCommand,
}

#[derive(Subcommand)]
enum TokensCommand {
    /// Make a token and print it, this once (`--json`: `{"token": …}` and its record).
    Create {
        /// `read`, `write`, or `apps:PREFIX` (reads and writes of the apps whose names start
        /// with PREFIX, nothing else).
        #[arg(long)]
        scope: String,
        /// What it is for (a pipeline, a person): shown in listings.
        #[arg(long, default_value = "")]
        name: String,
    },
    /// List the tokens (never their secrets).
    List,
    /// Revoke a token: every router refuses it from the next call.
    Revoke {
        /// Its id (`switchyard tokens list`).
        id: String,
    },
}

/// Runs one token command.
pub(crate) fn run_tokens(args: TokensArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let result = match &args.command {
        TokensCommand::Create { scope, name } => client
            .call(
                "POST",
                "/v1/tokens",
                Some(json!({"scope": scope, "name": name})),
            )
            .map(|made| {
                let summary = format!(
                    "{}\n(token {}, scope {}: shown this once, keep it now)",
                    made["token"].as_str().unwrap_or(""),
                    made["id"].as_str().unwrap_or(""),
                    made["scope"].as_str().unwrap_or("")
                );
                (summary, made)
            }),
        TokensCommand::List => client.call("GET", "/v1/tokens", None).map(|listed| {
            let lines: Vec<String> = listed["tokens"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    format!(
                        "{}  {:<20}  {}",
                        t["id"].as_str().unwrap_or(""),
                        t["scope"].as_str().unwrap_or(""),
                        t["name"].as_str().unwrap_or("")
                    )
                })
                .collect();
            let summary = if lines.is_empty() {
                "no tokens".to_string()
            } else {
                lines.join("\n")
            };
            (summary, listed)
        }),
        TokensCommand::Revoke { id } => client
            .call("DELETE", &format!("/v1/tokens/{id}"), None)
            .map(|_| (format!("token {id} revoked"), json!({"revoked": id}))),
    };
    args.admin.report(result)
}

/// `switchyard audit`.
#[derive(Args)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    admin: AdminOptions,
    /// Only the writes to this app.
    #[arg(long)]
    app: Option<String>,
    /// Only the writes since then: seconds since the epoch, or a span back (15m, 2h, 7d).
    #[arg(long)]
    since: Option<String>,
    /// Records shown, newest first (pages of the API are followed).
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

/// Most records one page of the API answers.
const PAGE: usize = 1000;

/// Runs `switchyard audit`.
pub(crate) fn run_audit(args: AuditArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let result = audit_records(&client, &args).map(|records| {
        let lines: Vec<String> = records.iter().map(describe).collect();
        let summary = if lines.is_empty() {
            "no writes recorded".to_string()
        } else {
            lines.join("\n")
        };
        (summary, json!({"records": records}))
    });
    args.admin.report(result)
}

fn audit_records(client: &AdminClient, args: &AuditArgs) -> Result<Vec<Value>, String> {
    let mut records = Vec::new();
    let mut before: Option<String> = None;
    while records.len() < args.limit {
        let limit = (args.limit - records.len()).min(PAGE).to_string();
        let mut query = vec![("limit", limit.as_str())];
        if let Some(app) = &args.app {
            query.push(("app", app));
        }
        if let Some(since) = &args.since {
            query.push(("since", since));
        }
        if let Some(before) = &before {
            query.push(("before", before));
        }
        let page = client.get_with_query("/v1/audit", &query)?;
        records.extend(page["records"].as_array().into_iter().flatten().cloned());
        match page["next"].as_str() {
            Some(next) => before = Some(next.to_string()),
            None => break,
        }
    }
    Ok(records)
}

/// One record on one line: when, who, from where, the call, its answer and the fields it
/// changed.
fn describe(record: &Value) -> String {
    let at_ms = record["at_ms"].as_u64().unwrap_or(0);
    let when = switchyard_proxy::format_rfc3339(std::time::Duration::from_millis(at_ms));
    let changed: Vec<&str> = record["change"]
        .as_object()
        .map(|fields| fields.keys().map(String::as_str).collect())
        .unwrap_or_default();
    format!(
        "{when}  {}  {}  {} {} -> {}{}",
        record["token"].as_str().unwrap_or(""),
        record["client"].as_str().unwrap_or(""),
        record["method"].as_str().unwrap_or(""),
        record["path"].as_str().unwrap_or(""),
        record["status"].as_u64().unwrap_or(0),
        if changed.is_empty() {
            String::new()
        } else {
            format!("  changed: {}", changed.join(", "))
        }
    )
}
