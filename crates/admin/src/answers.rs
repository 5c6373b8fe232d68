//! The admin API's answers as types: each handler returns one, serde writes it, and the
//! OpenAPI document describes it from the same type (schemars), so an answer and its
//! description cannot drift apart.

use schemars::JsonSchema;
use serde::Serialize;
use switchyard_model::{AcmeDomain, App, CertificateInfo, ResolvedBackend};
use switchyard_store::StoreStatus;

/// A JSON answer with the entity tag of the record it shows (`ETag`; none for a record
/// not stored yet), for a later write's `If-Match`; documented as the JSON it carries.
pub(crate) struct Tagged<T>(pub(crate) Option<String>, pub(crate) axum::Json<T>);

impl<T: Serialize> axum::response::IntoResponse for Tagged<T> {
    fn into_response(self) -> axum::response::Response {
        match self.0 {
            Some(tag) => ([(axum::http::header::ETAG, tag)], self.1).into_response(),
            None => self.1.into_response(),
        }
    }
}

impl<T: JsonSchema> aide::OperationOutput for Tagged<T> {
    type Inner = T;

    fn operation_response(
        ctx: &mut aide::generate::GenContext,
        operation: &mut aide::openapi::Operation,
    ) -> Option<aide::openapi::Response> {
        axum::Json::<T>::operation_response(ctx, operation)
    }

    fn inferred_responses(
        ctx: &mut aide::generate::GenContext,
        operation: &mut aide::openapi::Operation,
    ) -> Vec<(Option<aide::openapi::StatusCode>, aide::openapi::Response)> {
        axum::Json::<T>::inferred_responses(ctx, operation)
    }
}

/// Every refusal and failure.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ErrorBody {
    /// What went wrong, in words.
    pub(crate) error: String,
    /// The field (body field, path segment, query parameter or header) at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) field: Option<String>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Health {
    /// Always `ok`: the admin API answers.
    pub(crate) status: &'static str,
}

/// `GET /readyz`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Readiness {
    /// `ready`: this router routes by the store's apps (from memory while a Redis store is
    /// away); `starting`: it has not reached its store once yet; `handed-over`: a newer
    /// router process serves from this store now.
    pub(crate) status: &'static str,
    /// The store's kind: `embedded`, `redis` or `redis+sentinel`.
    pub(crate) store: &'static str,
    /// Whether the store answered its last call.
    pub(crate) store_available: bool,
}

/// A page of apps, by name.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AppsPage {
    /// The apps of this page.
    pub(crate) apps: Vec<App>,
    /// Pass as `after` for the next page; null on the last.
    pub(crate) next_after: Option<String>,
}

/// An app as stored, with every option's default filled in.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ShownApp {
    #[serde(flatten)]
    pub(crate) app: App,
    /// Read-only (ignored on PUT): what this router resolved each backend given by name to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) resolved_backends: Vec<ResolvedBackend>,
}

/// A stored certificate as listed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ListedCert {
    #[serde(flatten)]
    pub(crate) info: CertificateInfo,
    /// Listed by expiry only: its ACME state, null for an uploaded certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) acme: Option<Option<AcmeDomain>>,
}

/// A page of certificates, by domain or by expiry; never a key.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CertsPage {
    /// The certificates of this page.
    pub(crate) certs: Vec<ListedCert>,
    /// Pass as `after` for the next page; null on the last.
    pub(crate) next_after: Option<String>,
}

/// One domain's certificate: the stored one with its ACME state, or, ordered and not issued
/// yet, the ACME state alone.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ShownCert {
    /// A certificate is stored for the domain.
    Stored {
        #[serde(flatten)]
        info: CertificateInfo,
        /// Its ACME state; null for an uploaded certificate.
        acme: Option<AcmeDomain>,
    },
    /// Ordered by ACME, nothing issued yet (or failing).
    Ordered {
        /// The domain.
        domain: String,
        /// Where its order stands.
        acme: AcmeDomain,
    },
}

/// `DELETE /v1/apps/{name}/cache`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Purged {
    /// The app.
    pub(crate) app: String,
    /// The path purged (or the prefix).
    pub(crate) purged: String,
    /// Whether everything under the path was purged.
    pub(crate) prefix: bool,
    /// Shared cache (Redis) only: responses deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deleted: Option<u64>,
    /// Shared cache only: whether the whole keyspace was scanned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) complete: Option<bool>,
}

/// `POST /v1/waf/reload`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WafReloaded {
    /// Rules loaded and now in use.
    pub(crate) rules: usize,
}

/// The router holding the fleet's ACME lease.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AcmeLease {
    /// The router's id.
    pub(crate) holder: String,
    /// Grows with every new holder: writes of an older holder are refused.
    pub(crate) fencing_token: u64,
}

/// `GET /v1/acme`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct AcmeOverview {
    /// Who issues; null when no router holds the lease.
    pub(crate) lease: Option<AcmeLease>,
    /// A page of domains' ACME states.
    pub(crate) domains: Vec<AcmeDomain>,
    /// Pass as `after` to go on; null when every record was read.
    pub(crate) next_after: Option<String>,
    /// Records read by this call (filtered calls read at most 10,000).
    pub(crate) scanned: usize,
}

/// `GET /v1/store`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ShownStore {
    #[serde(flatten)]
    pub(crate) status: StoreStatus,
    /// Seconds since this router was last known in step with the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) seconds_since_last_sync: Option<i64>,
}
