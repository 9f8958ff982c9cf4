//! The node agent (`cni-node`): watches Kubernetes `Node` objects and keeps this node's
//! CNI network config, its routes to other nodes' pod CIDRs, egress SNAT and the pod
//! MTU in step with them.
//!
//! - [`node`]: the few fields of a Node that are used, read defensively.
//! - [`plan`]: the desired state as plain data (own pod CIDRs, routes, in-cluster set).
//! - [`host`]: what is read of this host over netlink, and the pod MTU.
//! - [`conflist`], [`routes`], [`egress`]: the three things kept in step.
//! - [`agent`]: the watch loop and the reconciler; [`health`]: the probes' endpoint.

pub mod agent;
pub mod cli;
pub mod conflist;
pub mod egress;
pub mod health;
pub mod host;
pub mod log;
pub mod node;
pub mod plan;
pub mod routes;

use std::ffi::OsString;
use std::process::ExitCode;

use cli::Command;

/// The program: parses the command line and runs the agent on a single-threaded
/// runtime (one watch, one reconciler: nothing to share between threads).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let command = match cli::parse(args, std::env::var("NODE_NAME").ok()) {
        Ok(command) => command,
        Err(e) => {
            eprintln!("cni-node: {e}");
            return ExitCode::from(2);
        }
    };
    let options = match command {
        Command::Help => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Command::Version => {
            println!("cni-node{}", cni_build_stamp::STAMP);
            return ExitCode::SUCCESS;
        }
        Command::Run(options) => *options,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            log::error(&format!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error(&e);
            ExitCode::FAILURE
        }
    }
}
