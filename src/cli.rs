//! `switchyard apps …`: a thin client of the admin API. Output is short and readable;
//! any failure prints the API's error (with the field it names) and exits non-zero.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Options shared by every admin command.
#[derive(Args)]
pub(crate) struct AppsArgs {
    /// Admin API address of the router (host:port or http://host:port).
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN",
        default_value = "127.0.0.1:8081",
        global = true
    )]
    admin: String,
    /// Bearer token, when the router requires one.
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// Print the API's JSON answer instead of a summary.
    #[arg(long, global = true)]
    json: bool,
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
    let client = AdminClient::new(&args.admin, args.token.clone());
    let result = match &args.command {
        AppsCommand::Put {
            name,
            domains,
            backends,
            balancer,
            health_check,
        } => {
            let mut body = json!({"domains": domains, "backends": backend_specs(backends)});
            if let Some(balancer) = balancer {
                body["balancer"] = json!(balancer);
            }
            if let Some(path) = health_check {
                body["health_check"] = json!({"path": path});
            }
            client
                .call("PUT", &format!("/v1/apps/{name}"), Some(body))
                .map(|app| (format!("app {name} stored\n{}", describe(&app)), app))
        }
        AppsCommand::Get { name } => client
            .call("GET", &format!("/v1/apps/{name}"), None)
            .map(|app| (describe(&app), app)),
        AppsCommand::List => list_all(&client).map(|apps| {
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
    match result {
        Ok((summary, raw)) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&raw).unwrap_or_default());
            } else {
                println!("{summary}");
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
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

fn list_all(client: &AdminClient) -> Result<Vec<Value>, String> {
    let mut apps = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(after) => format!("/v1/apps?after={after}"),
            None => "/v1/apps".to_string(),
        };
        let page = client.call("GET", &path, None)?;
        if let Some(items) = page["apps"].as_array() {
            apps.extend(items.iter().cloned());
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return Ok(apps),
        }
    }
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

fn joined(list: &Value) -> String {
    list.as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

struct AdminClient {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl AdminClient {
    fn new(admin: &str, token: Option<String>) -> Self {
        let base = if admin.starts_with("http://") || admin.starts_with("https://") {
            admin.trim_end_matches('/').to_string()
        } else {
            format!("http://{admin}")
        };
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .build();
        Self { base, token, agent }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut request = self.agent.request(method, &format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let response = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match response {
            Ok(response) if response.status() == 204 => Ok(Value::Null),
            Ok(response) => response
                .into_json()
                .map_err(|e| format!("unreadable answer from {}: {e}", self.base)),
            Err(ureq::Error::Status(status, response)) => {
                let body: Value = response.into_json().unwrap_or(Value::Null);
                let message = body["error"].as_str().unwrap_or("request refused");
                Err(match body["field"].as_str() {
                    Some(field) => format!("{field}: {message} (HTTP {status})"),
                    None => format!("{message} (HTTP {status})"),
                })
            }
            Err(e) => Err(format!("cannot reach the admin API at {}: {e}", self.base)),
        }
    }
}
