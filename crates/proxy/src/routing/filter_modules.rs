//! The proxy-wasm modules this router has compiled, by the names apps use: read from the
//! store the first time an app needs one, compiled off the event loops (or loaded from the
//! disk cache by hash), and read again when the store says the name changed
//! (`Change::Filter`). An app's route gets its filters ([`AppFilters`]) from here; a route
//! rebuilt with the same module, configuration and limits keeps its filters' instances.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use switchyard_filters::{CompiledModule, EngineSettings, FilterEngine, Limits, Plugin};
use switchyard_model::{App, FilterUse};
use switchyard_store::Store;

/// The router's limits for filters that do not set their own.
#[derive(Debug, Clone, Copy)]
pub struct FilterDefaults {
    /// CPU time one callback may use.
    pub deadline: Duration,
    /// Memory one instance may grow to.
    pub memory_bytes: usize,
    /// Instances of one app's filter per event-loop thread.
    pub instances_per_thread: usize,
}

/// What the router holds of one stored name.
#[derive(Clone)]
enum Loaded {
    Module(Arc<CompiledModule>),
    /// Not stored, or its module could not be compiled here: why.
    Missing(String),
}

/// The router's compiled modules by name.
pub struct FilterModules {
    engine: Arc<FilterEngine>,
    defaults: FilterDefaults,
    loaded: Mutex<HashMap<String, Loaded>>,
}

/// An app's filters, as its route runs them.
pub(crate) struct AppFilters {
    pub(crate) plugins: Box<[Arc<Plugin>]>,
    /// The first filter that must run and cannot (not stored, not compiled), with why:
    /// the app's requests are answered 500 until it can.
    pub(crate) missing: Option<(String, String)>,
    /// What each plugin was built from (its use and module), to keep it across route
    /// rebuilds.
    built: Vec<(FilterUse, String)>,
}

impl FilterModules {
    /// Modules compiled on a new engine, their code cached in `cache_dir`.
    pub fn new(
        cache_dir: Option<std::path::PathBuf>,
        defaults: FilterDefaults,
    ) -> Result<Self, String> {
        switchyard_filters::register_metrics();
        let engine =
            FilterEngine::new(&EngineSettings { cache_dir }).map_err(|e| format!("{e:#}"))?;
        Ok(Self {
            engine,
            defaults,
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The engine, to check modules at upload.
    pub fn engine(&self) -> &Arc<FilterEngine> {
        &self.engine
    }

    /// Loads, once, every module `app` names that is not held yet.
    pub(crate) async fn load_for(&self, app: &App, store: &dyn Store) {
        for used in &app.filters {
            if !self.loaded.lock().contains_key(&used.name) {
                self.load(&used.name, store).await;
            }
        }
    }

    /// Reads `name` from the store again (it changed); whether the module held for it
    /// changed.
    pub(crate) async fn reload(&self, name: &str, store: &dyn Store) -> bool {
        let before = self.sha_of(name);
        self.load(name, store).await;
        before != self.sha_of(name)
    }

    /// The names held, to read again after missed changes.
    pub(crate) fn names(&self) -> Vec<String> {
        self.loaded.lock().keys().cloned().collect()
    }

    fn sha_of(&self, name: &str) -> Option<String> {
        match self.loaded.lock().get(name) {
            Some(Loaded::Module(module)) => Some(module.sha256.clone()),
            _ => None,
        }
    }

    async fn load(&self, name: &str, store: &dyn Store) {
        let loaded = match store.get_filter(name).await {
            Ok(None) => Loaded::Missing(format!("no filter named '{name}' is stored")),
            Err(e) => {
                // The module held (if any) stays: a store outage does not stop filters.
                log::warn!("cannot read the filter '{name}' from the store: {e}");
                if self.loaded.lock().contains_key(name) {
                    return;
                }
                Loaded::Missing(format!("the store could not be read: {e}"))
            }
            Ok(Some(record)) if self.sha_of(name).as_deref() == Some(record.sha256.as_str()) => {
                return
            }
            Ok(Some(record)) => match store.filter_bytes(&record.sha256).await {
                Ok(Some(bytes)) => self.compile(name, bytes, record.sha256).await,
                Ok(None) => Loaded::Missing(format!("the module of '{name}' is not stored")),
                Err(e) => Loaded::Missing(format!("the store could not be read: {e}")),
            },
        };
        self.loaded.lock().insert(name.to_string(), loaded);
    }

    async fn compile(&self, name: &str, bytes: Vec<u8>, sha256: String) -> Loaded {
        let engine = self.engine.clone();
        // Cranelift takes milliseconds to seconds: off the event loops.
        match tokio::task::spawn_blocking(move || engine.compile(&bytes, sha256)).await {
            Ok(Ok(module)) => {
                log::info!(
                    "filter '{name}' ({}) ready in {:?}",
                    &module.sha256[..12],
                    module.compile_time
                );
                Loaded::Module(module)
            }
            Ok(Err(e)) => {
                Loaded::Missing(format!("the module of '{name}' does not compile here: {e}"))
            }
            Err(e) => Loaded::Missing(format!("compiling '{name}' failed: {e}")),
        }
    }

    /// `app`'s filters from the modules held, keeping `previous`'s where nothing changed.
    pub(crate) fn filters_for(
        &self,
        app: &App,
        previous: Option<&AppFilters>,
    ) -> Option<Box<AppFilters>> {
        if app.filters.is_empty() {
            return None;
        }
        let loaded = self.loaded.lock();
        let mut plugins = Vec::with_capacity(app.filters.len());
        let mut built = Vec::with_capacity(app.filters.len());
        let mut missing = None;
        for used in &app.filters {
            let module = match loaded.get(&used.name) {
                Some(Loaded::Module(module)) => module.clone(),
                other => {
                    let why = match other {
                        Some(Loaded::Missing(why)) => why.clone(),
                        _ => format!("the filter '{}' is not loaded", used.name),
                    };
                    if !used.fail_open && missing.is_none() {
                        missing = Some((used.name.clone(), why));
                    }
                    continue;
                }
            };
            let kept = previous.and_then(|p| {
                let at =
                    (p.built.iter()).position(|(u, sha)| u == used && *sha == module.sha256)?;
                p.plugins.get(at)
            });
            let plugin = match kept {
                Some(plugin) => plugin.clone(),
                None => Plugin::new(
                    self.engine.clone(),
                    module.clone(),
                    app.name.as_str(),
                    &used.name,
                    Bytes::from(used.config_bytes()),
                    used.fail_open,
                    self.limits_of(used),
                ),
            };
            built.push((used.clone(), module.sha256.clone()));
            plugins.push(plugin);
        }
        Some(Box::new(AppFilters {
            plugins: plugins.into_boxed_slice(),
            missing,
            built,
        }))
    }

    fn limits_of(&self, used: &FilterUse) -> Limits {
        Limits {
            deadline: used.deadline_ms.map_or(self.defaults.deadline, |ms| {
                Duration::from_millis(u64::from(ms))
            }),
            memory_bytes: used
                .memory_mib
                .map_or(self.defaults.memory_bytes, |mib| mib as usize * (1 << 20)),
            instances_per_thread: self.defaults.instances_per_thread,
        }
    }
}

impl std::fmt::Debug for AppFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.plugins.iter().map(|p| p.name()).collect();
        f.debug_struct("AppFilters")
            .field("plugins", &names)
            .field("missing", &self.missing)
            .finish()
    }
}
