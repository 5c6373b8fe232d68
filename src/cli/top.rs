//! `switchyard top`: a live terminal view of the busiest apps, from the router's traffic
//! history (`GET /v1/stats/apps`), redrawn every two seconds; `--sort cpu` shows who costs
//! the router the most.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::{AdminClient, AdminOptions};

/// `switchyard top`.
#[derive(Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    admin: AdminOptions,
    /// Order by `traffic` (answers in the last minute), `errors` (5xx in it) or `cpu` (the
    /// router's CPU spent for the app in it).
    #[arg(long, default_value = "traffic", value_parser = ["traffic", "errors", "cpu"])]
    sort: String,
    /// Apps shown.
    #[arg(long, short = 'n', default_value_t = 20)]
    limit: usize,
    /// Print once and exit (for scripts), instead of redrawing until interrupted.
    #[arg(long)]
    once: bool,
    /// Seconds between redraws.
    #[arg(long, default_value_t = 2)]
    every_s: u64,
}

pub(crate) fn run(args: TopArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let path = format!("/v1/stats/apps?sort={}&limit={}", args.sort, args.limit);
    if args.once {
        let result = client
            .call("GET", &path, None)
            .map(|stats| (render(&stats), stats));
        return args.admin.report(result);
    }
    loop {
        match client.call("GET", &path, None) {
            // Clear the screen and go home, then draw: one frame per answer.
            Ok(stats) => println!("\x1b[2J\x1b[H{}", render(&stats)),
            Err(message) => println!("\x1b[2J\x1b[Herror: {message}"),
        }
        std::thread::sleep(Duration::from_secs(args.every_s.max(1)));
    }
}

/// One frame: a header, then an app a line with its rates and a sparkline of 15 minutes.
fn render(stats: &Value) -> String {
    let mut text = format!(
        "{} apps with traffic in the last {} min (kept: {} of at most {}, {} KB)\n\n{:<32} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9}  last 15 min\n",
        stats["tracked_apps"],
        stats["window_s"].as_u64().unwrap_or(900) / 60,
        stats["tracked_apps"],
        stats["max_apps"],
        stats["memory_bytes"].as_u64().unwrap_or(0) / 1024,
        "APP",
        "REQ/S 10s",
        "REQ/S 1m",
        "5xx 1m",
        "4xx 1m",
        "p99 1m",
        "CPU ms/s"
    );
    for app in stats["apps"].as_array().into_iter().flatten() {
        text.push_str(&format!(
            "{:<32} {:>9.1} {:>9.1} {:>6.1}% {:>6.1}% {:>9} {:>9.1}  {}\n",
            app["app"].as_str().unwrap_or("?"),
            app["rps_10s"].as_f64().unwrap_or(0.0),
            app["rps_1m"].as_f64().unwrap_or(0.0),
            app["error_ratio_1m"].as_f64().unwrap_or(0.0) * 100.0,
            app["client_error_ratio_1m"].as_f64().unwrap_or(0.0) * 100.0,
            p99(&app["p99_ms_1m"]),
            app["cpu_ms_per_s_1m"].as_f64().unwrap_or(0.0),
            sparkline(&app["requests"])
        ));
    }
    text.trim_end().to_string()
}

/// A p99 from the history's duration buckets: an upper bound.
fn p99(ms: &Value) -> String {
    match ms.as_u64() {
        None => "-".into(),
        Some(ms) if ms >= 10_000 => ">=10 s".into(),
        Some(ms) => format!("<={ms} ms"),
    }
}

/// The series as block characters scaled to its own maximum.
fn sparkline(series: &Value) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let values: Vec<u64> = series
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    values
        .iter()
        .map(|&v| BARS[((v * 7) / max) as usize])
        .collect()
}
