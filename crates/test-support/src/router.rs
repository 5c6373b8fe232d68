//! The router under test: the real release binary, on free ports, with its own data dir.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{client, free_port};

pub struct RouterProcess {
    child: Option<Child>,
    pub http: SocketAddr,
    pub https: SocketAddr,
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    /// Environment variables beside `RUST_LOG`, kept over restarts and upgrades.
    extra_env: Vec<(String, String)>,
    token: Option<String>,
    starts: usize,
}

impl RouterProcess {
    /// Starts a router with default options (drain grace 1 s, shutdown grace 2 s).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a router with extra `serve` flags.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_on(free_port(), extra)
    }

    /// Starts a router with extra `serve` flags and environment variables (the benchmarks'
    /// switches, which are no settings).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut router = Self::unstarted(free_port(), free_port(), extra);
        router.extra_env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        router.spawn();
        router
    }

    /// Starts a router whose plain HTTP listener is on `http_port` (one chosen before, for a
    /// peer that must know it, such as an ACME server validating HTTP-01).
    pub fn start_on(http_port: u16, extra: &[&str]) -> Self {
        Self::start_on_ports(http_port, free_port(), extra)
    }

    /// Like [`RouterProcess::start_on`], with the HTTPS listener on `https_port` too.
    pub fn start_on_ports(http_port: u16, https_port: u16, extra: &[&str]) -> Self {
        let mut router = Self::unstarted(http_port, https_port, extra);
        router.spawn();
        router
    }

    fn unstarted(http_port: u16, https_port: u16, extra: &[&str]) -> Self {
        Self {
            child: None,
            http: SocketAddr::from(([127, 0, 0, 1], http_port)),
            https: SocketAddr::from(([127, 0, 0, 1], https_port)),
            admin: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::tempdir().expect("tempdir"),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            extra_env: Vec::new(),
            token: extra
                .iter()
                .position(|a| *a == "--admin-token")
                .and_then(|i| extra.get(i + 1))
                .map(|t| t.to_string()),
            starts: 0,
        }
    }

    /// The `switchyard` binary under test: `SWITCHYARD_BIN` when set, otherwise the one
    /// cargo builds beside the test binaries' `deps/` folder for the same profile (cargo
    /// builds it for the root package's integration tests).
    pub fn binary() -> PathBuf {
        if let Some(path) = std::env::var_os("SWITCHYARD_BIN") {
            return PathBuf::from(path);
        }
        let test_binary = std::env::current_exe().expect("the test binary's path");
        let profile_dir = test_binary
            .parent()
            .and_then(Path::parent)
            .expect("test binaries live in target/PROFILE/deps");
        profile_dir.join("switchyard")
    }

    /// Runs `switchyard serve ARGS`, which must refuse to start; its exit status and stderr.
    pub fn refused_start<S: AsRef<std::ffi::OsStr>>(
        args: impl IntoIterator<Item = S>,
    ) -> (ExitStatus, String) {
        let output = Command::new(Self::binary())
            .arg("serve")
            .args(args)
            .output()
            .expect("run switchyard");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!output.status.success(), "switchyard started:\n{stderr}");
        (output.status, stderr)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn access_log(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }

    /// The access log's records so far; a line still being written is left out.
    pub fn access_records(&self) -> Vec<Value> {
        std::fs::read_to_string(self.access_log())
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    fn spawn(&mut self) {
        self.spawn_process(&[]);
        self.wait_ready();
    }

    fn spawn_process(&mut self, more_args: &[&str]) {
        self.starts += 1;
        let stderr =
            std::fs::File::create(self.dir.path().join(format!("stderr-{}.log", self.starts)))
                .expect("stderr file");
        // Shipping to a log service replaces the local access log.
        let access_log = if self.extra_args.iter().any(|a| a == "--log-to") {
            vec![]
        } else {
            vec![
                "--access-log".to_string(),
                self.access_log().display().to_string(),
            ]
        };
        let child = Command::new(Self::binary())
            .arg("serve")
            .args(["--http", &self.http.to_string()])
            .args(["--https", &self.https.to_string()])
            .args(["--admin", &self.admin.to_string()])
            .args(["--data-dir", &self.data_dir().display().to_string()])
            .args(&access_log)
            .args([
                "--drain-grace-s",
                "1",
                "--shutdown-grace-s",
                "2",
                "--threads",
                "2",
            ])
            .args(&self.extra_args)
            .args(more_args)
            .env("RUST_LOG", "info")
            .envs(self.extra_env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start switchyard");
        self.child = Some(child);
    }

    /// A graceful binary upgrade, as an operator does it: a new process started with
    /// `--upgrade` on the same ports and data directory, which takes the running one's
    /// listening sockets over, then SIGQUIT to the running one. Returns the old process
    /// (draining, then exiting); this handle now drives the new one.
    pub fn upgrade(&mut self) -> Child {
        let old = self.child.take().expect("running");
        self.spawn_process(&["--upgrade"]);
        let start = Instant::now();
        while !self.logs().contains("took over") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the new process never waited for the sockets:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = Command::new("kill")
            .args(["-QUIT", &old.id().to_string()])
            .status()
            .expect("kill -QUIT");
        assert!(status.success());
        old
    }

    /// A binary upgrade as systemd's `ExecReload` makes it: a new process started with
    /// `--upgrade --quit-predecessor`, which sends the running one SIGQUIT itself. Returns
    /// the old process; this handle now drives the new one, once it answers.
    pub fn upgrade_quitting_predecessor(&mut self) -> Child {
        let old = self.child.take().expect("running");
        self.spawn_process(&["--upgrade", "--quit-predecessor"]);
        self.wait_ready();
        old
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            // An admin API over TLS is up once it accepts (its tests speak TLS themselves).
            let admin_tls = self.extra_args.iter().any(|a| a == "--admin-tls-cert");
            let admin_up = if admin_tls {
                std::net::TcpStream::connect(self.admin).is_ok()
            } else {
                client::get(self.admin, "localhost", "/healthz").is_ok_and(|r| r.status == 200)
            };
            let http_up = std::net::TcpStream::connect(self.http).is_ok()
                && std::net::TcpStream::connect(self.https).is_ok();
            if admin_up && http_up {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "switchyard exited during start-up ({status}):\n{}",
                    self.logs()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "switchyard not ready:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the router wrote on stderr, across restarts.
    pub fn logs(&self) -> String {
        super::stderr_of_starts(self.dir.path(), self.starts)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// A call to the admin API: status and JSON body (Null when empty).
    pub fn admin_call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let auth = self
            .token
            .as_ref()
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let body = body.unwrap_or("");
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let response = client::request(self.admin, &raw).expect("admin API reachable");
        let json = if response.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&response.body).unwrap_or(Value::String(response.text()))
        };
        (response.status, json)
    }

    /// The value of one Prometheus series (name with labels, as exported); 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        let (status, text) = self.admin_call("GET", "/metrics", None);
        assert_eq!(status, 200, "metrics: {text}");
        super::metric_in(text.as_str().unwrap_or_default(), series)
    }

    /// PUTs an app and insists on success.
    pub fn put_app(&self, name: &str, spec: Value) -> Value {
        let (status, body) =
            self.admin_call("PUT", &format!("/v1/apps/{name}"), Some(&spec.to_string()));
        assert_eq!(status, 200, "PUT app {name} failed: {body}");
        body
    }

    /// Stores a certificate and its key for `domain`: the admin API's status and answer.
    pub fn put_cert(&self, domain: &str, cert: &super::pki::Issued) -> (u16, Value) {
        let body = serde_json::json!({"cert_pem": cert.cert_pem, "key_pem": cert.key_pem});
        self.admin_call(
            "PUT",
            &format!("/v1/certs/{domain}"),
            Some(&body.to_string()),
        )
    }

    /// [`Self::put_cert`], insisting on success.
    pub fn store_cert(&self, domain: &str, cert: &super::pki::Issued) {
        let (status, body) = self.put_cert(domain, cert);
        assert_eq!(status, 200, "PUT cert {domain}: {body}");
    }

    /// Replaces an app's backends and insists on success.
    pub fn scale(&self, name: &str, backends: &[SocketAddr]) {
        let list: Vec<String> = backends.iter().map(ToString::to_string).collect();
        let body = serde_json::json!({ "backends": list }).to_string();
        let (status, answer) =
            self.admin_call("PUT", &format!("/v1/apps/{name}/backends"), Some(&body));
        assert_eq!(status, 200, "scale {name} failed: {answer}");
    }

    /// `GET path` through the proxy with the given Host.
    pub fn get(&self, host: &str, path: &str) -> client::Response {
        self.send("GET", host, path, "")
    }

    /// `method path` through the proxy with the given Host and `extra` header lines (each
    /// ending in `\r\n`), no body.
    pub fn send(&self, method: &str, host: &str, path: &str, extra: &str) -> client::Response {
        client::send(self.http, method, host, path, extra)
            .unwrap_or_else(|e| panic!("{method} {host}{path} failed: {e}\n{}", self.logs()))
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        child.wait().expect("wait for switchyard")
    }

    /// Sends a signal by name (`HUP`, `USR1`) without waiting.
    pub fn signal(&self, name: &str) {
        super::send_signal(self.pid(), name);
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_terminate(&self) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
    }

    /// Waits for an exit already under way.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.child.take().expect("running").wait().expect("wait")
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the binary again on the same ports and data directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the router before restarting it");
        self.spawn();
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
