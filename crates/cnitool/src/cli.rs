//! The command line, compatible with the CNI project's Go cnitool:
//! `cnitool [-i IFNAME] add|check|del|gc|status <network> <netns>`, flags anywhere
//! (`-i eth1`, `-ieth1`, `-i=eth1`, `--ifname eth1`, `--ifname=eth1`), `--` ends the
//! flags, `help [command]` and `-h/--help` everywhere. Two additions for `gc`:
//! `--valid <container-id>/<ifname>` and `--valid-netns <path>` name attachments to keep.

use crate::error::Error;

/// The five operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// ADD.
    Add,
    /// CHECK.
    Check,
    /// DEL.
    Del,
    /// GC.
    Gc,
    /// STATUS.
    Status,
}

impl Operation {
    fn parse(word: &str) -> Option<Self> {
        Some(match word {
            "add" => Self::Add,
            "check" => Self::Check,
            "del" => Self::Del,
            "gc" => Self::Gc,
            "status" => Self::Status,
            _ => return None,
        })
    }

    /// The subcommand's word.
    pub fn word(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Check => "check",
            Self::Del => "del",
            Self::Gc => "gc",
            Self::Status => "status",
        }
    }

    /// Whether the netns argument may be left out (GC and STATUS do not use it; the Go
    /// tool requires it anyway, so passing it keeps scripts working with both).
    fn netns_optional(self) -> bool {
        matches!(self, Self::Gc | Self::Status)
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Print this help text on stdout and exit 0.
    Help(String),
    /// Run an operation.
    Run(Request),
}

/// One operation with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The operation.
    pub operation: Operation,
    /// The network name.
    pub network: String,
    /// The netns path as given (empty when left out for GC/STATUS).
    pub netns: String,
    /// `-i/--ifname`, if given.
    pub ifname: Option<String>,
    /// `--valid <id>/<ifname>` (GC).
    pub valid: Vec<(String, String)>,
    /// `--valid-netns <path>` (GC).
    pub valid_netns: Vec<String>,
}

impl Request {
    /// Whether a GC names any attachment to keep (else every attachment is stale).
    pub fn has_valid_list(&self) -> bool {
        !self.valid.is_empty() || !self.valid_netns.is_empty()
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, Error> {
    let mut positional = Vec::new();
    let mut help = false;
    let mut ifname = None;
    let mut valid = Vec::new();
    let mut valid_netns = Vec::new();
    let mut flags_done = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if flags_done || arg == "-" || !arg.starts_with('-') {
            positional.push(arg.clone());
            continue;
        }
        if arg == "--" {
            flags_done = true;
            continue;
        }
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v.to_string())),
                None => (arg.clone(), None),
            }
        } else {
            // Shorthand: -h, -i VALUE, -iVALUE, -i=VALUE.
            let short = &arg[1..];
            let mut chars = short.chars();
            let letter = chars.next().unwrap_or_default();
            let tail = chars.as_str();
            let value = tail.strip_prefix('=').unwrap_or(tail);
            match letter {
                'h' if tail.is_empty() => ("--help".into(), None),
                'i' => (
                    "--ifname".into(),
                    (!tail.is_empty()).then(|| value.to_string()),
                ),
                other => {
                    return Err(Error::Usage(format!(
                        "unknown shorthand flag: '{other}' in {arg}"
                    )));
                }
            }
        };
        let mut value = |flag: &str| match &inline {
            Some(v) => Ok(v.clone()),
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| Error::Usage(format!("flag needs an argument: {flag}"))),
        };
        match name.as_str() {
            "--help" => help = true,
            "--ifname" => ifname = Some(value(arg)?),
            "--valid" => {
                let text = value("--valid")?;
                let pair = text
                    .rsplit_once('/')
                    .filter(|(id, ifname)| !id.is_empty() && !ifname.is_empty())
                    .ok_or_else(|| {
                        Error::Usage(format!(
                            "invalid argument {text:?} for \"--valid\" flag: want <container-id>/<ifname>"
                        ))
                    })?;
                valid.push((pair.0.to_string(), pair.1.to_string()));
            }
            "--valid-netns" => valid_netns.push(value("--valid-netns")?),
            _ => return Err(Error::Usage(format!("unknown flag: {name}"))),
        }
    }

    let mut positional = positional.into_iter();
    let Some(word) = positional.next() else {
        return Ok(Invocation::Help(root_help()));
    };
    if word == "help" {
        return Ok(Invocation::Help(match positional.next() {
            None => root_help(),
            Some(w) => match Operation::parse(&w) {
                Some(op) => command_help(op),
                None => {
                    return Err(Error::Usage(format!(
                        "unknown help topic [{w:?}]\nRun 'cnitool --help' for usage."
                    )));
                }
            },
        }));
    }
    let Some(operation) = Operation::parse(&word) else {
        if help {
            return Ok(Invocation::Help(root_help()));
        }
        return Err(Error::Usage(format!(
            "unknown command {word:?} for \"cnitool\"\nRun 'cnitool --help' for usage."
        )));
    };
    if help {
        return Ok(Invocation::Help(command_help(operation)));
    }
    if operation != Operation::Gc && !(valid.is_empty() && valid_netns.is_empty()) {
        return Err(Error::Usage(format!(
            "--valid and --valid-netns are flags of gc, not of {}\nRun 'cnitool {} --help' for usage.",
            operation.word(),
            operation.word()
        )));
    }
    let rest: Vec<String> = positional.collect();
    let needed = if operation.netns_optional() { 1 } else { 2 };
    if rest.len() < needed {
        return Err(Error::Usage(format!(
            "requires at least {needed} arg(s), only received {}\nRun 'cnitool {} --help' for usage.",
            rest.len(),
            operation.word()
        )));
    }
    let mut rest = rest.into_iter();
    Ok(Invocation::Run(Request {
        operation,
        network: rest.next().unwrap_or_default(),
        netns: rest.next().unwrap_or_default(),
        ifname,
        valid,
        valid_netns,
    }))
}

const ENVIRONMENT: &str = "\
Environment:
  NETCONFPATH    directory of network configs (default /etc/cni/net.d): *.conflist
                 files in name order, then single-plugin *.conf and *.json files
  CNI_PATH       plugin directories, separated by ':'
  CNI_IFNAME     interface name when -i is not given (default eth0)
  CNI_ARGS       extra arguments for the plugins: K=V;K=V
  CAP_ARGS       capability args as a JSON object, e.g. '{\"portMappings\":[...]}';
                 each plugin gets those it lists in its \"capabilities\"
  CNI_CACHE_DIR  result cache directory (default /var/lib/cni, as libcni); the
                 cache file is <dir>/results/<network>-<container id>-<ifname>

The container id is \"cnitool-\" followed by the first 20 hex digits of the SHA-512
of the absolute netns path, as the Go cnitool derives it.
Exit status: 0 on success, 1 on any error (the error is printed on stderr).
";

const GLOBAL_FLAGS: &str = "\
Global Flags:
  -i, --ifname string   Interface name (defaults to env var CNI_IFNAME or 'eth0')
";

/// `cnitool --help`.
pub fn root_help() -> String {
    format!(
        "\
CNI Tool is a simple program that executes a CNI configuration.
It will add, check, remove, gc, or get status of an interface in an already-created network namespace.

Usage:
  cnitool [command]

Available Commands:
  add         Add network interface to a network namespace
  check       Check network interface in a network namespace
  del         Delete network interface from a network namespace
  gc          Garbage collect network interfaces
  help        Help about any command
  status      Get status of network interfaces

Flags:
  -h, --help            help for cnitool
  -i, --ifname string   Interface name (defaults to env var CNI_IFNAME or 'eth0')

{ENVIRONMENT}
Use \"cnitool [command] --help\" for more information about a command.
"
    )
}

/// `cnitool <command> --help`.
pub fn command_help(op: Operation) -> String {
    let (usage, text, flags) = match op {
        Operation::Add => (
            "add <network-name> <netns>",
            "Add network interface to a network namespace.
This command will create a new network interface and add it to the specified network namespace.
The plugins of the network run in order, each getting the previous one's result as
prevResult; the last result is printed on stdout and kept in the result cache.",
            "",
        ),
        Operation::Check => (
            "check <network-name> <netns>",
            "Check network interface in a network namespace.
This command will check if the network interface is properly configured in the specified network namespace.
Every plugin gets the cached ADD result as prevResult. Needs cniVersion 0.4.0 or later;
a network with \"disableCheck\": true passes without running its plugins.",
            "",
        ),
        Operation::Del => (
            "del <network-name> <netns>",
            "Delete network interface from a network namespace.
This command will remove the network interface from the specified network namespace.
The plugins run in reverse order with the cached ADD result as prevResult; the cache
entry is removed afterwards.",
            "",
        ),
        Operation::Gc => (
            "gc <network-name> [<netns>]",
            "Garbage collect network interfaces.
Every attachment of the network in the result cache that is not named valid is deleted
(DEL, as `cnitool del` does), then every plugin gets GC (cniVersion 1.1.0 or later) with
the valid attachments in cni.dev/valid-attachments, so that it releases what belongs to
any other attachment (IP reservations, firewall rules).

Without --valid or --valid-netns, EVERY attachment of the network is stale: all cached
attachments are deleted and the plugins are told nothing is valid (the Go cnitool does
the same). The netns argument is accepted for compatibility and not used.",
            "
  --valid string         keep the attachment <container-id>/<ifname> (repeatable)
  --valid-netns string   keep the attachment cnitool made for this netns path, on the
                         interface of -i/CNI_IFNAME (repeatable)",
        ),
        Operation::Status => (
            "status <network-name> [<netns>]",
            "Get status of network interfaces.
Every plugin of the network gets STATUS (cniVersion 1.1.0 or later; older networks
succeed without asking), in order; the first that reports it cannot serve ADD fails the
command. Nothing is printed on success. The netns argument is accepted for compatibility
and not used.",
            "",
        ),
    };
    format!(
        "{text}

Usage:
  cnitool {usage} [flags]

Flags:
  -h, --help             help for {word}{flags}

{GLOBAL_FLAGS}
{ENVIRONMENT}",
        word = op.word()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn run(text: &str) -> Request {
        match parse(&args(text)).unwrap() {
            Invocation::Run(r) => r,
            Invocation::Help(h) => panic!("help for {text}: {h}"),
        }
    }

    #[test]
    fn commands_and_ifname_flag_anywhere() {
        let r = run("add net /var/run/netns/a");
        assert_eq!(r.operation, Operation::Add);
        assert_eq!(r.network, "net");
        assert_eq!(r.netns, "/var/run/netns/a");
        assert_eq!(r.ifname, None);
        for line in [
            "-i eth1 check net ns",
            "check -i eth1 net ns",
            "check net ns --ifname eth1",
            "check net ns --ifname=eth1",
            "check -ieth1 net ns",
            "check -i=eth1 net ns",
        ] {
            let r = run(line);
            assert_eq!(r.operation, Operation::Check, "{line}");
            assert_eq!(r.ifname.as_deref(), Some("eth1"), "{line}");
            assert_eq!((r.network.as_str(), r.netns.as_str()), ("net", "ns"));
        }
        let r = run("del -- net -weird");
        assert_eq!(r.netns, "-weird");
    }

    #[test]
    fn gc_valid_lists_and_optional_netns() {
        let r = run("gc net --valid cnitool-abc/eth0 --valid-netns /var/run/netns/p");
        assert_eq!(r.operation, Operation::Gc);
        assert_eq!(r.netns, "");
        assert_eq!(r.valid, [("cnitool-abc".to_string(), "eth0".to_string())]);
        assert_eq!(r.valid_netns, ["/var/run/netns/p"]);
        assert!(r.has_valid_list());
        assert!(!run("gc net ns").has_valid_list());
        assert!(run("status net").netns.is_empty());
        for bad in [
            "gc net --valid noslash",
            "gc net --valid /eth0",
            "add net ns --valid a/b",
        ] {
            assert!(matches!(parse(&args(bad)), Err(Error::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn help_everywhere() {
        for line in ["", "-h", "--help", "help", "bogus --help"] {
            assert_eq!(
                parse(&args(line)).unwrap(),
                Invocation::Help(root_help()),
                "{line}"
            );
        }
        for op in ["add", "check", "del", "gc", "status"] {
            let expected = Invocation::Help(command_help(Operation::parse(op).unwrap()));
            assert_eq!(parse(&args(&format!("{op} --help"))).unwrap(), expected);
            assert_eq!(parse(&args(&format!("{op} -h net ns"))).unwrap(), expected);
            assert_eq!(parse(&args(&format!("help {op}"))).unwrap(), expected);
        }
        assert!(command_help(Operation::Gc).contains("EVERY attachment of the network is stale"));
    }

    #[test]
    fn usage_errors_as_cobra() {
        let msg = |line: &str| parse(&args(line)).unwrap_err().to_string();
        assert!(msg("add net").starts_with("requires at least 2 arg(s), only received 1"));
        assert!(msg("gc").starts_with("requires at least 1 arg(s), only received 0"));
        assert!(msg("frob net ns").starts_with("unknown command \"frob\" for \"cnitool\""));
        assert_eq!(msg("add net ns --bogus"), "unknown flag: --bogus");
        assert_eq!(msg("add net ns -x"), "unknown shorthand flag: 'x' in -x");
        assert_eq!(msg("add net ns -i"), "flag needs an argument: -i");
    }
}
