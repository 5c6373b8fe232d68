//! The host against the example filters, built by `scripts/test` (or `cargo build --release
//! --target wasm32-unknown-unknown` in examples/filters): their callbacks, hostcalls and
//! limits, without the router around them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use switchyard_filters::{
    EngineSettings, FailureKind, FilterEngine, HttpCall, HttpCallAnswer, HttpCalls, Limits, Plugin,
    RequestFacts, RequestFilters, RequestHead, ResponseHead, Verdict,
};

fn wasm(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../../examples/filters/target/wasm32-unknown-unknown/release/{name}.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (scripts/test builds the example filters)"))
}

fn limits() -> Limits {
    Limits {
        deadline: Duration::from_millis(20),
        memory_bytes: 16 << 20,
        instances_per_thread: 2,
    }
}

fn plugin(engine: &Arc<FilterEngine>, module: &str, config: &str, fail_open: bool) -> Arc<Plugin> {
    let compiled = (engine.compile(&wasm(module), module.to_string())).expect("compiles");
    Plugin::new(
        engine.clone(),
        compiled,
        "app-a",
        module,
        Bytes::from(config.to_string()),
        fail_open,
        limits(),
    )
}

fn head(path: &str) -> RequestHead {
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", "test".parse().expect("value"));
    RequestHead {
        method: "GET".into(),
        path: path.into(),
        authority: "a.test".into(),
        scheme: "http",
        headers,
    }
}

struct NoCalls;

impl HttpCalls for NoCalls {
    fn call<'a>(
        &'a self,
        _call: &'a HttpCall,
    ) -> Pin<Box<dyn Future<Output = Option<HttpCallAnswer>> + 'a>> {
        Box::pin(async { None })
    }
}

fn facts() -> RequestFacts {
    RequestFacts {
        app: Arc::from("app-a"),
        source: Some("127.0.0.1:4242".parse().expect("address")),
        request_id: "req-1".into(),
        protocol: "HTTP/1.1",
    }
}

fn run<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}

#[test]
fn the_header_policy_edits_both_heads_and_refuses_what_lacks_a_field() {
    run(async {
        let engine = FilterEngine::new(&EngineSettings { cache_dir: None }).expect("engine");
        let config = r#"{"require": ["user-agent"], "remove_request": ["x-debug"],
                         "set_response": {"x-frame-options": "DENY"}, "remove_response": ["server"]}"#;
        let policy = plugin(&engine, "header_policy", config, false);
        let (mut run, verdict) =
            RequestFilters::start(std::slice::from_ref(&policy), facts()).await;
        assert_eq!(verdict, Verdict::Continue);
        let mut request = head("/");
        request
            .headers
            .insert("x-debug", "1".parse().expect("value"));
        assert_eq!(
            run.request_headers(&mut request, true, &NoCalls).await,
            Verdict::Continue
        );
        assert!(request.headers.get("x-debug").is_none());
        let mut answer = ResponseHead {
            status: 200,
            headers: HeaderMap::new(),
        };
        answer
            .headers
            .insert("server", "app".parse().expect("value"));
        assert_eq!(
            run.response_headers(&mut answer, false, &NoCalls).await,
            Verdict::Continue
        );
        assert_eq!(
            answer.headers.get("x-frame-options").map(|v| v.as_bytes()),
            Some(&b"DENY"[..])
        );
        assert!(answer.headers.get("server").is_none());
        drop(run);

        let (mut run, _) = RequestFilters::start(&[policy], facts()).await;
        let mut bare = head("/");
        bare.headers.clear();
        match run.request_headers(&mut bare, true, &NoCalls).await {
            Verdict::Respond(local) => assert_eq!(local.status, 400),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_spinning_filter_is_stopped_at_its_deadline_and_the_thread_goes_on() {
    run(async {
        let engine = FilterEngine::new(&EngineSettings { cache_dir: None }).expect("engine");
        let spin = plugin(&engine, "misbehave", "spin", false);
        let started = Instant::now();
        let (mut run, _) = RequestFilters::start(std::slice::from_ref(&spin), facts()).await;
        // Another task on the same thread keeps running while the filter spins.
        let beats = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = beats.clone();
        let beating = tokio::task::spawn_local(async move {
            loop {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let verdict = run.request_headers(&mut head("/"), true, &NoCalls).await;
        let took = started.elapsed();
        beating.abort();
        assert_eq!(
            verdict,
            Verdict::Failed {
                filter: "misbehave".into()
            }
        );
        assert!(took < Duration::from_secs(2), "stopped after {took:?}");
        assert!(
            beats.load(std::sync::atomic::Ordering::Relaxed) >= 3,
            "the thread's other task did not run"
        );
        assert_eq!(
            spin.stats
                .failures
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        let error = spin.stats.last_error.lock().clone().unwrap_or_default();
        assert!(error.starts_with(FailureKind::Deadline.label()), "{error}");
    });
}

#[test]
fn a_filter_past_its_memory_or_trapping_fails_open_or_closed_as_set() {
    run(async {
        let engine = FilterEngine::new(&EngineSettings { cache_dir: None }).expect("engine");
        let grow = plugin(&engine, "misbehave", "grow", true);
        let (mut run, _) = RequestFilters::start(std::slice::from_ref(&grow), facts()).await;
        assert_eq!(
            run.request_headers(&mut head("/"), true, &NoCalls).await,
            Verdict::Continue
        );
        let error = grow.stats.last_error.lock().clone().unwrap_or_default();
        assert!(error.starts_with(FailureKind::Memory.label()), "{error}");

        let trap = plugin(&engine, "misbehave", "trap", false);
        let (mut run, _) = RequestFilters::start(std::slice::from_ref(&trap), facts()).await;
        assert!(matches!(
            run.request_headers(&mut head("/"), true, &NoCalls).await,
            Verdict::Failed { .. }
        ));
        let error = trap.stats.last_error.lock().clone().unwrap_or_default();
        assert!(error.starts_with(FailureKind::Trap.label()), "{error}");

        let refused = plugin(&engine, "misbehave", "configure-fails", false);
        let (_, verdict) = RequestFilters::start(&[refused], facts()).await;
        assert!(matches!(verdict, Verdict::Failed { .. }));
    });
}

#[test]
fn properties_shared_data_ticks_and_the_body_reach_the_filter() {
    run(async {
        let engine = FilterEngine::new(&EngineSettings { cache_dir: None }).expect("engine");
        let echo = plugin(&engine, "misbehave", "echo", false);
        for round in 1..=2 {
            let (mut run, _) = RequestFilters::start(std::slice::from_ref(&echo), facts()).await;
            let mut request = head("/p?q=1");
            assert_eq!(
                run.request_headers(&mut request, false, &NoCalls).await,
                Verdict::Continue
            );
            let field = |name: &str| {
                request
                    .headers
                    .get(name)
                    .map(|v| v.to_str().unwrap_or("").to_string())
            };
            assert_eq!(field("x-echo-request-path").as_deref(), Some("/p?q=1"));
            assert_eq!(field("x-echo-request-host").as_deref(), Some("a.test"));
            assert_eq!(
                field("x-echo-source-address").as_deref(),
                Some("127.0.0.1:4242")
            );
            assert_eq!(field("x-echo-source-port").as_deref(), Some("4242"));
            assert_eq!(field("x-echo-route-name").as_deref(), Some("app-a"));
            assert_eq!(field("x-echo-plugin-name").as_deref(), Some("misbehave"));
            assert_eq!(field("x-echo-count"), Some(round.to_string()));
            let mut body = b"hello".to_vec();
            assert_eq!(
                run.request_body(&request, &mut body, &NoCalls).await,
                Verdict::Continue
            );
            assert_eq!(body, b"HELLO");
            let mut answer = ResponseHead {
                status: 200,
                headers: HeaderMap::new(),
            };
            let head = run.response_headers(&mut answer, false, &NoCalls).await;
            assert_eq!(head, Verdict::Continue);
            assert!(
                run.wants_answer_body(),
                "it paused on the head for the body"
            );
            let mut body = b"answer".to_vec();
            assert_eq!(
                run.response_body(&answer, &mut body, &NoCalls).await,
                Verdict::Continue
            );
            assert_eq!(body, b"ANSWER");
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        let (mut run, _) = RequestFilters::start(&[echo], facts()).await;
        let mut request = head("/");
        run.request_headers(&mut request, true, &NoCalls).await;
        let ticks: u64 = request
            .headers
            .get("x-echo-ticks")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        assert!(ticks >= 2, "ticks seen: {ticks}");
    });
}

#[test]
fn a_module_without_the_abi_is_refused_with_the_reason() {
    let engine = FilterEngine::new(&EngineSettings { cache_dir: None }).expect("engine");
    let error = engine.check(b"not wasm").err().unwrap_or_default();
    assert!(error.contains("not a WebAssembly module"), "{error}");
    let plain = wat_module();
    let error = engine.check(&plain).err().unwrap_or_default();
    assert!(error.contains("proxy-wasm ABI"), "{error}");
}

/// A valid module that exports nothing of the ABI (the binary of `(module (memory 1))`).
fn wat_module() -> Vec<u8> {
    vec![
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x05, 0x03, 0x01, 0x00, 0x01,
    ]
}
