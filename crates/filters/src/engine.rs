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
    /// Its SHA-256, hex, as the store names it.
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

    /// Checks that `wasm` is a proxy-wasm filter this host can run, compiling it (or
    /// finding it compiled in the disk cache): the error says what is wrong with it.
    pub fn check(&self, wasm: &[u8]) -> Result<(), String> {
        self.link(wasm).map(|_| ())
    }

    /// Compiles `wasm`, the module the store names `sha256`, as [`Self::check`] does, ready
    /// to be instantiated.
    pub fn compile(&self, wasm: &[u8], sha256: String) -> Result<Arc<CompiledModule>, String> {
        let started = Instant::now();
        let pre = self.link(wasm)?;
        let compile_time = started.elapsed();
        crate::metrics::COMPILE_SECONDS.observe(compile_time.as_secs_f64());
        Ok(Arc::new(CompiledModule {
            sha256,
            pre,
            compile_time,
        }))
    }

    fn link(&self, wasm: &[u8]) -> Result<InstancePre<HostState>, String> {
        let module = Module::new(&self.engine, wasm)
            .map_err(|e| format!("not a WebAssembly module this host compiles: {e:#}"))?;
        check_exports(&module)?;
        let linker = hostcalls::linker_for(&self.linker, &module).map_err(|e| format!("{e:#}"))?;
        linker
            .instantiate_pre(&module)
            .map_err(|e| format!("its imports do not match the proxy-wasm ABI: {e:#}"))
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
