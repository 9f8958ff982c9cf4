//! One transaction ([`Batch`]): tables, chains and rules added or deleted (sets and
//! elements are in the `sets` module), each message remembered with its description
//! so an error names what failed.

use super::*;

/// One transaction: the messages between a batch begin and end.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(super) w: Writer,
    pub(super) next_seq: u32,
    /// Sequence number and description (nft syntax) of each message.
    pub(super) ops: Vec<(u32, String)>,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Self::begin_batch(None)
    }

    /// A transaction the kernel runs only if the rule set is still at
    /// `generation` (see [`Nfnl::generation_id`]); otherwise it fails as a
    /// whole with ERESTART ([`is_restart`]).
    pub(crate) fn at_generation(generation: u32) -> Batch {
        Self::begin_batch(Some(generation))
    }

    pub(super) fn begin_batch(generation: Option<u32>) -> Batch {
        let mut batch = Batch {
            w: Writer::default(),
            next_seq: 1,
            ops: Vec::new(),
        };
        let start = batch.w.begin_msg(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        if let Some(generation) = generation {
            batch.w.attr_u32(NFNL_BATCH_GENID, generation);
        }
        batch.w.end_msg(start);
        batch
    }

    /// Number of changes in the batch.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    pub(super) fn begin(&mut self, ty: u16, flags: u16, family: u8, what: String) -> usize {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ops.push((seq, what));
        self.w.begin_msg(
            (NFNL_SUBSYS_NFTABLES << 8) | ty,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            seq,
            family,
            0,
        )
    }

    /// `add table` (no error if it exists).
    pub(crate) fn add_table(
        &mut self,
        family: u8,
        name: &str,
        comment: Option<&str>,
    ) -> Result<()> {
        let what = format!("add table {} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_NEWTABLE, NLM_F_CREATE, family, what);
        self.w.attr_str(NFTA_TABLE_NAME, name);
        self.w.attr_u32(NFTA_TABLE_FLAGS, 0);
        if let Some(comment) = comment {
            self.w.attr(NFTA_TABLE_USERDATA, &udata_comment(comment)?);
        }
        self.w.end_msg(msg);
        Ok(())
    }

    /// `add chain` (no error if it exists with the same hook).
    pub(crate) fn add_chain(
        &mut self,
        family: u8,
        table: &str,
        name: &str,
        hook: Option<Hook<'_>>,
        comment: Option<&str>,
    ) -> Result<()> {
        let what = format!("add chain {} {table} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, what);
        self.w.attr_str(NFTA_CHAIN_TABLE, table);
        self.w.attr_str(NFTA_CHAIN_NAME, name);
        if let Some(hook) = hook {
            self.w.attr_str(NFTA_CHAIN_TYPE, hook.chain_type);
            let nest = self.w.nest_start(NFTA_CHAIN_HOOK);
            self.w.attr_u32(NFTA_HOOK_HOOKNUM, hook.hooknum);
            self.w
                .attr(NFTA_HOOK_PRIORITY, &hook.priority.to_be_bytes());
            self.w.nest_end(nest);
            if let Some(policy) = hook.policy {
                self.w.attr_u32(NFTA_CHAIN_POLICY, policy);
            }
        }
        if let Some(comment) = comment {
            self.w.attr(NFTA_CHAIN_USERDATA, &udata_comment(comment)?);
        }
        self.w.end_msg(msg);
        Ok(())
    }

    /// `flush chain`: deletes all its rules.
    pub(crate) fn flush_chain(&mut self, family: u8, table: &str, chain: &str) {
        let what = format!("flush chain {} {table} {chain}", family_name(family));
        let msg = self.begin(NFT_MSG_DELRULE, 0, family, what);
        self.w.attr_str(NFTA_RULE_TABLE, table);
        self.w.attr_str(NFTA_RULE_CHAIN, chain);
        self.w.end_msg(msg);
    }

    /// `delete table` with everything in it.
    pub(crate) fn delete_table(&mut self, family: u8, name: &str) {
        let what = format!("delete table {} {name}", family_name(family));
        let msg = self.begin(NFT_MSG_DELTABLE, 0, family, what);
        self.w.attr_str(NFTA_TABLE_NAME, name);
        self.w.end_msg(msg);
    }

    /// `delete chain` (it must be empty and unreferenced).
    pub(crate) fn delete_chain(&mut self, family: u8, table: &str, chain: &str) {
        let what = format!("delete chain {} {table} {chain}", family_name(family));
        let msg = self.begin(NFT_MSG_DELCHAIN, 0, family, what);
        self.w.attr_str(NFTA_CHAIN_TABLE, table);
        self.w.attr_str(NFTA_CHAIN_NAME, chain);
        self.w.end_msg(msg);
    }

    /// The changes in nft syntax, in order (for tests).
    #[cfg(test)]
    pub(crate) fn describe(&self) -> Vec<&str> {
        self.ops.iter().map(|(_, what)| what.as_str()).collect()
    }

    /// `add rule` (appended at the end of the chain).
    pub(crate) fn add_rule(
        &mut self,
        family: u8,
        table: &str,
        chain: &str,
        exprs: &[Expr],
        comment: Option<&str>,
    ) -> Result<()> {
        let what = match comment {
            Some(c) => format!(
                "add rule {} {table} {chain} (comment \"{c}\")",
                family_name(family)
            ),
            None => format!("add rule {} {table} {chain}", family_name(family)),
        };
        let msg = self.begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, what);
        self.w.attr_str(NFTA_RULE_TABLE, table);
        self.w.attr_str(NFTA_RULE_CHAIN, chain);
        let list = self.w.nest_start(NFTA_RULE_EXPRESSIONS);
        for expr in exprs {
            self.w.expr(expr);
        }
        self.w.nest_end(list);
        if let Some(comment) = comment {
            self.w.attr(NFTA_RULE_USERDATA, &udata_comment(comment)?);
        }
        self.w.end_msg(msg);
        Ok(())
    }

    /// `delete rule ... handle N`.
    pub(crate) fn delete_rule(&mut self, family: u8, table: &str, chain: &str, handle: u64) {
        let what = format!(
            "delete rule {} {table} {chain} handle {handle}",
            family_name(family)
        );
        let msg = self.begin(NFT_MSG_DELRULE, 0, family, what);
        self.w.attr_str(NFTA_RULE_TABLE, table);
        self.w.attr_str(NFTA_RULE_CHAIN, chain);
        self.w.attr(NFTA_RULE_HANDLE, &handle.to_be_bytes());
        self.w.end_msg(msg);
    }

    /// The finished batch as sent to the kernel.
    pub(super) fn finish(mut self) -> (Vec<u8>, Vec<(u32, String)>) {
        let seq = self.next_seq;
        let start = self.w.begin_msg(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        self.w.end_msg(start);
        (self.w.w.into_bytes(), self.ops)
    }
}

/// A set key for messages: its text up to the first NUL (interface names), or hex.
pub(super) fn printable_key(key: &[u8]) -> String {
    let text = key.split(|b| *b == 0).next().unwrap_or_default();
    match std::str::from_utf8(text) {
        Ok(t) if !t.is_empty() && t.chars().all(|c| c.is_ascii_graphic()) => format!("\"{t}\""),
        _ => key.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// nft's name of a table family.
pub(crate) fn family_name(family: u8) -> &'static str {
    match family {
        NFPROTO_INET => "inet",
        NFPROTO_IPV4 => "ip",
        NFPROTO_IPV6 => "ip6",
        NFPROTO_BRIDGE => "bridge",
        _ => "unknown-family",
    }
}
