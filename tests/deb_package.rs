//! The Debian package (Cargo.toml's [package.metadata.deb], built by scripts/test with
//! cargo-deb into target/debian/switchyard.deb), checked as dpkg would see it: its
//! dependencies and conffiles, its files unpacked and run, its unit verified by systemd,
//! its maintainer scripts valid, and an upgrade that reloads (the binary upgrade) rather
//! than restarts. Installing it and starting the unit needs systemd as PID 1, which this
//! harness does not assume.

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
    assert_eq!(conffiles.trim(), "/etc/switchyard/switchyard.toml");
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
