//! `/v1/filters`: the proxy-wasm modules apps' filters run, stored by name (their bytes by
//! SHA-256). An upload is compiled and checked for the ABI by this router before it is
//! stored: a module that does not compile, or is not a proxy-wasm filter, is refused with
//! the reason and nothing is written.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use switchyard_model::{valid_filter_name, FilterModule, ValidationError, MAX_FILTER_MODULE_BYTES};

use crate::error::ApiError;
use crate::AdminState;

/// Compiles a module as the router's filters would run it: `Err` says why it cannot.
pub trait FilterCheck: Send + Sync {
    /// Checks `module`; blocking (it compiles).
    fn check(&self, module: &[u8]) -> Result<(), String>;
}

/// The largest module accepted.
pub(crate) const MAX_MODULE_BYTES: usize = MAX_FILTER_MODULE_BYTES;

/// A filter named in the path.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct FilterPath {
    /// The filter's name: 1-64 of a-z, 0-9, `-` and `_`.
    #[schemars(regex(pattern = r"^[a-z0-9_-]{1,64}$"))]
    name: String,
}

fn valid_name(name: &str) -> Result<(), ApiError> {
    if valid_filter_name(name) {
        Ok(())
    } else {
        Err(ValidationError::new("name", "must be 1-64 of a-z, 0-9, '-' and '_'").into())
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::NotFound {
        what: format!("no filter named '{name}' is stored"),
        field: "name",
    }
}

pub(crate) async fn put(
    State(state): State<AdminState>,
    Path(FilterPath { name }): Path<FilterPath>,
    body: Bytes,
) -> Result<Json<FilterModule>, ApiError> {
    valid_name(&name)?;
    if body.is_empty() {
        return Err(ValidationError::new(
            "module",
            "the body must be the module's bytes (application/wasm)",
        )
        .into());
    }
    let Some(check) = state.filter_check.clone() else {
        return Err(ApiError::Unavailable("this router runs no filters".into()));
    };
    let module = body.to_vec();
    let checked = {
        let module = module.clone();
        tokio::task::spawn_blocking(move || check.check(&module)).await
    };
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(ValidationError::new("module", why).into()),
        Err(e) => {
            return Err(ApiError::Unavailable(format!(
                "the module could not be checked: {e}"
            )))
        }
    }
    let stored = state.store.put_filter(&name, module).await?;
    state.applied_locally().await;
    Ok(Json(stored))
}

pub(crate) async fn get(
    State(state): State<AdminState>,
    Path(FilterPath { name }): Path<FilterPath>,
) -> Result<Json<FilterModule>, ApiError> {
    valid_name(&name)?;
    match state.store.get_filter(&name).await? {
        Some(record) => Ok(Json(record)),
        None => Err(not_found(&name)),
    }
}

pub(crate) async fn list(
    State(state): State<AdminState>,
) -> Result<Json<Vec<FilterModule>>, ApiError> {
    Ok(Json(state.store.list_filters().await?))
}

pub(crate) async fn delete(
    State(state): State<AdminState>,
    Path(FilterPath { name }): Path<FilterPath>,
) -> Result<StatusCode, ApiError> {
    valid_name(&name)?;
    if state.store.delete_filter(&name).await? {
        state.applied_locally().await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found(&name))
    }
}

impl AdminState {
    /// Uploads to `/v1/filters` are checked with `check`; without it they are refused.
    pub fn with_filter_check(mut self, check: Arc<dyn FilterCheck>) -> Self {
        self.filter_check = Some(check);
        self
    }
}
