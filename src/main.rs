//! The `switchyard` binary: command-line parsing and wiring only. `serve` runs the router;
//! `logd` runs the log service; `apps` and `certs` talk to a running router's admin API.

mod admin_service;
mod bench_seed;
mod cli;
mod limits;
mod logd;
mod reference;
mod serve;
mod service_manager;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// glibc's malloc showed up as ~10% of the proxy's CPU under load; mimalloc's thread-local
// free lists suit Pingora's many short-lived per-request allocations.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Switchyard: a dynamic edge router for multi-tenant application platforms.
#[derive(Parser)]
#[command(name = "switchyard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the router (HTTP listener, admin API) on the configured store.
    Serve(Box<switchyard_config::ServeArgs>),
    /// Create, inspect, scale and delete apps through the admin API.
    Apps(cli::AppsArgs),
    /// Upload, list and delete TLS certificates through the admin API.
    Certs(cli::CertsArgs),
    /// Store, list and delete the proxy-wasm modules apps' filters run.
    Filters(cli::FiltersArgs),
    /// Explain where a request for HOST [PATH] goes: app, rule, stages, next backend.
    Explain(cli::ExplainArgs),
    /// A live view of the busiest apps: requests/s, 5xx and 4xx shares, 15 minutes of traffic.
    Top(cli::TopArgs),
    /// Back up the store while the router serves, restore it, see where it stands.
    Store(cli::StoreArgs),
    /// Make, list and revoke scoped admin API tokens (with the router's --admin-token).
    Tokens(cli::TokensArgs),
    /// Who changed what through the admin API, newest first.
    Audit(cli::AuditArgs),
    /// Run the log service: receives routers' access-log batches, writes one file per app.
    Logd(logd::LogdArgs),
    /// Fill an embedded store with generated apps (benchmarks; run before `serve`).
    #[command(hide = true)]
    BenchSeed(bench_seed::SeedArgs),
    /// Write the references made from the code (settings, metrics, command line) as
    /// Markdown into DIR (docs/reference: scripts/docs).
    #[command(hide = true)]
    Reference(reference::ReferenceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            match switchyard_config::Config::resolve(*args).and_then(serve::run) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("switchyard: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Logd(args) => match logd::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("switchyard logd: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Apps(args) => cli::run_apps(args),
        Command::Certs(args) => cli::run_certs(args),
        Command::Filters(args) => cli::run_filters(args),
        Command::Explain(args) => cli::run_explain(args),
        Command::Top(args) => cli::run_top(args),
        Command::Store(args) => cli::run_store(args),
        Command::Tokens(args) => cli::run_tokens(args),
        Command::Audit(args) => cli::run_audit(args),
        Command::Reference(args) => {
            match reference::write(&args, <Cli as clap::CommandFactory>::command()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("switchyard reference: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::BenchSeed(args) => match bench_seed::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("switchyard bench-seed: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
