//! The command line, compatible with the CNI project's Go cnitool:
//! `cnitool [-i IFNAME] add|check|del|gc|status <network> <netns>`, flags anywhere
//! (`-i eth1`, `-ieth1`, `-i=eth1`, `--ifname eth1`, `--ifname=eth1`), `--` ends the
//! flags, `help [command]` and `-h/--help` everywhere. Two additions for `gc`:
//! `--valid <container-id>/<ifname>` and `--valid-netns <path>` name attachments to keep.
//! clap reads it; its errors are reworded as cobra, which the Go tool is built on, words
//! them, and the help texts are ours, in cobra's layout.

use crate::error::Error;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};

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

/// The command line as clap reads it. Help is ours (cobra's layout, with the
/// environment explained), so clap's own `--help` and `help` are off; the arity of the
/// positionals is checked afterwards, to report it in cobra's words.
#[derive(Debug, Parser)]
#[command(
    name = "cnitool",
    disable_help_flag = true,
    disable_help_subcommand = true,
    args_override_self = true
)]
struct Line {
    /// `-i/--ifname`, before or after the command.
    #[arg(short = 'i', long = "ifname", global = true)]
    ifname: Option<String>,
    /// `-h/--help`, before or after the command.
    #[arg(short = 'h', long = "help", global = true)]
    help: bool,
    #[command(subcommand)]
    command: Option<Word>,
}

/// The first positional: an operation, `help`, or anything else (an unknown command).
#[derive(Debug, Subcommand)]
enum Word {
    Add(Positionals),
    Check(Positionals),
    Del(Positionals),
    Gc(GcArgs),
    Status(Positionals),
    /// `help [<command>]`; words after the command are ignored, as cobra does.
    Help {
        topic: Vec<String>,
    },
    /// An unknown command, kept so that `bogus --help` prints the help as cobra does.
    #[command(external_subcommand)]
    Unknown(Vec<String>),
}

/// `<network> <netns>` and whatever follows (ignored, as cobra's `MinimumNArgs` does).
#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct Positionals {
    args: Vec<String>,
}

#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct GcArgs {
    #[command(flatten)]
    positionals: Positionals,
    /// `--valid <container-id>/<ifname>`, repeatable.
    #[arg(long = "valid", action = ArgAction::Append)]
    valid: Vec<String>,
    /// `--valid-netns <path>`, repeatable.
    #[arg(long = "valid-netns", action = ArgAction::Append)]
    valid_netns: Vec<String>,
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, Error> {
    let line =
        Line::try_parse_from(std::iter::once("cnitool").chain(args.iter().map(String::as_str)))
            .map_err(|e| usage_error(&e, args))?;
    let (operation, Positionals { args: rest }, valid, valid_netns) = match line.command {
        None => return Ok(Invocation::Help(root_help())),
        Some(Word::Help { topic }) => {
            return match topic.first() {
                None => Ok(Invocation::Help(root_help())),
                Some(w) => match operation(w) {
                    Some(op) => Ok(Invocation::Help(command_help(op))),
                    None => Err(Error::Usage(format!(
                        "unknown help topic [{w:?}]\nRun 'cnitool --help' for usage."
                    ))),
                },
            };
        }
        Some(Word::Unknown(words)) => {
            let mut after = words.iter().skip(1).take_while(|w| *w != "--");
            if line.help || after.any(|w| w == "-h" || w == "--help") {
                return Ok(Invocation::Help(root_help()));
            }
            let word = words.first().map(String::as_str).unwrap_or_default();
            return Err(Error::Usage(format!(
                "unknown command {word:?} for \"cnitool\"\nRun 'cnitool --help' for usage."
            )));
        }
        Some(Word::Add(p)) => (Operation::Add, p, vec![], vec![]),
        Some(Word::Check(p)) => (Operation::Check, p, vec![], vec![]),
        Some(Word::Del(p)) => (Operation::Del, p, vec![], vec![]),
        Some(Word::Status(p)) => (Operation::Status, p, vec![], vec![]),
        Some(Word::Gc(gc)) => (Operation::Gc, gc.positionals, gc.valid, gc.valid_netns),
    };
    if line.help {
        return Ok(Invocation::Help(command_help(operation)));
    }
    let valid = valid
        .iter()
        .map(|text| {
            text.rsplit_once('/')
                .filter(|(id, ifname)| !id.is_empty() && !ifname.is_empty())
                .map(|(id, ifname)| (id.to_string(), ifname.to_string()))
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "invalid argument {text:?} for \"--valid\" flag: want <container-id>/<ifname>"
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
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
        ifname: line.ifname,
        valid,
        valid_netns,
    }))
}

/// The operation a word names (`help <word>`).
fn operation(word: &str) -> Option<Operation> {
    Some(match word {
        "add" => Operation::Add,
        "check" => Operation::Check,
        "del" => Operation::Del,
        "gc" => Operation::Gc,
        "status" => Operation::Status,
        _ => return None,
    })
}

/// A clap error in the words of cobra (which the Go tool is built on): what scripts and
/// users of that tool see.
fn usage_error(e: &clap::Error, args: &[String]) -> Error {
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let arg = context(ContextKind::InvalidArg);
    let text = match e.kind() {
        ErrorKind::UnknownArgument => match arg.strip_prefix('-') {
            // clap names the one letter (`-w`), cobra the whole word it is in (`-weird`).
            Some(short) if !short.starts_with('-') => {
                let letter = short.chars().next().unwrap_or_default();
                let word = args
                    .iter()
                    .take_while(|a| *a != "--")
                    .find(|a| {
                        a.strip_prefix('-')
                            .is_some_and(|s| !s.starts_with('-') && s.contains(letter))
                    })
                    .unwrap_or(&arg);
                format!("unknown shorthand flag: '{letter}' in {word}")
            }
            _ => format!("unknown flag: {arg}"),
        },
        // clap names the flag by its long name with a placeholder (`--ifname <IFNAME>`);
        // cobra names it as typed, and a flag without its value is the last argument.
        ErrorKind::InvalidValue if context(ContextKind::InvalidValue).is_empty() => {
            let long = arg.split_whitespace().next().unwrap_or_default();
            let short = Line::command()
                .get_arguments()
                .find(|a| {
                    a.get_long()
                        .is_some_and(|l| long.strip_prefix("--") == Some(l))
                })
                .and_then(clap::Arg::get_short)
                .map(|c| format!("-{c}"));
            let typed = match args.last() {
                Some(last) if Some(last) == short.as_ref() => last.as_str(),
                _ => long,
            };
            format!("flag needs an argument: {typed}")
        }
        _ => {
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    };
    Error::Usage(text)
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
        assert_eq!(
            run("-i a add --ifname b net ns").ifname.as_deref(),
            Some("b")
        );
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
        for bad in ["gc net --valid noslash", "gc net --valid /eth0"] {
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
            let expected = Invocation::Help(command_help(operation(op).unwrap()));
            assert_eq!(parse(&args(&format!("{op} --help"))).unwrap(), expected);
            assert_eq!(parse(&args(&format!("{op} -h net ns"))).unwrap(), expected);
            assert_eq!(parse(&args(&format!("help {op}"))).unwrap(), expected);
            assert_eq!(parse(&args(&format!("help {op} more"))).unwrap(), expected);
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
        assert_eq!(
            msg("del net -weird"),
            "unknown shorthand flag: 'w' in -weird"
        );
        assert_eq!(msg("add net ns --valid a/b"), "unknown flag: --valid");
        assert_eq!(
            msg("add net ns --ifname"),
            "flag needs an argument: --ifname"
        );
        assert!(msg("help frob").starts_with("unknown help topic [\"frob\"]"));
        assert_eq!(msg("add net ns -i"), "flag needs an argument: -i");
    }
}
