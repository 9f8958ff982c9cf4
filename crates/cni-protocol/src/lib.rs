//! The CNI plugin protocol, spec 0.1.0 to 1.1.0: `CNI_*` environment, network config,
//! versions, results in every version's shape, errors and their codes, `CNI_ARGS`,
//! delegation to IPAM plugins (exec'd, or in-process when the delegate is this same
//! multi-call executable), and the dispatcher a plugin's `main` calls.

pub mod args;
pub mod config;
pub mod delegate;
pub mod dispatch;
pub mod env;
pub mod error;
pub mod failpoint;
pub mod inproc;
pub mod ip;
pub mod json;
pub mod log;
pub mod mac;
pub mod pod_record;
pub mod process;
pub mod result;
pub mod version;

pub use args::CniArgs;
pub use config::{Attachment, NetConf};
pub use dispatch::{Outcome, Plugin, Request, dispatch, run};
pub use env::{CmdArgs, Command};
pub use error::{CniError, Context, ErrorCode, Errors};
pub use mac::MacAddr;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::{CURRENT_VERSION, SUPPORTED_VERSIONS, Version};
