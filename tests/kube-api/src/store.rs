//! The server's state: Nodes with resourceVersions, the change history watches replay,
//! and the compaction point before which versions are "too old".

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// A change, as a watch sends it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object's JSON as of the change.
    pub object: Arc<Vec<u8>>,
}

/// Nodes and their history.
#[derive(Debug, Default)]
pub struct Store {
    /// The newest resourceVersion.
    pub rv: u64,
    /// Versions before this are compacted away (a watch from them gets 410 Gone).
    pub oldest: u64,
    /// Name -> JSON bytes of the current object.
    pub nodes: BTreeMap<String, Arc<Vec<u8>>>,
    /// Every change after `oldest`, oldest first.
    pub history: Vec<Change>,
    uids: u64,
}

impl Store {
    /// Creates or replaces a Node; sets its resourceVersion (and uid and creation time
    /// when new); returns the new resourceVersion, or an error for an object without a
    /// name.
    pub fn apply(&mut self, mut node: Value) -> Result<u64, String> {
        let name = node["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or("a Node needs metadata.name")?
            .to_owned();
        self.rv += 1;
        let existed = self.nodes.contains_key(&name);
        let meta = node
            .as_object_mut()
            .ok_or("a Node is a JSON object")?
            .entry("metadata")
            .or_insert_with(|| json!({}));
        let meta = meta.as_object_mut().ok_or("metadata is an object")?;
        meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        if !existed || !meta.contains_key("uid") {
            self.uids += 1;
            meta.entry("uid")
                .or_insert_with(|| json!(format!("00000000-0000-4000-8000-{:012x}", self.uids)));
        }
        meta.entry("creationTimestamp")
            .or_insert_with(|| json!("2026-11-24T00:00:00Z"));
        node["kind"] = json!("Node");
        node["apiVersion"] = json!("v1");
        let bytes = Arc::new(serde_json::to_vec(&node).map_err(|e| e.to_string())?);
        self.nodes.insert(name, Arc::clone(&bytes));
        self.history.push(Change {
            rv: self.rv,
            kind: if existed { "MODIFIED" } else { "ADDED" },
            object: bytes,
        });
        Ok(self.rv)
    }

    /// Deletes a Node; false when there was none.
    pub fn delete(&mut self, name: &str) -> bool {
        let Some(bytes) = self.nodes.remove(name) else {
            return false;
        };
        self.rv += 1;
        // The deleted object carries the deletion's resourceVersion, as the API server's.
        let mut object: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({}));
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let object = Arc::new(serde_json::to_vec(&object).unwrap_or_default());
        self.history.push(Change {
            rv: self.rv,
            kind: "DELETED",
            object,
        });
        true
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

    /// Changes after `rv`.
    pub fn changes_after(&self, rv: u64) -> impl Iterator<Item = &Change> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history[start..].iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_history_and_compaction() {
        let mut s = Store::default();
        assert_eq!(s.apply(json!({"metadata": {"name": "a"}})), Ok(1));
        assert_eq!(s.apply(json!({"metadata": {"name": "b"}})), Ok(2));
        assert_eq!(
            s.apply(json!({"metadata": {"name": "a"}, "spec": {}})),
            Ok(3)
        );
        assert!(s.delete("b"));
        assert!(!s.delete("b"));
        let kinds: Vec<_> = s.changes_after(1).map(|c| (c.rv, c.kind)).collect();
        assert_eq!(kinds, vec![(2, "ADDED"), (3, "MODIFIED"), (4, "DELETED")]);
        assert!(s.serves(0));
        s.compact();
        assert!(!s.serves(3) && s.serves(4));
        assert_eq!(s.changes_after(4).count(), 0);
        let a: Value = serde_json::from_slice(&s.nodes["a"]).unwrap();
        assert_eq!(a["metadata"]["resourceVersion"], "3");
        assert!(s.apply(json!({"metadata": {}})).is_err());
    }
}
