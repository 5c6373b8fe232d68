//! A long write's progress on the terminal: the admin API streams its steps (JSON lines,
//! `Accept: application/x-ndjson`) and this draws them on stderr as one line redrawn in
//! place — apps compared, then a bar of apps written and left. Off a terminal, the CLI
//! asks for no progress and prints only the outcome.

use std::io::{BufRead, IsTerminal, Write};

use serde_json::Value;

use super::AdminClient;

/// JSON lines: how the apps are sent, and how the steps come back when asked for.
const STEPS: &str = "application/x-ndjson";

/// Width of the bar, in characters.
const BAR: usize = 30;

impl AdminClient {
    /// Sends a long write of JSON lines (`label` names it on the bar); its status and
    /// answer, as [`AdminClient::send_text_if`] gives them.
    pub(super) fn send_with_progress(
        &self,
        label: &str,
        method: &str,
        path: &str,
        body: String,
        if_match: Option<&str>,
    ) -> Result<(u16, Value), String> {
        if !std::io::stderr().is_terminal() {
            return self.send_text_if(method, path, STEPS, body, if_match);
        }
        let request = self
            .request_if(method, path, if_match)
            .set("Content-Type", STEPS)
            .set("Accept", STEPS);
        let response = self.send_body(request, &body)?;
        if response.content_type() != STEPS {
            // Refused before the write began (a token, a size): a plain answer.
            return self.status_and_json(response);
        }
        let mut drawn = Drawn::default();
        for line in std::io::BufReader::new(response.into_reader()).lines() {
            let line = line.map_err(|e| format!("the answer broke off: {e}"))?;
            let step: Value = serde_json::from_str(&line)
                .map_err(|e| format!("unreadable progress from {}: {e}", self.base))?;
            if let Some(status) = step["status"].as_u64() {
                drawn.end();
                return Ok((status as u16, step["answer"].clone()));
            }
            drawn.step(label, &step);
        }
        drawn.end();
        Err("the answer ended before its outcome".into())
    }
}

/// What is on the terminal's last line.
#[derive(Default)]
struct Drawn {
    compared: Option<u64>,
    started: bool,
}

impl Drawn {
    fn step(&mut self, label: &str, step: &Value) {
        if let Some(compared) = step["compared"].as_u64() {
            self.compared = Some(compared);
        }
        let written = step["written"].as_u64();
        let left = step["left"].as_u64().unwrap_or(0);
        let line = match written {
            Some(written) => {
                let total = (written + left).max(1);
                let filled = (written as usize * BAR) / total as usize;
                format!(
                    "{label} [{}{}] {written} written, {left} left{}",
                    "#".repeat(filled),
                    "-".repeat(BAR - filled),
                    self.compared
                        .map(|c| format!(" ({c} apps compared)"))
                        .unwrap_or_default()
                )
            }
            None => format!(
                "{label}: {} apps compared, {} to write",
                self.compared.unwrap_or(0),
                step["writes"].as_u64().unwrap_or(0)
            ),
        };
        let mut stderr = std::io::stderr();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
        self.started = true;
    }

    fn end(&mut self) {
        if self.started {
            eprintln!();
            self.started = false;
        }
    }
}
