//! A router-wide count of bytes held against a limit, mirrored in a gauge: the WAF's spool
//! of request bodies, the memory and spool of request bodies read whole, and those of
//! answers read ahead of slow clients each draw on one. A reservation is all or nothing; what is held is given back by its holder
//! (a [`BudgetHold`] gives it back when dropped).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

#[derive(Debug)]
pub(crate) struct ByteBudget {
    limit: u64,
    used: AtomicU64,
    /// The bytes held, as exported.
    gauge: IntGauge,
}

impl ByteBudget {
    pub(crate) fn new(limit: u64, gauge: IntGauge) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
            gauge,
        }
    }

    /// Holds `bytes` more if the total stays within the limit; false (nothing held) if not.
    pub(crate) fn reserve(&self, bytes: u64) -> bool {
        let reserved = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok();
        if reserved {
            self.gauge.add(gauge_units(bytes));
        }
        reserved
    }

    /// Holds `bytes` more whatever the limit says: for what must be held to make progress
    /// at all, counted so that the others see less room.
    pub(crate) fn reserve_past_limit(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        self.gauge.add(gauge_units(bytes));
    }

    pub(crate) fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.gauge.sub(gauge_units(bytes));
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

/// Bytes held of a budget, given back on drop.
pub(crate) struct BudgetHold {
    budget: Arc<ByteBudget>,
    bytes: u64,
}

impl BudgetHold {
    pub(crate) fn none(budget: Arc<ByteBudget>) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Holds `more` bytes if the budget has room; false (nothing more held) if not.
    pub(crate) fn grow(&mut self, more: u64) -> bool {
        let reserved = self.budget.reserve(more);
        if reserved {
            self.bytes += more;
        }
        reserved
    }

    /// Gives back all it holds, and goes on holding.
    pub(crate) fn release_all(&mut self) {
        self.budget.release(std::mem::take(&mut self.bytes));
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

fn gauge_units(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_is_all_or_nothing_and_the_gauge_follows() {
        let gauge = IntGauge::new("budget_test", "bytes of one test").expect("gauge");
        let budget = ByteBudget::new(10, gauge.clone());
        assert!(budget.reserve(6));
        assert!(!budget.reserve(5), "6 + 5 is past 10");
        assert_eq!((budget.used(), gauge.get()), (6, 6));
        budget.reserve_past_limit(5);
        assert_eq!((budget.used(), gauge.get()), (11, 11));
        assert!(!budget.reserve(1));
        budget.release(11);
        assert_eq!((budget.used(), gauge.get()), (0, 0));
        assert!(budget.reserve(10));
    }
}
