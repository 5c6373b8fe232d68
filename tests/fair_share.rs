//! The fair share through the real binary: the event loops saturated by an app whose answers
//! the router compresses, beside a quiet app. The heavy app, over its share, has requests
//! queued (and past the bound refused with 503 and `Retry-After`); the quiet one is never
//! refused. bench/engines/fair_share.py measures the latencies.

use switchyard_test_support as support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::{Backend, RouterProcess};

const LOAD_FOR: Duration = Duration::from_secs(4);

#[test]
fn an_app_over_its_share_waits_on_a_saturated_loop_and_a_quiet_one_is_never_refused() {
    let router = RouterProcess::start_with(&["--fair-share", "on", "--fair-share-lag-ms", "1"]);
    let backend = Backend::start("app");
    let backends = [backend.addr.to_string()];
    router.put_app(
        "heavy",
        json!({"domains": ["heavy.test"], "backends": backends,
               "compress": {"types": ["application/octet-stream"]}}),
    );
    router.put_app(
        "quiet",
        json!({"domains": ["quiet.test"], "backends": backends}),
    );
    let started = Instant::now();
    let (heavy, quiet) = std::thread::scope(|scope| {
        let heavy: Vec<_> = (0..12)
            .map(|_| {
                scope.spawn(|| {
                    let mut answers = Vec::new();
                    while started.elapsed() < LOAD_FOR {
                        let answer = router.send(
                            "GET",
                            "heavy.test",
                            "/bytes?n=4000000",
                            "Accept-Encoding: gzip\r\n",
                        );
                        answers.push((answer.status, answer.header("retry-after").is_some()));
                    }
                    answers
                })
            })
            .collect();
        let quiet = scope.spawn(|| {
            let mut statuses = Vec::new();
            while started.elapsed() < LOAD_FOR {
                statuses.push(router.get("quiet.test", "/").status);
                std::thread::sleep(Duration::from_millis(10));
            }
            statuses
        });
        let heavy: Vec<(u16, bool)> = heavy
            .into_iter()
            .flat_map(|t| t.join().expect("heavy client"))
            .collect();
        (heavy, quiet.join().expect("quiet client"))
    });
    let queued = router.metric(r#"switchyard_fair_share_requests_total{outcome="queued"}"#);
    let refused = router.metric(r#"switchyard_fair_share_requests_total{outcome="refused"}"#);
    eprintln!(
        "heavy: {} answers, queued {queued}, refused {refused}; quiet: {} answers",
        heavy.len(),
        quiet.len()
    );
    assert!(
        !quiet.is_empty() && quiet.iter().all(|&s| s == 200),
        "{quiet:?}"
    );
    assert!(
        queued > 0.0,
        "the heavy app, over its share of a saturated loop, waited its turn"
    );
    assert!(heavy.iter().any(|&(status, _)| status == 200));
    // Refused only as the fair share refuses: 503 with Retry-After, counted.
    let refusals: Vec<_> = heavy.iter().filter(|&&(s, _)| s != 200).collect();
    assert!(
        refusals.iter().all(|&&(s, retry)| s == 503 && retry),
        "{refusals:?}"
    );
    assert_eq!(refusals.len() as f64, refused);
}
