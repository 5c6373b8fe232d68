//! `switchyard certs …`: upload, list and delete TLS certificates; see where ACME orders
//! stand.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{joined, list_all, AdminClient, AdminOptions};

/// `switchyard certs` and its subcommands.
#[derive(Args)]
pub(crate) struct CertsArgs {
    #[command(flatten)]
    admin: AdminOptions,
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Store (or replace) the certificate of a domain; the next handshake uses it.
    Put {
        /// www.example.com, or *.example.com for a wildcard certificate.
        domain: String,
        /// PEM file: the certificate first, then its intermediates.
        #[arg(long)]
        cert: PathBuf,
        /// PEM file with the unencrypted private key.
        #[arg(long)]
        key: PathBuf,
        /// Store it even if it is expired or not yet valid.
        #[arg(long)]
        allow_expired: bool,
    },
    /// Show a stored certificate (never its key).
    Get {
        /// The domain it is stored under.
        domain: String,
    },
    /// List stored certificates with their expiry.
    List,
    /// Delete the certificate of a domain.
    Delete {
        /// The domain it is stored under.
        domain: String,
    },
    /// Where each ACME-ordered domain stands (pending, validating, issued, failed), and
    /// which router holds the issuing lease.
    Status,
}

/// Runs one certificate command.
pub(crate) fn run(args: CertsArgs) -> ExitCode {
    let client = AdminClient::new(&args.admin);
    let result = match &args.command {
        CertsCommand::Put {
            domain,
            cert,
            key,
            allow_expired,
        } => read_pem(cert, "--cert").and_then(|cert_pem| {
            let key_pem = read_pem(key, "--key")?;
            let body = json!({
                "cert_pem": cert_pem,
                "key_pem": key_pem,
                "allow_expired": allow_expired,
            });
            client
                .call("PUT", &format!("/v1/certs/{domain}"), Some(body))
                .map(|info| {
                    (
                        format!("certificate for {domain} stored\n{}", describe(&info)),
                        info,
                    )
                })
        }),
        CertsCommand::Get { domain } => client
            .call("GET", &format!("/v1/certs/{domain}"), None)
            .map(|info| (describe(&info), info)),
        CertsCommand::List => list_all(&client, "/v1/certs", "certs").map(|certs| {
            let mut text = format!(
                "{:<40} {:<12} {:<10} ISSUER\n",
                "DOMAIN", "EXPIRES", "DAYS LEFT"
            );
            for cert in &certs {
                let not_after = cert["not_after"].as_i64().unwrap_or(0);
                text.push_str(&format!(
                    "{:<40} {:<12} {:<10} {}\n",
                    cert["domain"].as_str().unwrap_or(""),
                    date(not_after),
                    days_left(not_after),
                    cert["issuer"].as_str().unwrap_or("")
                ));
            }
            text.push_str(&format!("{} certificates", certs.len()));
            (text, Value::Array(certs))
        }),
        CertsCommand::Status => client.call("GET", "/v1/acme", None).and_then(|first| {
            let domains = list_all(&client, "/v1/acme", "domains")?;
            let lease = match first["lease"]["holder"].as_str() {
                Some(holder) => format!("issuing: {holder}"),
                None => "issuing: no router holds the lease".to_string(),
            };
            let mut text = format!(
                "{lease}\n{:<40} {:<11} {:<12} {:<8} DETAIL\n",
                "DOMAIN", "STATE", "EXPIRES", "ATTEMPTS"
            );
            for state in &domains {
                let detail = match state["status"].as_str() {
                    Some("failed") => format!(
                        "next try {}: {}",
                        time_of_day(state["next_try_unix"].as_i64().unwrap_or(0)),
                        state["reason"].as_str().unwrap_or("")
                    ),
                    _ => state["reason"].as_str().unwrap_or("").to_string(),
                };
                let expires = state["not_after_unix"].as_i64().map_or("-".into(), date);
                text.push_str(&format!(
                    "{:<40} {:<11} {:<12} {:<8} {detail}\n",
                    state["domain"].as_str().unwrap_or(""),
                    state["status"].as_str().unwrap_or(""),
                    expires,
                    state["attempts"].as_i64().unwrap_or(0),
                ));
            }
            text.push_str(&format!("{} domains", domains.len()));
            Ok((text, json!({"lease": first["lease"], "domains": domains})))
        }),
        CertsCommand::Delete { domain } => client
            .call("DELETE", &format!("/v1/certs/{domain}"), None)
            .map(|_| {
                (
                    format!("certificate for {domain} deleted"),
                    json!({"deleted": domain}),
                )
            }),
    };
    args.admin.report(result)
}

fn read_pem(path: &Path, flag: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

fn describe(info: &Value) -> String {
    let not_after = info["not_after"].as_i64().unwrap_or(0);
    format!(
        "  domain:  {}\n  names:   {}\n  issuer:  {}\n  expires: {} ({} days left)",
        info["domain"].as_str().unwrap_or(""),
        joined(&info["names"]),
        info["issuer"].as_str().unwrap_or(""),
        date(not_after),
        days_left(not_after)
    )
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time.
fn time_of_day(unix: i64) -> String {
    let seconds = unix.rem_euclid(86_400);
    format!(
        "{} {:02}:{:02} UTC",
        date(unix),
        seconds / 3600,
        seconds % 3600 / 60
    )
}

fn days_left(not_after: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    (not_after - now).div_euclid(86_400)
}

/// `YYYY-MM-DD` (UTC) of a Unix time, by the days-to-civil algorithm of H. Hinnant.
fn date(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::date;

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(date(1_798_761_599), "2026-12-31");
        assert_eq!(super::time_of_day(1_798_761_599), "2026-12-31 23:59 UTC");
    }
}
