//! The Debian package (Cargo.toml's [package.metadata.deb], built by scripts/test with
//! cargo-deb into target/debian/switchyard.deb), checked as dpkg would see it: its
//! dependencies and conffiles, its files unpacked and run, its unit verified by systemd,
//! its maintainer scripts valid, and an upgrade that reloads (the binary upgrade) rather
//! than restarts; and installed by dpkg, with its maintainer scripts, and its unit started
//! as systemd would start it (its user, state directory, capabilities, environment) and
//! reloaded by its ExecReload (the binary upgrade), in a
//! copy of this machine that vanishes after the test (tests/deb/install_and_start.sh):
//! systemd itself is not PID 1 on the machines this runs on.

use std::path::{Path, PathBuf};
use std::process::Command;

fn package() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debian/switchyard.deb");
    assert!(
        path.exists(),
        "{} is made by scripts/test (cargo deb --profile ci --no-build --output …)",
        path.display()
    );
    path
}

fn dpkg_deb(args: &[&str]) -> String {
    let output = Command::new("dpkg-deb")
        .args(args)
        .output()
        .expect("dpkg-deb");
    assert!(
        output.status.success(),
        "dpkg-deb {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_package_depends_on_what_the_binary_links_and_keeps_the_settings_as_a_conffile() {
    let deb = package();
    let deb = deb.to_str().expect("a path");
    let depends = dpkg_deb(&["--field", deb, "Depends"]);
    for library in [
        "libssl3",
        "libmodsecurity3",
        "libturbojpeg0",
        "modsecurity-crs",
    ] {
        assert!(depends.contains(library), "Depends: {depends}");
    }
    let control = tempfile::tempdir().expect("a directory");
    dpkg_deb(&["--control", deb, control.path().to_str().expect("a path")]);
    let conffiles = std::fs::read_to_string(control.path().join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles.trim(),
        "/etc/switchyard/switchyard.toml\n/etc/logrotate.d/switchyard"
    );
    // The access log the settings write is rotated, the router told by SIGHUP to reopen it.
    let contents = dpkg_deb(&["--contents", deb]);
    assert!(
        contents.contains("./etc/logrotate.d/switchyard"),
        "{contents}"
    );
    // The log service's unit ships beside the router's.
    assert!(
        contents.contains("./lib/systemd/system/switchyard-logd.service"),
        "{contents}"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let path = control.path().join(script);
        let status = Command::new("sh")
            .arg("-n")
            .arg(&path)
            .status()
            .expect("sh -n");
        assert!(status.success(), "{script} is not valid sh");
    }
    // An upgrade reloads the running router (its binary upgrade); nothing stops or
    // restarts it.
    let postinst = std::fs::read_to_string(control.path().join("postinst")).expect("postinst");
    assert!(
        postinst.contains("systemctl reload switchyard.service"),
        "{postinst}"
    );
    assert!(
        !postinst.contains("_dh_action=restart") && !postinst.contains("invoke restart"),
        "{postinst}"
    );
    let prerm = std::fs::read_to_string(control.path().join("prerm")).expect("prerm");
    assert!(
        prerm.contains("\"$1\" = remove"),
        "stops only on removal: {prerm}"
    );
}

#[test]
fn the_unpacked_package_runs_and_its_unit_verifies() {
    let deb = package();
    let root = tempfile::tempdir().expect("a directory");
    dpkg_deb(&[
        "--extract",
        deb.to_str().expect("a path"),
        root.path().to_str().expect("a path"),
    ]);
    let binary = root.path().join("usr/bin/switchyard");
    let version = Command::new(&binary)
        .arg("--version")
        .output()
        .expect("the packaged binary");
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("switchyard "));
    let check = Command::new(&binary)
        .args(["apps", "check"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/shop.toml"))
        .output()
        .expect("apps check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    for file in [
        "etc/switchyard/switchyard.toml",
        "usr/share/doc/switchyard/README.md",
        "usr/share/doc/switchyard/reference/metrics.md",
        "usr/share/doc/switchyard/reference/openapi.json",
        "usr/share/switchyard/prometheus/switchyard-alerts.yml",
        "usr/share/switchyard/grafana/switchyard.json",
    ] {
        assert!(root.path().join(file).exists(), "{file} not packaged");
    }
    let unit = root
        .path()
        .join("usr/lib/systemd/system/switchyard.service");
    let packaged = std::fs::read_to_string(&unit).expect("the unit");
    let kept = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/switchyard.service"),
    )
    .expect("deploy/systemd/switchyard.service");
    assert_eq!(packaged, kept);
    // Verified where the package puts the binary, as installed.
    let installed = root.path().join("switchyard.service");
    std::fs::write(
        &installed,
        packaged.replace("/usr/bin/switchyard", binary.to_str().expect("a path")),
    )
    .expect("write the unit");
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&installed)
        .output()
        .expect("systemd-analyze (scripts/test installs systemd)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    // Any word about this unit fails (other units it names are not ours to judge).
    assert!(
        verified.status.success() && !said.lines().any(|line| line.contains("switchyard")),
        "{said}"
    );
}

fn install_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deb/install_and_start.sh")
}

/// tests/deb/install_and_start.sh in its namespaces: `probe` only makes its overlay.
fn install_apart(work: &Path, deb: &Path, probe: bool) -> std::io::Result<std::process::Output> {
    Command::new("timeout")
        .args([
            "120", "unshare", "--mount", "--net", "--pid", "--fork", "sh",
        ])
        .arg(install_script())
        .args(probe.then_some("probe"))
        .env("WORK", work)
        .env("DEB", deb)
        .env(
            "SANDBOX",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/unit_sandbox.py"),
        )
        .output()
}

/// Whether this machine lets the test make the namespaces and the overlay it installs in:
/// root, util-linux's unshare, mount namespaces and overlayfs. Why not, otherwise.
fn can_install_apart(deb: &Path) -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0");
    if !root {
        return Err("not root: installing apart needs mount and network namespaces".into());
    }
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    match install_apart(work.path(), deb, true) {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "no namespaces or overlay here: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(e) => Err(format!("no unshare (util-linux): {e}")),
    }
}

#[test]
fn the_package_installs_and_its_unit_starts_the_router() {
    let deb = package();
    if let Err(why) = can_install_apart(&deb) {
        // CI's machines run scripts/test as root with both, and run this.
        eprintln!("skipped: {why}");
        return;
    }
    let work = tempfile::tempdir().expect("a directory");
    let output = install_apart(work.path(), &deb, false).expect("unshare");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    for line in [
        "status: install ok installed",
        "enabled: yes",
        r#"healthz: {"status":"ok"}"#,
        // The unit's own user, not root: port 80 is bound by its ambient capability.
        "user: 65534",
        // Under the unit's system-call filter (2: a seccomp filter), files its own (UMask).
        "seccomp: 2",
        "put: 200",
        // The app has no backends yet: the router answers for it on port 80.
        "port 80: 503",
        "state: 65534 700 ",
        "store mode: 600",
        // `systemctl reload`'s command hands the sockets over and the old process ends.
        "old router after reload: exit 0",
        // The app, in the store the new process opened after the old one let it go.
        "after reload, user: 65534",
        "after reload, port 80: 503",
        "stopped: yes",
        "removed, settings kept: yes",
        "purged: yes",
    ] {
        assert!(
            said.lines().any(|l| l.starts_with(line)),
            "{line:?} not in:\n{said}"
        );
    }
    assert!(
        said.lines()
            .any(|l| l.starts_with("state:") && l.contains("switchyard.redb")),
        "the store is in the state directory:\n{said}"
    );
}
