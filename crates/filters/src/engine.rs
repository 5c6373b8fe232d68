//! The engine every filter of a router runs on: one wasmtime engine (its compiled code
//! cached on disk by the module's hash), the host's calls linked once, the per-router
//! shared data and the deadline ticker.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{Cache, CacheConfig, Config, Engine, InstancePre, Linker, Module};

use crate::deadline::Ticker;
use crate::hostcalls::{self, HostState};
use crate::shared_data::SharedData;

/// How a router's filters run.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Where compiled modules are kept across restarts (wasmtime's cache, by hash); `None`:
    /// compiled again by each process.
    pub cache_dir: Option<PathBuf>,
}

/// A router's filter engine.
pub struct FilterEngine {
    pub(crate) engine: Engine,
    linker: Linker<HostState>,
    pub(crate) shared: Arc<SharedData>,
    pub(crate) ticker: Arc<Ticker>,
}

/// A module compiled and linked, ready to be instantiated.
pub struct CompiledModule {
    /// Its SHA-256, hex.
    pub sha256: String,
    pub(crate) pre: InstancePre<HostState>,
    /// How long compiling (or loading from the disk cache) took.
    pub compile_time: Duration,
}

/// The exports a proxy-wasm filter must have, whichever SDK made it.
const ABI_VERSIONS: [&str; 2] = ["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"];

impl FilterEngine {
    /// An engine; its ticker thread starts with it.
    pub fn new(settings: &EngineSettings) -> anyhow::Result<Arc<Self>> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        // A filter's own stack, on the fiber its callbacks run on: 256 KiB of Wasm stack
        // within a 512 KiB fiber (the default 2 MiB is address space per instance).
        config.max_wasm_stack(256 * 1024);
        config.async_stack_size(512 * 1024);
        if let Some(dir) = &settings.cache_dir {
            std::fs::create_dir_all(dir)?;
            let mut cache = CacheConfig::new();
            cache.with_directory(dir);
            config.cache(Some(Cache::new(cache)?));
        }
        let engine = Engine::new(&config)?;
        let linker = hostcalls::linker(&engine)?;
        let ticker = Ticker::start(engine.clone())?;
        Ok(Arc::new(FilterEngine {
            engine,
            linker,
            shared: Arc::new(SharedData::default()),
            ticker,
        }))
    }

    /// Compiles `wasm` (or finds it compiled in the disk cache) and checks that it is a
    /// proxy-wasm filter this host can run: the error says what is wrong with it.
    pub fn compile(&self, wasm: &[u8]) -> Result<Arc<CompiledModule>, String> {
        let started = Instant::now();
        let sha256 = sha256_hex(wasm);
        let module = Module::new(&self.engine, wasm)
            .map_err(|e| format!("not a WebAssembly module this host compiles: {e:#}"))?;
        check_exports(&module)?;
        let linker = hostcalls::linker_for(&self.linker, &module).map_err(|e| format!("{e:#}"))?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| format!("its imports do not match the proxy-wasm ABI: {e:#}"))?;
        let compile_time = started.elapsed();
        crate::metrics::COMPILE_SECONDS.observe(compile_time.as_secs_f64());
        Ok(Arc::new(CompiledModule {
            sha256,
            pre,
            compile_time,
        }))
    }

    /// Keys held in the shared data, over every app.
    pub fn shared_data_keys(&self) -> usize {
        self.shared.keys()
    }
}

fn check_exports(module: &Module) -> Result<(), String> {
    let has = |name: &str| module.get_export(name).is_some();
    if !ABI_VERSIONS.iter().any(|v| has(v)) {
        return Err(format!(
            "it does not export the proxy-wasm ABI ({}): is it built with a proxy-wasm SDK?",
            ABI_VERSIONS.join(" or ")
        ));
    }
    for needed in ["memory", "proxy_on_context_create"] {
        if !has(needed) {
            return Err(format!("it does not export `{needed}`"));
        }
    }
    if !has("proxy_on_memory_allocate") && !has("malloc") {
        return Err("it exports no allocator (`proxy_on_memory_allocate` or `malloc`)".into());
    }
    Ok(())
}

/// The SHA-256 of `bytes`, hex: a module's name in the store and on disk.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = openssl::sha::sha256(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
