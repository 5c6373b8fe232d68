//! An HTTP/3 client not written here: tests/h3_client.py (aioquic) in the virtual
//! environment scripts/test makes, one request over a new QUIC connection.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// One request to the router's HTTP/3 listener on `port`, `server_name` verified against
/// `ca_file`, with the client's further `args`: its one line of JSON (status, fields,
/// body), or what it said instead.
pub fn ask(port: u16, ca_file: &Path, server_name: &str, args: &[&str]) -> Result<Value, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("SWITCHYARD_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/h3-venv/bin/python3"));
    let output = Command::new(&python)
        .arg(root.join("tests/h3_client.py"))
        .args(["--port", &port.to_string()])
        .args(["--server-name", server_name])
        .args(["--ca", ca_file.to_str().expect("a path")])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} (scripts/test makes it): {e}", python.display()));
    let line = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(line.trim()).map_err(|e| {
        format!(
            "the HTTP/3 client said {line:?} ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr),
        )
    })
}
