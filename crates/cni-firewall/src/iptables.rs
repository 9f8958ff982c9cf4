//! The `nat` table through the iptables tools: `iptables-save` and `iptables -S`
//! read into a [`NatTable`], changes written as `iptables-restore --noflush` input (one
//! transaction per family), with the tools' own quoting. Masquerade, host ports and the
//! node agent's egress SNAT all read and write their iptables rules through this.

use std::collections::HashSet;

pub(crate) use cni_protocol::ip::Family;

use crate::error::{Error, Result};
use crate::exec;
use crate::naming::{go_quote, parse_iptables_comment};

/// Bounded wait for the xtables lock (legacy iptables): a hung holder must
/// not block every pod start on the node forever.
const RESTORE_ARGS: &[&str] = &["--noflush", "--wait=30"];

/// What each family means here: iptables (IPv4) or ip6tables (IPv6).
pub(crate) trait Tables {
    /// The tool's name, used in messages.
    fn name(self) -> &'static str;
    fn save_program(self) -> &'static str;
    fn restore_program(self) -> &'static str;
}

impl Tables for Family {
    fn name(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }

    fn save_program(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    fn restore_program(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }
}

/// One `-A` line of `iptables-save`, split into unquoted arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SavedRule {
    pub(crate) chain: String,
    pub(crate) args: Vec<String>,
}

impl SavedRule {
    pub(crate) fn jumps_to(&self, chain: &str) -> bool {
        self.args
            .windows(2)
            .any(|w| (w[0] == "-j" || w[0] == "-g") && w[1] == chain)
    }

    /// The chain a `-j`/`-g` of this rule goes to.
    pub(crate) fn jump_target(&self) -> Option<&str> {
        self.args
            .windows(2)
            .find(|w| w[0] == "-j" || w[0] == "-g")
            .map(|w| w[1].as_str())
    }

    pub(crate) fn comment(&self) -> Option<&str> {
        self.args
            .windows(2)
            .find(|w| w[0] == "--comment")
            .map(|w| w[1].as_str())
    }
}

/// The `nat` table as `iptables-save -t nat` printed it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct NatTable {
    pub(crate) chains: Vec<String>,
    pub(crate) rules: Vec<SavedRule>,
}

impl NatTable {
    pub(crate) fn has_chain(&self, chain: &str) -> bool {
        self.chains.iter().any(|c| c == chain)
    }

    pub(crate) fn has_rule(&self, chain: &str, args: &[String]) -> bool {
        self.rules
            .iter()
            .any(|r| r.chain == chain && r.args == args)
    }
}

/// Parses the `*nat` section of `iptables-save` output.
pub(crate) fn parse_save(text: &str) -> NatTable {
    let mut table = NatTable::default();
    let mut in_nat = false;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            in_nat = name.trim() == "nat";
            continue;
        }
        if !in_nat {
            continue;
        }
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next() {
                table.chains.push(name.to_owned());
            }
        } else if line.starts_with("-A ") {
            let mut args = tokenize(line);
            if args.len() >= 2 {
                let chain = args.remove(1);
                args.remove(0);
                table.rules.push(SavedRule { chain, args });
            }
        }
    }
    table
}

/// Parses `iptables -t nat -S <chain>` output: `-P`/`-N` lines declare the
/// chain, `-A` lines are its rules, quoted as `iptables-save` quotes them.
pub(crate) fn parse_listing(text: &str) -> NatTable {
    let mut table = NatTable::default();
    for line in text.lines() {
        let mut args = tokenize(line);
        if args.len() < 2 {
            continue;
        }
        match args[0].as_str() {
            "-P" | "-N" => table.chains.push(args.swap_remove(1)),
            "-A" => {
                let chain = args.remove(1);
                args.remove(0);
                table.rules.push(SavedRule { chain, args });
            }
            _ => {}
        }
    }
    table
}

/// Splits a save line into arguments the way `iptables-restore` does:
/// whitespace separates, double quotes group, backslash escapes inside
/// quotes.
fn tokenize(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut in_token = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '"' => {
                quoted = !quoted;
                in_token = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_token {
                    args.push(std::mem::take(&mut current));
                    in_token = false;
                }
            }
            c => {
                current.push(c);
                in_token = true;
            }
        }
    }
    if in_token {
        args.push(current);
    }
    args
}

/// Quotes an argument for an `iptables-restore` input line, the inverse of
/// [`tokenize`] (and what `iptables-save` prints).
fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && !arg
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '\'');
    if plain {
        return arg.to_owned();
    }
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    for c in arg.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// One restore/save line: `head` is e.g. `-A POSTROUTING` or `-I CHAIN 1`.
pub(crate) fn line(head: &str, args: &[String]) -> String {
    let mut l = head.to_owned();
    for a in args {
        l.push(' ');
        l.push_str(&quote(a));
    }
    l.push('\n');
    l
}

/// Owned copies of `parts`, for rule arguments.
pub(crate) fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// The `target` of messages about `chain`.
pub(crate) fn target(chain: &str) -> String {
    format!("table nat chain {chain}")
}

/// What `iptables` (both variants, also inside `iptables-restore`) says when
/// a chain does not exist.
const NO_SUCH_CHAIN: &str = "No chain/target/match by that name";

/// The input that deletes every jump to one of `chains` (by its full text, from the
/// chains that stay), then flushes and deletes those of `chains` that exist; `None`
/// when there is nothing to do.
pub(crate) fn removal_input(chains: &[String], current: &NatTable) -> Option<String> {
    let mut body = String::new();
    for rule in &current.rules {
        let doomed_source = chains.contains(&rule.chain);
        if !doomed_source && chains.iter().any(|c| rule.jumps_to(c)) {
            body.push_str(&line(&format!("-D {}", rule.chain), &rule.args));
        }
    }
    for chain in chains.iter().filter(|c| current.has_chain(c)) {
        body.push_str(&format!("-F {chain}\n"));
    }
    for chain in chains.iter().filter(|c| current.has_chain(c)) {
        body.push_str(&format!("-X {chain}\n"));
    }
    (!body.is_empty()).then(|| format!("*nat\n{body}COMMIT\n"))
}

/// How a feature names its per-container chains and comments the rules in them or
/// jumping to them (`<kind>name: "<network>" id: "<containerID>"`), which is what
/// tells GC whose a chain is.
pub(crate) struct ContainerChains {
    /// What precedes `name:` in the comments (`""` for masquerade, `"dnat "` for host
    /// ports).
    pub(crate) kind: &'static str,
    /// What every such chain's name starts with.
    pub(crate) prefix: &'static str,
    /// The chain of a network and container ID.
    pub(crate) chain_of: fn(&str, &str) -> String,
}

impl ContainerChains {
    /// Whether `chain`, seen with a rule commented `comment`, is `network`'s chain of a
    /// container not in `valid`: the comment names `network` and a container that is
    /// not valid, and the chain's name is their hash (so chains of other networks or
    /// other software are never touched); or iptables cut the comment (a long
    /// container ID) and the chain is no valid container's.
    pub(crate) fn is_stale(
        &self,
        network: &str,
        valid: &HashSet<&str>,
        chain: &str,
        comment: &str,
    ) -> bool {
        if !chain.starts_with(self.prefix) {
            return false;
        }
        match comment
            .strip_prefix(self.kind)
            .and_then(parse_iptables_comment)
        {
            Some((net, cid)) => {
                net == network
                    && (self.chain_of)(&net, &cid) == chain
                    && !valid.contains(cid.as_str())
            }
            None => {
                truncated_comment_of(comment, self.kind, network)
                    && !valid.iter().any(|id| (self.chain_of)(network, id) == chain)
            }
        }
    }
}

/// iptables keeps at most this many bytes of a comment (longer ones are cut silently).
const COMMENT_KEPT: usize = 255;

/// Whether `comment` is one of ours for `network` that iptables cut (a long container
/// ID): it then names no container, and the chain's name tells whether it is a valid
/// one's, so that GC still finds what ADD made. `kind` is what precedes `name:` in
/// the comment.
fn truncated_comment_of(comment: &str, kind: &str, network: &str) -> bool {
    let prefix = format!("{kind}name: {} id: \"", go_quote(network));
    comment.len() >= COMMENT_KEPT - 1 && comment.starts_with(&prefix)
}

/// Reads the nat table of `family`.
pub(crate) fn save(family: Family) -> Result<NatTable> {
    exec::run(family.save_program(), &["-t", "nat"], None, "table nat").map(|out| parse_save(&out))
}

/// Reads one chain of the nat table of `family` (`iptables -S`): with
/// iptables-nft this fetches that chain's rules, not the whole table.
pub(crate) fn list(family: Family, chain: &str) -> Result<NatTable> {
    exec::run(
        family.name(),
        &["--wait=30", "-t", "nat", "-S", chain],
        None,
        &target(chain),
    )
    .map(|out| parse_listing(&out))
}

pub(crate) fn restore(family: Family, input: &str, target: &str) -> Result<()> {
    exec::run(
        family.restore_program(),
        RESTORE_ARGS,
        Some(input.as_bytes()),
        target,
    )
    .map(drop)
}

/// Whether `error` is the tool saying that a chain does not exist.
pub(crate) fn is_no_such_chain(error: &Error) -> bool {
    matches!(error, Error::Command { stderr, .. } if stderr.contains(NO_SUCH_CHAIN))
}

/// Runs `work` for each family at once: the v4 and v6 tables are independent, and each
/// family's read + restore is a few milliseconds of process start and kernel commit.
pub(crate) fn per_family<T: Send>(
    families: &[Family],
    work: impl Fn(Family) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = families
            .iter()
            .map(|&family| scope.spawn(move || work(family)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// Whether iptables works here: the tools exist and the nat table can be
/// read. One small built-in chain is read rather than the whole table, which
/// grows with the pods (this runs on every operation without an
/// `ipMasqBackend`).
pub(crate) fn usable() -> bool {
    exec::locate(Family::V4.restore_program()).is_some() && list(Family::V4, "OUTPUT").is_ok()
}

/// Whether the iptables tools are installed at all (the reference's
/// tie-breaker when neither backend passes its full check).
pub(crate) fn installed() -> bool {
    exec::locate(Family::V4.restore_program()).is_some()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const COMMENT: &str = r#"name: "mynet" id: "ctrA""#;
    pub(crate) const CHAIN: &str = "CNI-f55d1ff5e9696738bd206b7d";

    /// `iptables-save -t nat` after the reference bridge plugin's ADD of
    /// `mynet`/`ctrA` (as the reference bridge plugin leaves it, iptables-nft 1.8.9), plus foreign rules.
    pub(crate) const SAVED: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables) on Sun Nov 22 05:39:25 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-f55d1ff5e9696738bd206b7d - [0:0]
:CNI-0123456789abcdef01234567 - [0:0]
:KUBE-POSTROUTING - [0:0]
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j CNI-f55d1ff5e9696738bd206b7d
-A POSTROUTING -s 10.77.0.3/32 -m comment --comment "name: \"mynet\" id: \"ctrB\"" -j CNI-0123456789abcdef01234567
-A CNI-f55d1ff5e9696738bd206b7d -d 10.77.0.0/24 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j ACCEPT
-A CNI-f55d1ff5e9696738bd206b7d ! -d 224.0.0.0/4 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j MASQUERADE
-A KUBE-POSTROUTING -j RETURN
COMMIT
# Completed on Sun Nov 22 05:39:25 2026
"#;

    #[test]
    fn parses_save_output() {
        let t = parse_save(SAVED);
        assert_eq!(t.chains.len(), 7);
        assert!(t.has_chain(CHAIN));
        assert_eq!(t.rules.len(), 6);
        assert_eq!(t.rules[1].chain, "POSTROUTING");
        assert_eq!(
            t.rules[1].args,
            strings(&[
                "-s",
                "10.77.0.2/32",
                "-m",
                "comment",
                "--comment",
                COMMENT,
                "-j",
                CHAIN
            ])
        );
        assert_eq!(t.rules[1].comment(), Some(COMMENT));
        assert_eq!(t.rules.iter().filter(|r| r.jumps_to(CHAIN)).count(), 1);
    }

    #[test]
    fn ignores_other_tables() {
        let t = parse_save("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\nCOMMIT\n");
        assert_eq!(t, NatTable::default());
    }

    #[test]
    fn quote_round_trips_through_tokenize() {
        for arg in [COMMENT, "plain", "", "a b", r"back\slash", "it's"] {
            let l = format!("-A X {}", quote(arg));
            assert_eq!(tokenize(&l), strings(&["-A", "X", arg]), "{l}");
        }
    }

    #[test]
    fn parses_chain_listings() {
        let post = parse_listing(
            r#"-P POSTROUTING ACCEPT
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"mynet\" id: \"ctrA\"" -j CNI-f55d1ff5e9696738bd206b7d
"#,
        );
        let saved = parse_save(SAVED);
        assert_eq!(post.chains, strings(&["POSTROUTING"]));
        assert_eq!(post.rules.len(), 2);
        assert_eq!(&post.rules[..], &saved.rules[..2]);

        let own = parse_listing(&format!(
            "-N {CHAIN}\n-A {CHAIN} -d 10.77.0.0/24 -m comment --comment \"name: \\\"mynet\\\" id: \\\"ctrA\\\"\" -j ACCEPT\n"
        ));
        assert_eq!(own.chains, strings(&[CHAIN]));
        assert_eq!(own.rules, saved.rules[3..4].to_vec());
        assert_eq!(parse_listing(""), NatTable::default());
        assert_eq!(parse_listing("-A\n-N\n\n"), NatTable::default());
    }

    #[test]
    fn recognises_absent_chain_errors() {
        let err = |stderr: &str| Error::Command {
            program: "iptables-restore".into(),
            target: "x".into(),
            status: "exit status: 1".into(),
            stderr: stderr.into(),
        };
        assert!(is_no_such_chain(&err(
            "iptables-nft-restore: line 2 failed: No chain/target/match by that name.\n"
        )));
        assert!(is_no_such_chain(&err(
            "iptables: No chain/target/match by that name.\n"
        )));
        assert!(!is_no_such_chain(&err("iptables-restore: line 2 failed\n")));
        assert!(!is_no_such_chain(&Error::ProgramNotFound {
            program: "iptables".into(),
            searched: String::new(),
        }));
    }

    #[test]
    fn stale_chains_are_judged_by_comment_and_name() {
        use crate::naming::{hostport_comment, hostport_dnat_chain, iptables_chain_name};
        let masq = ContainerChains {
            kind: "",
            prefix: "CNI-",
            chain_of: iptables_chain_name,
        };
        let a = iptables_chain_name("mynet", "ctrA");
        let valid: HashSet<&str> = ["ctrB"].into();
        assert!(masq.is_stale("mynet", &valid, &a, COMMENT));
        assert!(!masq.is_stale("othernet", &valid, &a, COMMENT));
        assert!(!masq.is_stale("mynet", &["ctrA"].into(), &a, COMMENT));
        // The comment's container must be the one the chain's name is the hash of.
        let b = iptables_chain_name("mynet", "ctrB");
        assert!(!masq.is_stale("mynet", &HashSet::new(), &b, COMMENT));
        // A host port comment is not a masquerade one.
        let dnat = hostport_comment("mynet", "ctrA");
        assert!(!masq.is_stale("mynet", &valid, &a, &dnat));

        let hostport = ContainerChains {
            kind: "dnat ",
            prefix: "CNI-DN-",
            chain_of: hostport_dnat_chain,
        };
        let dn = hostport_dnat_chain("mynet", "ctrA");
        assert!(hostport.is_stale("mynet", &valid, &dn, &dnat));
        assert!(!hostport.is_stale("mynet", &valid, &dn, COMMENT));
        assert!(!hostport.is_stale("mynet", &valid, &a, &dnat));

        // A container ID so long that iptables cut the comment: the chain's name says
        // whether it is a valid container's.
        let long = "c".repeat(300);
        let cut = hostport_comment("mynet", &long);
        let long_chain = hostport_dnat_chain("mynet", &long);
        assert!(hostport.is_stale("mynet", &valid, &long_chain, &cut));
        assert!(!hostport.is_stale("mynet", &[long.as_str()].into(), &long_chain, &cut));
        assert!(!hostport.is_stale("othernet", &valid, &long_chain, &cut));
    }
}
