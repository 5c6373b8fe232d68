//! The references in docs/reference are the code's own: the binary writes them again here
//! and each must equal the committed copy (scripts/docs regenerates them).

use std::path::Path;
use std::process::Command;

use switchyard_test_support::RouterProcess;

#[test]
fn the_committed_references_are_what_the_code_says() {
    let fresh = tempfile::tempdir().expect("a directory");
    let output = Command::new(RouterProcess::binary())
        .args(["reference", fresh.path().to_str().expect("a path")])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("run switchyard reference");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference");
    for name in ["settings.md", "metrics.md", "cli.md"] {
        let made = std::fs::read_to_string(fresh.path().join(name)).expect("a reference made");
        let kept = std::fs::read_to_string(committed.join(name)).unwrap_or_default();
        if made != kept {
            let first = made
                .lines()
                .zip(kept.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(made.lines().count().min(kept.lines().count()));
            panic!(
                "docs/reference/{name} differs from what the code says (first at line {}): \
                 run scripts/docs and commit the result",
                first + 1
            );
        }
    }
}
