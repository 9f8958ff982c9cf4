//! One store per watched kind: the watcher's events in, a view that is either complete
//! or not out. Every kind the agent watches goes through it, so the rules live here
//! once:
//!
//! - nothing is known until the first complete list: before it, [`Store::snapshot`]
//!   is `None` and the agent acts on nothing (an agent that cannot reach the API
//!   leaves the node as it was);
//! - a relist (after a restarted watch or a `410 Gone`) is gathered aside and replaces
//!   the view only once it is whole, so a list cut short never removes anything;
//! - single changes apply at once; an event that changes nothing the agent keeps
//!   (a Node's status heartbeat) is not a change.
//!
//! Objects are turned into small items the moment they arrive ([`Watched::read`]), so
//! the store holds a few dozen bytes per object whatever the API sends. A snapshot is
//! an `Arc` of the map: the reconciler reads it while the watch goes on. Each item is
//! behind an `Arc` of its own, so a change that arrives while the reconciler holds a
//! snapshot copies the map's keys and nodes, not every item (at 5,000 Nodes or 10,000
//! Pods a deep copy took most of a change's time under load).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use crate::node::SlimNode;
use crate::policy::pipeline::{PolicyInputs, PolicyStores};

use kube::runtime::watcher::Event;

/// A kind the agent watches, and what it keeps of each object.
pub trait Watched: Clone + Debug + Send + 'static {
    /// The kind's name, for logs and metrics.
    const KIND: &'static str;
    /// What is kept of one object.
    type Item: Clone + PartialEq + Debug + Send + Sync + 'static;
    /// The object's key (`name`, or `namespace/name`) and its item; `None` for an
    /// object without a name, which a real API server never sends.
    fn read(&self) -> Option<(String, Self::Item)>;
    /// The key of an object (for a deletion).
    fn key(&self) -> Option<String>;
    /// What of an item could not be read, for a kind whose problems the watch itself
    /// names in the log (when the item comes or changes); the others name theirs where
    /// they are used.
    fn problems(_item: &Self::Item) -> &[String] {
        &[]
    }
}

/// The items of one kind by key.
pub type Items<K> = Arc<ItemMap<<K as Watched>::Item>>;

/// Items by key, each shared.
pub type ItemMap<T> = BTreeMap<String, Arc<T>>;

/// An [`ItemMap`] of `(key, item)` pairs.
pub fn item_map<T>(items: impl IntoIterator<Item = (String, T)>) -> ItemMap<T> {
    items.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
}

/// What one event did to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// Nothing the agent keeps changed (or a list is still being gathered).
    Unchanged,
    /// A complete list replaced the view.
    Listed {
        /// Objects in it.
        count: usize,
        /// The first complete list since the start.
        first: bool,
        /// Whether the view differs from before (always true for the first).
        changed: bool,
    },
    /// An object was added or changed.
    Applied {
        /// Its key.
        key: String,
    },
    /// An object was deleted.
    Deleted {
        /// Its key.
        key: String,
    },
}

impl Update {
    /// Whether the view changed (and so the plan may have).
    pub fn changed(&self) -> bool {
        match self {
            Self::Unchanged => false,
            Self::Listed { changed, .. } => *changed,
            Self::Applied { .. } | Self::Deleted { .. } => true,
        }
    }
}

/// The view of one kind.
#[derive(Debug)]
pub struct Store<K: Watched> {
    items: Items<K>,
    /// A list in progress: the view it will replace.
    relist: Option<ItemMap<K::Item>>,
    /// A complete list has been seen.
    complete: bool,
}

impl<K: Watched> Default for Store<K> {
    fn default() -> Self {
        Self {
            items: Arc::new(BTreeMap::new()),
            relist: None,
            complete: false,
        }
    }
}

impl<K: Watched> Store<K> {
    /// Takes one watcher event.
    pub fn apply(&mut self, event: Event<K>) -> Update {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                Update::Unchanged
            }
            Event::InitApply(object) => {
                if let (Some(relist), Some((key, item))) = (&mut self.relist, object.read()) {
                    relist.insert(key, Arc::new(item));
                }
                Update::Unchanged
            }
            Event::InitDone => {
                let Some(relist) = self.relist.take() else {
                    return Update::Unchanged;
                };
                let first = !self.complete;
                let changed = first || relist != *self.items;
                let count = relist.len();
                if changed {
                    self.items = Arc::new(relist);
                }
                self.complete = true;
                Update::Listed {
                    count,
                    first,
                    changed,
                }
            }
            Event::Apply(object) => {
                let Some((key, item)) = object.read() else {
                    return Update::Unchanged;
                };
                if !self.complete || self.get(&key) == Some(&item) {
                    return Update::Unchanged;
                }
                Arc::make_mut(&mut self.items).insert(key.clone(), Arc::new(item));
                Update::Applied { key }
            }
            Event::Delete(object) => {
                let Some(key) = object.key() else {
                    return Update::Unchanged;
                };
                if !self.complete || !self.items.contains_key(&key) {
                    return Update::Unchanged;
                }
                Arc::make_mut(&mut self.items).remove(&key);
                Update::Deleted { key }
            }
        }
    }

    /// The view, once a complete list has been seen.
    pub fn snapshot(&self) -> Option<Items<K>> {
        self.complete.then(|| Arc::clone(&self.items))
    }

    /// One item.
    pub fn get(&self, key: &str) -> Option<&K::Item> {
        self.items.get(key).map(|item| &**item)
    }

    /// Objects in the view.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The stores of every watched kind.
#[derive(Debug, Default)]
pub struct Stores {
    /// Nodes.
    pub nodes: Arc<Mutex<Store<SlimNode>>>,
    /// What policy is judged on: Pods, Namespaces and each enforced kind's own.
    pub policy: PolicyStores,
    /// Where the bridge plugin leaves its pod records (when NetworkPolicy is enforced),
    /// for `explain` to see new pods as the reconciler does.
    pub records_dir: Option<std::path::PathBuf>,
    /// What each verdict chain of the policy table stands for, as the datapath's last
    /// apply named them (for `/metrics` and the deny log).
    pub verdict_names: crate::policy::verdicts::SharedVerdictNames,
}

/// Everything the plan is computed from, as of one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Nodes by name.
    pub nodes: Items<SlimNode>,
    /// Each policy kind's input, or what it still waits for.
    pub policy: PolicyInputs,
}

/// A store's view, once it is complete.
pub fn snapshot_of<K: Watched>(store: &Mutex<Store<K>>) -> Option<Items<K>> {
    store
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .snapshot()
}

impl Stores {
    /// A snapshot, once the Node store has its first complete list: the routes and the
    /// conflist need nothing else, and each policy kind waits for its own stores alone.
    pub fn snapshot(&self) -> Option<Snapshot> {
        Some(Snapshot {
            nodes: snapshot_of(&self.nodes)?,
            policy: self.policy.snapshot(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up kind: a name and a value, the value `None` for a nameless object.
    #[derive(Debug, Clone)]
    struct Thing(Option<&'static str>, u32);

    impl Watched for Thing {
        const KIND: &'static str = "Thing";
        type Item = u32;
        fn read(&self) -> Option<(String, u32)> {
            Some((self.0?.to_owned(), self.1))
        }
        fn key(&self) -> Option<String> {
            self.0.map(str::to_owned)
        }
    }

    fn list(store: &mut Store<Thing>, things: &[(&'static str, u32)]) -> Update {
        store.apply(Event::Init);
        for &(name, value) in things {
            store.apply(Event::InitApply(Thing(Some(name), value)));
        }
        store.apply(Event::InitDone)
    }

    fn view(store: &Store<Thing>) -> Option<Vec<(String, u32)>> {
        store
            .snapshot()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), **v)).collect())
    }

    #[test]
    fn nothing_is_known_until_the_first_complete_list() {
        let mut store = Store::<Thing>::default();
        assert_eq!(view(&store), None);
        store.apply(Event::Init);
        store.apply(Event::InitApply(Thing(Some("a"), 1)));
        assert_eq!(view(&store), None, "a list cut short is no view");
        assert_eq!(
            store.apply(Event::InitDone),
            Update::Listed {
                count: 1,
                first: true,
                changed: true
            }
        );
        assert_eq!(view(&store), Some(vec![("a".into(), 1)]));
    }

    #[test]
    fn an_empty_first_list_is_a_complete_view() {
        let mut store = Store::<Thing>::default();
        assert!(list(&mut store, &[]).changed());
        assert_eq!(view(&store), Some(vec![]));
    }

    #[test]
    fn a_relist_replaces_the_view_only_once_whole() {
        let mut store = Store::<Thing>::default();
        list(&mut store, &[("a", 1), ("b", 2)]);
        // The watch restarts: a new list begins and breaks off after one object.
        store.apply(Event::Init);
        store.apply(Event::InitApply(Thing(Some("a"), 1)));
        assert_eq!(view(&store), Some(vec![("a".into(), 1), ("b".into(), 2)]));
        // It starts over and completes without b: now b is gone.
        let update = list(&mut store, &[("a", 1), ("c", 3)]);
        assert_eq!(
            update,
            Update::Listed {
                count: 2,
                first: false,
                changed: true
            }
        );
        assert_eq!(view(&store), Some(vec![("a".into(), 1), ("c".into(), 3)]));
        // The same list again changes nothing.
        assert!(!list(&mut store, &[("c", 3), ("a", 1)]).changed());
    }

    #[test]
    fn changes_apply_at_once_and_heartbeats_are_no_change() {
        let mut store = Store::<Thing>::default();
        list(&mut store, &[("a", 1)]);
        assert_eq!(
            store.apply(Event::Apply(Thing(Some("b"), 2))),
            Update::Applied { key: "b".into() }
        );
        assert_eq!(
            store.apply(Event::Apply(Thing(Some("b"), 2))),
            Update::Unchanged
        );
        assert!(store.apply(Event::Apply(Thing(Some("b"), 5))).changed());
        assert_eq!(
            store.apply(Event::Delete(Thing(Some("a"), 0))),
            Update::Deleted { key: "a".into() }
        );
        assert_eq!(
            store.apply(Event::Delete(Thing(Some("a"), 0))),
            Update::Unchanged
        );
        assert_eq!(view(&store), Some(vec![("b".into(), 5)]));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn nameless_objects_are_ignored() {
        let mut store = Store::<Thing>::default();
        list(&mut store, &[("a", 1)]);
        assert_eq!(store.apply(Event::Apply(Thing(None, 2))), Update::Unchanged);
        assert_eq!(
            store.apply(Event::Delete(Thing(None, 2))),
            Update::Unchanged
        );
        store.apply(Event::Init);
        store.apply(Event::InitApply(Thing(None, 9)));
        store.apply(Event::InitDone);
        assert_eq!(view(&store), Some(vec![]));
    }

    #[test]
    fn a_snapshot_is_not_changed_by_later_events() {
        let mut store = Store::<Thing>::default();
        list(&mut store, &[("a", 1)]);
        let before = store.snapshot().unwrap();
        store.apply(Event::Apply(Thing(Some("a"), 2)));
        assert_eq!(before.get("a").map(|v| **v), Some(1));
        assert_eq!(store.get("a"), Some(&2));
    }

    /// A change while a snapshot is held copies the map, not the items it leaves alone:
    /// both views hold the same `b`.
    #[test]
    fn a_change_during_a_snapshot_shares_the_items_it_does_not_touch() {
        let mut store = Store::<Thing>::default();
        list(&mut store, &[("a", 1), ("b", 2)]);
        let before = store.snapshot().unwrap();
        store.apply(Event::Apply(Thing(Some("a"), 3)));
        let after = store.snapshot().unwrap();
        assert!(!Arc::ptr_eq(&before, &after));
        assert!(Arc::ptr_eq(&before["b"], &after["b"]));
        assert!(!Arc::ptr_eq(&before["a"], &after["a"]));
    }
}
