//! `switchyard filters …`: store, list and delete the proxy-wasm modules apps' filters run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{AdminClient, AdminOptions};

/// `switchyard filters` and its subcommands.
#[derive(Args)]
pub(crate) struct FiltersArgs {
    #[command(flatten)]
    admin: AdminOptions,
    #[command(subcommand)]
    command: FiltersCommand,
}

#[derive(Subcommand)]
enum FiltersCommand {
    /// Store (or replace) a module under a name: the router compiles and checks it first,
    /// and every router serves it to the apps that name it at their next request.
    Put {
        /// The name apps use (`"filters": [{"name": NAME}]`): a-z, 0-9, '-' and '_'.
        name: String,
        /// The module: a .wasm built with a proxy-wasm SDK.
        file: PathBuf,
    },
    /// Show a stored module's SHA-256 and size.
    Get {
        /// Its name.
        name: String,
    },
    /// List the stored modules.
    List,
    /// Delete a stored module (apps that name it answer 500, or skip it with fail_open).
    Delete {
        /// Its name.
        name: String,
    },
}

/// Runs one filters command.
pub(crate) fn run(args: FiltersArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let result = match &args.command {
        FiltersCommand::Put { name, file } => std::fs::read(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))
            .and_then(|module| {
                client.send_bytes(
                    "PUT",
                    &format!("/v1/filters/{name}"),
                    "application/wasm",
                    &module,
                )
            })
            .map(|stored| {
                (
                    format!("filter {name} stored\n{}", describe(&stored)),
                    stored,
                )
            }),
        FiltersCommand::Get { name } => client
            .call("GET", &format!("/v1/filters/{name}"), None)
            .map(|stored| (describe(&stored), stored)),
        FiltersCommand::List => client.call("GET", "/v1/filters", None).map(|all| {
            let mut text = format!("{:<32} {:<14} SHA-256\n", "NAME", "SIZE");
            let filters = all.as_array().cloned().unwrap_or_default();
            for filter in &filters {
                text.push_str(&format!(
                    "{:<32} {:<14} {}\n",
                    filter["name"].as_str().unwrap_or(""),
                    filter["size"].as_u64().unwrap_or(0),
                    filter["sha256"].as_str().unwrap_or("")
                ));
            }
            text.push_str(&format!("{} filters", filters.len()));
            (text, all)
        }),
        FiltersCommand::Delete { name } => client
            .call("DELETE", &format!("/v1/filters/{name}"), None)
            .map(|_| (format!("filter {name} deleted"), Value::Null)),
    };
    args.admin.report(result)
}

fn describe(stored: &Value) -> String {
    format!(
        "name:    {}\nsha256:  {}\nsize:    {} bytes",
        stored["name"].as_str().unwrap_or(""),
        stored["sha256"].as_str().unwrap_or(""),
        stored["size"].as_u64().unwrap_or(0)
    )
}
