//! Switchyard's domain model: apps, their domains and backends, per-app options, TLS
//! certificates, and the change events that tell every cache what moved. It sits under
//! everything else — the store persists these types, the proxy routes by them, the admin API
//! validates input with them — and it does no IO, so validation lives here once.

mod access;
mod acme;
mod affinity;
mod app;
mod basic_auth;
mod cache;
mod certificate;
mod change;
mod client;
mod compress;
mod domain;
mod entity_tag;
mod error;
mod filters;
mod header_rules;
mod images;
mod limits;
mod mirror;
mod pages;
mod redirects;
mod request_buffering;
mod schema;
mod spec;
mod views;
mod waf;

pub use access::{field_changes, ApiToken, AuditPage, AuditQuery, AuditRecord, TokenScope};
pub use acme::{
    backoff_s, renew_at, AcmeChallenge, AcmeDomain, AcmeStatus, AcmeTlsAlpnAnswer,
    DUPLICATES_PER_WEEK, FAILURES_PER_HOUR,
};
pub use affinity::{Affinity, DEFAULT_AFFINITY_COOKIE};
pub use app::{
    App, AppForwarding, AppName, AppTls, Backend, BackendAddress, Balancer, Drain, HealthCheck,
    Hsts, ProxyProtocol, Timeouts, MAX_WEIGHT, SRV_PREFIX,
};
pub use basic_auth::{BasicAuth, MAX_BCRYPT_COST};
pub use cache::{CacheStore, ResponseCache};
pub use certificate::{
    covers, parse_certificate_spec, unix_seconds, CertificateInfo, CertificateUpload,
    StoredCertificate,
};
pub use change::Change;
pub use client::{ClientTimeouts, DEFAULT_CLIENT_TIMEOUT_S};
pub use compress::{Compress, DEFAULT_COMPRESSED_TYPES};
pub use domain::{normalize_host, Domain};
pub use entity_tag::{entity_tag_of, IfMatch};
pub use error::ValidationError;
pub use filters::{
    valid_filter_name, FilterModule, FilterUse, MAX_FILTERS_PER_APP, MAX_FILTER_CONFIG_BYTES,
    MAX_FILTER_DEADLINE_MS, MAX_FILTER_MEMORY_MIB, MAX_FILTER_MODULE_BYTES,
};
pub use header_rules::{
    HeaderEdits, HeaderRules, PROTECTED_REQUEST_FIELDS, PROTECTED_RESPONSE_FIELDS,
};
pub use images::{Images, DEFAULT_MAX_SOURCE_BYTES};
pub use ipnet::IpNet;
pub use limits::{
    parse_cidr, ClientKey, LimitMode, LimitScope, Limits, PerClient, Rate, DEFAULT_LIMIT_CLIENTS,
    MAX_CIDRS,
};
pub use mirror::{Mirror, MirrorKey, PathPattern, Share, MAX_MIRROR_BODY};
pub use pages::{ErrorPages, Maintenance, ERROR_PAGE_STATUSES, MAX_PAGE_BYTES};
pub use redirects::{Redirect, MAX_REDIRECTS};
pub use request_buffering::{RequestBuffering, MAX_MIN_UPLOAD_RATE, MAX_UPLOAD_DEADLINE_S};
pub use schema::{app_file_schema, backends_body_schema};
pub use spec::{parse_app_spec, parse_backends_spec};
pub use views::{
    AppTrafficReport, AppUsageReport, AppliedChange, BackendView, DomainRule, Explanation,
    NextBackend, RecentChangesReport, ResolvedBackend, StageVerdict, StoredCopy, TrafficReport,
    UsageReport,
};
pub use waf::{Waf, WafMode, WafOverload, DEFAULT_INSPECTED_BODY, MAX_INSPECTED_BODY};
