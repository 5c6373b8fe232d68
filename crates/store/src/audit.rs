//! Writing the audit log, counted: every write through the admin API leaves a record, the
//! oldest go once the log holds its retention, and a record the store could not keep is
//! counted where an operator alerts on it.

use switchyard_model::AuditRecord;

use crate::metrics::{AUDIT_FAILURES, AUDIT_RECORDS, AUDIT_TRIMMED};
use crate::{Store, StoreError};

/// Appends `record` to `store`'s audit log, keeping the newest `keep`.
pub async fn record(store: &dyn Store, record: AuditRecord, keep: usize) -> Result<(), StoreError> {
    match store.append_audit(record, keep).await {
        Ok(trimmed) => {
            AUDIT_RECORDS.inc();
            AUDIT_TRIMMED.inc_by(trimmed);
            Ok(())
        }
        Err(e) => {
            AUDIT_FAILURES.inc();
            Err(e)
        }
    }
}
