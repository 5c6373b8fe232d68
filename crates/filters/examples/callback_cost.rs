//! The host's cost alone, without the router: a request's whole life through one filter
//! (context made, request head, answer head, log, done, delete) run `--requests` times on
//! one thread, its wall and thread CPU time per request printed.
//!
//!     cargo run --release -p switchyard-filters --example callback_cost -- MODULE.wasm CONFIG [REQUESTS]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use switchyard_filters::{
    EngineSettings, FilterEngine, HttpCall, HttpCallAnswer, HttpCalls, Limits, Plugin,
    RequestFacts, RequestFilters, RequestHead, ResponseHead,
};

struct NoCalls;

impl HttpCalls for NoCalls {
    fn call<'a>(
        &'a self,
        _call: &'a HttpCall,
    ) -> Pin<Box<dyn Future<Output = Option<HttpCallAnswer>> + 'a>> {
        Box::pin(async { None })
    }
}

fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

async fn one_request(plugins: &[Arc<Plugin>]) {
    let facts = RequestFacts {
        app: Arc::from("app-a"),
        source: "127.0.0.1:4242".parse().ok(),
        request_id: "req-1".into(),
        protocol: "HTTP/1.1",
    };
    let (mut run, _) = RequestFilters::start(plugins, facts).await;
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", http::HeaderValue::from_static("bench"));
    headers.insert("accept", http::HeaderValue::from_static("*/*"));
    let mut request = RequestHead {
        method: "GET".into(),
        path: "/".into(),
        authority: "a.test".into(),
        scheme: "http",
        headers,
    };
    run.request_headers(&mut request, true, &NoCalls).await;
    request.headers.clear();
    run.keep_for_log(request);
    let mut answer = ResponseHead {
        status: 200,
        headers: HeaderMap::new(),
    };
    answer
        .headers
        .insert("server", http::HeaderValue::from_static("nginx"));
    answer
        .headers
        .insert("content-length", http::HeaderValue::from_static("3"));
    run.response_headers(&mut answer, false, &NoCalls).await;
    drop(run);
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(module), Some(config)) = (args.get(1), args.get(2)) else {
        anyhow::bail!("usage: callback_cost MODULE.wasm CONFIG [REQUESTS]");
    };
    let requests: u32 = args.get(3).map_or(Ok(20_000), |n| n.parse())?;
    let engine = FilterEngine::new(&EngineSettings { cache_dir: None })?;
    let compiled = engine
        .compile(&std::fs::read(module)?, "bench".to_string())
        .map_err(anyhow::Error::msg)?;
    let plugin = Plugin::new(
        engine.clone(),
        compiled,
        "app-a",
        "bench",
        Bytes::from(config.clone()),
        false,
        Limits {
            deadline: Duration::from_millis(10),
            memory_bytes: 16 << 20,
            instances_per_thread: 4,
        },
    );
    let plugins = [plugin];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio::task::LocalSet::new().block_on(&runtime, async {
        for _ in 0..1_000 {
            one_request(&plugins).await;
        }
        let (wall, cpu) = (Instant::now(), thread_cpu());
        for _ in 0..requests {
            one_request(&plugins).await;
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(requests);
        println!(
            "{requests} requests: {:.2} µs wall, {:.2} µs thread CPU a request",
            per(wall.elapsed()),
            per(thread_cpu() - cpu)
        );
    });
    Ok(())
}
