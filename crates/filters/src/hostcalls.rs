//! The host side of the proxy-wasm ABI v0.2.1 (the `env` imports) and the WASI imports the
//! SDKs' filters need (`wasi_snapshot_preview1`): what a filter may ask of the router.
//! Every call checks the filter's pointers against its memory (a bad one is
//! `InvalidMemoryAccess`, never a host fault); a call the host does not offer returns
//! `Unimplemented` (WASI's `ENOSYS`); nothing here blocks.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use wasmtime::{
    Caller, Extern, ExternType, Linker, Memory, Module, ResourceLimiter, Result, TypedFunc, Val,
    ValType,
};

use crate::abi::{self, BufferType, MapType, Status};
use crate::deadline::CallCpu;
use crate::exchange::{Exchange, HttpCall, LocalResponse};
use crate::shared_data::{self, SharedData};

/// Longest key or value of a field a filter may set, and most fields in a map it sets.
const MAX_FIELD_BYTES: usize = 64 * 1024;
/// Longest wait a filter may give a call.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Calls one callback may dispatch.
const MAX_CALLS_PER_CALLBACK: usize = 8;

/// Who a filter instance is, for its hostcalls and its log lines.
#[derive(Debug)]
pub(crate) struct Identity {
    pub(crate) app: Arc<str>,
    pub(crate) filter: Arc<str>,
    pub(crate) config: Bytes,
}

/// The store's data of one filter instance.
pub(crate) struct HostState {
    pub(crate) identity: Arc<Identity>,
    pub(crate) memory_cap: MemoryCap,
    pub(crate) shared: Arc<SharedData>,
    /// The callback's views: the request's box, swapped in for the callback's length.
    pub(crate) exchange: Box<Exchange>,
    pub(crate) cpu: CallCpu,
    /// The tick period the root context asked for, in milliseconds (0: none).
    pub(crate) tick_period_ms: Arc<AtomicU32>,
    /// The filter's allocator (`proxy_on_memory_allocate`, or `malloc`), once instantiated.
    pub(crate) malloc: Option<TypedFunc<i32, i32>>,
    /// The filter's memory, once instantiated (looked up once, not by name per call).
    pub(crate) memory: Option<Memory>,
    pub(crate) next_token: u32,
}

/// The instance's memory cap: growth past it traps, and is remembered as the reason.
pub(crate) struct MemoryCap {
    pub(crate) bytes: usize,
    pub(crate) hit: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> Result<bool> {
        if desired > self.bytes {
            self.hit = true;
            wasmtime::bail!(
                "the filter's memory would grow to {desired} bytes, past its cap of {}",
                self.bytes
            );
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> Result<bool> {
        Ok(desired <= 100_000)
    }
}

type Call<'a> = Caller<'a, HostState>;

fn memory(caller: &mut Call<'_>) -> Option<Memory> {
    if let Some(memory) = caller.data().memory {
        return Some(memory);
    }
    match caller.get_export("memory") {
        Some(Extern::Memory(memory)) => Some(memory),
        _ => None,
    }
}

fn read(caller: &mut Call<'_>, ptr: i32, len: i32) -> Result<Vec<u8>, Status> {
    let memory = memory(caller).ok_or(Status::InvalidMemoryAccess)?;
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    let bytes = memory.data(&*caller);
    let end = start.checked_add(len).ok_or(Status::InvalidMemoryAccess)?;
    bytes
        .get(start..end)
        .map(<[u8]>::to_vec)
        .ok_or(Status::InvalidMemoryAccess)
}

fn write(caller: &mut Call<'_>, ptr: i32, data: &[u8]) -> Result<(), Status> {
    let memory = memory(caller).ok_or(Status::InvalidMemoryAccess)?;
    memory
        .write(&mut *caller, ptr as u32 as usize, data)
        .map_err(|_| Status::InvalidMemoryAccess)
}

fn status(result: Result<(), Status>) -> i32 {
    match result {
        Ok(()) => Status::Ok as i32,
        Err(status) => status as i32,
    }
}

/// Hands `data` to the filter: allocated with its allocator, the pointer and size written
/// at `ret_ptr` and `ret_size`.
async fn hand_over(caller: &mut Call<'_>, data: &[u8], ret_ptr: i32, ret_size: i32) -> Result<i32> {
    let Some(malloc) = caller.data().malloc.clone() else {
        return Ok(Status::InternalFailure as i32);
    };
    let at = if data.is_empty() {
        0
    } else {
        malloc.call_async(&mut *caller, data.len() as i32).await?
    };
    if at == 0 && !data.is_empty() {
        return Ok(Status::InternalFailure as i32);
    }
    let written = write(caller, at, data)
        .and_then(|()| write(caller, ret_ptr, &at.to_le_bytes()))
        .and_then(|()| write(caller, ret_size, &(data.len() as u32).to_le_bytes()));
    Ok(status(written))
}

/// The map a `MapType` names in this callback, as pairs.
fn map_pairs(exchange: &Exchange, map: MapType) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let owned = |pairs: Vec<(&[u8], &[u8])>| {
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    };
    match map {
        MapType::RequestHeaders => exchange.request.as_ref().map(|r| owned(r.pairs())),
        MapType::ResponseHeaders => exchange.response.as_ref().map(|r| {
            let status = r.status.to_string();
            let mut pairs: Vec<(Vec<u8>, Vec<u8>)> =
                vec![(b":status".to_vec(), status.into_bytes())];
            pairs.extend(
                r.headers
                    .iter()
                    .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())),
            );
            pairs
        }),
        MapType::HttpCallResponseHeaders => exchange.call_answer.as_ref().map(|a| {
            // A failed call has no status: the filter sees no `:status` (as in Envoy).
            let mut pairs = Vec::with_capacity(a.headers.len() + 1);
            if a.status != 0 {
                pairs.push((b":status".to_vec(), a.status.to_string().into_bytes()));
            }
            pairs.extend(
                a.headers
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.clone())),
            );
            pairs
        }),
        MapType::RequestTrailers
        | MapType::ResponseTrailers
        | MapType::HttpCallResponseTrailers => Some(Vec::new()),
    }
}

fn map_value(exchange: &Exchange, map: MapType, key: &[u8]) -> Option<Vec<u8>> {
    let key = key.to_ascii_lowercase();
    match map {
        MapType::RequestHeaders => {
            let request = exchange.request.as_ref()?;
            if let Some(value) = request.pseudo(&key) {
                return Some(value.as_bytes().to_vec());
            }
            joined(&request.headers, &key)
        }
        MapType::ResponseHeaders => {
            let response = exchange.response.as_ref()?;
            if key == b":status" {
                return Some(response.status.to_string().into_bytes());
            }
            joined(&response.headers, &key)
        }
        _ => map_pairs(exchange, map)?
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&key))
            .map(|(_, v)| v),
    }
}

/// A field's values joined with commas, as Envoy answers for a repeated field.
fn joined(headers: &HeaderMap, key: &[u8]) -> Option<Vec<u8>> {
    let name = HeaderName::from_bytes(key).ok()?;
    let mut values = headers.get_all(&name).iter();
    let mut out = values.next()?.as_bytes().to_vec();
    for value in values {
        out.extend_from_slice(b", ");
        out.extend_from_slice(value.as_bytes());
    }
    Some(out)
}

/// How a field edit goes.
enum Edit {
    Replace,
    Add,
    Remove,
}

fn edit_map(
    exchange: &mut Exchange,
    map: MapType,
    key: &[u8],
    value: &[u8],
    edit: Edit,
) -> Result<(), Status> {
    if key.len() > MAX_FIELD_BYTES || value.len() > MAX_FIELD_BYTES {
        return Err(Status::BadArgument);
    }
    let key = key.to_ascii_lowercase();
    let headers = match map {
        MapType::RequestHeaders => {
            let request = exchange.request.as_mut().ok_or(Status::NotFound)?;
            if key.starts_with(b":") {
                return match edit {
                    Edit::Remove => Err(Status::BadArgument),
                    _ if request.set_pseudo(&key, value) => Ok(()),
                    _ => Err(Status::BadArgument),
                };
            }
            &mut request.headers
        }
        MapType::ResponseHeaders => {
            let response = exchange.response.as_mut().ok_or(Status::NotFound)?;
            if key == b":status" {
                let status = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<u16>().ok());
                return match (edit, status) {
                    (Edit::Remove, _) => Err(Status::BadArgument),
                    (_, Some(status @ 200..=599)) => {
                        response.status = status;
                        Ok(())
                    }
                    _ => Err(Status::BadArgument),
                };
            }
            &mut response.headers
        }
        _ => return Err(Status::BadArgument),
    };
    let name = HeaderName::from_bytes(&key).map_err(|_| Status::BadArgument)?;
    match edit {
        Edit::Remove => {
            headers.remove(&name);
        }
        Edit::Replace => {
            let value = HeaderValue::from_bytes(value).map_err(|_| Status::BadArgument)?;
            headers.insert(name, value);
        }
        Edit::Add => {
            let value = HeaderValue::from_bytes(value).map_err(|_| Status::BadArgument)?;
            headers.append(name, value);
        }
    }
    Ok(())
}

fn set_map(exchange: &mut Exchange, map: MapType, bytes: &[u8]) -> Result<(), Status> {
    let pairs = abi::decode_map(bytes).ok_or(Status::SerializationFailure)?;
    if pairs.len() > 1000 {
        return Err(Status::BadArgument);
    }
    // The whole map is replaced: the fields go, the pseudo-fields stay unless named.
    match map {
        MapType::RequestHeaders => exchange
            .request
            .as_mut()
            .ok_or(Status::NotFound)?
            .headers
            .clear(),
        MapType::ResponseHeaders => exchange
            .response
            .as_mut()
            .ok_or(Status::NotFound)?
            .headers
            .clear(),
        _ => return Err(Status::BadArgument),
    }
    for (key, value) in pairs {
        edit_map(exchange, map, key, value, Edit::Add)?;
    }
    Ok(())
}

fn buffer(exchange: &mut Exchange, identity: &Identity, buffer: BufferType) -> Option<Vec<u8>> {
    match buffer {
        BufferType::RequestBody => exchange.request_body.clone(),
        BufferType::ResponseBody => exchange.response_body.clone(),
        BufferType::HttpCallResponseBody => exchange.call_answer.as_ref().map(|a| a.body.to_vec()),
        BufferType::PluginConfiguration => Some(identity.config.to_vec()),
        BufferType::VmConfiguration => Some(Vec::new()),
    }
}

/// `proxy_set_buffer_bytes`: `size` bytes from `start` are replaced by `data` (Envoy's
/// meaning: start 0 and size at least the length replaces the whole buffer).
fn set_buffer(
    exchange: &mut Exchange,
    buffer: BufferType,
    start: usize,
    size: usize,
    data: &[u8],
) -> Result<(), Status> {
    let body = match buffer {
        BufferType::RequestBody => exchange.request_body.as_mut(),
        BufferType::ResponseBody => exchange.response_body.as_mut(),
        _ => return Err(Status::BadArgument),
    }
    .ok_or(Status::NotFound)?;
    let start = start.min(body.len());
    let end = start.saturating_add(size).min(body.len());
    body.splice(start..end, data.iter().copied());
    Ok(())
}

/// What `proxy_get_property` answers, by path (elements joined with NUL bytes). Strings
/// are their bytes; numbers eight little-endian bytes, as Envoy gives them.
fn property(state: &HostState, path: &[u8]) -> Option<Vec<u8>> {
    let path = std::str::from_utf8(path).ok()?.replace('\0', ".");
    let exchange = &state.exchange;
    let identity = &state.identity;
    let request = exchange.request.as_ref();
    let facts = exchange.facts.as_deref();
    let text = |s: &str| Some(s.as_bytes().to_vec());
    let number = |n: u64| Some(n.to_le_bytes().to_vec());
    match path.as_str() {
        "plugin_name" => text(&identity.filter),
        "plugin_root_id" | "plugin_vm_id" => text(&identity.filter),
        "route_name" | "cluster_name" | "switchyard.app" => text(&identity.app),
        "request.path" => text(&request?.path),
        "request.url_path" => text(request?.path.split('?').next().unwrap_or_default()),
        "request.query" => text(request?.path.split_once('?').map_or("", |(_, q)| q)),
        "request.host" => text(&request?.authority),
        "request.method" => text(&request?.method),
        "request.scheme" => text(request?.scheme),
        "request.protocol" => text(facts?.protocol),
        "request.id" => text(&facts?.request_id),
        "source.address" => text(&facts?.source?.to_string()),
        "source.port" => number(u64::from(facts?.source?.port())),
        "response.code" => number(u64::from(exchange.response.as_ref()?.status)),
        _ => None,
    }
}

fn log_line(identity: &Identity, level: i32, message: &[u8]) {
    let level = match level {
        0 => log::Level::Trace,
        1 => log::Level::Debug,
        2 => log::Level::Info,
        3 => log::Level::Warn,
        _ => log::Level::Error,
    };
    let message = String::from_utf8_lossy(message);
    log::log!(target: "switchyard::filter", level, "app '{}' filter '{}': {}", identity.app, identity.filter, message);
}

/// The linker every module is instantiated with.
pub(crate) fn linker(engine: &wasmtime::Engine) -> Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    define_env(&mut linker)?;
    define_wasi(&mut linker)?;
    Ok(linker)
}

/// The linker for one module: the host's calls, and the imports it does not offer made to
/// answer `Unimplemented` (`ENOSYS` for WASI's) when their type allows, a trap otherwise.
pub(crate) fn linker_for(base: &Linker<HostState>, module: &Module) -> Result<Linker<HostState>> {
    let mut linker = base.clone();
    for import in module.imports() {
        let ExternType::Func(ty) = import.ty() else {
            continue;
        };
        let answer = match import.module() {
            "env" if import.name().starts_with("proxy_") => Some(Status::Unimplemented as i32),
            "wasi_snapshot_preview1" => Some(52),
            _ => None,
        };
        let returns_one_i32 =
            ty.results().len() == 1 && matches!(ty.results().next(), Some(ValType::I32));
        let name = format!("{}::{}", import.module(), import.name());
        // A name the host defines is refused here (no shadowing): it keeps the host's.
        let _ = match answer.filter(|_| returns_one_i32) {
            Some(code) => {
                linker.func_new(import.module(), import.name(), ty, move |_, _, results| {
                    results[0] = Val::I32(code);
                    Ok(())
                })
            }
            None => linker.func_new(import.module(), import.name(), ty, move |_, _, _| {
                wasmtime::bail!("the filter called {name}, which this host does not offer")
            }),
        };
    }
    Ok(linker)
}

/// The `env` imports: the proxy-wasm ABI.
fn define_env(linker: &mut Linker<HostState>) -> Result<()> {
    define_basics(linker)?;
    define_buffers(linker)?;
    define_maps(linker)?;
    define_properties(linker)?;
    define_streams(linker)
}

/// Logging, time and ticks.
fn define_basics(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: Call<'_>, level: i32, ptr: i32, len: i32| -> i32 {
            match read(&mut c, ptr, len) {
                Ok(message) => {
                    log_line(&c.data().identity, level, &message);
                    Status::Ok as i32
                }
                Err(status) => status as i32,
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: Call<'_>, ret: i32| -> i32 {
            let level: i32 = match log::max_level() {
                log::LevelFilter::Trace => 0,
                log::LevelFilter::Debug => 1,
                log::LevelFilter::Info => 2,
                log::LevelFilter::Warn => 3,
                _ => 4,
            };
            status(write(&mut c, ret, &level.to_le_bytes()))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: Call<'_>, ret: i32| -> i32 {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            status(write(&mut c, ret, &now.to_le_bytes()))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |c: Call<'_>, period: i32| -> i32 {
            c.data()
                .tick_period_ms
                .store(period as u32, Ordering::Relaxed);
            Status::Ok as i32
        },
    )?;
    Ok(())
}

/// Bodies and configuration: `proxy_get_buffer_bytes`, `proxy_set_buffer_bytes`.
fn define_buffers(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap_async(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: Call<'_>, (kind, start, max, ret_ptr, ret_size): (i32, i32, i32, i32, i32)| {
            Box::new(async move {
                let Some(kind) = BufferType::of(kind) else {
                    return Ok(Status::BadArgument as i32);
                };
                let state = c.data_mut();
                let identity = state.identity.clone();
                let Some(bytes) = buffer(&mut state.exchange, &identity, kind) else {
                    return Ok(Status::NotFound as i32);
                };
                let start = (start as u32 as usize).min(bytes.len());
                let end = start.saturating_add(max as u32 as usize).min(bytes.len());
                hand_over(&mut c, &bytes[start..end], ret_ptr, ret_size).await
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: Call<'_>, kind: i32, start: i32, size: i32, ptr: i32, len: i32| -> i32 {
            let Some(kind) = BufferType::of(kind) else {
                return Status::BadArgument as i32;
            };
            let data = match read(&mut c, ptr, len) {
                Ok(data) => data,
                Err(status) => return status as i32,
            };
            let exchange = &mut c.data_mut().exchange;
            status(set_buffer(
                exchange,
                kind,
                start as u32 as usize,
                size as u32 as usize,
                &data,
            ))
        },
    )?;
    Ok(())
}

/// Header maps: whole, and field by field.
fn define_maps(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap_async(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: Call<'_>, (map, ret_ptr, ret_size): (i32, i32, i32)| {
            Box::new(async move {
                let Some(map) = MapType::of(map) else {
                    return Ok(Status::BadArgument as i32);
                };
                let Some(pairs) = map_pairs(&c.data().exchange, map) else {
                    return Ok(Status::NotFound as i32);
                };
                let bytes =
                    abi::encode_map(pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
                hand_over(&mut c, &bytes, ret_ptr, ret_size).await
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: Call<'_>, map: i32, ptr: i32, len: i32| -> i32 {
            let Some(map) = MapType::of(map) else {
                return Status::BadArgument as i32;
            };
            match read(&mut c, ptr, len) {
                Ok(bytes) => status(set_map(&mut c.data_mut().exchange, map, &bytes)),
                Err(status) => status as i32,
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_size",
        |mut c: Call<'_>, map: i32, ret: i32| -> i32 {
            let Some(map) = MapType::of(map) else {
                return Status::BadArgument as i32;
            };
            let Some(pairs) = map_pairs(&c.data().exchange, map) else {
                return Status::NotFound as i32;
            };
            let size = abi::encode_map(pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
                .len() as u32;
            status(write(&mut c, ret, &size.to_le_bytes()))
        },
    )?;
    linker.func_wrap_async(
        "env",
        "proxy_get_header_map_value",
        |mut c: Call<'_>, (map, key_ptr, key_len, ret_ptr, ret_size): (i32, i32, i32, i32, i32)| {
            Box::new(async move {
                let Some(map) = MapType::of(map) else {
                    return Ok(Status::BadArgument as i32);
                };
                let key = match read(&mut c, key_ptr, key_len) {
                    Ok(key) => key,
                    Err(status) => return Ok(status as i32),
                };
                match map_value(&c.data().exchange, map, &key) {
                    Some(value) => hand_over(&mut c, &value, ret_ptr, ret_size).await,
                    None => Ok(Status::NotFound as i32),
                }
            })
        },
    )?;
    for (name, edit) in [
        ("proxy_replace_header_map_value", 0),
        ("proxy_add_header_map_value", 1),
    ] {
        linker.func_wrap(
            "env",
            name,
            move |mut c: Call<'_>,
                  map: i32,
                  key_ptr: i32,
                  key_len: i32,
                  value_ptr: i32,
                  value_len: i32|
                  -> i32 {
                let Some(map) = MapType::of(map) else {
                    return Status::BadArgument as i32;
                };
                let (key, value) = match (
                    read(&mut c, key_ptr, key_len),
                    read(&mut c, value_ptr, value_len),
                ) {
                    (Ok(key), Ok(value)) => (key, value),
                    _ => return Status::InvalidMemoryAccess as i32,
                };
                let edit = if edit == 0 { Edit::Replace } else { Edit::Add };
                status(edit_map(
                    &mut c.data_mut().exchange,
                    map,
                    &key,
                    &value,
                    edit,
                ))
            },
        )?;
    }
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: Call<'_>, map: i32, key_ptr: i32, key_len: i32| -> i32 {
            let Some(map) = MapType::of(map) else {
                return Status::BadArgument as i32;
            };
            match read(&mut c, key_ptr, key_len) {
                Ok(key) => status(edit_map(
                    &mut c.data_mut().exchange,
                    map,
                    &key,
                    b"",
                    Edit::Remove,
                )),
                Err(status) => status as i32,
            }
        },
    )?;
    Ok(())
}

/// Properties and shared data.
fn define_properties(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap_async(
        "env",
        "proxy_get_property",
        |mut c: Call<'_>, (path_ptr, path_len, ret_ptr, ret_size): (i32, i32, i32, i32)| {
            Box::new(async move {
                let path = match read(&mut c, path_ptr, path_len) {
                    Ok(path) => path,
                    Err(status) => return Ok(status as i32),
                };
                match property(c.data(), &path) {
                    Some(value) => hand_over(&mut c, &value, ret_ptr, ret_size).await,
                    None => Ok(Status::NotFound as i32),
                }
            })
        },
    )?;
    linker.func_wrap_async(
        "env",
        "proxy_get_shared_data",
        |mut c: Call<'_>,
         (key_ptr, key_len, ret_ptr, ret_size, ret_cas): (i32, i32, i32, i32, i32)| {
            Box::new(async move {
                let key = match read(&mut c, key_ptr, key_len) {
                    Ok(key) => key,
                    Err(status) => return Ok(status as i32),
                };
                let state = c.data();
                let Some((value, cas)) = state.shared.get(&state.identity.app, &key) else {
                    return Ok(Status::NotFound as i32);
                };
                if let Err(status) = write(&mut c, ret_cas, &cas.to_le_bytes()) {
                    return Ok(status as i32);
                }
                hand_over(&mut c, &value, ret_ptr, ret_size).await
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: Call<'_>,
         key_ptr: i32,
         key_len: i32,
         value_ptr: i32,
         value_len: i32,
         cas: i32|
         -> i32 {
            let (key, value) = match (
                read(&mut c, key_ptr, key_len),
                read(&mut c, value_ptr, value_len),
            ) {
                (Ok(key), Ok(value)) => (key, value),
                _ => return Status::InvalidMemoryAccess as i32,
            };
            let state = c.data();
            match state
                .shared
                .set(&state.identity.app, &key, &value, cas as u32)
            {
                Ok(()) => {
                    crate::metrics::SHARED_DATA_KEYS.set(state.shared.keys() as i64);
                    Status::Ok as i32
                }
                Err(shared_data::Refused::CasMismatch) => Status::CasMismatch as i32,
                Err(shared_data::Refused::Full) => Status::InternalFailure as i32,
            }
        },
    )?;
    Ok(())
}

/// The request's course: resumed, answered in place of the app, calls dispatched.
fn define_streams(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: Call<'_>, stream: i32| -> i32 {
            match stream {
                abi::STREAM_REQUEST | abi::STREAM_RESPONSE => {
                    c.data_mut().exchange.resumed = true;
                    Status::Ok as i32
                }
                _ => Status::Unimplemented as i32,
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |_: Call<'_>, _context: i32| -> i32 { Status::Ok as i32 },
    )?;
    linker.func_wrap("env", "proxy_done", |_: Call<'_>| -> i32 {
        Status::Ok as i32
    })?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: Call<'_>,
         code: i32,
         details_ptr: i32,
         details_len: i32,
         body_ptr: i32,
         body_len: i32,
         fields_ptr: i32,
         fields_len: i32,
         _grpc: i32|
         -> i32 {
            let read_all = (
                read(&mut c, details_ptr, details_len),
                read(&mut c, body_ptr, body_len),
                read(&mut c, fields_ptr, fields_len),
            );
            let (Ok(details), Ok(body), Ok(fields)) = read_all else {
                return Status::InvalidMemoryAccess as i32;
            };
            let Ok(status @ 200..=599) = u16::try_from(code) else {
                return Status::BadArgument as i32;
            };
            let Some(pairs) = abi::decode_map(&fields) else {
                return Status::SerializationFailure as i32;
            };
            let mut headers = Vec::with_capacity(pairs.len());
            for (key, value) in pairs {
                match (HeaderName::from_bytes(key), HeaderValue::from_bytes(value)) {
                    (Ok(name), Ok(value)) => headers.push((name, value)),
                    _ => return Status::BadArgument as i32,
                }
            }
            let exchange = &mut c.data_mut().exchange;
            if !exchange.in_request {
                return Status::BadArgument as i32;
            }
            exchange.local_response = Some(LocalResponse {
                status,
                headers,
                body: Bytes::from(body),
                details: String::from_utf8_lossy(&details).into_owned(),
            });
            Status::Ok as i32
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: Call<'_>,
         upstream_ptr: i32,
         upstream_len: i32,
         fields_ptr: i32,
         fields_len: i32,
         body_ptr: i32,
         body_len: i32,
         _trailers_ptr: i32,
         _trailers_len: i32,
         timeout_ms: i32,
         ret_token: i32|
         -> i32 {
            let read_all = (
                read(&mut c, upstream_ptr, upstream_len),
                read(&mut c, fields_ptr, fields_len),
                read(&mut c, body_ptr, body_len),
            );
            let (Ok(upstream), Ok(fields), Ok(body)) = read_all else {
                return Status::InvalidMemoryAccess as i32;
            };
            let Ok(upstream) = String::from_utf8(upstream) else {
                return Status::BadArgument as i32;
            };
            let Some(pairs) = abi::decode_map(&fields) else {
                return Status::SerializationFailure as i32;
            };
            let headers: Vec<(String, Vec<u8>)> = pairs
                .into_iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).to_ascii_lowercase(), v.to_vec()))
                .collect();
            let has = |name: &str| headers.iter().any(|(k, _)| k == name);
            if !has(":method") || !has(":path") {
                return Status::BadArgument as i32;
            }
            let state = c.data_mut();
            if !state.exchange.in_request || state.exchange.calls.len() >= MAX_CALLS_PER_CALLBACK {
                return Status::BadArgument as i32;
            }
            state.next_token = state.next_token.wrapping_add(1).max(1);
            let token = state.next_token;
            let timeout = Duration::from_millis(u64::from(timeout_ms as u32)).min(MAX_CALL_TIMEOUT);
            state.exchange.calls.push(HttpCall {
                token,
                upstream,
                headers,
                body: Bytes::from(body),
                timeout,
            });
            status(write(&mut c, ret_token, &token.to_le_bytes()))
        },
    )?;
    Ok(())
}

/// WASI preview 1, as far as the SDKs' filters use it: output goes to the log, the clock
/// and random bytes are the host's, there are no arguments, environment or files.
fn define_wasi(linker: &mut Linker<HostState>) -> Result<()> {
    const WASI: &str = "wasi_snapshot_preview1";
    const ERRNO_SUCCESS: i32 = 0;
    const ERRNO_BADF: i32 = 8;
    const ERRNO_INVAL: i32 = 28;
    linker.func_wrap(
        WASI,
        "fd_write",
        |mut c: Call<'_>, fd: i32, iovs: i32, iovs_len: i32, ret_written: i32| -> i32 {
            if fd != 1 && fd != 2 {
                return ERRNO_BADF;
            }
            let Ok(vectors) = read(&mut c, iovs, iovs_len.saturating_mul(8)) else {
                return ERRNO_INVAL;
            };
            let mut text = Vec::new();
            for pair in vectors.chunks_exact(8) {
                let ptr = i32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
                let len = i32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
                match read(&mut c, ptr, len) {
                    Ok(bytes) if text.len() + bytes.len() <= MAX_FIELD_BYTES => text.extend(bytes),
                    Ok(_) => {}
                    Err(_) => return ERRNO_INVAL,
                }
            }
            let written = text.len() as u32;
            let line = text.strip_suffix(b"\n").unwrap_or(&text);
            log_line(&c.data().identity, if fd == 2 { 3 } else { 2 }, line);
            match write(&mut c, ret_written, &written.to_le_bytes()) {
                Ok(()) => ERRNO_SUCCESS,
                Err(_) => ERRNO_INVAL,
            }
        },
    )?;
    linker.func_wrap(
        WASI,
        "clock_time_get",
        |mut c: Call<'_>, clock: i32, _precision: i64, ret: i32| -> i32 {
            let now = match clock {
                0 => SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
                _ => crate::deadline::monotonic_ns(),
            };
            match write(&mut c, ret, &now.to_le_bytes()) {
                Ok(()) => ERRNO_SUCCESS,
                Err(_) => ERRNO_INVAL,
            }
        },
    )?;
    linker.func_wrap(
        WASI,
        "random_get",
        |mut c: Call<'_>, ptr: i32, len: i32| -> i32 {
            let len = len as u32 as usize;
            if len > MAX_FIELD_BYTES {
                return ERRNO_INVAL;
            }
            let mut bytes = vec![0; len];
            if openssl::rand::rand_bytes(&mut bytes).is_err() {
                return ERRNO_INVAL;
            }
            match write(&mut c, ptr, &bytes) {
                Ok(()) => ERRNO_SUCCESS,
                Err(_) => ERRNO_INVAL,
            }
        },
    )?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        linker.func_wrap(
            WASI,
            name,
            |mut c: Call<'_>, ret_count: i32, ret_size: i32| -> i32 {
                let zeros = write(&mut c, ret_count, &0u32.to_le_bytes())
                    .and_then(|()| write(&mut c, ret_size, &0u32.to_le_bytes()));
                match zeros {
                    Ok(()) => ERRNO_SUCCESS,
                    Err(_) => ERRNO_INVAL,
                }
            },
        )?;
    }
    for name in ["environ_get", "args_get"] {
        linker.func_wrap(WASI, name, |_: Call<'_>, _: i32, _: i32| -> i32 {
            ERRNO_SUCCESS
        })?;
    }
    linker.func_wrap(WASI, "sched_yield", |_: Call<'_>| -> i32 { ERRNO_SUCCESS })?;
    linker.func_wrap(WASI, "proc_exit", |_: Call<'_>, code: i32| -> Result<()> {
        wasmtime::bail!("the filter exited (proc_exit {code})")
    })?;
    Ok(())
}
