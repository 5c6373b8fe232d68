//! The in-process stream of [`Change`] events, numbered, so that a writer can wait until the
//! router it talks to has applied its own change (read-your-writes through the admin API).

use parking_lot::Mutex;
use switchyard_model::Change;
use tokio::sync::broadcast;

use crate::CHANGE_CHANNEL_CAPACITY;

/// Change events as a store announces them. Every event gets the next position; a subscriber
/// learns the position it starts from, so counting what it received tells it how far it is.
pub struct ChangeFeed {
    // Sending and numbering under one lock: positions follow the channel's order exactly.
    sender: Mutex<(broadcast::Sender<Change>, u64)>,
}

/// A subscriber's receiver and the number of events announced before it subscribed.
pub struct Subscription {
    /// Events from now on, in order.
    pub changes: broadcast::Receiver<Change>,
    /// How many events were announced before `changes` was created.
    pub position: u64,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        let (sender, _) = broadcast::channel(CHANGE_CHANNEL_CAPACITY);
        Self {
            sender: Mutex::new((sender, 0)),
        }
    }
}

impl ChangeFeed {
    /// Announces `change` to current subscribers (none is fine: nothing is cached yet).
    pub fn announce(&self, change: Change) {
        let mut sender = self.sender.lock();
        let _ = sender.0.send(change);
        sender.1 += 1;
    }

    /// How many events have been announced so far.
    pub fn announced(&self) -> u64 {
        self.sender.lock().1
    }

    /// Events from now on, with the position they start after.
    pub fn subscribe(&self) -> Subscription {
        let sender = self.sender.lock();
        Subscription {
            changes: sender.0.subscribe(),
            position: sender.1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn positions_count_every_event_before_and_after_a_subscription() {
        let feed = ChangeFeed::default();
        feed.announce(Change::Resync);
        let mut first = feed.subscribe();
        assert_eq!(first.position, 1);
        feed.announce(Change::Cert {
            domain: "a.test".into(),
        });
        let second = feed.subscribe();
        assert_eq!(second.position, 2);
        assert_eq!(feed.announced(), 2);
        assert_eq!(
            first
                .changes
                .recv()
                .await
                .expect("the event after subscribing"),
            Change::Cert {
                domain: "a.test".into()
            }
        );
    }
}
