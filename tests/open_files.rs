//! Process limits: a router must not refuse connections at the usual soft limit of 1,024
//! open files when the administrator allowed more.

use switchyard_test_support as support;

use std::process::Command;

use support::RouterProcess;

/// (soft, hard) "Max open files" of a process, from /proc.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("/proc limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open-files line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    (
        fields.next().expect("soft").to_string(),
        fields.next().expect("hard").to_string(),
    )
}

#[test]
fn the_router_raises_its_open_file_limit_to_the_hard_limit() {
    // This test binary runs alone in its process: lower its own soft limit, which the
    // router it starts inherits, as on a stock system.
    let own = std::process::id().to_string();
    let (_, hard) = open_file_limits(std::process::id());
    let lowered = Command::new("prlimit")
        .args(["--pid", &own, "--nofile=512:"])
        .status()
        .expect("prlimit (util-linux)");
    assert!(lowered.success());
    assert_eq!(open_file_limits(std::process::id()).0, "512");

    let router = RouterProcess::start();
    let (soft, router_hard) = open_file_limits(router.pid());
    assert_eq!(router_hard, hard);
    let expected = match hard.parse::<u64>() {
        Ok(hard) => hard.min(1 << 20).to_string(),
        Err(_) => (1u64 << 20).to_string(), // "unlimited"
    };
    assert_eq!(soft, expected, "soft limit after start-up (was 512)");
    assert!(router.logs().contains("open-file limit raised from 512"));
}
