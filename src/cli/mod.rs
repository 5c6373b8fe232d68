//! `switchyard apps …`, `certs …`, `explain` and `top`: thin clients of the admin API.
//! Output is short and readable; any failure prints the API's error (with the field it names) and
//! exits non-zero.

mod access;
mod apps;
mod certs;
mod explain;
mod files;
mod filters;
mod progress;
mod store;
mod sync;
mod top;

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

pub(crate) use access::{run_audit, run_tokens, AuditArgs, TokensArgs};
pub(crate) use apps::{run as run_apps, AppsArgs};
pub(crate) use certs::{run as run_certs, CertsArgs};
pub(crate) use explain::{run as run_explain, ExplainArgs};
pub(crate) use filters::{run as run_filters, FiltersArgs};
pub(crate) use store::{run as run_store, StoreArgs};
pub(crate) use top::{run as run_top, TopArgs};

/// Options shared by every admin command.
#[derive(Args)]
pub(crate) struct AdminOptions {
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
    /// PEM CA to verify an admin API over HTTPS with (`--admin https://…`), instead of the
    /// system's.
    #[arg(long, env = "SWITCHYARD_ADMIN_CA", global = true)]
    admin_ca: Option<std::path::PathBuf>,
    /// PEM client certificate for an admin API that asks for one (`--admin-client-ca`).
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_CLIENT_CERT",
        global = true,
        requires = "admin_client_key"
    )]
    admin_client_cert: Option<std::path::PathBuf>,
    /// PEM private key of `--admin-client-cert`.
    #[arg(
        long,
        env = "SWITCHYARD_ADMIN_CLIENT_KEY",
        global = true,
        requires = "admin_client_cert"
    )]
    admin_client_key: Option<std::path::PathBuf>,
}

impl AdminOptions {
    /// Prints a command's outcome (summary or JSON) and turns it into the exit code.
    fn report(&self, result: Result<(String, Value), String>) -> ExitCode {
        match result {
            Ok((summary, raw)) => {
                if self.json {
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
}

/// Every item of a paged listing (`{"<key>": [...], "next_after": ...}`).
fn list_all(client: &AdminClient, path: &str, key: &str) -> Result<Vec<Value>, String> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page_path = match &after {
            Some(after) => format!("{path}?after={after}"),
            None => path.to_string(),
        };
        let page = client.call("GET", &page_path, None)?;
        if let Some(page_items) = page[key].as_array() {
            items.extend(page_items.iter().cloned());
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return Ok(items),
        }
    }
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

/// The TLS connector the CLI's options ask for: a CA of the operator's, a client
/// certificate; `None` for the defaults (the system's CAs, no client certificate).
fn tls_connector(options: &AdminOptions) -> Result<Option<native_tls::TlsConnector>, String> {
    if options.admin_ca.is_none() && options.admin_client_cert.is_none() {
        return Ok(None);
    }
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
    };
    let mut builder = native_tls::TlsConnector::builder();
    if let Some(ca) = &options.admin_ca {
        let pem = read(ca, "--admin-ca")?;
        let certificate = native_tls::Certificate::from_pem(&pem)
            .map_err(|e| format!("--admin-ca {}: {e}", ca.display()))?;
        builder.add_root_certificate(certificate);
    }
    if let (Some(cert), Some(key)) = (&options.admin_client_cert, &options.admin_client_key) {
        let identity = native_tls::Identity::from_pkcs8(
            &read(cert, "--admin-client-cert")?,
            &read(key, "--admin-client-key")?,
        )
        .map_err(|e| format!("--admin-client-cert/--admin-client-key: {e}"))?;
        builder.identity(identity);
    }
    builder
        .build()
        .map(Some)
        .map_err(|e| format!("TLS setup: {e}"))
}

impl AdminClient {
    fn new(options: &AdminOptions) -> Self {
        let admin = &options.admin;
        let token = options.token.clone();
        let base = if admin.starts_with("http://") || admin.starts_with("https://") {
            admin.trim_end_matches('/').to_string()
        } else {
            format!("http://{admin}")
        };
        let mut agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(30));
        match tls_connector(options) {
            Ok(Some(connector)) => agent = agent.tls_connector(std::sync::Arc::new(connector)),
            Ok(None) => {}
            Err(message) => {
                // Said here, once, rather than as a vaguer TLS failure of every call.
                eprintln!("error: {message}");
                std::process::exit(1);
            }
        }
        Self {
            base,
            token,
            agent: agent.build(),
        }
    }

    /// Sends `body` as `content_type` (with an `If-Match` when given) and returns the status
    /// and the JSON answer, whatever the status (the bulk import's refusals carry one entry
    /// per line).
    fn send_text_if(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: String,
        if_match: Option<&str>,
    ) -> Result<(u16, Value), String> {
        let request = self
            .request_if(method, path, if_match)
            .set("Content-Type", content_type);
        self.status_and_json(self.send_body(request, &body)?)
    }

    /// Sends `body` as `content_type` and reads its JSON answer; a refusal becomes the
    /// API's message and the field it names.
    fn send_bytes(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Value, String> {
        let request = self.request(method, path).set("Content-Type", content_type);
        match request.send_bytes(body) {
            Ok(response) => response
                .into_json()
                .map_err(|e| format!("unreadable answer from {}: {e}", self.base)),
            Err(e) => Err(self.failure(e)),
        }
    }

    /// Sends `body`: the answer whatever its status, or why the API could not be reached.
    fn send_body(&self, request: ureq::Request, body: &str) -> Result<ureq::Response, String> {
        match request.send_string(body) {
            Ok(response) => Ok(response),
            Err(ureq::Error::Status(_, response)) => Ok(response),
            Err(e) => Err(format!("cannot reach the admin API at {}: {e}", self.base)),
        }
    }

    /// An answer's status and JSON body.
    fn status_and_json(&self, response: ureq::Response) -> Result<(u16, Value), String> {
        let status = response.status();
        let answer = response
            .into_json()
            .map_err(|e| format!("unreadable answer from {}: {e}", self.base))?;
        Ok((status, answer))
    }

    /// A request to the API's `path`, carrying the token when there is one.
    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let request = self.agent.request(method, &format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.set("Authorization", &format!("Bearer {token}")),
            None => request,
        }
    }

    /// [`AdminClient::request`] that lands only if the record still has the entity tag
    /// `if_match`, when one is given.
    fn request_if(&self, method: &str, path: &str, if_match: Option<&str>) -> ureq::Request {
        let request = self.request(method, path);
        match if_match {
            Some(tag) => request.set("If-Match", tag),
            None => request,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        self.answer(self.request(method, path), body)
    }

    /// `GET path`'s JSON and the `ETag` of the record it shows.
    fn get_tagged(&self, path: &str) -> Result<(Value, Option<String>), String> {
        let response = self
            .request("GET", path)
            .call()
            .map_err(|e| self.failure(e))?;
        let tag = response.header("etag").map(str::to_string);
        let body = response
            .into_json()
            .map_err(|e| format!("unreadable answer from {}: {e}", self.base))?;
        Ok((body, tag))
    }

    /// A write that lands only if the record still has the entity tag `if_match`.
    fn call_if_match(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        if_match: Option<&str>,
    ) -> Result<Value, String> {
        self.answer(self.request_if(method, path, if_match), body)
    }

    /// `GET path` with `query`'s pairs, percent-encoded by ureq.
    fn get_with_query(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, String> {
        let request = query
            .iter()
            .fold(self.request("GET", path), |request, (name, value)| {
                request.query(name, value)
            });
        self.answer(request, None)
    }

    /// Sends `request` (with a JSON `body`) and reads its JSON answer; a refusal becomes
    /// the API's message and the field it names.
    fn answer(&self, request: ureq::Request, body: Option<Value>) -> Result<Value, String> {
        let response = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        match response {
            Ok(response) if response.status() == 204 => Ok(Value::Null),
            Ok(response) => response
                .into_json()
                .map_err(|e| format!("unreadable answer from {}: {e}", self.base)),
            Err(e) => Err(self.failure(e)),
        }
    }

    /// A failed call in words: the API's message and the field it names, or why the API
    /// could not be reached.
    fn failure(&self, error: ureq::Error) -> String {
        match error {
            ureq::Error::Status(status, response) => {
                let body: Value = response.into_json().unwrap_or(Value::Null);
                let message = body["error"].as_str().unwrap_or("request refused");
                match body["field"].as_str() {
                    Some(field) => format!("{field}: {message} (HTTP {status})"),
                    None => format!("{message} (HTTP {status})"),
                }
            }
            e => format!("cannot reach the admin API at {}: {e}", self.base),
        }
    }
}
