//! Harness for the black-box tests, which run the built plugins as a runtime would.
//!
//! The tests in `tests/tests/` treat the plugins as the runtime does: they run the built
//! binaries with `CNI_*` environment variables and a JSON config on stdin, inside a
//! throwaway "host" network namespace, against a throwaway "pod" network namespace, and
//! then look at stdout, the exit code and the kernel state in those namespaces.
//! Nothing here touches the machine's own root netns.
//!
//! The pieces:
//! - [`require_root`]: root tests skip locally without root, and fail under `CI=true`.
//! - [`unique_name`] / [`unique_ifname`]: collision-free names for namespaces, networks,
//!   container ids and (≤15 byte) links, also across test binaries running at once.
//! - [`Netns`] and [`TempDir`]: guards that remove what they made on drop, also when a
//!   test panics.
//! - [`bin_dir`]: builds the multi-call plugin binary once per test process and returns
//!   the directory holding it as `bridge`, `host-local` and `loopback` hard links (what
//!   tests pass as `CNI_PATH`).
//! - [`Plugin`] / [`Outcome`]: run one plugin command and inspect its result.
//! - [`kernel`]: `ip -j …` and sysctl readers that run inside a namespace.
//! - [`json`]: Go-compatible pretty printing, to compare result text byte for byte.
//! - [`check_cases`]: table-driven tests that report every failing row.
//! - [`underlay`]: a layer-2 segment between test hosts and UDP probes across it.
//! - [`hostport`]: TCP probes of host ports and a client beside the node.
//! - [`fleet`]: which side, ours or the reference's, adds and deletes each pod of a mixed fleet.
//! - [`cluster`]: a cluster of namespaces on an underlay, each node running `cni-node`
//!   against the Kubernetes API test server.
//! - [`probe`]: HTTP probes of a health or metrics endpoint inside a namespace.
//! - [`netpol`]: servers answering TCP and UDP in a pod, and a prober running many
//!   connection probes at once, for the NetworkPolicy tests.
//! - [`policy_oracle`]: NetworkPolicy's meaning written from the Kubernetes
//!   documentation, apart from the agent's, as the NetworkPolicy tests' expectation;
//!   with ClusterNetworkPolicy's tiers (from network-policy-api's documentation), which
//!   also names the tier, policy and rule that decided.
//! - [`nft`]: nftables commits seen as they happen, and the NetworkPolicy table as
//!   `nft -j` lists it.
//! - [`connections`]: short TCP connections between namespaces, timed one by one.
//! - [`measured`]: figures a test measured, recorded so that a green run shows them.
//! - [`kprobe`]: when a kernel function returned, on the clock `Instant` reads, for
//!   benchmarks that time a change by the kernel's own clock.

pub mod bins;
pub mod cases;
pub mod cluster;
pub mod connections;
pub mod fleet;
pub mod hostport;
pub mod ipam;
pub mod json;
pub mod kernel;
pub mod kprobe;
pub mod measured;
pub mod names;
pub mod netns;
pub mod netpol;
pub mod nft;
pub mod plugin;
pub mod podman;
pub mod policy_matrix;
pub mod policy_oracle;
pub mod privilege;
pub mod probe;
pub mod segments;
pub mod tempdir;
pub mod underlay;

pub use bins::{bin_dir, cargo, multicall_path, plugin_path, workspace_root};
pub use cases::{check_cases, parallel};
pub use names::{unique_ifname, unique_name};
pub use netns::Netns;
pub use plugin::{Outcome, Plugin};
pub use privilege::{in_ci, require_root};
pub use tempdir::TempDir;

/// The seven spec versions, oldest first, exactly as plugins advertise them.
pub const ALL_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
