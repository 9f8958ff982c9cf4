//! A Kubernetes API test server for the node agent's tests and benchmark: it serves
//! list and watch of Nodes, Namespaces, Pods, NetworkPolicies and ClusterNetworkPolicies
//! (`policy.networking.k8s.io/v1alpha2`, a custom resource) the way kube-apiserver
//! does (one resourceVersion sequence for all of them, paginated lists read at one
//! snapshot with continue tokens, chunked watch streams of JSON lines, bookmarks,
//! streaming lists, label and field selectors on both, `410 Gone` for versions older
//! than the last compaction, as an `ERROR` event or as an HTTP status), merge patches of
//! one object (a Node's annotations, as the agent publishes its WireGuard key), and lets a test
//! add, change and delete objects, stop it (every connection breaks), compact its
//! history and start it again on the same address. A custom resource's kind can be
//! taken away and installed again at run time ([`ApiServer::uninstall_crd`],
//! [`ApiServer::install_crd`]): without it the server answers 404 for its group, its
//! paths and in discovery, as a cluster without the CRD does.
//!
//! No kube-apiserver can be installed where the tests run, so the agent's API side is
//! tested against this server, with the real client (kube-rs), not against a cluster.
//!
//! - [`Kind`]: what is served where; [`store`]: objects, versions and history;
//!   [`selector`]: label and field selectors; `http`: the protocol and discovery.
//! - [`fixture`]: a Node as a kubelet writes it (~15 KB with 40 images), a Pod as the
//!   kubelet reports it, a labelled Namespace, NetworkPolicies and ClusterNetworkPolicies
//!   from JSON.

pub mod fixture;
mod http;
mod kind;
pub mod selector;
pub mod store;

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

pub use fixture::{
    BENCHMARK_ENVS, benchmark_cluster_policy, cluster_network_policy, network_policy,
    realistic_namespace, realistic_node, realistic_pod,
};
pub use kind::Kind;
use store::Store;

/// State shared by the connection threads.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Mutex<Store>,
    changed: Condvar,
    events: Mutex<Vec<Value>>,
    requests: Mutex<Vec<String>>,
    /// False while stopped.
    running: AtomicBool,
    /// Bumped at every stop, so streams of an earlier run end.
    generation: AtomicU64,
    gone_as_http: AtomicBool,
    bookmark_ms: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
    expired: AtomicU64,
    bookmarks: AtomicU64,
    connections: Mutex<Vec<TcpStream>>,
    /// Custom kinds whose CRD is not installed: not served at all.
    uninstalled: Mutex<BTreeSet<Kind>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lock_events(&self) -> MutexGuard<'_, Vec<Value>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lock_requests(&self) -> MutexGuard<'_, Vec<String>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn wait_changed<'a>(
        &self,
        guard: MutexGuard<'a, Store>,
        wait: Duration,
    ) -> MutexGuard<'a, Store> {
        self.changed
            .wait_timeout(guard, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// Whether `kind` is served (a custom kind only while its CRD is installed).
    pub(crate) fn serves_kind(&self, kind: Kind) -> bool {
        !self
            .uninstalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&kind)
    }

    pub(crate) fn bookmark_interval(&self) -> Duration {
        Duration::from_millis(self.bookmark_ms.load(Ordering::SeqCst))
    }
}

/// A running (or stopped) test server.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    netns: Option<PathBuf>,
    listener: Mutex<Option<(TcpListener, JoinHandle<()>)>>,
}

impl ApiServer {
    /// Listens on `addr` in this thread's network namespace (`127.0.0.1:0` for a free
    /// port). Panics when it cannot listen: a test without its server cannot run.
    pub fn start(addr: SocketAddr) -> Self {
        Self::start_where(None, addr)
    }

    /// Listens on `addr` inside the network namespace at `netns` (a short-lived thread
    /// enters it to make the socket, which stays there), so hosts in test namespaces
    /// reach it over their own links.
    pub fn start_in_netns(netns: &Path, addr: SocketAddr) -> Self {
        Self::start_where(Some(netns.to_path_buf()), addr)
    }

    fn start_where(netns: Option<PathBuf>, addr: SocketAddr) -> Self {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changed: Condvar::new(),
            events: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            gone_as_http: AtomicBool::new(false),
            bookmark_ms: AtomicU64::new(1000),
            lists: AtomicU64::new(0),
            watches: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            bookmarks: AtomicU64::new(0),
            connections: Mutex::new(Vec::new()),
            uninstalled: Mutex::new(BTreeSet::new()),
        });
        let mut server = Self {
            shared,
            addr,
            netns,
            listener: Mutex::new(None),
        };
        server.listen();
        server
    }

    fn listen(&mut self) {
        let (listener, addr) = bind(self.netns.as_deref(), self.addr);
        self.addr = addr;
        self.shared.running.store(true, Ordering::SeqCst);
        let accept = listener
            .try_clone()
            .unwrap_or_else(|e| panic!("clone listener: {e}"));
        let shared = Arc::clone(&self.shared);
        let handle = std::thread::spawn(move || {
            for stream in accept.incoming() {
                if !shared.running.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let _ = stream.set_nodelay(true);
                if let Ok(clone) = stream.try_clone() {
                    shared
                        .connections
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(clone);
                }
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || http::serve(stream, &shared));
            }
        });
        *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some((listener, handle));
    }

    /// `http://ip:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes a kubeconfig for this server (one cluster, a user with a dummy token).
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n\
             users:\n- name: test\n  user:\n    token: test-token\ncontexts:\n- name: test\n  context:\n    \
             cluster: test\n    user: test\ncurrent-context: test\n",
            self.url()
        );
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Creates or replaces an object of `kind` (its `kind` and `apiVersion` are set,
    /// a namespaced object without a namespace goes to `default`, a replaced object
    /// keeps its uid); returns its new resourceVersion. Panics on an object the API
    /// server would refuse (no name, a namespace on a cluster-scoped kind): a mistake in
    /// the test, as is an object of a custom kind whose CRD is not installed. Nothing
    /// checks that a namespaced object's Namespace exists.
    pub fn apply(&self, kind: Kind, object: Value) -> u64 {
        assert!(
            self.crd_installed(kind),
            "apply {}: its CRD is not installed",
            kind.name()
        );
        let rv = self
            .shared
            .lock()
            .apply(kind, object)
            .unwrap_or_else(|e| panic!("apply {}: {e}", kind.name()));
        self.shared.changed.notify_all();
        rv
    }

    /// Deletes an object (`namespace` is `""` for a cluster-scoped kind); false if
    /// there was none. Deleting a Namespace leaves the objects in it (the API server's
    /// namespace controller would delete them, later).
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) -> bool {
        let deleted = self.shared.lock().delete(kind, namespace, name);
        self.shared.changed.notify_all();
        deleted
    }

    /// The current object, as a get answers it.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let store = self.shared.lock();
        let object = store.get(kind, namespace, name)?;
        serde_json::from_slice(&object.json).ok()
    }

    /// The objects' keys in list order: `name` for a cluster-scoped kind,
    /// `namespace/name` for a namespaced one.
    pub fn keys(&self, kind: Kind) -> Vec<String> {
        self.shared.lock().objects(kind).keys().cloned().collect()
    }

    /// Creates or replaces a Node; returns its new resourceVersion. Panics on a Node
    /// without a name (a mistake in the test).
    pub fn apply_node(&self, node: Value) -> u64 {
        self.apply(Kind::Node, node)
    }

    /// Deletes a Node; false if there was none.
    pub fn delete_node(&self, name: &str) -> bool {
        self.delete(Kind::Node, "", name)
    }

    /// The Nodes' names.
    pub fn node_names(&self) -> Vec<String> {
        self.keys(Kind::Node)
    }

    /// Creates or replaces a Namespace (labelled `kubernetes.io/metadata.name`, as the
    /// API server does); returns its new resourceVersion.
    pub fn apply_namespace(&self, namespace: Value) -> u64 {
        self.apply(Kind::Namespace, namespace)
    }

    /// Deletes a Namespace (not what is in it); false if there was none.
    pub fn delete_namespace(&self, name: &str) -> bool {
        self.delete(Kind::Namespace, "", name)
    }

    /// Creates or replaces a Pod; returns its new resourceVersion.
    pub fn apply_pod(&self, pod: Value) -> u64 {
        self.apply(Kind::Pod, pod)
    }

    /// Deletes a Pod; false if there was none.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        self.delete(Kind::Pod, namespace, name)
    }

    /// Creates or replaces a NetworkPolicy; returns its new resourceVersion.
    pub fn apply_network_policy(&self, policy: Value) -> u64 {
        self.apply(Kind::NetworkPolicy, policy)
    }

    /// Deletes a NetworkPolicy; false if there was none.
    pub fn delete_network_policy(&self, namespace: &str, name: &str) -> bool {
        self.delete(Kind::NetworkPolicy, namespace, name)
    }

    /// Creates or replaces a ClusterNetworkPolicy; returns its new resourceVersion.
    /// Panics while its CRD is not installed (the API server would answer 404).
    pub fn apply_cluster_network_policy(&self, policy: Value) -> u64 {
        self.apply(Kind::ClusterNetworkPolicy, policy)
    }

    /// Deletes a ClusterNetworkPolicy; false if there was none.
    pub fn delete_cluster_network_policy(&self, name: &str) -> bool {
        self.delete(Kind::ClusterNetworkPolicy, "", name)
    }

    /// Whether `kind` is served: always for a built-in kind, for a custom one while its
    /// CRD is installed (it is when the server starts).
    pub fn crd_installed(&self, kind: Kind) -> bool {
        self.shared.serves_kind(kind)
    }

    /// Takes a custom kind's CRD away, as `kubectl delete crd` does: its objects are
    /// deleted (watchers see them go), open watches of it end, and from then on its
    /// paths, its group in discovery and its group version answer 404. Call it right
    /// after starting for a cluster that never had the CRD. Panics for a built-in kind
    /// (a mistake in the test).
    pub fn uninstall_crd(&self, kind: Kind) {
        assert!(kind.custom(), "{} is built in, not a CRD", kind.name());
        {
            let mut store = self.shared.lock();
            let keys: Vec<(String, String)> = store
                .objects(kind)
                .values()
                .map(|o| (o.namespace.clone(), o.name.clone()))
                .collect();
            for (namespace, name) in keys {
                store.delete(kind, &namespace, &name);
            }
            self.shared
                .uninstalled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(kind);
        }
        self.shared.changed.notify_all();
    }

    /// Installs a custom kind's CRD (again): its paths and discovery answer from now
    /// on, with no objects until the test applies some.
    pub fn install_crd(&self, kind: Kind) {
        assert!(kind.custom(), "{} is built in, not a CRD", kind.name());
        self.shared
            .uninstalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&kind);
        self.shared.changed.notify_all();
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Makes every earlier resourceVersion too old, of every kind: watches and continue
    /// tokens from before now get `410 Gone`.
    pub fn compact(&self) {
        self.shared.lock().compact();
        self.shared.changed.notify_all();
    }

    /// Answers too-old watches with an HTTP 410 status instead of an `ERROR` event in a
    /// 200 stream (the API server's way).
    pub fn set_gone_as_http_status(&self, on: bool) {
        self.shared.gone_as_http.store(on, Ordering::SeqCst);
    }

    /// How often an idle watch that asked for them gets a bookmark (default 1 s).
    pub fn set_bookmark_interval(&self, every: Duration) {
        let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        self.shared.bookmark_ms.store(ms, Ordering::SeqCst);
    }

    /// Stops listening and breaks every open connection at once.
    pub fn stop(&self) {
        self.shared.running.store(false, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        if let Some((listener, handle)) = self
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            // Shutting a listening socket down wakes its accept() with an error.
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(&listener.as_fd()),
                nix::sys::socket::Shutdown::Both,
            );
            drop(listener);
            let _ = handle.join();
        }
        for conn in self
            .shared
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        self.shared.changed.notify_all();
    }

    /// Listens again on the same address (and namespace), keeping the objects.
    pub fn restart(&mut self) {
        self.stop();
        self.listen();
    }

    /// List requests served so far.
    pub fn list_count(&self) -> u64 {
        self.shared.lists.load(Ordering::SeqCst)
    }

    /// Watch requests served so far.
    pub fn watch_count(&self) -> u64 {
        self.shared.watches.load(Ordering::SeqCst)
    }

    /// `410 Gone` answers (watches and continue tokens) so far.
    pub fn expired_count(&self) -> u64 {
        self.shared.expired.load(Ordering::SeqCst)
    }

    /// Bookmarks sent so far.
    pub fn bookmark_count(&self) -> u64 {
        self.shared.bookmarks.load(Ordering::SeqCst)
    }

    /// Every request served so far, as `METHOD path?query` (the query as sent).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock_requests().clone()
    }

    /// Events clients posted.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock_events().clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds `addr`, inside `netns` when given; returns the listener and its address.
fn bind(netns: Option<&Path>, addr: SocketAddr) -> (TcpListener, SocketAddr) {
    let netns = netns.map(Path::to_path_buf);
    let listener = std::thread::spawn(move || {
        if let Some(path) = &netns {
            let file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
        }
        // The address may still be held by the previous run's sockets for a moment.
        let mut tries = 0;
        loop {
            match TcpListener::bind(addr) {
                Ok(l) => return l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("bind {addr}: {e}"),
            }
        }
    })
    .join()
    .unwrap_or_else(|_| panic!("the thread binding {addr} panicked"));
    let local = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"));
    (listener, local)
}
