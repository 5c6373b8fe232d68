//! `PUT /v1/apps`: the platform's whole desired set of apps, and the store made to match it
//! — created, updated and (with `prune`) deleted — like `kubectl apply --prune` or a
//! Terraform plan and apply. `dry_run` answers the plan alone. The plan names the revision
//! of the app set it was made from (a digest of every app's entity tag); an `If-Match` with
//! that revision applies it only if nothing changed since. Writes go in batches, each
//! conditional on every app being as the plan read it: a write made meanwhile (another
//! sync, a deploy) stops the sync with 412 instead of being overwritten.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use switchyard_model::{entity_tag_of, field_changes, App, ValidationError};
use switchyard_store::{AppWrite, Expected, StoreError};

use crate::api_doc::AppLines;
use crate::audit::AuditDetail;
use crate::import::{refusal, valid_apps};
use crate::progress::{self, report, Progress, WRITE_BATCH};
use crate::{AdminState, ApiError};

/// Apps read per page while the store's set is compared.
const READ_PAGE: usize = 10_000;
/// Most names the audit record lists per kind of change.
const AUDITED_NAMES: usize = 100;

/// `PUT /v1/apps`' query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct SyncParams {
    /// Delete the stored apps the desired set does not hold (default false).
    #[serde(default)]
    prune: bool,
    /// Answer the plan only; change nothing (default false).
    #[serde(default)]
    dry_run: bool,
}

/// What a sync changes, or changed.
#[derive(Serialize, JsonSchema)]
pub(crate) struct SyncPlan {
    /// The revision of the stored app set the plan was made from: give it as `If-Match`
    /// to apply this plan only if nothing changed since.
    revision: String,
    /// Apps created.
    create: Vec<String>,
    /// Apps updated, each with the fields that change.
    update: Vec<Updated>,
    /// Apps deleted (with `prune`).
    delete: Vec<String>,
    /// Apps the desired set holds as stored.
    unchanged: usize,
    /// Stored apps the desired set does not hold, left alone without `prune`.
    not_in_desired: usize,
    /// Whether the plan was applied (false for `dry_run`, or when there was nothing to do).
    applied: bool,
    /// Batches written.
    batches: usize,
}

/// An app the sync updates.
#[derive(Serialize, JsonSchema)]
pub(crate) struct Updated {
    /// Its name.
    app: String,
    /// The top-level fields that change.
    fields: Vec<String>,
}

pub(crate) async fn sync_apps(
    State(state): State<AdminState>,
    Query(params): Query<SyncParams>,
    headers: HeaderMap,
    AppLines(body): AppLines,
) -> Response {
    let if_match = headers
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string());
    progress::answer(&headers, move |progress| {
        sync(state, params, if_match, body, progress)
    })
    .await
}

async fn sync(
    state: AdminState,
    params: SyncParams,
    if_match: Option<String>,
    body: bytes::Bytes,
    progress: Progress,
) -> Result<Response, ApiError> {
    let Ok(_one_at_a_time) = state.sync_running.clone().try_lock_owned() else {
        return Err(ApiError::Conflict {
            message: "a sync is under way on this router: try again once it ends".into(),
            field: "apps",
        });
    };
    let desired = match desired_apps(&body).await? {
        Ok(apps) => apps,
        Err(refused) => return Ok(refused),
    };
    let stored = stored_apps(&state).await?;
    let revision = revision_of(&stored);
    if let Some(asked) = if_match {
        if asked != revision {
            return Err(ApiError::PreconditionFailed(format!(
                "the stored apps changed since the plan (now at revision {revision}): plan again"
            )));
        }
    }
    let (mut plan, writes) = plan(&desired, &stored, params.prune, revision);
    let compared = desired.len() + plan.not_in_desired + plan.delete.len();
    report(
        &progress,
        json!({"compared": compared, "writes": writes.len()}),
    )
    .await;
    if !params.dry_run && !writes.is_empty() {
        plan.batches = apply(&state, writes, &progress).await?;
        plan.applied = true;
        state.applied_locally().await;
    }
    let detail = AuditDetail(json!({
        "dry_run": params.dry_run,
        "prune": params.prune,
        "created": plan.create.iter().take(AUDITED_NAMES).collect::<Vec<_>>(),
        "updated": plan.update.iter().take(AUDITED_NAMES).map(|u| &u.app).collect::<Vec<_>>(),
        "deleted": plan.delete.iter().take(AUDITED_NAMES).collect::<Vec<_>>(),
        "counts": [plan.create.len(), plan.update.len(), plan.delete.len()],
    }));
    Ok((StatusCode::OK, Extension(detail), Json(plan)).into_response())
}

/// The desired apps of a body of JSON lines or of one JSON array, every one validated (and
/// its maintenance page by URL fetched) before anything is compared; or the refusal naming
/// each bad line (422).
async fn desired_apps(body: &[u8]) -> Result<Result<Vec<App>, Response>, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ValidationError::new("body", format!("not UTF-8: {e}")))?;
    let lines;
    let text = if text.trim_start().starts_with('[') {
        let items: Vec<serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| ValidationError::new("body", format!("not a JSON array of apps: {e}")))?;
        lines = items
            .iter()
            .map(serde_json::Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        lines.as_str()
    } else {
        text
    };
    match valid_apps(text).await {
        Ok(apps) => Ok(Ok(apps.into_iter().map(|(_, app)| app).collect())),
        Err(problems) => Ok(Err(refusal(&problems))),
    }
}

/// Every stored app, with its entity tag, by name.
async fn stored_apps(state: &AdminState) -> Result<Vec<(App, String)>, ApiError> {
    let mut stored = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = state.store.list_apps(after.as_deref(), READ_PAGE).await?;
        stored.extend(page.apps.into_iter().map(|app| {
            let tag = entity_tag_of(&app);
            (app, tag)
        }));
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(stored),
        }
    }
}

/// The revision of an app set: a digest of every app's name and entity tag, in name order
/// (as listed), so any write to any app moves it, on any router of a fleet.
fn revision_of(stored: &[(App, String)]) -> String {
    let tags: Vec<(&str, &str)> = stored
        .iter()
        .map(|(app, tag)| (app.name.as_str(), tag.as_str()))
        .collect();
    entity_tag_of(&tags)
}

/// The plan, and its writes in the order they go: deletes first (they free domains), then
/// updates, then creates.
fn plan(
    desired: &[App],
    stored: &[(App, String)],
    prune: bool,
    revision: String,
) -> (SyncPlan, Vec<AppWrite>) {
    let by_name: HashMap<&str, (&App, &String)> = stored
        .iter()
        .map(|(app, tag)| (app.name.as_str(), (app, tag)))
        .collect();
    let wanted: std::collections::HashSet<&str> =
        desired.iter().map(|app| app.name.as_str()).collect();
    let mut plan = SyncPlan {
        revision,
        create: Vec::new(),
        update: Vec::new(),
        delete: Vec::new(),
        unchanged: 0,
        not_in_desired: 0,
        applied: false,
        batches: 0,
    };
    let (mut deletes, mut updates, mut creates) = (Vec::new(), Vec::new(), Vec::new());
    for (app, tag) in stored {
        if wanted.contains(app.name.as_str()) {
            continue;
        }
        if prune {
            plan.delete.push(app.name.to_string());
            deletes.push(AppWrite::Delete(
                app.name.to_string(),
                Expected::Tag(tag.clone()),
            ));
        } else {
            plan.not_in_desired += 1;
        }
    }
    for app in desired {
        match by_name.get(app.name.as_str()) {
            None => {
                plan.create.push(app.name.to_string());
                creates.push(AppWrite::Put(Box::new(app.clone()), Expected::Absent));
            }
            Some((_, tag)) if entity_tag_of(app) == **tag => plan.unchanged += 1,
            Some((current, tag)) => {
                let before = serde_json::to_value(current).unwrap_or_default();
                let after = serde_json::to_value(app).unwrap_or_default();
                let fields = field_changes(&before, &after)
                    .as_object()
                    .map(|changes| changes.keys().cloned().collect())
                    .unwrap_or_default();
                plan.update.push(Updated {
                    app: app.name.to_string(),
                    fields,
                });
                updates.push(AppWrite::Put(
                    Box::new(app.clone()),
                    Expected::Tag((*tag).clone()),
                ));
            }
        }
    }
    deletes.extend(updates);
    deletes.extend(creates);
    (plan, deletes)
}

/// Applies `writes` in batches; the first refused stops the sync, saying how far it went.
async fn apply(
    state: &AdminState,
    writes: Vec<AppWrite>,
    progress: &Progress,
) -> Result<usize, ApiError> {
    let count = writes.len();
    let total = count.div_ceil(WRITE_BATCH);
    let mut writes = writes.into_iter().peekable();
    let mut done = 0;
    while writes.peek().is_some() {
        let batch: Vec<AppWrite> = writes.by_ref().take(WRITE_BATCH).collect();
        if let Err(refused) = state.store.apply_apps(batch).await {
            let so_far =
                format!("{done} of {total} batches of at most {WRITE_BATCH} writes applied");
            return Err(match refused {
                StoreError::PreconditionFailed(app) => ApiError::PreconditionFailed(format!(
                    "app '{app}' changed during the sync (another writer): batch {} refused, \
                     {so_far}; plan again",
                    done + 1
                )),
                StoreError::DomainTaken { .. } => ApiError::Conflict {
                    message: format!("{refused}: batch {} refused, {so_far}", done + 1),
                    field: "domains",
                },
                other => ApiError::from(other),
            });
        }
        done += 1;
        let written = (done * WRITE_BATCH).min(count);
        report(
            progress,
            json!({"written": written, "left": count - written}),
        )
        .await;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(name: &str, backend: &str) -> App {
        let spec = json!({"domains": [format!("{name}.test")], "backends": [backend]});
        switchyard_model::parse_app_spec(name, &spec).expect("an app")
    }

    fn stored(apps: &[App]) -> Vec<(App, String)> {
        apps.iter().map(|a| (a.clone(), entity_tag_of(a))).collect()
    }

    #[test]
    fn the_plan_creates_updates_and_prunes_only_when_asked() {
        let now = stored(&[
            app("a", "10.0.0.1:80"),
            app("b", "10.0.0.1:80"),
            app("c", "10.0.0.1:80"),
        ]);
        let desired = [
            app("a", "10.0.0.1:80"),
            app("b", "10.0.0.2:80"),
            app("d", "10.0.0.1:80"),
        ];
        let (plan, writes) = super::plan(&desired, &now, false, revision_of(&now));
        assert_eq!(plan.create, ["d"]);
        assert_eq!(plan.update.len(), 1);
        assert_eq!(plan.update[0].app, "b");
        assert_eq!(plan.update[0].fields, ["backends"]);
        assert!(plan.delete.is_empty());
        assert_eq!((plan.unchanged, plan.not_in_desired), (1, 1));
        let names: Vec<&str> = writes.iter().map(AppWrite::name).collect();
        assert_eq!(names, ["b", "d"], "updates, then creates");

        let (plan, writes) = super::plan(&desired, &now, true, revision_of(&now));
        assert_eq!(plan.delete, ["c"]);
        assert_eq!(
            writes.first().map(AppWrite::name),
            Some("c"),
            "deletes first"
        );
        assert!(matches!(&writes[0], AppWrite::Delete(_, Expected::Tag(_))));

        let (plan, writes) = super::plan(
            &now.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>(),
            &now,
            true,
            String::new(),
        );
        assert!(writes.is_empty() && plan.unchanged == 3, "idempotent");
    }

    #[test]
    fn the_revision_moves_with_any_app() {
        let one = stored(&[app("a", "10.0.0.1:80"), app("b", "10.0.0.1:80")]);
        let two = stored(&[app("a", "10.0.0.1:80"), app("b", "10.0.0.9:80")]);
        assert_eq!(revision_of(&one), revision_of(&one.clone()));
        assert_ne!(revision_of(&one), revision_of(&two));
        assert_ne!(revision_of(&one), revision_of(&one[..1]));
    }
}
