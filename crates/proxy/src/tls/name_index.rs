//! The names the store holds certificates under, so that QUIC's handshakes, which cannot
//! wait for the store, serve a name without a certificate of its own the default at once.
//!
//! The index is read from the store's list while changes keep arriving. A change that
//! arrives during the read is noted and applied on top of the read once it ends, in order,
//! so the index misses none: were it simply dropped, as before, one certificate change
//! during a start-up or resync read left the index off until the next resync.

use std::collections::HashSet;

use parking_lot::Mutex;

/// Most names indexed (about 64 bytes each); past it there is no index and a name not in
/// memory is looked up in the store.
pub(crate) const MOST_STORED_NAMES: usize = 1_000_000;

#[derive(Default)]
pub(crate) struct NameIndex {
    state: Mutex<State>,
}

#[derive(Default)]
enum State {
    /// No index: every name not in memory is asked of the store.
    #[default]
    Off,
    /// The store's list is being read; `noted`: the changes seen meanwhile, in order, each
    /// with whether the store holds the name after it.
    Reading {
        noted: Vec<(String, bool)>,
        overflowed: bool,
    },
    Ready(HashSet<String>),
}

impl NameIndex {
    /// A read of the store's list begins; the guard abandons it unless
    /// [`finish`](ReadGuard::finish)ed (a read that failed or was given up on).
    pub(crate) fn begin_read(&self) -> ReadGuard<'_> {
        let mut state = self.state.lock();
        if !matches!(*state, State::Reading { .. }) {
            *state = State::Reading {
                noted: Vec::new(),
                overflowed: false,
            };
        }
        ReadGuard {
            index: self,
            finished: false,
        }
    }

    /// After a change of `domain`'s certificate: whether the store now holds one under it.
    pub(crate) fn note(&self, domain: &str, stored: bool) {
        let mut state = self.state.lock();
        match &mut *state {
            State::Off => {}
            State::Reading { noted, overflowed } => {
                if noted.len() < MOST_STORED_NAMES {
                    noted.push((domain.to_string(), stored));
                } else {
                    *overflowed = true;
                }
            }
            State::Ready(names) => {
                if !stored {
                    names.remove(domain);
                } else if names.len() < MOST_STORED_NAMES {
                    names.insert(domain.to_string());
                } else {
                    *state = State::Off;
                }
            }
        }
    }

    /// No index until the next read: a change could not be followed, or some were missed.
    pub(crate) fn forget(&self) {
        *self.state.lock() = State::Off;
    }

    /// Whether the store is known to hold no certificate under `name` nor `wildcard`.
    pub(crate) fn knows_unstored(&self, name: &str, wildcard: Option<&str>) -> bool {
        match &*self.state.lock() {
            State::Ready(names) => {
                !names.contains(name) && wildcard.is_none_or(|wildcard| !names.contains(wildcard))
            }
            State::Off | State::Reading { .. } => false,
        }
    }
}

/// A read of the store's list under way.
pub(crate) struct ReadGuard<'a> {
    index: &'a NameIndex,
    finished: bool,
}

impl ReadGuard<'_> {
    /// The read ended with `names`, all the store listed unless not `complete` (past
    /// [`MOST_STORED_NAMES`]); the changes noted meanwhile are applied on top. A read
    /// overtaken by another that finished first, or by a [`NameIndex::forget`], leaves
    /// the index as that one left it.
    pub(crate) fn finish(mut self, mut names: HashSet<String>, complete: bool) {
        self.finished = true;
        let mut state = self.index.state.lock();
        let State::Reading { noted, overflowed } = std::mem::take(&mut *state) else {
            return;
        };
        for (domain, stored) in noted {
            if stored {
                names.insert(domain);
            } else {
                names.remove(&domain);
            }
        }
        *state = if complete && !overflowed && names.len() <= MOST_STORED_NAMES {
            State::Ready(names)
        } else {
            State::Off
        };
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut state = self.index.state.lock();
            if matches!(*state, State::Reading { .. }) {
                *state = State::Off;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> HashSet<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn changes_during_the_read_are_applied_on_top_of_it() {
        let index = NameIndex::default();
        let read = index.begin_read();
        // The list was read before these changes reached the store.
        index.note("new.test", true);
        index.note("gone.test", false);
        assert!(
            !index.knows_unstored("other.test", None),
            "no index while reading"
        );
        read.finish(names(&["gone.test", "kept.test"]), true);
        assert!(
            !index.knows_unstored("new.test", None),
            "added during the read"
        );
        assert!(!index.knows_unstored("kept.test", None));
        assert!(
            index.knows_unstored("gone.test", None),
            "removed during the read"
        );
        assert!(index.knows_unstored("other.test", Some("*.test")));
        assert!(!index.knows_unstored("a.kept.test", Some("kept.test")));
        // Once ready, changes apply at once.
        index.note("later.test", true);
        assert!(!index.knows_unstored("later.test", None));
        index.note("later.test", false);
        assert!(index.knows_unstored("later.test", None));
    }

    #[test]
    fn a_read_given_up_on_or_incomplete_leaves_no_index() {
        let index = NameIndex::default();
        drop(index.begin_read());
        assert!(!index.knows_unstored("any.test", None));
        index.begin_read().finish(names(&["a.test"]), false);
        assert!(!index.knows_unstored("any.test", None), "past the bound");
        index.begin_read().finish(names(&["a.test"]), true);
        assert!(index.knows_unstored("any.test", None));
        index.forget();
        assert!(!index.knows_unstored("any.test", None));
    }

    #[test]
    fn of_two_reads_the_first_to_finish_stands() {
        let index = NameIndex::default();
        let first = index.begin_read();
        let second = index.begin_read();
        index.note("new.test", true);
        first.finish(names(&["a.test"]), true);
        index.note("newer.test", true);
        // Read before `newer.test` was stored: it must not undo that change.
        second.finish(names(&["a.test"]), true);
        assert!(!index.knows_unstored("new.test", None));
        assert!(!index.knows_unstored("newer.test", None));
    }
}
