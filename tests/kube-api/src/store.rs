//! The server's state: objects of every kind with resourceVersions from one sequence
//! (as etcd has), the change history watches replay and paginated lists read their
//! snapshot from, and the compaction point before which versions are "too old".

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::kind::Kind;

/// One version of an object, with what selectors look at taken out once.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace, `""` for a cluster-scoped kind.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// The values of the kind's selectable fields (see [`Kind::selectable_fields`]).
    pub fields: Vec<String>,
    /// Its JSON, as lists and watches send it.
    pub json: Vec<u8>,
}

impl Object {
    fn new(kind: Kind, value: &Value) -> Result<Self, String> {
        let meta = &value["metadata"];
        let labels = match &meta["labels"] {
            Value::Null => BTreeMap::new(),
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    _ => Err(format!("label {k:?} is not a string")),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err("metadata.labels is not an object".into()),
        };
        Ok(Self {
            kind,
            namespace: meta["namespace"].as_str().unwrap_or_default().to_owned(),
            name: meta["name"].as_str().unwrap_or_default().to_owned(),
            uid: meta["uid"].as_str().unwrap_or_default().to_owned(),
            labels,
            fields: kind.field_values(value),
            json: serde_json::to_vec(value).map_err(|e| e.to_string())?,
        })
    }

    /// The value of the selectable field `field`, `None` when the kind has no such field.
    pub fn field(&self, field: &str) -> Option<&str> {
        let i = self
            .kind
            .selectable_fields()
            .iter()
            .position(|f| *f == field)?;
        Some(&self.fields[i])
    }

    /// Its JSON with `metadata.resourceVersion` set to `rv`.
    pub fn json_at(&self, rv: u64) -> Vec<u8> {
        let mut value: Value = serde_json::from_slice(&self.json).unwrap_or_else(|_| json!({}));
        value["metadata"]["resourceVersion"] = json!(rv.to_string());
        serde_json::to_vec(&value).unwrap_or_default()
    }
}

/// The key of an object within its kind, in etcd's order: `namespace/name` for a
/// namespaced kind, `name` for a cluster-scoped one.
pub fn key(kind: Kind, namespace: &str, name: &str) -> String {
    if kind.namespaced() {
        format!("{namespace}/{name}")
    } else {
        name.to_owned()
    }
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Created.
    Added,
    /// Replaced.
    Modified,
    /// Deleted.
    Deleted,
}

impl Event {
    /// The watch event's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Added => "ADDED",
            Event::Modified => "MODIFIED",
            Event::Deleted => "DELETED",
        }
    }
}

/// A change, as the watch cache keeps it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// What it did.
    pub event: Event,
    /// The object as of the change (for a deletion, the last version with the
    /// deletion's resourceVersion, as the API server sends it).
    pub object: Arc<Object>,
    /// The object before the change (none for an addition).
    pub previous: Option<Arc<Object>>,
}

/// Objects of every kind, keyed by [`key`].
pub type Objects = BTreeMap<String, Arc<Object>>;

/// All objects and their history.
#[derive(Debug, Default)]
pub struct Store {
    /// The newest resourceVersion, shared by every kind.
    pub rv: u64,
    /// Versions before this are compacted away (a watch or continue token from them
    /// gets 410 Gone).
    pub oldest: u64,
    objects: BTreeMap<Kind, Objects>,
    /// Every change after `oldest`, oldest first.
    pub history: Vec<Change>,
    uids: u64,
}

const EMPTY: &Objects = &BTreeMap::new();

impl Store {
    /// Creates or replaces an object of `kind`; sets its `kind`, `apiVersion` and
    /// resourceVersion, keeps the uid and creation time of the object it replaces
    /// (new ones when new), puts a namespaced object without a namespace in `default`
    /// and labels a Namespace with `kubernetes.io/metadata.name` (both as the API
    /// server does). Returns the new resourceVersion, or an error for an object the API
    /// server would refuse (no name, a namespace on a cluster-scoped kind).
    pub fn apply(&mut self, kind: Kind, mut value: Value) -> Result<u64, String> {
        let what = kind.name();
        let meta = value
            .as_object_mut()
            .ok_or_else(|| format!("a {what} is a JSON object"))?
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or("metadata is an object")?;
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("a {what} needs metadata.name"))?
            .to_owned();
        let namespace = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
        let namespace = match (kind.namespaced(), namespace) {
            (true, "") => "default".to_owned(),
            (true, ns) => ns.to_owned(),
            (false, "") => String::new(),
            (false, ns) => return Err(format!("a {what} has no namespace, got {ns:?}")),
        };
        if kind.namespaced() {
            meta.insert("namespace".into(), json!(namespace));
        }
        if kind == Kind::Namespace {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            labels
                .as_object_mut()
                .ok_or("metadata.labels is not an object")?
                .insert("kubernetes.io/metadata.name".into(), json!(name));
        }
        let key = key(kind, &namespace, &name);
        let previous = self.objects.get(&kind).and_then(|m| m.get(&key)).cloned();
        let uid = match &previous {
            Some(p) => p.uid.clone(),
            None => {
                self.uids += 1;
                format!("00000000-0000-4000-8000-{:012x}", self.uids)
            }
        };
        meta.entry("uid").or_insert_with(|| json!(uid));
        meta.entry("creationTimestamp")
            .or_insert_with(|| json!("2026-11-24T00:00:00Z"));
        meta.insert("resourceVersion".into(), json!((self.rv + 1).to_string()));
        let map = value.as_object_mut().ok_or("not an object")?;
        map.insert("kind".into(), json!(kind.name()));
        map.insert("apiVersion".into(), json!(kind.api_version()));
        let object = Arc::new(Object::new(kind, &value)?);
        self.rv += 1;
        self.objects
            .entry(kind)
            .or_default()
            .insert(key, Arc::clone(&object));
        self.history.push(Change {
            rv: self.rv,
            event: if previous.is_some() {
                Event::Modified
            } else {
                Event::Added
            },
            object,
            previous,
        });
        Ok(self.rv)
    }

    /// Deletes an object (`namespace` is `""` for a cluster-scoped kind); false when
    /// there was none.
    pub fn delete(&mut self, kind: Kind, namespace: &str, name: &str) -> bool {
        let Some(previous) = self
            .objects
            .get_mut(&kind)
            .and_then(|m| m.remove(&key(kind, namespace, name)))
        else {
            return false;
        };
        self.rv += 1;
        // The deleted object carries the deletion's resourceVersion, as the API server's.
        let object = Object {
            kind,
            namespace: previous.namespace.clone(),
            name: previous.name.clone(),
            uid: previous.uid.clone(),
            labels: previous.labels.clone(),
            fields: previous.fields.clone(),
            json: previous.json_at(self.rv),
        };
        self.history.push(Change {
            rv: self.rv,
            event: Event::Deleted,
            object: Arc::new(object),
            previous: Some(previous),
        });
        true
    }

    /// The current object, if any.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<&Arc<Object>> {
        self.objects.get(&kind)?.get(&key(kind, namespace, name))
    }

    /// The current objects of `kind`, by key.
    pub fn objects(&self, kind: Kind) -> &Objects {
        self.objects.get(&kind).unwrap_or(EMPTY)
    }

    /// The objects of `kind` as they were at `rv` (which must be served): the current
    /// ones, with the changes after `rv` undone. Borrowed when there are none.
    pub fn objects_at(&self, kind: Kind, rv: u64) -> Cow<'_, Objects> {
        let mut undo = self.changes_after(rv).filter(|c| c.object.kind == kind);
        let Some(first) = undo.next() else {
            return Cow::Borrowed(self.objects(kind));
        };
        let mut objects = self.objects(kind).clone();
        // Undo the newest first, so each key ends as it was before its first change.
        let mut changes: Vec<&Change> = std::iter::once(first).chain(undo).collect();
        changes.reverse();
        for change in changes {
            let o = &change.object;
            let key = key(kind, &o.namespace, &o.name);
            match &change.previous {
                Some(previous) => objects.insert(key, Arc::clone(previous)),
                None => objects.remove(&key),
            };
        }
        Cow::Owned(objects)
    }

    /// Forgets the history: every version before the current one is too old.
    pub fn compact(&mut self) {
        self.oldest = self.rv;
        self.history.clear();
    }

    /// Whether a watch or continue token from `rv` can still be served.
    pub fn serves(&self, rv: u64) -> bool {
        rv >= self.oldest
    }

    /// Changes after `rv`, of every kind.
    pub fn changes_after(&self, rv: u64) -> impl Iterator<Item = &Change> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history[start..].iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_of(o: &Object) -> Value {
        serde_json::from_slice(&o.json).unwrap()
    }

    #[test]
    fn versions_history_and_compaction() {
        let mut s = Store::default();
        let node = Kind::Node;
        assert_eq!(s.apply(node, json!({"metadata": {"name": "a"}})), Ok(1));
        assert_eq!(s.apply(node, json!({"metadata": {"name": "b"}})), Ok(2));
        assert_eq!(
            s.apply(node, json!({"metadata": {"name": "a"}, "spec": {}})),
            Ok(3)
        );
        assert!(s.delete(node, "", "b"));
        assert!(!s.delete(node, "", "b"));
        let kinds: Vec<_> = s.changes_after(1).map(|c| (c.rv, c.event)).collect();
        assert_eq!(
            kinds,
            vec![(2, Event::Added), (3, Event::Modified), (4, Event::Deleted)]
        );
        assert!(s.serves(0));
        s.compact();
        assert!(!s.serves(3) && s.serves(4));
        assert_eq!(s.changes_after(4).count(), 0);
        let a = json_of(s.get(node, "", "a").unwrap());
        assert_eq!(a["metadata"]["resourceVersion"], "3");
        assert_eq!(a["kind"], "Node");
        assert!(s.apply(node, json!({"metadata": {}})).is_err());
        assert!(
            s.apply(node, json!({"metadata": {"name": "c", "namespace": "x"}}))
                .is_err()
        );
    }

    #[test]
    fn one_sequence_across_kinds_and_what_the_api_server_fills_in() {
        let mut s = Store::default();
        assert_eq!(
            s.apply(Kind::Namespace, json!({"metadata": {"name": "web"}})),
            Ok(1)
        );
        assert_eq!(
            s.apply(Kind::Pod, json!({"metadata": {"name": "p"}})),
            Ok(2)
        );
        assert_eq!(
            s.apply(
                Kind::NetworkPolicy,
                json!({"metadata": {"name": "p", "namespace": "web"}})
            ),
            Ok(3)
        );
        let ns = json_of(s.get(Kind::Namespace, "", "web").unwrap());
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "web"
        );
        let pod = s.get(Kind::Pod, "default", "p").unwrap();
        assert_eq!(pod.field("metadata.namespace"), Some("default"));
        let uid = pod.uid.clone();
        s.apply(
            Kind::Pod,
            json!({"metadata": {"name": "p", "labels": {"a": "b"}}}),
        )
        .unwrap();
        let pod = s.get(Kind::Pod, "default", "p").unwrap();
        assert_eq!(pod.uid, uid, "a replaced object keeps its uid");
        assert_eq!(pod.labels["a"], "b");
        let policy = json_of(s.get(Kind::NetworkPolicy, "web", "p").unwrap());
        assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
        assert_eq!(
            s.objects(Kind::Pod).keys().collect::<Vec<_>>(),
            ["default/p"]
        );
    }

    #[test]
    fn objects_at_an_older_version_undo_later_changes() {
        let mut s = Store::default();
        let pod = |name: &str, v: u32| json!({"metadata": {"name": name, "labels": {"v": v.to_string()}}});
        s.apply(Kind::Pod, pod("a", 1)).unwrap();
        s.apply(Kind::Pod, pod("b", 1)).unwrap();
        let at = s.rv;
        s.apply(Kind::Pod, pod("a", 2)).unwrap();
        s.apply(Kind::Pod, pod("a", 3)).unwrap();
        s.delete(Kind::Pod, "default", "b");
        s.apply(Kind::Pod, pod("c", 1)).unwrap();
        s.apply(Kind::Node, json!({"metadata": {"name": "n"}}))
            .unwrap();
        let then = s.objects_at(Kind::Pod, at);
        let summary: Vec<(String, String)> = then
            .iter()
            .map(|(k, o)| (k.clone(), o.labels["v"].clone()))
            .collect();
        assert_eq!(
            summary,
            [
                ("default/a".into(), "1".into()),
                ("default/b".into(), "1".into())
            ]
        );
        assert!(matches!(s.objects_at(Kind::Pod, s.rv), Cow::Borrowed(_)));
        assert!(s.objects_at(Kind::Node, at).is_empty());
    }
}
