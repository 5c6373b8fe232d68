//! The limits of answers read ahead of slow clients (`read_ahead`): what one answer may
//! hold, the memory and the spool all answers share.

use std::path::PathBuf;

use crate::byte_budget::ByteBudget;
use crate::metrics;

/// The limits of read-ahead, shared by every listener thread.
pub struct ResponseBuffers {
    /// Most bytes one answer may hold ahead of its client; 0 turns read-ahead off.
    pub(crate) per_answer: u64,
    pub(crate) memory: ByteBudget,
    pub(crate) spool: ByteBudget,
    pub(crate) spool_dir: PathBuf,
}

impl ResponseBuffers {
    /// `per_answer` bytes ahead per answer (0: off), within `memory_limit` bytes of memory
    /// and `spool_limit` bytes of unlinked files in `spool_dir` for all answers.
    pub fn new(per_answer: u64, memory_limit: u64, spool_limit: u64, spool_dir: PathBuf) -> Self {
        metrics::RESPONSE_BUFFER_MEMORY_BUDGET.set(i64::try_from(memory_limit).unwrap_or(i64::MAX));
        metrics::RESPONSE_SPOOL_BUDGET.set(i64::try_from(spool_limit).unwrap_or(i64::MAX));
        Self {
            per_answer,
            memory: ByteBudget::new(memory_limit, metrics::RESPONSE_BUFFER_MEMORY.clone()),
            spool: ByteBudget::new(spool_limit, metrics::RESPONSE_SPOOL.clone()),
            spool_dir,
        }
    }

    /// Read-ahead off: every answer streams at its client's pace.
    pub fn off() -> Self {
        Self::new(0, 0, 0, PathBuf::new())
    }

    pub(crate) fn enabled(&self) -> bool {
        self.per_answer > 0
    }
}
