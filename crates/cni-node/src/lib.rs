//! The node agent (`cni-node`): watches Kubernetes `Node` objects and keeps this node's
//! CNI network config, its routes to other nodes' pod CIDRs, egress SNAT and the pod
//! MTU in step with them.
//!
//! - [`cli`]: the command line; [`logging`]: the log; [`error`]: what can fail.
//! - [`api`]: the API client and the watch of one kind; [`store`]: one store per
//!   watched kind, complete or not; [`node`]: the few fields of a Node that are used.
//! - [`host`]: what is read of this host, and its change notifications.
//! - [`plan`]: the whole desired state as plain data, from a snapshot of the stores and
//!   the host; [`reconcile`]: the one reconciler that applies the difference through
//!   [`conflist`], [`overlay`] (the VXLAN devices), [`routes`] (routes and the tunnels'
//!   entries), [`egress`] and the policy tables.
//! - [`policy`]: the policy tiers in packet order, one module per policy kind (its
//!   store, readiness and compile), the kernel side and `explain`.
//! - [`agent`]: how the parts meet (threads, wake-ups, retries); [`wake`]: the
//!   coalescing wake-up; [`health`] and [`metrics`]: the probes' and Prometheus's
//!   endpoint; [`explain_socket`]: where `explain` is answered, for root on this node
//!   only; [`deny_log`]: a line per connection a policy denied (`--deny-log`).

pub mod agent;
pub mod api;
pub mod cli;
pub mod conflist;
pub mod deny_log;
pub mod egress;
pub mod error;
pub mod explain_socket;
pub mod health;
pub mod host;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod overlay;
pub mod plan;
pub mod policy;
pub mod reconcile;
pub mod routes;
pub mod store;
pub mod wake;

use std::ffi::OsString;
use std::process::ExitCode;

use crate::error::{Error, chain};

/// The program: parses the command line and runs the agent (or a subcommand). The
/// runtime has two workers so that the probes are answered while a page of a large list
/// is parsed; the reconciler has a thread of its own.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match cli::Cli::parse_args(std::iter::once(OsString::from("cni-node")).chain(args)) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Some(cli::Subcommand::Explain(args)) = &cli.command {
        return explain(args);
    }
    let options = cli.options;
    logging::init(options.log_format, options.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("{}", chain(&Error::Runtime(e)));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(agent::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `cni-node explain`: prints the running agent's answer; 0 allowed, 1 denied, 2 no
/// answer.
fn explain(args: &cli::ExplainArgs) -> ExitCode {
    let question = policy::explain::Question {
        from: args.from.clone(),
        to: args.to.clone(),
        protocol: args.protocol.clone(),
        port: args.port,
        ipv6: args.ipv6,
        via_service: args.via_service,
    };
    match explain_socket::ask(&args.explain_socket, &question) {
        Ok((allowed, text)) => {
            print!("{text}");
            if allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(why) => {
            eprintln!("cni-node explain: {}", chain(&why));
            ExitCode::from(2)
        }
    }
}
