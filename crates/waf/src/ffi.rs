//! The libmodsecurity v3 C API, and the only unsafe code of this crate. Every function here
//! is safe to call: pointers are checked, strings are NUL-terminated copies, and what the
//! library allocates is freed here.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

#[repr(C)]
struct RawIntervention {
    status: c_int,
    pause: c_int,
    url: *mut c_char,
    log: *mut c_char,
    disruptive: c_int,
}

type LogCallback = Option<unsafe extern "C" fn(data: *mut c_void, message: *const c_void)>;

extern "C" {
    fn msc_init() -> *mut c_void;
    fn msc_set_connector_info(msc: *mut c_void, connector: *const c_char);
    fn msc_set_log_cb(msc: *mut c_void, cb: LogCallback);
    fn msc_cleanup(msc: *mut c_void);
    fn msc_create_rules_set() -> *mut c_void;
    fn msc_rules_add(rules: *mut c_void, plain: *const c_char, error: *mut *const c_char) -> c_int;
    fn msc_rules_cleanup(rules: *mut c_void) -> c_int;
    fn msc_new_transaction(msc: *mut c_void, rules: *mut c_void, data: *mut c_void) -> *mut c_void;
    fn msc_process_connection(
        tx: *mut c_void,
        client: *const c_char,
        client_port: c_int,
        server: *const c_char,
        server_port: c_int,
    ) -> c_int;
    fn msc_process_uri(
        tx: *mut c_void,
        uri: *const c_char,
        method: *const c_char,
        http_version: *const c_char,
    ) -> c_int;
    fn msc_add_n_request_header(
        tx: *mut c_void,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> c_int;
    fn msc_process_request_headers(tx: *mut c_void) -> c_int;
    fn msc_append_request_body(tx: *mut c_void, body: *const u8, len: usize) -> c_int;
    fn msc_process_request_body(tx: *mut c_void) -> c_int;
    fn msc_intervention(tx: *mut c_void, it: *mut RawIntervention) -> c_int;
    fn msc_process_logging(tx: *mut c_void) -> c_int;
    fn msc_transaction_cleanup(tx: *mut c_void);
    fn free(p: *mut c_void);
}

/// Receives every log line of a transaction: a `Vec<String>` owned by [`Transaction`].
unsafe extern "C" fn collect_log(data: *mut c_void, message: *const c_void) {
    if data.is_null() || message.is_null() {
        return;
    }
    // SAFETY: `data` is the `Box<Vec<String>>` pointer a `Transaction` registered and keeps
    // alive until after `msc_transaction_cleanup`; the library calls back on the thread
    // running the transaction, so there is no concurrent access. `message` is a C string
    // (no log properties are requested).
    let lines = unsafe { &mut *data.cast::<Vec<String>>() };
    let text = unsafe { CStr::from_ptr(message.cast::<c_char>()) };
    lines.push(text.to_string_lossy().into_owned());
}

/// The ModSecurity engine object.
pub(crate) struct Engine(*mut c_void);

// SAFETY: libmodsecurity's engine is made once and only read afterwards (its in-memory
// collections take their own locks); transactions may run on different threads at once.
unsafe impl Send for Engine {}
unsafe impl Sync for Engine {}

impl Engine {
    pub(crate) fn new(connector: &str) -> Option<Self> {
        // SAFETY: no arguments; a null result is handled.
        let msc = unsafe { msc_init() };
        if msc.is_null() {
            return None;
        }
        let connector = CString::new(connector).unwrap_or_default();
        // SAFETY: `msc` is valid; the library copies the string; the callback has the
        // signature the header declares.
        unsafe {
            msc_set_connector_info(msc, connector.as_ptr());
            msc_set_log_cb(msc, Some(collect_log));
        }
        Some(Self(msc))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: made by `msc_init`, dropped once, after every rule set (they hold an Arc).
        unsafe { msc_cleanup(self.0) }
    }
}

/// A loaded rule set.
pub(crate) struct Rules(*mut c_void);

// SAFETY: rules are read-only once loaded; transactions only read them.
unsafe impl Send for Rules {}
unsafe impl Sync for Rules {}

impl Rules {
    /// Parses `text` (directives, `Include`s resolved by the library). Returns how many
    /// rules were loaded, or the library's error.
    pub(crate) fn load(text: &str) -> Result<(Self, usize), String> {
        // libmodsecurity's rule parser (bison/flex) keeps global state: two loads at once
        // corrupt the heap.
        static PARSER: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _parsing = PARSER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let text = CString::new(text).map_err(|_| "rules contain a NUL byte".to_string())?;
        // SAFETY: no arguments; a null result is handled.
        let rules = unsafe { msc_create_rules_set() };
        if rules.is_null() {
            return Err("libmodsecurity could not create a rule set".into());
        }
        let mut error: *const c_char = ptr::null();
        // SAFETY: `rules` is valid, `text` NUL-terminated and alive for the call, `error`
        // receives a malloc'd string (freed below) or stays null.
        let added = unsafe { msc_rules_add(rules, text.as_ptr(), &mut error) };
        if added < 0 {
            let reason = if error.is_null() {
                "unknown error".to_string()
            } else {
                // SAFETY: a NUL-terminated string allocated by the library with malloc.
                let reason = unsafe { CStr::from_ptr(error) }
                    .to_string_lossy()
                    .into_owned();
                unsafe { free(error as *mut c_void) };
                reason
            };
            // SAFETY: made above, not shared.
            unsafe { msc_rules_cleanup(rules) };
            return Err(reason);
        }
        Ok((Self(rules), usize::try_from(added).unwrap_or(0)))
    }
}

impl Drop for Rules {
    fn drop(&mut self) {
        // SAFETY: made by `msc_create_rules_set`, dropped once, after its transactions.
        unsafe { msc_rules_cleanup(self.0) };
    }
}

/// What a phase decided.
pub(crate) struct Intervention {
    pub(crate) status: u16,
    pub(crate) log: Option<String>,
}

/// One request's inspection. Not `Send`: it runs start to end on one thread.
pub(crate) struct Transaction<'a> {
    tx: *mut c_void,
    // Boxed for a fixed address: the library holds a pointer to the Vec itself while the
    // Transaction value moves.
    #[allow(clippy::box_collection)]
    log: Box<Vec<String>>,
    _rules: &'a Rules,
    _engine: &'a Engine,
}

impl<'a> Transaction<'a> {
    pub(crate) fn new(engine: &'a Engine, rules: &'a Rules) -> Option<Self> {
        let mut log: Box<Vec<String>> = Box::default();
        let data: *mut Vec<String> = &mut *log;
        // SAFETY: engine and rules are valid for 'a, which outlives the transaction; `data`
        // points into a Box that is kept (and not moved out of) until after cleanup.
        let tx = unsafe { msc_new_transaction(engine.0, rules.0, data.cast()) };
        if tx.is_null() {
            return None;
        }
        Some(Self {
            tx,
            log,
            _rules: rules,
            _engine: engine,
        })
    }

    pub(crate) fn connection(&mut self, client: &str, client_port: u16, server_port: u16) {
        let client = c_string(client);
        let server = c_string("127.0.0.1");
        // SAFETY: valid transaction; strings alive for the call (the library copies them).
        unsafe {
            msc_process_connection(
                self.tx,
                client.as_ptr(),
                c_int::from(client_port),
                server.as_ptr(),
                c_int::from(server_port),
            );
        }
    }

    pub(crate) fn uri(&mut self, uri: &str, method: &str, http_version: &str) {
        let (uri, method, version) = (c_string(uri), c_string(method), c_string(http_version));
        // SAFETY: as above.
        unsafe { msc_process_uri(self.tx, uri.as_ptr(), method.as_ptr(), version.as_ptr()) };
    }

    pub(crate) fn header(&mut self, name: &[u8], value: &[u8]) {
        // SAFETY: pointers and lengths describe live slices; the library copies them.
        unsafe {
            msc_add_n_request_header(
                self.tx,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        };
    }

    pub(crate) fn end_of_headers(&mut self) {
        // SAFETY: valid transaction.
        unsafe { msc_process_request_headers(self.tx) };
    }

    pub(crate) fn append_body(&mut self, piece: &[u8]) {
        if piece.is_empty() {
            return;
        }
        // SAFETY: valid transaction and a live slice; the library copies it.
        unsafe { msc_append_request_body(self.tx, piece.as_ptr(), piece.len()) };
    }

    /// Runs phase 2 on the body appended so far.
    pub(crate) fn end_of_body(&mut self) {
        // SAFETY: valid transaction.
        unsafe { msc_process_request_body(self.tx) };
    }

    /// The disruptive action decided so far, if any.
    pub(crate) fn intervention(&mut self) -> Option<Intervention> {
        let mut it = RawIntervention {
            status: 200,
            pause: 0,
            url: ptr::null_mut(),
            log: ptr::null_mut(),
            disruptive: 0,
        };
        // SAFETY: valid transaction and a properly initialised struct, as the header's
        // `intervention::clean` would leave it.
        let disruptive = unsafe { msc_intervention(self.tx, &mut it) } != 0;
        let log = if it.log.is_null() {
            None
        } else {
            // SAFETY: a malloc'd NUL-terminated string handed to us; freed right after.
            let text = unsafe { CStr::from_ptr(it.log) }
                .to_string_lossy()
                .into_owned();
            unsafe { free(it.log.cast()) };
            Some(text)
        };
        if !it.url.is_null() {
            // SAFETY: as for `log`.
            unsafe { free(it.url.cast()) };
        }
        disruptive.then(|| Intervention {
            status: u16::try_from(it.status).unwrap_or(403),
            log,
        })
    }

    /// Log lines so far (rule matches).
    pub(crate) fn log_lines(&mut self) -> &[String] {
        &self.log
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        // SAFETY: valid transaction, cleaned up once; the log box outlives this call.
        unsafe {
            msc_process_logging(self.tx);
            msc_transaction_cleanup(self.tx);
        }
    }
}

fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', "")).unwrap_or_default()
}
