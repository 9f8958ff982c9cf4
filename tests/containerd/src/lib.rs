//! containerd's CRI driving our plugins, the way a Kubernetes node runs them.
//!
//! Kubelet never runs CNI plugins itself: it tells containerd the node's pod CIDR
//! (`UpdateRuntimeConfig`), containerd renders its `conf_template` into a conflist, and
//! every `RunPodSandbox` / `StopPodSandbox` / `RemovePodSandbox` makes containerd's CNI
//! library run our `bridge`, `host-local` and `loopback`. This crate reproduces that:
//! - [`Containerd`]: Debian's containerd (runc, the v2 shim) in a throwaway host netns and
//!   a private mount namespace, with its own root, state, socket, `bin_dir` (a copy of
//!   the built plugins) and `conf_dir`, and a sandbox image built locally;
//! - [`Cri`]: a small blocking CRI client (the `k8s-cri` crate over tonic) doing the
//!   calls kubelet makes for pod networking.
//!
//! It is a crate of its own so that the gRPC stack is built only for this suite. The
//! scenarios are in `tests/cri.rs`.

pub mod containerd;
pub mod cri;
pub mod procs;

pub use containerd::{Containerd, NETWORK, SANDBOX_IMAGE, ping_from};
pub use cri::{Cri, PodMeta, RuntimeStatus, SandboxNet};
