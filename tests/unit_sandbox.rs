//! The router under the packaged unit's sandbox, on a machine where systemd is not PID 1:
//! `tests/unit_sandbox.py` applies deploy/systemd/switchyard.service's system-call filter,
//! address families, capability bounding set and umask as systemd would (stricter: a call
//! outside the filter kills the router), in a mount namespace whose /proc hides other
//! users' processes (ProtectProc=invisible). Then traffic of every kind goes through it,
//! a SIGHUP reopens its log and a binary upgrade hands its sockets over; a single call the
//! unit refuses would end the router and fail the test.
//!
//! The only test of this file: it points `SWITCHYARD_BIN` at the sandboxed launcher for the
//! whole test process.

use switchyard_test_support as support;

use std::io::Cursor;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;
use support::h2_raw::{self, Outcome};
use support::pki::Ca;
use support::{tls, Backend, RouterProcess};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A script that runs the real binary inside the unit's sandbox, keeping its process id
/// (every step `exec`s), so the harness's signals reach the router itself.
fn sandboxed_launcher(dir: &Path) -> PathBuf {
    let unit = repository().join("deploy/systemd/switchyard.service");
    let sandbox = repository().join("tests/unit_sandbox.py");
    let script = format!(
        "#!/bin/sh\nexec unshare --mount --propagation private /bin/sh -c \
         'mount -t proc -o hidepid=invisible proc /proc && exec /usr/bin/python3 \"$0\" \"$@\"' \
         {sandbox} {unit} {binary} \"$@\"\n",
        sandbox = sandbox.display(),
        unit = unit.display(),
        binary = RouterProcess::binary().display(),
    );
    let path = dir.join("switchyard-sandboxed");
    std::fs::write(&path, script).expect("write the launcher");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn png(width: u32, height: u32) -> Vec<u8> {
    let pixels = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x % 251) as u8, (y % 241) as u8, 90])
    });
    let mut out = Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(pixels)
        .write_to(&mut out, image::ImageFormat::Png)
        .expect("encode");
    out.into_inner()
}

#[test]
fn the_router_serves_every_kind_of_traffic_under_the_units_sandbox() {
    let dir = tempfile::tempdir().expect("temp dir");
    // SAFETY of the process environment: this file's only test, set before any thread.
    std::env::set_var("SWITCHYARD_BIN", sandboxed_launcher(dir.path()));
    let ca = Ca::root("Sandbox Root");
    let default = ca.issue(&["default.invalid"], -1, 30);
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, &default.cert_pem).expect("write");
    std::fs::write(&key_path, &default.key_pem).expect("write");
    let mut router = RouterProcess::start_with(&[
        "--default-cert",
        cert_path.to_str().expect("path"),
        "--default-key",
        key_path.to_str().expect("path"),
    ]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", router.pid()))
        .expect("the router's status");
    assert!(
        status.lines().any(|l| l == "Seccomp:\t2"),
        "the router runs under a seccomp filter:\n{status}"
    );
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");

    let backend = Backend::start("sandboxed");
    let root = tempfile::tempdir().expect("static root");
    std::fs::write(root.path().join("photo.png"), png(400, 200)).expect("write");
    router.put_app(
        "shop",
        json!({
            "domains": ["shop.test"],
            "backends": [backend.addr.to_string()],
            "waf": {"mode": "block"},
            "images": {"max_width": 1000, "max_height": 1000},
            "static_root": root.path().display().to_string(),
        }),
    );
    let own = ca.issue(&["shop.test"], -1, 30);
    router.store_cert("shop.test", &own);

    // HTTP/1.1, HTTPS, HTTP/2, the WAF and the worker pool's image resizing.
    let plain = router.get("shop.test", "/hello");
    assert_eq!(plain.status, 200, "{}", router.logs());
    assert_eq!(plain.json()["backend"], "sandboxed");
    let mut secure =
        tls::connect(router.https, Some("shop.test"), &["http/1.1"]).expect("a TLS handshake");
    assert_eq!(secure.fingerprint, own.fingerprint);
    assert_eq!(secure.get("shop.test", "/").expect("HTTPS").status, 200);
    let h2 = h2_raw::exchange(
        router.http,
        &[h2_raw::frame(
            h2_raw::HEADERS,
            h2_raw::END_HEADERS | h2_raw::END_STREAM,
            1,
            &h2_raw::request_block("GET", "shop.test", b"/", &[]),
        )],
    );
    assert_eq!(h2, Outcome::Answered(200));
    let probe = router.send(
        "GET",
        "shop.test",
        "/search?q=%3Cscript%3Ealert(1)%3C/script%3E",
        "User-Agent: Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0\r\n",
    );
    assert_eq!(probe.status, 403, "the WAF refuses an injection");
    let resized = router.get("shop.test", "/_img/100x100/photo.png");
    assert_eq!(resized.status, 200, "{}", resized.text());
    let image = image::load_from_memory(&resized.body).expect("an image");
    assert_eq!((image.width(), image.height()), (100, 50));

    // A backup of the store, a log reopened, then a binary upgrade under the same sandbox.
    let (status, _) = router.admin_call("GET", "/v1/store/backup", None);
    assert_eq!(status, 200, "{}", router.logs());
    let records_before = router.access_records().len();
    router.signal("HUP");
    assert_eq!(router.get("shop.test", "/after-hup").status, 200);
    support::eventually(
        std::time::Duration::from_secs(5),
        "the request after SIGHUP logged",
        || router.access_records().len() > records_before,
    );
    let mut old = router.upgrade_quitting_predecessor();
    let old_status = old.wait().expect("the old router's exit");
    assert!(old_status.success(), "{old_status}: {}", router.logs());
    assert_eq!(router.get("shop.test", "/upgraded").status, 200);
    let exit = router.terminate();
    assert!(exit.success(), "stopped cleanly: {exit}\n{}", router.logs());
}
