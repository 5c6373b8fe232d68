//! The admin API over TLS with client certificates, end to end: the real router with its
//! certificate and a client CA, the real CLI with the CA to trust and a client certificate
//! (issue 68, step 5).

use switchyard_test_support as support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::pki::Ca;
use support::RouterProcess;

const TOKEN: &str = "tls-admin-s3cret";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a PEM file");
    path
}

/// The CLI against `https://localhost:PORT` with `tls` options: success, stdout, stderr.
fn cli(router: &RouterProcess, tls: &[&Path], args: &[&str]) -> (bool, String, String) {
    let admin = format!("https://localhost:{}", router.admin.port());
    let mut command = Command::new(RouterProcess::binary());
    command
        .args(args)
        .args(["--admin", &admin, "--token", TOKEN]);
    let flags = ["--admin-ca", "--admin-client-cert", "--admin-client-key"];
    for (flag, path) in flags.iter().zip(tls) {
        command.arg(flag).arg(path);
    }
    let output = command.output().expect("run the CLI");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_admin_api_over_tls_serves_only_clients_with_a_certificate_of_its_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::root("Fleet admin CA");
    let server = ca.issue(&["localhost"], -1, 30);
    let client = ca.issue(&["deploy-bot"], -1, 30);
    let stranger = Ca::root("Another CA").issue(&["intruder"], -1, 30);
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let server_cert = write(dir.path(), "server.pem", &server.cert_pem);
    let server_key = write(dir.path(), "server.key", &server.key_pem);
    let client_cert = write(dir.path(), "client.pem", &client.cert_pem);
    let client_key = write(dir.path(), "client.key", &client.key_pem);
    let stranger_cert = write(dir.path(), "stranger.pem", &stranger.cert_pem);
    let stranger_key = write(dir.path(), "stranger.key", &stranger.key_pem);
    let router = RouterProcess::start_with(&[
        "--admin-token",
        TOKEN,
        "--admin-tls-cert",
        server_cert.to_str().expect("path"),
        "--admin-tls-key",
        server_key.to_str().expect("path"),
        "--admin-client-ca",
        ca_file.to_str().expect("path"),
    ]);

    // With the CA and a client certificate of it: served, and a write is audited with the
    // client's address.
    let trusted = [ca_file.as_path(), &client_cert, &client_key];
    let (ok, out, err) = cli(&router, &trusted, &["tokens", "create", "--scope", "read"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&router, &trusted, &["audit", "--json"]);
    assert!(ok, "{err}");
    let audit: Value = serde_json::from_str(&out).expect("JSON");
    let made = &audit["records"][0];
    assert_eq!(made["path"], "/v1/tokens");
    assert!(
        made["client"]
            .as_str()
            .is_some_and(|c| c.starts_with("127.0.0.1:")),
        "{made}"
    );

    // No client certificate, or one of another CA: refused in the handshake.
    let (ok, _, err) = cli(&router, &[ca_file.as_path()], &["apps", "list"]);
    assert!(!ok, "served without a client certificate");
    assert!(!err.is_empty());
    let foreign = [ca_file.as_path(), &stranger_cert, &stranger_key];
    let (ok, _, _) = cli(&router, &foreign, &["apps", "list"]);
    assert!(!ok, "served with another CA's certificate");
    // Without the CA, the router's certificate is not trusted.
    let (ok, _, err) = cli(&router, &[], &["apps", "list"]);
    assert!(!ok && !err.is_empty(), "trusted an unknown CA");
    // Plain HTTP gets no HTTP answer.
    let mut plain = std::net::TcpStream::connect(router.admin).expect("connect");
    plain
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
        .expect("send");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "plain HTTP served");
}

#[test]
fn admin_tls_settings_are_checked_at_start() {
    let (_, refused) = RouterProcess::refused_start(["--admin-tls-cert", "/nonexistent.pem"]);
    assert!(
        refused.contains("admin_tls_cert and admin_tls_key"),
        "{refused}"
    );
    let (_, refused) = RouterProcess::refused_start(["--admin-client-ca", "/ca.pem"]);
    assert!(
        refused.contains("client certificates need the admin API over TLS"),
        "{refused}"
    );
    let (_, refused) = RouterProcess::refused_start([
        "--admin-tls-cert",
        "/nonexistent.pem",
        "--admin-tls-key",
        "/nonexistent.key",
    ]);
    assert!(
        refused.contains("admin_tls_cert /nonexistent.pem"),
        "{refused}"
    );
}
