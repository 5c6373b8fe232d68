//! One filter of one app (a module with its configuration and limits) and its instances:
//! pooled per event-loop thread, each holding the root context and the HTTP contexts of
//! the requests it serves, as Envoy keeps one VM per worker. A request keeps the instance
//! its context was made in; another request may use that instance between its callbacks.
//! An instance whose callback traps, runs past its deadline or its memory is dropped, and
//! the next request makes a new one.

use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, Ordering as AtomicOrdering,
};
use std::sync::{Arc, Weak};
use std::task::{Poll, Waker};
use std::thread::ThreadId;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};
use wasmtime::{Store, TypedFunc, UpdateDeadline};

use crate::abi::ACTION_CONTINUE;
use crate::deadline::thread_cpu_ns;
use crate::engine::{CompiledModule, FilterEngine};
use crate::exchange::Exchange;
use crate::hostcalls::{HostState, Identity, MemoryCap};

/// The root context's id in every instance; requests' contexts follow it.
pub(crate) const ROOT_CONTEXT: u32 = 1;

/// A filter's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// CPU time one callback may use.
    pub deadline: Duration,
    /// Bytes of linear memory one instance may grow to.
    pub memory_bytes: usize,
    /// Instances kept per event-loop thread.
    pub instances_per_thread: usize,
}

/// Why a filter was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// A callback ran past its CPU deadline.
    Deadline,
    /// The instance would have grown past its memory cap.
    Memory,
    /// The filter trapped (a panic, `unreachable`, a bad access) or a call failed.
    Trap,
    /// The filter refused its configuration, or could not start.
    Start,
    /// It paused the request with nothing that could resume it.
    Stalled,
    /// The instance holding the request's context was stopped under it.
    Lost,
}

impl FailureKind {
    /// Its label in the metrics.
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Deadline => "deadline",
            FailureKind::Memory => "memory",
            FailureKind::Trap => "trap",
            FailureKind::Start => "start",
            FailureKind::Stalled => "stalled",
            FailureKind::Lost => "lost",
        }
    }
}

/// A filter stopped, and why.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) kind: FailureKind,
    pub(crate) message: String,
}

/// What a filter's failures and instances add up to, for `explain` and the metrics.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Times it was stopped.
    pub failures: AtomicU64,
    /// Its instances alive, over every thread.
    pub instances: AtomicUsize,
    /// Its last failure: the reason's label, and what happened.
    pub last_error: Mutex<Option<String>>,
}

/// One filter of one app.
pub struct Plugin {
    pub(crate) identity: Arc<Identity>,
    module: Arc<CompiledModule>,
    pub(crate) engine: Arc<FilterEngine>,
    /// Whether a failed filter lets the request through (else the request is answered 500).
    pub fail_open: bool,
    pub(crate) limits: Limits,
    threads: Mutex<Vec<(ThreadId, Vec<Arc<Slot>>)>>,
    /// What its failures and instances add up to.
    pub stats: Arc<PluginStats>,
}

/// Where an instance lives; empty until a request needs it, and again after a failure.
/// Held by one callback at a time, across its awaits (a callback may yield its thread);
/// slots are per thread, so the lock is taken on one thread only and costs a compare and
/// swap when free, where tokio's mutex took its semaphore's lock on every release.
pub(crate) struct Slot {
    instance: Mutex<Option<Instance>>,
    /// The wakers of callbacks waiting for the instance, woken when it is let go.
    waiters: Mutex<Vec<Waker>>,
    contended: AtomicBool,
}

/// The instance of a [`Slot`], held.
pub(crate) struct SlotGuard<'a> {
    slot: &'a Slot,
    held: Option<MutexGuard<'a, Option<Instance>>>,
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = Option<Instance>;

    fn deref(&self) -> &Self::Target {
        self.held.as_deref().unwrap_or(&None)
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self.held.as_deref_mut() {
            Some(instance) => instance,
            // `held` is only emptied by drop.
            None => unreachable!("a slot guard is held until dropped"),
        }
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        drop(self.held.take());
        // Pairs with the fence in `Slot::lock`: a waiter that found the instance held has
        // said so before looking again, or sees it free.
        fence(AtomicOrdering::SeqCst);
        if self.slot.contended.swap(false, AtomicOrdering::SeqCst) {
            for waiter in std::mem::take(&mut *self.slot.waiters.lock()) {
                waiter.wake();
            }
        }
    }
}

impl Slot {
    fn new() -> Self {
        Slot {
            instance: Mutex::new(None),
            waiters: Mutex::new(Vec::new()),
            contended: AtomicBool::new(false),
        }
    }

    /// Whether no callback holds it.
    fn is_free(&self) -> bool {
        !self.instance.is_locked()
    }

    /// The instance, once no other callback holds it.
    pub(crate) async fn lock(&self) -> SlotGuard<'_> {
        let held = std::future::poll_fn(|cx| {
            if let Some(held) = self.instance.try_lock() {
                return Poll::Ready(held);
            }
            self.waiters.lock().push(cx.waker().clone());
            self.contended.store(true, AtomicOrdering::SeqCst);
            fence(AtomicOrdering::SeqCst);
            match self.instance.try_lock() {
                Some(held) => Poll::Ready(held),
                None => Poll::Pending,
            }
        })
        .await;
        SlotGuard {
            slot: self,
            held: Some(held),
        }
    }

    /// Runs `callback` for context `id` in the instance here, when it is still the one of
    /// `generation`: `None` once that one was stopped. An instance whose callback failed is
    /// dropped (its state cannot be trusted: the next request starts a new one); the
    /// failure is the caller's to note.
    pub(crate) async fn run(
        &self,
        plugin: &Plugin,
        generation: u64,
        callback: Callback,
        id: u32,
        exchange: &mut Box<Exchange>,
    ) -> Option<Result<i32, Failure>> {
        let mut held = self.lock().await;
        let instance = held.as_mut().filter(|i| i.generation == generation)?;
        let result = instance.invoke(plugin, callback, id, exchange).await;
        let yields = instance.store.data().cpu.yields;
        if yields > 0 {
            crate::metrics::YIELDS.inc_by(u64::from(yields));
        }
        if result.is_err() {
            *held = None;
        }
        Some(result)
    }
}

/// A running instance.
pub(crate) struct Instance {
    pub(crate) store: Store<HostState>,
    pub(crate) funcs: Funcs,
    pub(crate) next_context: u32,
    pub(crate) generation: u64,
    stats: Arc<PluginStats>,
    /// Callbacks made and not yet added to `switchyard_filter_callbacks_total`: added in
    /// batches of [`CALLBACKS_COUNTED_EVERY`], not one by one (a counter shared by every thread).
    callbacks: u64,
}

/// How many callbacks an instance makes between two additions to the callbacks' counter.
const CALLBACKS_COUNTED_EVERY: u64 = 64;

impl Drop for Instance {
    fn drop(&mut self) {
        crate::metrics::CALLBACKS.inc_by(self.callbacks);
        self.stats.instances.fetch_sub(1, Ordering::Relaxed);
        crate::metrics::INSTANCES.dec();
    }
}

/// The callbacks a filter exports (all but context creation are optional).
pub(crate) struct Funcs {
    context_create: TypedFunc<(i32, i32), ()>,
    vm_start: Option<TypedFunc<(i32, i32), i32>>,
    configure: Option<TypedFunc<(i32, i32), i32>>,
    request_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    request_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    response_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    response_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    log: Option<TypedFunc<i32, ()>>,
    done: Option<TypedFunc<i32, i32>>,
    delete: Option<TypedFunc<i32, ()>>,
    tick: Option<TypedFunc<i32, ()>>,
    http_call_response: Option<TypedFunc<CallResponseArgs, ()>>,
}

/// `proxy_on_http_call_response`'s: context, token, fields, body size, trailers.
type CallResponseArgs = (i32, i32, i32, i32, i32);

/// A callback of the ABI, with its arguments but the context's id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Callback {
    Create,
    RequestHeaders {
        fields: usize,
        end_of_stream: bool,
    },
    RequestBody {
        size: usize,
        end_of_stream: bool,
    },
    ResponseHeaders {
        fields: usize,
        end_of_stream: bool,
    },
    ResponseBody {
        size: usize,
        end_of_stream: bool,
    },
    Log,
    Done,
    Delete,
    Tick,
    HttpCallResponse {
        token: u32,
        fields: usize,
        body: usize,
    },
}

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl Plugin {
    /// `module` as the filter `name` of `app`, with its configuration.
    pub fn new(
        engine: Arc<FilterEngine>,
        module: Arc<CompiledModule>,
        app: &str,
        name: &str,
        config: Bytes,
        fail_open: bool,
        limits: Limits,
    ) -> Arc<Self> {
        Arc::new(Plugin {
            identity: Arc::new(Identity {
                app: Arc::from(app),
                filter: Arc::from(name),
                config,
            }),
            module,
            engine,
            fail_open,
            limits,
            threads: Mutex::new(Vec::new()),
            stats: Arc::default(),
        })
    }

    /// The filter's name.
    pub fn name(&self) -> &str {
        &self.identity.filter
    }

    /// Its module's SHA-256.
    pub fn sha256(&self) -> &str {
        &self.module.sha256
    }

    /// An instance slot of this thread for a new request: a free one, else a new one while
    /// the thread has fewer than its limit, else the least recently given.
    pub(crate) fn slot(&self) -> Arc<Slot> {
        let me = std::thread::current().id();
        let mut threads = self.threads.lock();
        let at = match threads.iter().position(|(id, _)| *id == me) {
            Some(at) => at,
            None => {
                threads.push((me, Vec::new()));
                threads.len() - 1
            }
        };
        let slots = &mut threads[at].1;
        if let Some(free) = slots.iter().find(|slot| slot.is_free()) {
            return free.clone();
        }
        if slots.len() < self.limits.instances_per_thread.max(1) || slots.is_empty() {
            let slot = Arc::new(Slot::new());
            slots.push(slot.clone());
            return slot;
        }
        // All busy: the first, moved last, so that the waits go round.
        slots.rotate_left(1);
        slots[slots.len() - 1].clone()
    }

    /// Starts an instance: instantiated, initialised, its root context configured, and
    /// its ticks started when it asks for them.
    pub(crate) async fn start_instance(
        self: &Arc<Self>,
        slot: &Arc<Slot>,
    ) -> Result<Instance, Failure> {
        let state = HostState {
            identity: self.identity.clone(),
            memory_cap: MemoryCap {
                bytes: self.limits.memory_bytes,
                hit: false,
            },
            shared: self.engine.shared.clone(),
            exchange: Box::default(),
            cpu: Default::default(),
            tick_period_ms: Arc::new(AtomicU32::new(0)),
            malloc: None,
            memory: None,
            next_token: 0,
        };
        let mut store = Store::new(&self.engine.engine, state);
        store.limiter(|state| &mut state.memory_cap);
        store.epoch_deadline_callback(|mut store| {
            let cpu = &mut store.data_mut().cpu;
            if cpu.at_tick() {
                return Ok(UpdateDeadline::Interrupt);
            }
            cpu.yields += 1;
            let ran_on_at = cpu.ran_on_at.clone();
            Ok(UpdateDeadline::YieldCustom(
                1,
                Box::pin(async move {
                    tokio::task::yield_now().await;
                    ran_on_at.store(thread_cpu_ns(), Ordering::Relaxed);
                }),
            ))
        });
        store.set_epoch_deadline(1);
        let failed = |kind, e: wasmtime::Error| Failure {
            kind,
            message: format!("{e:#}"),
        };
        let running = self.engine.ticker.callback_starts();
        let instance = self.module.pre.instantiate_async(&mut store).await;
        drop(running);
        let instance = instance.map_err(|e| failed(FailureKind::Start, e))?;
        let malloc = instance
            .get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| instance.get_typed_func::<i32, i32>(&mut store, "malloc"))
            .map_err(|e| failed(FailureKind::Start, e))?;
        store.data_mut().malloc = Some(malloc);
        store.data_mut().memory = instance.get_memory(&mut store, "memory");
        let func = |store: &mut Store<HostState>, name: &str| instance.get_func(&mut *store, name);
        macro_rules! typed {
            ($name:literal) => {
                match func(&mut store, $name) {
                    Some(f) => Some(f.typed(&store).map_err(|e| failed(FailureKind::Start, e))?),
                    None => None,
                }
            };
        }
        let Some(context_create) = typed!("proxy_on_context_create") else {
            return Err(Failure {
                kind: FailureKind::Start,
                message: "no proxy_on_context_create".into(),
            });
        };
        let funcs = Funcs {
            context_create,
            vm_start: typed!("proxy_on_vm_start"),
            configure: typed!("proxy_on_configure"),
            request_headers: typed!("proxy_on_request_headers"),
            request_body: typed!("proxy_on_request_body"),
            response_headers: typed!("proxy_on_response_headers"),
            response_body: typed!("proxy_on_response_body"),
            log: typed!("proxy_on_log"),
            done: typed!("proxy_on_done"),
            delete: typed!("proxy_on_delete"),
            tick: typed!("proxy_on_tick"),
            http_call_response: typed!("proxy_on_http_call_response"),
        };
        let initialize: Option<TypedFunc<(), ()>> = typed!("_initialize");
        self.stats.instances.fetch_add(1, Ordering::Relaxed);
        crate::metrics::INSTANCES.inc();
        let mut instance = Instance {
            store,
            funcs,
            next_context: ROOT_CONTEXT + 1,
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            stats: self.stats.clone(),
            callbacks: 0,
        };
        if let Some(initialize) = initialize {
            instance.call_raw(self, initialize, ()).await?;
        }
        let mut exchange = Box::default();
        instance
            .invoke(self, Callback::Create, ROOT_CONTEXT, &mut exchange)
            .await?;
        let vm_started = match instance.funcs.vm_start.clone() {
            Some(start) => {
                instance
                    .call_raw(self, start, (ROOT_CONTEXT as i32, 0))
                    .await?
            }
            None => 1,
        };
        let config_len = self.identity.config.len() as i32;
        let configured = match instance.funcs.configure.clone() {
            Some(configure) => {
                instance
                    .call_raw(self, configure, (ROOT_CONTEXT as i32, config_len))
                    .await?
            }
            None => 1,
        };
        if vm_started == 0 || configured == 0 {
            return Err(Failure {
                kind: FailureKind::Start,
                message: "the filter refused its configuration (proxy_on_configure returned false)"
                    .into(),
            });
        }
        let period = instance.store.data().tick_period_ms.clone();
        if period.load(Ordering::Relaxed) > 0 && instance.funcs.tick.is_some() {
            let ticks = ticks(
                Arc::downgrade(self),
                Arc::downgrade(slot),
                instance.generation,
                period,
            );
            tokio::task::spawn_local(ticks);
        }
        Ok(instance)
    }

    /// Notes a failure: counted, logged with the app and the filter, kept for `explain`.
    pub(crate) fn note_failure(&self, failure: &Failure) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        crate::metrics::FAILURES
            .with_label_values(&[
                &self.identity.app,
                &self.identity.filter,
                failure.kind.label(),
            ])
            .inc();
        log::warn!(
            "app '{}' filter '{}' stopped ({}): {}",
            self.identity.app,
            self.identity.filter,
            failure.kind.label(),
            failure.message
        );
        *self.stats.last_error.lock() =
            Some(format!("{}: {}", failure.kind.label(), failure.message));
    }
}

/// The root context's ticks, for as long as its instance lives.
async fn ticks(plugin: Weak<Plugin>, slot: Weak<Slot>, generation: u64, period: Arc<AtomicU32>) {
    loop {
        let every = Duration::from_millis(u64::from(period.load(Ordering::Relaxed)).max(1));
        tokio::time::sleep(every).await;
        let (Some(plugin), Some(slot)) = (plugin.upgrade(), slot.upgrade()) else {
            return;
        };
        let mut exchange = Box::default();
        let ticked = slot.run(
            &plugin,
            generation,
            Callback::Tick,
            ROOT_CONTEXT,
            &mut exchange,
        );
        match ticked.await {
            Some(Ok(_)) => {}
            Some(Err(failure)) => return plugin.note_failure(&failure),
            None => return,
        }
    }
}

impl Instance {
    /// Runs one call into the filter under its deadline; a failure says why it stopped.
    async fn call_raw<P, R>(
        &mut self,
        plugin: &Plugin,
        func: TypedFunc<P, R>,
        params: P,
    ) -> Result<R, Failure>
    where
        P: wasmtime::WasmParams + Sync,
        R: wasmtime::WasmResults + Send + Sync,
    {
        self.store.data_mut().cpu.start(plugin.limits.deadline);
        self.store.data_mut().memory_cap.hit = false;
        self.store.set_epoch_deadline(1);
        self.callbacks += 1;
        if self.callbacks == CALLBACKS_COUNTED_EVERY {
            crate::metrics::CALLBACKS.inc_by(std::mem::take(&mut self.callbacks));
        }
        let _running = plugin.engine.ticker.callback_starts();
        // Boxed: wasmtime's call future is large, and every future that awaits it would
        // otherwise carry (and move) its size.
        let result = Box::pin(func.call_async(&mut self.store, params)).await;
        result.map_err(|e| {
            let state = self.store.data();
            let kind = if state.cpu.over {
                FailureKind::Deadline
            } else if state.memory_cap.hit {
                FailureKind::Memory
            } else {
                FailureKind::Trap
            };
            let message = match kind {
                FailureKind::Deadline => format!(
                    "a callback ran past its CPU deadline of {:?} ({} µs measured)",
                    plugin.limits.deadline,
                    state.cpu.used_ns / 1000
                ),
                _ => format!("{e:#}"),
            };
            Failure { kind, message }
        })
    }

    /// Calls `callback` for context `id`, with `exchange` swapped into the store for its
    /// length (and back, whatever happens); the action it answered (a callback the module
    /// does not export, or that answers none, goes on).
    pub(crate) async fn invoke(
        &mut self,
        plugin: &Plugin,
        callback: Callback,
        id: u32,
        exchange: &mut Box<Exchange>,
    ) -> Result<i32, Failure> {
        std::mem::swap(&mut self.store.data_mut().exchange, exchange);
        let id = id as i32;
        let action = |action: i32| action;
        let goes_on = |()| ACTION_CONTINUE;
        let result = match callback {
            Callback::Create => {
                let root = if id as u32 == ROOT_CONTEXT {
                    0
                } else {
                    ROOT_CONTEXT as i32
                };
                let create = Some(self.funcs.context_create.clone());
                self.call_if(plugin, create, (id, root), goes_on).await
            }
            Callback::RequestHeaders {
                fields,
                end_of_stream,
            } => {
                let args = (id, fields as i32, end_of_stream as i32);
                self.call_if(plugin, self.funcs.request_headers.clone(), args, action)
                    .await
            }
            Callback::RequestBody {
                size,
                end_of_stream,
            } => {
                let args = (id, size as i32, end_of_stream as i32);
                self.call_if(plugin, self.funcs.request_body.clone(), args, action)
                    .await
            }
            Callback::ResponseHeaders {
                fields,
                end_of_stream,
            } => {
                let args = (id, fields as i32, end_of_stream as i32);
                self.call_if(plugin, self.funcs.response_headers.clone(), args, action)
                    .await
            }
            Callback::ResponseBody {
                size,
                end_of_stream,
            } => {
                let args = (id, size as i32, end_of_stream as i32);
                self.call_if(plugin, self.funcs.response_body.clone(), args, action)
                    .await
            }
            Callback::Log => {
                self.call_if(plugin, self.funcs.log.clone(), id, goes_on)
                    .await
            }
            Callback::Done => {
                self.call_if(plugin, self.funcs.done.clone(), id, action)
                    .await
            }
            Callback::Delete => {
                self.call_if(plugin, self.funcs.delete.clone(), id, goes_on)
                    .await
            }
            Callback::Tick => {
                self.call_if(plugin, self.funcs.tick.clone(), id, goes_on)
                    .await
            }
            Callback::HttpCallResponse {
                token,
                fields,
                body,
            } => {
                let args = (id, token as i32, fields as i32, body as i32, 0);
                let response = self.funcs.http_call_response.clone();
                self.call_if(plugin, response, args, goes_on).await
            }
        };
        std::mem::swap(&mut self.store.data_mut().exchange, exchange);
        result
    }

    /// [`Self::call_raw`] when the module exports `func`, its result made an action.
    async fn call_if<P, R>(
        &mut self,
        plugin: &Plugin,
        func: Option<TypedFunc<P, R>>,
        params: P,
        action: fn(R) -> i32,
    ) -> Result<i32, Failure>
    where
        P: wasmtime::WasmParams + Sync,
        R: wasmtime::WasmResults + Send + Sync,
    {
        match func {
            Some(func) => self.call_raw(plugin, func, params).await.map(action),
            None => Ok(ACTION_CONTINUE),
        }
    }
}
