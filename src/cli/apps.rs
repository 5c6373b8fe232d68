//! `switchyard apps …`: create, inspect, scale and delete apps.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{files, joined, list_all, AdminClient, AdminOptions};

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
    /// Create or replace an app, from options or from a whole app file (-f).
    Put {
        /// App name ([a-z0-9][a-z0-9-]{0,62}).
        name: String,
        /// The whole app as JSON or TOML (as `apps get --output` prints it; `-`: stdin).
        /// Replaces every option below.
        #[arg(long = "file", short = 'f', value_name = "FILE", conflicts_with_all = [
            "domains", "backends", "balancer", "health_check", "https_redirect", "hsts", "acme"])]
        file: Option<String>,
        /// A domain (repeatable): www.example.com or *.example.com.
        #[arg(long = "domain", short = 'd')]
        domains: Vec<String>,
        /// A backend (repeatable): ip:port, host:port or srv:NAME, optionally =WEIGHT.
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
        /// Order certificates for the app's exact domains from the router's ACME CA
        /// (`switchyard serve --acme-directory …`).
        #[arg(long)]
        acme: bool,
    },
    /// Show one app.
    Get {
        /// App name.
        name: String,
        /// Print the whole app as `json` or `toml` (what `apps put -f` reads back).
        #[arg(long, short = 'o', value_parser = ["json", "toml"])]
        output: Option<String>,
    },
    /// Edit an app in $EDITOR (TOML) and store it when the editor exits.
    Edit {
        /// App name.
        name: String,
    },
    /// Create or replace many apps: a file of JSON lines, one app object with its "name"
    /// per line (`-`: stdin). A file with a bad line is refused whole, each bad line named.
    Import {
        /// The JSON-lines file.
        file: String,
    },
    /// Make the stored apps match FILE (JSON lines, or a JSON array) or DIR (one app file,
    /// JSON or TOML, each): the plan first, then applied only if nothing changed since.
    Sync {
        /// The desired apps: a file, or a directory of app files.
        path: String,
        /// Delete the stored apps the desired set does not hold.
        #[arg(long)]
        prune: bool,
        /// Print the plan only; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List apps.
    List,
    /// Delete an app (its open connections close after the drain grace period).
    Delete {
        /// App name.
        name: String,
    },
    /// Mirror a share of an app's requests to shadow backends, or stop (--off).
    ///
    /// The app is read, changed and written back whole; other options are kept.
    Mirror {
        /// App name.
        name: String,
        /// A shadow backend (repeatable): ip:port.
        #[arg(long = "backend", short = 'b', required_unless_present = "off")]
        backends: Vec<String>,
        /// Share of requests mirrored, 0-100 (fractions allowed).
        #[arg(long, default_value_t = 100.0)]
        percent: f64,
        /// random, client_ip, header:NAME, query:NAME or cookie:NAME.
        #[arg(long, default_value = "random")]
        key: String,
        /// Only mirror this method (repeatable).
        #[arg(long = "method")]
        methods: Vec<String>,
        /// Only mirror this path, or a prefix ending in '*' (repeatable).
        #[arg(long = "path")]
        paths: Vec<String>,
        /// Deadline for each step of a copy, in milliseconds.
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Copies in progress at once; more are dropped.
        #[arg(long)]
        max_in_flight: Option<u64>,
        /// Largest request body mirrored, in bytes.
        #[arg(long)]
        max_body_bytes: Option<u64>,
        /// Speak TLS to the shadow backends.
        #[arg(long)]
        tls: bool,
        /// Stop mirroring this app.
        #[arg(long, conflicts_with = "backends")]
        off: bool,
    },
    /// Check app files (JSON or TOML, as `apps put -f` reads them) without a router: each
    /// is valid, or its error names the field. The app's name is its "name" key, else the
    /// file's name without its extension.
    Check {
        /// The files (`-`: stdin).
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Print the JSON Schema of app files (as `GET /v1/schema/app.json` serves it), for
    /// editors to check them as they are written.
    Schema,
    /// Replace an app's backends (scale up, down, or redeploy).
    Scale {
        /// App name.
        name: String,
        /// A backend (repeatable): ip:port, host:port or srv:NAME, optionally =WEIGHT. None means zero containers.
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
            file: Some(file),
            ..
        } => files::read_app(file).and_then(|app| put_whole(&client, name, app)),
        AppsCommand::Put {
            name,
            file: None,
            domains,
            backends,
            balancer,
            health_check,
            https_redirect,
            hsts,
            acme,
        } => {
            let mut body = json!({"domains": domains, "backends": backend_specs(backends)});
            if let Some(balancer) = balancer {
                body["balancer"] = json!(balancer);
            }
            if let Some(path) = health_check {
                body["health_check"] = json!({"path": path});
            }
            if *acme {
                body["tls"] = json!({"acme": true});
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
        AppsCommand::Get { name, output } => client
            .call("GET", &format!("/v1/apps/{name}"), None)
            .and_then(|app| match output.as_deref() {
                Some(format) => files::render_app(&app, format).map(|text| (text, app)),
                None => Ok((describe(&app), app)),
            }),
        AppsCommand::Edit { name } => {
            files::edit_app(&client, name).and_then(|edited| match edited {
                // Stored only if nobody changed the app meanwhile: an edit never overwrites
                // a write it did not see.
                Some(edited) => client
                    .call_if_match(
                        "PUT",
                        &format!("/v1/apps/{name}"),
                        Some(edited.app),
                        edited.read_as.as_deref(),
                    )
                    .map(|app| (format!("app {name} stored\n{}", describe(&app)), app))
                    .map_err(|e| {
                        if e.contains("HTTP 412") {
                            format!(
                                "app {name} changed while you edited it; nothing stored. Run \
                                 `switchyard apps edit {name}` again on the current app ({e})"
                            )
                        } else {
                            e
                        }
                    }),
                None => Ok((format!("app {name} unchanged"), Value::Null)),
            })
        }
        AppsCommand::Import { file } => files::import_apps(&client, file),
        AppsCommand::Sync {
            path,
            prune,
            dry_run,
        } => super::sync::sync_apps(&client, path, *prune, *dry_run),
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
        AppsCommand::Mirror {
            name,
            backends,
            percent,
            key,
            methods,
            paths,
            timeout_ms,
            max_in_flight,
            max_body_bytes,
            tls,
            off,
        } => {
            let mirror = if *off {
                Value::Null
            } else {
                let mut mirror = json!({
                    "backends": backends, "percent": percent, "key": key,
                    "methods": methods, "paths": paths, "tls": tls,
                });
                for (field, value) in [
                    ("timeout_ms", timeout_ms),
                    ("max_in_flight", max_in_flight),
                    ("max_body_bytes", max_body_bytes),
                ] {
                    if let Some(value) = value {
                        mirror[field] = json!(value);
                    }
                }
                mirror
            };
            let path = format!("/v1/apps/{name}");
            client
                .call("GET", &path, None)
                .and_then(|mut app| {
                    app["mirror"] = mirror;
                    client.call("PUT", &path, Some(app))
                })
                .map(|app| (format!("app {name} stored\n{}", describe(&app)), app))
        }
        AppsCommand::Check { files } => files::check_apps(files),
        AppsCommand::Schema => {
            let schema = switchyard_model::app_file_schema();
            serde_json::to_string_pretty(&schema)
                .map(|text| (text, schema))
                .map_err(|e| e.to_string())
        }
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

/// Stores `app` whole under `name`.
fn put_whole(client: &AdminClient, name: &str, app: Value) -> Result<(String, Value), String> {
    client
        .call("PUT", &format!("/v1/apps/{name}"), Some(app))
        .map(|app| (format!("app {name} stored\n{}", describe(&app)), app))
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
    let mirror = match &app["mirror"] {
        Value::Object(m) => format!(
            "\n  mirror:   {}% by {} to {}",
            m.get("percent").and_then(Value::as_f64).unwrap_or(0.0),
            m.get("key").and_then(Value::as_str).unwrap_or("?"),
            m.get("backends").map_or_else(String::new, joined)
        ),
        _ => String::new(),
    };
    format!(
        "  domains:  {}\n  backends: {}\n  balancer: {}{mirror}",
        joined(&app["domains"]),
        if backends.is_empty() {
            "(none)".to_string()
        } else {
            backends.join(", ")
        },
        app["balancer"].as_str().unwrap_or("round_robin")
    )
}
