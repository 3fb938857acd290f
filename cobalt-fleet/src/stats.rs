//! What a fleet did, counted across all its devices, and the summary line printed at
//! the end of `cobalt devices`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters shared by every device of a fleet (updated as things happen, read any
/// time).
#[derive(Debug, Default)]
pub struct FleetStats {
    registrations: AtomicU64,
    registered_now: AtomicU64,
    renewals: AtomicU64,
    reregistrations: AtomicU64,
    deregistrations: AtomicU64,
    notifications: AtomicU64,
    requests: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Registrations the directory accepted (2.01), re-registrations included.
    pub registrations: u64,
    /// Devices registered now.
    pub registered_now: u64,
    /// Renewals the directory accepted (2.04).
    pub renewals: u64,
    /// Registrations made again because the directory had lost one (4.04 to a renewal).
    pub reregistrations: u64,
    /// Registrations removed at shutdown (2.02, or 4.04: already gone).
    pub deregistrations: u64,
    /// Notifications sent to observers.
    pub notifications: u64,
    /// Requests the devices answered (observe registrations included).
    pub requests: u64,
    /// Failed registration exchanges by what happened: a response code (`4.03`,
    /// `5.03`) or `timeout`, `reset`, `unusable answer`, `send failed`, `dtls
    /// handshake`, and `removal unanswered` (at shutdown, within the grace period).
    pub errors: BTreeMap<String, u64>,
}

impl FleetStats {
    pub(crate) fn registered(&self) {
        self.registrations.fetch_add(1, Ordering::Relaxed);
        self.registered_now.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn unregistered(&self) {
        // Never below zero: only a registered device calls this.
        let _ = self
            .registered_now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    pub(crate) fn renewed(&self) {
        self.renewals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reregistering(&self) {
        self.reregistrations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn deregistered(&self) {
        self.deregistrations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn notified(&self) {
        self.notifications.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn answered(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn error(&self, what: &str) {
        if let Ok(mut errors) = self.errors.lock() {
            *errors.entry(what.to_string()).or_default() += 1;
        }
    }

    /// The counters now.
    pub fn summary(&self) -> Summary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            registrations: get(&self.registrations),
            registered_now: get(&self.registered_now),
            renewals: get(&self.renewals),
            reregistrations: get(&self.reregistrations),
            deregistrations: get(&self.deregistrations),
            notifications: get(&self.notifications),
            requests: get(&self.requests),
            errors: self.errors.lock().map(|e| e.clone()).unwrap_or_default(),
        }
    }
}

impl fmt::Display for Summary {
    /// One line: `registered 1000 (now 998), renewals 12, re-registrations 0,
    /// deregistered 0, notifications sent 5000, requests answered 1000, errors: none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "registered {} (now {}), renewals {}, re-registrations {}, deregistered {}, \
             notifications sent {}, requests answered {}, errors: ",
            self.registrations,
            self.registered_now,
            self.renewals,
            self.reregistrations,
            self.deregistrations,
            self.notifications,
            self.requests
        )?;
        if self.errors.is_empty() {
            return f.write_str("none");
        }
        let parts: Vec<String> = self
            .errors
            .iter()
            .map(|(k, n)| format!("{k} ×{n}"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_and_names_errors() {
        let s = FleetStats::default();
        s.registered();
        s.registered();
        s.unregistered();
        s.unregistered();
        s.unregistered();
        s.error("5.03");
        s.error("5.03");
        s.error("timeout");
        let sum = s.summary();
        assert_eq!((sum.registrations, sum.registered_now), (2, 0));
        let line = sum.to_string();
        assert!(line.starts_with("registered 2 (now 0)"), "{line}");
        assert!(line.ends_with("errors: 5.03 ×2, timeout ×1"), "{line}");
        assert!(FleetStats::default()
            .summary()
            .to_string()
            .ends_with("errors: none"));
    }
}
