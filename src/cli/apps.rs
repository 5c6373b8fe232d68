//! `switchyard apps …`: create, inspect, scale and delete apps.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{joined, list_all, AdminClient, AdminOptions};

/// `switchyard apps` and its subcommands.
#[derive(Args)]
pub(crate) struct AppsArgs {
    #[command(flatten)]
    admin: AdminOptions,
    #[command(subcommand)]
    command: AppsCommand,
}

#[derive(Subcommand)]
enum AppsCommand {
    /// Create or replace an app.
    Put {
        /// App name ([a-z0-9][a-z0-9-]{0,62}).
        name: String,
        /// A domain (repeatable): www.example.com or *.example.com.
        #[arg(long = "domain", short = 'd')]
        domains: Vec<String>,
        /// A backend (repeatable): ip:port, or ip:port=WEIGHT.
        #[arg(long = "backend", short = 'b')]
        backends: Vec<String>,
        /// round_robin (default) or least_loaded.
        #[arg(long)]
        balancer: Option<String>,
        /// Path for active health checks (enables them).
        #[arg(long)]
        health_check: Option<String>,
        /// Redirect plain-HTTP requests to HTTPS (308).
        #[arg(long)]
        https_redirect: bool,
        /// Send Strict-Transport-Security with this max-age (seconds) on HTTPS responses.
        #[arg(long, value_name = "MAX_AGE_S")]
        hsts: Option<u64>,
    },
    /// Show one app.
    Get {
        /// App name.
        name: String,
    },
    /// List apps.
    List,
    /// Delete an app (its open connections close after the drain grace period).
    Delete {
        /// App name.
        name: String,
    },
    /// Replace an app's backends (scale up, down, or redeploy).
    Scale {
        /// App name.
        name: String,
        /// A backend (repeatable): ip:port, or ip:port=WEIGHT. None means zero containers.
        #[arg(long = "backend", short = 'b')]
        backends: Vec<String>,
    },
}

/// Runs one admin command.
pub(crate) fn run(args: AppsArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let result = match &args.command {
        AppsCommand::Put {
            name,
            domains,
            backends,
            balancer,
            health_check,
            https_redirect,
            hsts,
        } => {
            let mut body = json!({"domains": domains, "backends": backend_specs(backends)});
            if let Some(balancer) = balancer {
                body["balancer"] = json!(balancer);
            }
            if let Some(path) = health_check {
                body["health_check"] = json!({"path": path});
            }
            if *https_redirect {
                body["https_redirect"] = json!(true);
            }
            if let Some(max_age) = hsts {
                body["hsts"] = json!({"max_age_s": max_age});
            }
            client
                .call("PUT", &format!("/v1/apps/{name}"), Some(body))
                .map(|app| (format!("app {name} stored\n{}", describe(&app)), app))
        }
        AppsCommand::Get { name } => client
            .call("GET", &format!("/v1/apps/{name}"), None)
            .map(|app| (describe(&app), app)),
        AppsCommand::List => list_all(&client, "/v1/apps", "apps").map(|apps| {
            let mut text = format!("{:<32} {:<40} BACKENDS\n", "NAME", "DOMAINS");
            for app in &apps {
                text.push_str(&format!(
                    "{:<32} {:<40} {}\n",
                    app["name"].as_str().unwrap_or(""),
                    joined(&app["domains"]),
                    app["backends"].as_array().map_or(0, Vec::len)
                ));
            }
            text.push_str(&format!("{} apps", apps.len()));
            (text, Value::Array(apps))
        }),
        AppsCommand::Delete { name } => client
            .call("DELETE", &format!("/v1/apps/{name}"), None)
            .map(|_| (format!("app {name} deleted"), json!({"deleted": name}))),
        AppsCommand::Scale { name, backends } => client
            .call(
                "PUT",
                &format!("/v1/apps/{name}/backends"),
                Some(json!({"backends": backend_specs(backends)})),
            )
            .map(|app| (format!("app {name} scaled\n{}", describe(&app)), app)),
    };
    args.admin.report(result)
}

/// `ip:port=3` → `{"address": "ip:port", "weight": 3}`; anything else is passed as given so
/// the API names what is wrong with it.
fn backend_specs(backends: &[String]) -> Vec<Value> {
    backends
        .iter()
        .map(|b| match b.rsplit_once('=') {
            Some((address, weight)) => match weight.parse::<u64>() {
                Ok(weight) => json!({"address": address, "weight": weight}),
                Err(_) => json!(b),
            },
            None => json!(b),
        })
        .collect()
}

fn describe(app: &Value) -> String {
    let backends: Vec<String> = app["backends"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|b| {
                    let address = b["address"].as_str().unwrap_or("?");
                    match b["weight"].as_u64() {
                        Some(w) if w != 1 => format!("{address} (weight {w})"),
                        _ => address.to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "  domains:  {}\n  backends: {}\n  balancer: {}",
        joined(&app["domains"]),
        if backends.is_empty() {
            "(none)".to_string()
        } else {
            backends.join(", ")
        },
        app["balancer"].as_str().unwrap_or("round_robin")
    )
}
