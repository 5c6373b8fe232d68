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
const MOST_STORED_NAMES: usize = 1_000_000;

pub(crate) struct NameIndex {
    state: Mutex<State>,
    /// [`MOST_STORED_NAMES`], smaller in tests.
    most: usize,
}

impl Default for NameIndex {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            most: MOST_STORED_NAMES,
        }
    }
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
            names: HashSet::new(),
            finished: false,
        }
    }

    /// After a change of `domain`'s certificate: whether the store now holds one under it.
    pub(crate) fn note(&self, domain: &str, stored: bool) {
        let mut state = self.state.lock();
        match &mut *state {
            State::Off => {}
            State::Reading { noted, overflowed } => {
                if noted.len() < self.most {
                    noted.push((domain.to_string(), stored));
                } else {
                    *overflowed = true;
                }
            }
            State::Ready(names) => {
                if !stored {
                    names.remove(domain);
                } else if names.len() < self.most {
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
    /// The names listed so far, up to the index's bound.
    names: HashSet<String>,
    finished: bool,
}

impl ReadGuard<'_> {
    /// A name the store lists.
    pub(crate) fn listed(&mut self, name: &str) {
        if self.names.len() < self.index.most {
            self.names.insert(name.to_string());
        }
    }

    /// The read ended: the changes noted meanwhile are applied on top of what it listed,
    /// which becomes the index unless it reached the bound (there may be more). A read
    /// overtaken by another that finished first, or by a [`NameIndex::forget`], leaves
    /// the index as that one left it.
    pub(crate) fn finish(mut self) {
        self.finished = true;
        let mut names = std::mem::take(&mut self.names);
        let complete = names.len() < self.index.most;
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
        *state = if complete && !overflowed && names.len() <= self.index.most {
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

    /// Ends `read` having listed `list`.
    fn finish_with(mut read: ReadGuard<'_>, list: &[&str]) {
        for name in list {
            read.listed(name);
        }
        read.finish();
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
        finish_with(read, &["gone.test", "kept.test"]);
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
        let index = NameIndex {
            most: 2,
            ..NameIndex::default()
        };
        drop(index.begin_read());
        assert!(!index.knows_unstored("any.test", None));
        finish_with(index.begin_read(), &["a.test", "b.test", "c.test"]);
        assert!(!index.knows_unstored("any.test", None), "past the bound");
        finish_with(index.begin_read(), &["a.test"]);
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
        finish_with(first, &["a.test"]);
        index.note("newer.test", true);
        // Read before `newer.test` was stored: it must not undo that change.
        finish_with(second, &["a.test"]);
        assert!(!index.knows_unstored("new.test", None));
        assert!(!index.knows_unstored("newer.test", None));
    }
}
