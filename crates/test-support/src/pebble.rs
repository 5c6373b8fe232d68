//! A real ACME server for the certificate tests: Pebble (Let's Encrypt's test CA) and its
//! DNS, pebble-challtestsrv, which answers every name with 127.0.0.1, on free ports of
//! 127.0.0.1, stopped by their PIDs. Pebble validates HTTP-01 on the port the test gives
//! (the router's plain HTTP listener), TLS-ALPN-01 on another (its HTTPS listener); its own
//! HTTPS certificate comes from a test CA whose PEM routers are told to trust.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;
use super::pki::Ca;

pub struct Pebble {
    children: Vec<Child>,
    /// The directory URL routers are given.
    pub directory: String,
    /// PEM of the CA that signed Pebble's HTTPS certificate.
    pub ca_file: PathBuf,
    dir: tempfile::TempDir,
}

impl Pebble {
    /// Starts the DNS and the CA, validating HTTP-01 challenges on 127.0.0.1:`http_port`.
    pub fn start(http_port: u16) -> Self {
        Self::launch(http_port, free_port(), None)
    }

    /// Like [`Pebble::start`]; with `eab`, accounts must be bound to that external account
    /// (key id, base64url HMAC key), as some CAs require.
    pub fn start_requiring(http_port: u16, eab: Option<(&str, &str)>) -> Self {
        Self::launch(http_port, free_port(), eab)
    }

    /// Like [`Pebble::start`], validating TLS-ALPN-01 challenges on 127.0.0.1:`tls_port`.
    pub fn start_validating_tls(http_port: u16, tls_port: u16) -> Self {
        Self::launch(http_port, tls_port, None)
    }

    fn launch(http_port: u16, tls_port: u16, eab: Option<(&str, &str)>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::root("Pebble listener test CA");
        let listener_cert = ca.issue(&["localhost"], -1, 30);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write pebble file");
            path
        };
        let ca_file = write("ca.pem", &ca.pem());
        let cert = write("cert.pem", &listener_cert.cert_pem);
        let key = write("key.pem", &listener_cert.key_pem);

        let dns = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let dns_management = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let management = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut config = serde_json::json!({"pebble": {
            "listenAddress": listen.to_string(),
            "managementListenAddress": management.to_string(),
            "certificate": cert,
            "privateKey": key,
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        if let Some((kid, hmac)) = eab {
            config["pebble"]["externalAccountBindingRequired"] = true.into();
            config["pebble"]["externalAccountMACKeys"] = serde_json::json!({ kid: hmac });
        }
        let config_path = write("pebble.json", &config.to_string());
        let log =
            |name: &str| std::fs::File::create(dir.path().join(name)).expect("pebble log file");

        let mut children = Vec::new();
        let challtestsrv = Command::new("pebble-challtestsrv")
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .args(["-dns01", &dns.to_string()])
            .args(["-management", &dns_management.to_string()])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .stdout(log("challtestsrv.log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv (scripts/test installs the pebble package)");
        children.push(challtestsrv);
        wait_listening(dns_management, "pebble-challtestsrv");
        let pebble = Command::new("pebble")
            .args(["-config", config_path.to_str().expect("path")])
            .args(["-dnsserver", &dns.to_string()])
            // Validate at once, and never reject a good nonce: the tests time orders, not
            // the client's retries.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(log("pebble.log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble (scripts/test installs the pebble package)");
        children.push(pebble);
        wait_listening(listen, "pebble");
        Self {
            children,
            directory: format!("https://localhost:{}/dir", listen.port()),
            ca_file,
            dir,
        }
    }

    /// What Pebble logged so far (its validations, orders and issuances).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pebble.log")).unwrap_or_default()
    }

    /// Flags for a router ordering from this Pebble.
    pub fn router_flags(&self) -> Vec<String> {
        vec![
            "--acme-directory".into(),
            self.directory.clone(),
            "--acme-ca-file".into(),
            self.ca_file.display().to_string(),
            "--acme-email".into(),
            "ops@example.test".into(),
        ]
    }
}

fn wait_listening(address: SocketAddr, what: &str) {
    let start = Instant::now();
    while TcpStream::connect(address).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what} did not start listening on {address}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
