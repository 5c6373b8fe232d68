//! `/v1/tokens`: scoped tokens made, listed and revoked by the bootstrap admin, without a
//! restart. A token is shown once, when made; the store keeps only its secret's digest.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use switchyard_model::{ApiToken, TokenScope, ValidationError};

use crate::api_doc::JsonBody;
use crate::audit::AuditDetail;
use crate::auth::{secret_digest, TOKEN_PREFIX};
use crate::{AdminState, ApiError};

/// Most tokens a store keeps: each call reads one by id, listings read them all.
const MAX_TOKENS: usize = 10_000;
/// Longest name a token may be given.
const MAX_NAME: usize = 200;

/// `POST /v1/tokens`' body.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewToken {
    /// `read`, `write` or `apps:PREFIX` (the apps whose names start with PREFIX).
    scope: String,
    /// What it is for (a pipeline, a person).
    #[serde(default)]
    name: String,
}

/// A token just made: its secret is in `token`, shown this once.
#[derive(Serialize, JsonSchema)]
pub(crate) struct MadeToken {
    /// The bearer token to give the caller: `sy_ID_SECRET`.
    token: String,
    #[serde(flatten)]
    listed: ApiToken,
}

/// `GET /v1/tokens`' answer.
#[derive(Serialize, JsonSchema)]
pub(crate) struct TokenList {
    /// Every token, oldest first, without secrets.
    tokens: Vec<ApiToken>,
}

/// `/v1/tokens/{id}`.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct TokenPath {
    /// The token's id (the part after `sy_`, before the next `_`).
    #[schemars(regex(pattern = r"^[0-9a-f]{16}$"))]
    id: String,
}

pub(crate) async fn create(
    State(state): State<AdminState>,
    JsonBody(body, ..): JsonBody<NewToken>,
) -> Result<Response, ApiError> {
    let asked: NewToken = serde_json::from_slice(&body).map_err(|e| {
        ValidationError::new(
            if e.to_string().contains("scope") {
                "scope"
            } else {
                "body"
            },
            format!(
                "a JSON object {{\"scope\": \"read|write|apps:PREFIX\", \"name\": \"…\"}}: {e}"
            ),
        )
    })?;
    let scope = TokenScope::parse(&asked.scope)?;
    if asked.name.len() > MAX_NAME || asked.name.chars().any(char::is_control) {
        return Err(ValidationError::new(
            "name",
            format!("at most {MAX_NAME} bytes, no control characters"),
        )
        .into());
    }
    if state.store.tokens().await?.len() >= MAX_TOKENS {
        return Err(ApiError::Conflict {
            message: format!("the store holds {MAX_TOKENS} tokens already: revoke some first"),
            field: "scope",
        });
    }
    let id = random_hex(8)?;
    let secret = random_hex(32)?;
    let token = ApiToken {
        id: id.clone(),
        name: asked.name,
        scope: scope.to_string(),
        secret_sha256: secret_digest(&secret),
        created_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    state.store.put_token(token.clone()).await?;
    let detail = json!({"token": id, "scope": token.scope, "name": token.name});
    let made = MadeToken {
        token: format!("{TOKEN_PREFIX}{id}_{secret}"),
        listed: ApiToken {
            secret_sha256: String::new(),
            ..token
        },
    };
    Ok((
        StatusCode::CREATED,
        Extension(AuditDetail(detail)),
        Json(made),
    )
        .into_response())
}

pub(crate) async fn list(State(state): State<AdminState>) -> Result<Json<TokenList>, ApiError> {
    let mut tokens = state.store.tokens().await?;
    tokens.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    for token in &mut tokens {
        token.secret_sha256.clear();
    }
    Ok(Json(TokenList { tokens }))
}

pub(crate) async fn revoke(
    State(state): State<AdminState>,
    Path(TokenPath { id }): Path<TokenPath>,
) -> Result<Response, ApiError> {
    if !state.store.delete_token(&id).await? {
        return Err(ApiError::NotFound {
            what: format!("token '{id}' does not exist"),
            field: "id",
        });
    }
    let detail: Value = json!({"token": id});
    Ok((StatusCode::NO_CONTENT, Extension(AuditDetail(detail))).into_response())
}

fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut buffer = vec![0u8; bytes];
    openssl::rand::rand_bytes(&mut buffer)
        .map_err(|e| ApiError::Unavailable(format!("no random bytes for a token: {e}")))?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}
