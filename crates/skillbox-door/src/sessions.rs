//! The sandboxes kept open across calls (an HTTP session's, an MCP session's), in one
//! table type with one pair of bounds: how many a server keeps open in all and how many
//! one tenant may. A place is taken before its sandbox is made (so a burst of opens
//! cannot pass the bounds while they are being made) and given back if the open fails;
//! once the table is closed (the server stopping) no place is taken.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use skillbox_env::ErrorCode;

/// How many kept sandboxes a server holds, in all and per tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionBounds {
    pub max_total: usize,
    pub max_per_tenant: usize,
}

impl Default for SessionBounds {
    fn default() -> Self {
        SessionBounds {
            max_total: 64,
            max_per_tenant: 8,
        }
    }
}

/// Why no place was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The table takes no more: the server is stopping.
    Closed,
    /// As many are open on this server as it takes.
    Full { max: usize },
    /// As many are open for this tenant as one may have.
    TenantFull { tenant: String, max: usize },
}

impl Refusal {
    /// `unavailable` when closed, else `overloaded` (a retry may find a place).
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Closed => ErrorCode::Unavailable,
            Refusal::Full { .. } | Refusal::TenantFull { .. } => ErrorCode::Overloaded,
        }
    }

    /// What a caller is told: `what` names what is kept (`sessions`, `MCP sessions
    /// with a sandbox`), `end` how the caller ends one (`delete one`).
    pub fn message(&self, what: &str, end: &str) -> String {
        match self {
            Refusal::Closed => "the server is shutting down; nothing opens now".to_string(),
            Refusal::Full { max } => format!(
                "{max} {what} are open on this server, as many as it takes; {end} or retry later"
            ),
            Refusal::TenantFull { tenant, max } => format!(
                "tenant {tenant} has {max} {what} open, as many as one tenant may; {end} first"
            ),
        }
    }
}

struct Entry<V> {
    tenant: Arc<str>,
    /// `None` while it is being opened (it holds its place already).
    value: Option<Arc<V>>,
}

/// Kept sandboxes by key (a session's id, an MCP session's number), each a tenant's.
pub struct SessionTable<K, V> {
    entries: Mutex<HashMap<K, Entry<V>>>,
    bounds: SessionBounds,
    closed: AtomicBool,
}

impl<K, V> std::fmt::Debug for SessionTable<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTable")
            .field("bounds", &self.bounds)
            .field("closed", &self.closed.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone, V> Default for SessionTable<K, V> {
    fn default() -> Self {
        SessionTable::new(SessionBounds::default())
    }
}

impl<K: Eq + Hash + Clone, V> SessionTable<K, V> {
    pub fn new(bounds: SessionBounds) -> Self {
        SessionTable {
            entries: Mutex::new(HashMap::new()),
            bounds,
            closed: AtomicBool::new(false),
        }
    }

    pub fn bounds(&self) -> SessionBounds {
        self.bounds
    }

    /// The entries, whatever a panic elsewhere left (each change is one map operation,
    /// so a poisoned lock still guards a whole map).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Entry<V>>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a place for `key` of `tenant`, counted against the bounds at once, or says
    /// which bound is reached. The place is given back when the reservation is dropped
    /// unfilled.
    pub fn reserve(&self, key: K, tenant: &Arc<str>) -> Result<Reservation<'_, K, V>, Refusal> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Refusal::Closed);
        }
        let mut entries = self.lock();
        if entries.len() >= self.bounds.max_total {
            return Err(Refusal::Full {
                max: self.bounds.max_total,
            });
        }
        let theirs = entries.values().filter(|e| e.tenant == *tenant).count();
        if theirs >= self.bounds.max_per_tenant {
            return Err(Refusal::TenantFull {
                tenant: tenant.to_string(),
                max: self.bounds.max_per_tenant,
            });
        }
        entries.insert(
            key.clone(),
            Entry {
                tenant: tenant.clone(),
                value: None,
            },
        );
        Ok(Reservation {
            table: self,
            key: Some(key),
        })
    }

    /// The open one at `key`, if it is `tenant`'s (another's is as good as absent).
    pub fn get(&self, tenant: &str, key: &K) -> Option<Arc<V>> {
        self.lock()
            .get(key)
            .filter(|e| &*e.tenant == tenant)
            .and_then(|e| e.value.clone())
    }

    /// Every open one of `tenant`.
    pub fn of_tenant(&self, tenant: &str) -> Vec<Arc<V>> {
        self.lock()
            .values()
            .filter(|e| &*e.tenant == tenant)
            .filter_map(|e| e.value.clone())
            .collect()
    }

    /// Takes `key` out, giving its place back; what was open there, if anything.
    pub fn remove(&self, key: &K) -> Option<Arc<V>> {
        self.lock().remove(key).and_then(|e| e.value)
    }

    /// Takes out every open one `ended` says should end, with its reason.
    pub fn take_ended<W>(&self, ended: impl Fn(&V) -> Option<W>) -> Vec<(Arc<V>, W)> {
        let mut entries = self.lock();
        let keys: Vec<(K, W)> = entries
            .iter()
            .filter_map(|(key, e)| {
                let why = ended(e.value.as_deref()?)?;
                Some((key.clone(), why))
            })
            .collect();
        keys.into_iter()
            .filter_map(|(key, why)| Some((entries.remove(&key)?.value?, why)))
            .collect()
    }

    /// Takes no more places from now on (the server stopping); those open stay until
    /// taken out.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Closes the table and takes every open one out.
    pub fn drain(&self) -> Vec<Arc<V>> {
        self.close();
        self.lock().drain().filter_map(|(_, e)| e.value).collect()
    }

    /// Places taken: open, or being opened.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A place taken in a [`SessionTable`], given back when dropped unfilled.
pub struct Reservation<'a, K: Eq + Hash + Clone, V> {
    table: &'a SessionTable<K, V>,
    key: Option<K>,
}

impl<K: Eq + Hash + Clone, V> std::fmt::Debug for Reservation<'_, K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation").finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone, V> Reservation<'_, K, V> {
    /// Puts what was opened in its place. `Err` gives it back when the table closed or
    /// the place was taken out (its session ended) while it opened: the caller removes it.
    pub fn fill(mut self, value: Arc<V>) -> Result<(), Arc<V>> {
        let Some(key) = self.key.take() else {
            return Err(value);
        };
        let mut entries = self.table.lock();
        if self.table.is_closed() {
            entries.remove(&key);
            return Err(value);
        }
        match entries.get_mut(&key) {
            Some(entry) => {
                entry.value = Some(value);
                Ok(())
            }
            None => Err(value),
        }
    }
}

impl<K: Eq + Hash + Clone, V> Drop for Reservation<'_, K, V> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.table.lock().remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn places_are_bounded_in_all_and_per_tenant_and_given_back() {
        let table: SessionTable<u32, &str> = SessionTable::new(SessionBounds {
            max_total: 3,
            max_per_tenant: 2,
        });
        let (ana, bob) = (tenant("ana"), tenant("bob"));
        table
            .reserve(1, &ana)
            .unwrap()
            .fill(Arc::new("a1"))
            .unwrap();
        // Being opened counts already.
        let opening = table.reserve(2, &ana).unwrap();
        assert_eq!(
            table.reserve(3, &ana).err(),
            Some(Refusal::TenantFull {
                tenant: "ana".into(),
                max: 2
            })
        );
        table
            .reserve(3, &bob)
            .unwrap()
            .fill(Arc::new("b1"))
            .unwrap();
        let full = table.reserve(4, &bob).err().unwrap();
        assert_eq!(full, Refusal::Full { max: 3 });
        assert_eq!(full.code(), ErrorCode::Overloaded);
        assert_eq!(
            full.message("sessions", "delete one"),
            "3 sessions are open on this server, as many as it takes; delete one or retry later"
        );
        // An open that fails gives its place back.
        drop(opening);
        assert_eq!(table.len(), 2);
        table
            .reserve(4, &bob)
            .unwrap()
            .fill(Arc::new("b2"))
            .unwrap();
        // Another tenant's is as good as absent.
        assert_eq!(table.get("ana", &1).as_deref(), Some(&"a1"));
        assert_eq!(table.get("bob", &1), None);
        assert_eq!(table.of_tenant("bob").len(), 2);
        assert_eq!(table.remove(&4).as_deref(), Some(&"b2"));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn nothing_opens_once_closed_and_an_open_under_way_is_given_back() {
        let table: SessionTable<u32, &str> = SessionTable::default();
        let ana = tenant("ana");
        let opening = table.reserve(1, &ana).unwrap();
        table
            .reserve(2, &ana)
            .unwrap()
            .fill(Arc::new("two"))
            .unwrap();
        let drained = table.drain();
        assert_eq!(drained.len(), 1);
        assert_eq!(opening.fill(Arc::new("one")).err().as_deref(), Some(&"one"));
        assert_eq!(table.reserve(3, &ana).err(), Some(Refusal::Closed));
        assert!(table.is_empty());
    }

    #[test]
    fn ended_ones_are_taken_out_with_their_reason() {
        let table: SessionTable<u32, u32> = SessionTable::default();
        let ana = tenant("ana");
        for n in 0..4 {
            table.reserve(n, &ana).unwrap().fill(Arc::new(n)).unwrap();
        }
        let mut ended = table.take_ended(|n| (n % 2 == 0).then_some("even"));
        ended.sort();
        assert_eq!(ended, [(Arc::new(0), "even"), (Arc::new(2), "even")]);
        assert_eq!(table.len(), 2);
    }
}
