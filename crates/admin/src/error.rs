//! Every failure of the admin API becomes a JSON body `{"error": …, "field": …}` here, and
//! nowhere else.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use switchyard_model::ValidationError;
use switchyard_store::StoreError;

use crate::answers::ErrorBody;

/// A refused or failed admin call.
#[derive(Debug)]
pub enum ApiError {
    /// The input is invalid: 400, naming the field.
    Invalid(ValidationError),
    /// No such resource: 404.
    NotFound {
        /// What was looked for.
        what: String,
        /// The field (path segment) that named it.
        field: &'static str,
    },
    /// The write conflicts with another resource: 409.
    Conflict {
        /// Why.
        message: String,
        /// The field at fault.
        field: &'static str,
    },
    /// An `If-Match` the stored record no longer satisfies: 412, nothing written.
    PreconditionFailed(String),
    /// Missing or wrong bearer token: 401.
    Unauthorized,
    /// Allowed to this caller only by a setting that is off: 403.
    Forbidden {
        /// Why, naming the setting.
        message: String,
        /// The field (or header) at fault.
        field: &'static str,
    },
    /// The path exists but not with this method: 405.
    MethodNotAllowed,
    /// The body is larger than the API accepts: 413.
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The write is on the Redis primary but not on the replicas asked for: 503, retry.
    NotDurable(String),
    /// The store cannot be reached: 503; the write did not happen.
    Unavailable(String),
    /// The cache Redis shared by the fleet cannot be reached or is not configured: 503.
    SharedCacheUnavailable(String),
    /// Refused by the HTTP layer before a handler ran (a query or path that does not parse).
    Rejected {
        /// The status the HTTP layer chose (4xx).
        status: StatusCode,
        /// Its explanation.
        text: String,
    },
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        Self::Invalid(e)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::AppNotFound(name) => Self::NotFound {
                what: format!("app '{name}' does not exist"),
                field: "name",
            },
            StoreError::DomainTaken { .. } => Self::Conflict {
                message: e.to_string(),
                field: "domains",
            },
            StoreError::PreconditionFailed(_) => Self::PreconditionFailed(e.to_string()),
            StoreError::NotDurable(_) => {
                log::warn!("admin write not acknowledged by the replicas: {e}");
                Self::NotDurable(e.to_string())
            }
            StoreError::Unavailable(_) | StoreError::Corrupt { .. } => {
                log::error!("admin call failed in the store: {e}");
                Self::Unavailable(e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, error, field) = match self {
            Self::Invalid(e) => (StatusCode::BAD_REQUEST, e.message, e.field),
            Self::NotFound { what, field } => (StatusCode::NOT_FOUND, what, field.to_string()),
            Self::Conflict { message, field } => (StatusCode::CONFLICT, message, field.to_string()),
            Self::PreconditionFailed(message) => (
                StatusCode::PRECONDITION_FAILED,
                message,
                "if-match".to_string(),
            ),
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "missing or invalid bearer token".to_string(),
                "authorization".to_string(),
            ),
            Self::Forbidden { message, field } => {
                (StatusCode::FORBIDDEN, message, field.to_string())
            }
            Self::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this path".to_string(),
                "method".to_string(),
            ),
            Self::TooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {limit} bytes"),
                "body".to_string(),
            ),
            Self::NotDurable(message) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{message}; write it again once the replicas are back"),
                "store".to_string(),
            ),
            Self::Unavailable(message) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store is unavailable, nothing was changed: {message}"),
                String::new(),
            ),
            Self::SharedCacheUnavailable(message) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the shared response cache cannot be purged: {message}"),
                String::new(),
            ),
            Self::Rejected { status, text } => (status, text, "request".to_string()),
        };
        let body = ErrorBody {
            error,
            field: Some(field).filter(|field| !field.is_empty()),
        };
        (status, Json(body)).into_response()
    }
}

/// Each operation lists the refusals it may answer itself (`api_doc`).
impl aide::OperationOutput for ApiError {
    type Inner = Self;
}
