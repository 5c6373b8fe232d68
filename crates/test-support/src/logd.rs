//! `switchyard logd` under test: the real binary on a free port, writing into its own
//! temporary directory, restartable on the same port and directory.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{client, free_port, RouterProcess};

pub struct LogdProcess {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    starts: usize,
}

impl LogdProcess {
    /// Starts logd with extra flags.
    pub fn start_with(extra: &[&str]) -> Self {
        let mut logd = Self::unstarted_with(extra);
        logd.spawn();
        logd
    }

    /// Chooses ports and a directory without starting: routers can be pointed at a log
    /// service that is not there yet.
    pub fn unstarted_with(extra: &[&str]) -> Self {
        Self {
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            metrics: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::tempdir().expect("tempdir"),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            starts: 0,
        }
    }

    /// Starts (or starts again) on the same port and directory.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "logd is running");
        self.starts += 1;
        let stderr =
            std::fs::File::create(self.dir.path().join(format!("stderr-{}.log", self.starts)))
                .expect("stderr file");
        let child = Command::new(RouterProcess::binary())
            .arg("logd")
            .args(["--listen", &self.addr.to_string()])
            .args(["--dir", &self.logs_dir().display().to_string()])
            .args(["--metrics", &self.metrics.to_string()])
            .args(&self.extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start switchyard logd");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(self.addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "logd not ready:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Where the per-app directories are.
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: nothing flushed, nothing cleaned up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal by name (`HUP`, `TERM`).
    pub fn signal(&self, name: &str) {
        super::send_signal(self.pid(), name);
    }

    pub fn stderr(&self) -> String {
        super::stderr_of_starts(self.dir.path(), self.starts)
    }

    /// Every line of every file of `app` (current and rotated, gzipped ones unpacked by
    /// `zcat`), in no particular order.
    pub fn lines_of(&self, app_dir: &str) -> Vec<String> {
        lines_under(&self.logs_dir().join(app_dir))
    }

    /// The value of one Prometheus series from `--metrics`; 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        let Ok(response) = client::get(self.metrics, "logd", "/metrics") else {
            return 0.0;
        };
        super::metric_in(&response.text(), series)
    }
}

/// Lines of every file in `dir`.
pub fn lines_under(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        // A file logd is rotating: its lines are being copied, read them where they land.
        if path.extension().is_some_and(|e| e == "rotating") {
            continue;
        }
        let text = if path.extension().is_some_and(|e| e == "gz") {
            let out = Command::new("zcat").arg(&path).output().expect("zcat");
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            std::fs::read_to_string(&path).unwrap_or_default()
        };
        lines.extend(text.lines().map(str::to_string));
    }
    lines
}

/// Lines in one log file (gzipped or not): for diagnostics.
pub fn lines_under_file(path: &Path) -> usize {
    if path.extension().is_some_and(|e| e == "gz") {
        let out = Command::new("zcat").arg(path).output().expect("zcat");
        return String::from_utf8_lossy(&out.stdout).lines().count();
    }
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// How many times each value of `field` appears in JSON `lines`.
pub fn count_by(lines: &[String], field: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON record ({e}): {line}"));
        let value = match &record[field] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        *counts.entry(value).or_insert(0) += 1;
    }
    counts
}

impl Drop for LogdProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
