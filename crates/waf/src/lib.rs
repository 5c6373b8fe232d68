//! The web application firewall: ModSecurity v3 (Debian's libmodsecurity 3.0.9) with the
//! OWASP Core Rule Set, loaded once and shared by every inspection. One rule set serves every
//! paranoia level: the CRS reads the level from a transaction variable, which each
//! inspection sets through a header only the WAF sees (a client's copy is dropped).
//!
//! Inspection is CPU-bound (milliseconds with the full CRS) and synchronous: callers run it
//! on a worker pool, never on the event loop.

mod ffi;

use std::sync::Arc;

/// Where Debian's `modsecurity-crs` package puts the Core Rule Set.
pub const DEBIAN_CRS_SETUP: &str = "/etc/modsecurity/crs/crs-setup.conf";
/// The rule files of Debian's `modsecurity-crs` package.
pub const DEBIAN_CRS_RULES: &str = "/usr/share/modsecurity-crs/rules/*.conf";
/// Highest CRS paranoia level.
pub const MAX_PARANOIA: u8 = 4;
/// Carries the paranoia level into the transaction; never forwarded, never taken from a client.
const PARANOIA_HEADER: &str = "x-switchyard-paranoia";

/// Why the WAF could not be made.
#[derive(Debug, thiserror::Error)]
pub enum WafError {
    /// libmodsecurity itself failed to start.
    #[error("libmodsecurity failed to initialise")]
    Engine,
    /// A rule file was refused.
    #[error("cannot load the rules: {reason}")]
    Rules {
        /// libmodsecurity's message (file, line and reason).
        reason: String,
    },
}

/// Where the rules come from.
#[derive(Debug, Clone)]
pub struct RuleFiles {
    /// The CRS set-up file (`crs-setup.conf`).
    pub setup: String,
    /// The rule files, a path or a glob (`…/rules/*.conf`).
    pub rules: String,
    /// The platform's own rules and CRS exclusions, included after the CRS.
    pub extra: Option<String>,
}

impl Default for RuleFiles {
    fn default() -> Self {
        Self {
            setup: DEBIAN_CRS_SETUP.into(),
            rules: DEBIAN_CRS_RULES.into(),
            extra: None,
        }
    }
}

/// The request as the WAF sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The client's address.
    pub client_ip: &'a str,
    /// The client's port.
    pub client_port: u16,
    /// The port the router received the request on.
    pub server_port: u16,
    /// `GET`, `POST`, …
    pub method: &'a str,
    /// Path and query, as received.
    pub uri: &'a str,
    /// `1.1`, `2.0`.
    pub http_version: &'a str,
    /// The request's headers.
    pub headers: &'a [(&'a [u8], &'a [u8])],
    /// The body, as far as it is inspected.
    pub body: Body<'a>,
}

/// Where the inspected part of a request body is.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// No body, or none inspected.
    Absent,
    /// In memory (small bodies).
    Bytes(&'a [u8]),
    /// The first bytes of a file, read from its start at offsets (large bodies: the router
    /// does not hold them in memory beside the copy libmodsecurity makes, and the file may
    /// be the one the body is sent on from).
    Spooled(&'a std::fs::File, u64),
}

/// One rule that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMatch {
    /// The rule's id (`942100`).
    pub id: u32,
    /// The rule's message.
    pub message: String,
}

/// What the WAF found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The status the rules ask for (403), when they decided to block.
    pub block_status: Option<u16>,
    /// Every rule that matched, blocking or not.
    pub matches: Vec<RuleMatch>,
}

/// The rule set over its engine.
pub struct Waf {
    // The rule set before the engine: it is dropped first.
    rules: ffi::Rules,
    engine: Arc<ffi::Engine>,
    rule_count: usize,
}

impl std::fmt::Debug for Waf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waf")
            .field("rule_count", &self.rule_count)
            .finish_non_exhaustive()
    }
}

impl Waf {
    /// Loads the CRS (about a tenth of a second here); call it at start-up.
    pub fn load(files: &RuleFiles) -> Result<Self, WafError> {
        let engine = Arc::new(ffi::Engine::new("switchyard").ok_or(WafError::Engine)?);
        let (rules, rule_count) =
            ffi::Rules::load(&rule_text(files)).map_err(|reason| WafError::Rules { reason })?;
        Ok(Self {
            rules,
            engine,
            rule_count,
        })
    }

    /// Rules loaded.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// Inspects `request` at `paranoia` (clamped to 1..=4). Blocking, CPU-bound.
    pub fn inspect(&self, request: &Request<'_>, paranoia: u8) -> Verdict {
        let level = [b'0' + paranoia.clamp(1, MAX_PARANOIA)];
        let Some(mut tx) = ffi::Transaction::new(&self.engine, &self.rules) else {
            log::warn!("libmodsecurity could not start a transaction");
            return Verdict::default();
        };
        tx.connection(request.client_ip, request.client_port, request.server_port);
        tx.uri(request.uri, request.method, request.http_version);
        let mut decided = tx.intervention();
        if decided.is_none() {
            for (name, value) in request.headers {
                if !name.eq_ignore_ascii_case(PARANOIA_HEADER.as_bytes()) {
                    tx.header(name, value);
                }
            }
            tx.header(PARANOIA_HEADER.as_bytes(), &level);
            tx.end_of_headers();
            decided = tx.intervention();
        }
        if decided.is_none() {
            match request.body {
                Body::Absent => {}
                Body::Bytes(bytes) => tx.append_body(bytes),
                Body::Spooled(file, length) => append_spooled(&mut tx, file, length),
            }
            tx.end_of_body();
            decided = tx.intervention();
        }
        let mut matches: Vec<RuleMatch> = tx
            .log_lines()
            .iter()
            .filter_map(|l| parse_match(l))
            .collect();
        if let Some(log) = decided.as_ref().and_then(|d| d.log.as_deref()) {
            if let Some(found) = parse_match(log) {
                if !matches.contains(&found) {
                    matches.push(found);
                }
            }
        }
        Verdict {
            block_status: decided.map(|d| d.status),
            matches,
        }
    }
}

/// Feeds a spooled body to the transaction in pieces, `most` bytes of it at most; a read
/// error ends the body there (what was read is inspected, as with ModSecurity's
/// ProcessPartial) and is logged. Read at offsets: the file may be read by others too.
fn append_spooled(tx: &mut ffi::Transaction, file: &std::fs::File, most: u64) {
    use std::os::unix::fs::FileExt;
    const PIECE: usize = 64 * 1024;
    let mut piece = vec![0u8; PIECE];
    let mut offset = 0u64;
    loop {
        let want = (most - offset).min(PIECE as u64) as usize;
        if want == 0 {
            return;
        }
        match file.read_at(&mut piece[..want], offset) {
            Ok(0) => return,
            Ok(n) => {
                tx.append_body(&piece[..n]);
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("WAF: spooled request body read cut short: {e}");
                return;
            }
        }
    }
}

/// The directives for one paranoia level: the engine on, request bodies inspected as given
/// (the caller bounds them) and parsed as JSON or XML by their content type (with a body
/// that does not parse refused, as ModSecurity's recommended configuration does), no audit
/// log (matches come back in the verdict), then the CRS.
fn rule_text(files: &RuleFiles) -> String {
    format!(
        "SecRuleEngine On\n\
         SecRequestBodyAccess On\n\
         SecRequestBodyLimit 67108864\n\
         SecRequestBodyNoFilesLimit 67108864\n\
         SecRequestBodyLimitAction ProcessPartial\n\
         SecResponseBodyAccess Off\n\
         SecAuditEngine Off\n\
         SecArgumentSeparator &\n\
         SecCookieFormat 0\n\
         SecRule REQUEST_HEADERS:Content-Type \"^(?:application(?:/soap\\+|/)|text/)xml\" \
           \"id:200000,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=XML\"\n\
         SecRule REQUEST_HEADERS:Content-Type \"^application/json\" \
           \"id:200001,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON\"\n\
         SecRule REQBODY_ERROR \"!@eq 0\" \"id:200002,phase:2,t:none,log,deny,status:400,\
           msg:'Failed to parse request body.',severity:2\"\n\
         SecRule REQUEST_HEADERS:{PARANOIA_HEADER} \"@rx ^([1-4])$\" \
           \"id:900000,phase:1,pass,nolog,t:none,capture,setvar:tx.paranoia_level=%{{TX.1}}\"\n\
         Include {}\n\
         Include {}\n\
         {}",
        files.setup,
        files.rules,
        files
            .extra
            .as_ref()
            .map_or_else(String::new, |extra| format!("Include {extra}\n"))
    )
}

/// `… [id "942100"] … [msg "SQL Injection Attack Detected via libinjection"] …`
fn parse_match(line: &str) -> Option<RuleMatch> {
    let field = |name: &str| {
        let start = line.find(&format!("[{name} \""))? + name.len() + 3;
        let end = line[start..].find("\"]")? + start;
        Some(line[start..end].to_string())
    };
    Some(RuleMatch {
        id: field("id")?.parse().ok()?,
        message: field("msg").unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn waf() -> &'static Waf {
        static WAF: OnceLock<Waf> = OnceLock::new();
        WAF.get_or_init(|| Waf::load(&RuleFiles::default()).expect("the CRS loads"))
    }

    fn get(uri: &str, headers: &[(&[u8], &[u8])], body: Option<&[u8]>) -> Verdict {
        waf().inspect(
            &Request {
                client_ip: "192.0.2.10",
                client_port: 40000,
                server_port: 80,
                method: if body.is_some() { "POST" } else { "GET" },
                uri,
                http_version: "1.1",
                headers,
                body: body.map_or(Body::Absent, Body::Bytes),
            },
            1,
        )
    }

    const BROWSER: &[(&[u8], &[u8])] = &[
        (b"Host", b"shop.example.com"),
        (
            b"User-Agent",
            b"Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0",
        ),
        (b"Accept", b"text/html,application/xhtml+xml"),
    ];

    #[test]
    fn the_crs_blocks_attacks_and_passes_ordinary_requests() {
        assert!(waf().rule_count() > 100, "{}", waf().rule_count());
        let ordinary = get("/products?page=2&sort=price", BROWSER, None);
        assert_eq!(ordinary.block_status, None, "{:?}", ordinary.matches);

        let sqli = get("/products?id=1%27%20OR%20%271%27=%271", BROWSER, None);
        assert_eq!(sqli.block_status, Some(403), "{:?}", sqli.matches);
        assert!(
            sqli.matches
                .iter()
                .any(|m| (942000..943000).contains(&m.id)),
            "an SQL injection rule: {:?}",
            sqli.matches
        );
        let xss = get("/search?q=%3Cscript%3Ealert(1)%3C/script%3E", BROWSER, None);
        assert_eq!(xss.block_status, Some(403), "{:?}", xss.matches);

        let mut form: Vec<(&[u8], &[u8])> = BROWSER.to_vec();
        form.push((b"Content-Type", b"application/x-www-form-urlencoded"));
        form.push((b"Content-Length", b"31"));
        let shell = get(
            "/contact",
            &form,
            Some(b"name=x&cmd=%3B%20cat%20/etc/passwd"),
        );
        assert_eq!(shell.block_status, Some(403), "{:?}", shell.matches);
        let benign_form = get("/contact", &form, Some(b"name=Ada&message=Hello+there"));
        assert_eq!(benign_form.block_status, None, "{:?}", benign_form.matches);

        let mut json: Vec<(&[u8], &[u8])> = BROWSER.to_vec();
        json.push((b"Content-Type", b"application/json"));
        let sqli_json = get("/api", &json, Some(br#"{"q": "1' OR '1'='1"}"#));
        assert_eq!(sqli_json.block_status, Some(403), "{:?}", sqli_json.matches);
        let api_call = get(
            "/api",
            &json,
            Some(br#"{"name": "Ada", "tags": ["a", "b"], "n": 3}"#),
        );
        assert_eq!(api_call.block_status, None, "{:?}", api_call.matches);
        let broken = get("/api", &json, Some(b"{not json"));
        assert_eq!(broken.block_status, Some(400), "{:?}", broken.matches);
    }

    #[test]
    fn a_spooled_body_is_inspected_whole_from_its_file() {
        use std::io::Write;
        // The attack sits past the first 64 KiB piece read back from the spool.
        let mut body = b"comment=".to_vec();
        body.extend(std::iter::repeat_n(b'a', 200 * 1024));
        body.extend_from_slice(b"&cmd=%3B%20cat%20/etc/passwd");
        let mut spool = tempfile::tempfile().expect("spool");
        spool.write_all(&body).expect("write");
        let length = body.len().to_string();
        let mut form: Vec<(&[u8], &[u8])> = BROWSER.to_vec();
        form.push((b"Content-Type", b"application/x-www-form-urlencoded"));
        form.push((b"Content-Length", length.as_bytes()));
        let request = |body| Request {
            client_ip: "192.0.2.10",
            client_port: 40000,
            server_port: 80,
            method: "POST",
            uri: "/comments",
            http_version: "1.1",
            headers: &form,
            body,
        };
        let verdict = waf().inspect(&request(Body::Spooled(&spool, body.len() as u64)), 1);
        assert_eq!(verdict.block_status, Some(403), "{:?}", verdict.matches);

        let mut benign = tempfile::tempfile().expect("spool");
        benign.write_all(&body[..200 * 1024]).expect("write");
        let verdict = waf().inspect(&request(Body::Spooled(&benign, 200 * 1024)), 1);
        assert_eq!(verdict.block_status, None, "{:?}", verdict.matches);
    }

    #[test]
    fn the_paranoia_level_decides_which_rules_run() {
        // 920300 (a request without Accept) is a paranoia-level-2 rule.
        let no_accept: &[(&[u8], &[u8])] =
            &[(b"Host", b"shop.example.com"), (b"User-Agent", b"curl/8")];
        let at = |level: u8, headers: &[(&[u8], &[u8])]| {
            let request = Request {
                client_ip: "192.0.2.10",
                client_port: 40000,
                server_port: 80,
                method: "GET",
                uri: "/",
                http_version: "1.1",
                headers,
                body: Body::Absent,
            };
            let verdict = waf().inspect(&request, level);
            verdict.matches.iter().any(|m| m.id == 920300)
        };
        assert!(!at(1, no_accept));
        assert!(at(2, no_accept));
        assert!(at(4, no_accept));
        // A client cannot choose its own level.
        let mut forged = no_accept.to_vec();
        forged.push((b"X-Switchyard-Paranoia", b"1"));
        assert!(at(2, &forged), "a forged level header is ignored");
    }

    #[test]
    fn inspections_run_on_many_threads_at_once() {
        let threads: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let attack = get("/p?id=1%27%20OR%20%271%27=%271", BROWSER, None);
                        assert_eq!(attack.block_status, Some(403), "thread {i}");
                        assert_eq!(get("/p?id=12", BROWSER, None).block_status, None);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread failed");
        }
    }

    #[test]
    fn rule_messages_are_parsed() {
        let line = r#"ModSecurity: Warning. Matched "Operator `Rx' ..." [file "/x.conf"] [line "1"] [id "942100"] [rev ""] [msg "SQL Injection Attack Detected via libinjection"] [data ""]"#;
        assert_eq!(
            parse_match(line),
            Some(RuleMatch {
                id: 942100,
                message: "SQL Injection Attack Detected via libinjection".into()
            })
        );
        assert_eq!(parse_match("no fields here"), None);
    }

    #[test]
    fn a_broken_rule_file_is_refused_with_the_reason() {
        let err = Waf::load(&RuleFiles {
            setup: "/nonexistent/crs-setup.conf".into(),
            rules: DEBIAN_CRS_RULES.into(),
            extra: None,
        })
        .expect_err("a missing file is refused");
        assert!(err.to_string().contains("crs-setup.conf"), "{err}");
    }
}
