//! The socket ([`Nfnl`]): requests and their acknowledgements, a batch committed as
//! one transaction, dumps of tables, chains and rules, and sockets kept open past
//! their use where closing one would block.

use super::*;

/// A `NETLINK_NETFILTER` socket in the calling thread's network namespace.
#[derive(Debug)]
pub(crate) struct Nfnl {
    /// Always `Some` until dropped.
    pub(super) sock: Option<Socket>,
}

/// Closing a netfilter socket can block for an RCU grace period (several
/// ms): on `NETLINK_URELEASE` nf_tables flushes the deferred destruction of
/// what recent transactions removed (ours or anyone's), which waits for
/// `synchronize_rcu()`. Every answer has been read by then, so the close is
/// handed to a short-lived thread and the caller goes on with its other
/// work; a process that exits right away still waits for it in `exit`, as it
/// would have in `close`.
///
/// While a [`SocketsKept`] guard exists the socket is kept open instead, and
/// closed when the guard goes: the caller picks a moment when that wait is
/// over, or at least holds nothing up.
impl Drop for Nfnl {
    fn drop(&mut self) {
        let Some(sock) = self.sock.take() else {
            return;
        };
        let sock = match KEPT.lock() {
            Ok(mut kept) if kept.guards > 0 => {
                kept.sockets.push(sock);
                return;
            }
            _ => sock,
        };
        // If no thread can be started, the closure (and the socket with
        // it) is dropped here, closing synchronously.
        let _ = std::thread::Builder::new()
            .name("nfnl-close".into())
            .spawn(move || drop(sock));
    }
}

/// Sockets whose close is put off while guards exist (see [`keep_sockets`]).
#[derive(Debug, Default)]
pub(super) struct Kept {
    pub(super) guards: usize,
    pub(super) sockets: Vec<Socket>,
}

pub(super) static KEPT: std::sync::Mutex<Kept> = std::sync::Mutex::new(Kept {
    guards: 0,
    sockets: Vec::new(),
});

/// Keeps every netfilter socket the process is done with open until the
/// returned guard is dropped.
///
/// Why: releasing the socket waits while the kernel finishes freeing a recent
/// transaction (an RCU grace period), and measured, a release during the
/// deletion of a network device in that netns delays the deletion by that
/// wait (we believe both take the netns's nf_tables commit mutex): a DEL
/// that removed rules took 8.5 ms longer. Closing after the deletion, when
/// the freeing is long done, costs nothing.
pub fn keep_sockets() -> SocketsKept {
    if let Ok(mut kept) = KEPT.lock() {
        kept.guards += 1;
    }
    SocketsKept(())
}

/// See [`keep_sockets`]; the last guard to go closes the kept sockets.
#[derive(Debug)]
pub struct SocketsKept(());

impl Drop for SocketsKept {
    fn drop(&mut self) {
        let sockets = match KEPT.lock() {
            Ok(mut kept) => {
                kept.guards = kept.guards.saturating_sub(1);
                if kept.guards > 0 {
                    return;
                }
                std::mem::take(&mut kept.sockets)
            }
            Err(_) => return,
        };
        drop(sockets);
    }
}

impl Nfnl {
    /// Opens the socket (in the calling thread's network namespace).
    pub(crate) fn open() -> Result<Nfnl> {
        let sock = Socket::open(NETLINK_NETFILTER)
            .map_err(|e| io_error("netlink socket (NETLINK_NETFILTER)", &e))?;
        Ok(Nfnl { sock: Some(sock) })
    }

    pub(super) fn socket(&mut self, target: &str) -> Result<&mut Socket> {
        self.sock
            .as_mut()
            .ok_or_else(|| nl_error(target, "the netlink socket is closed"))
    }

    /// Runs `batch` as one kernel transaction: all of it or nothing. Every
    /// refused message is reported, named in nft syntax.
    pub(crate) fn commit(&mut self, batch: Batch, target: &str) -> Result<()> {
        let sock = self.socket(target)?;
        let base = sock.last_seq();
        let (mut bytes, ops) = batch.finish();
        // A large transaction asks for the acknowledgement of its last change only:
        // the kernel answers every change that asks with a datagram of its own, which
        // would overflow the receive buffer. Refusals are sent whatever the flags, and
        // the kernel queues every answer of a batch once it has processed all of it,
        // so the last change's acknowledgement still says the whole batch went in.
        let sparse = ops.len() > ACK_EACH_UP_TO;
        // Renumber into this socket's sequence space so a reply from an
        // earlier request can never be mistaken for one of these.
        let mut offset = 0;
        let mut last = base;
        while offset + NLMSG_HDRLEN <= bytes.len() {
            let len = u32::from_ne_bytes(bytes[offset..offset + 4].try_into().unwrap_or_default())
                as usize;
            let seq = u32::from_ne_bytes(
                bytes[offset + 8..offset + 12]
                    .try_into()
                    .unwrap_or_default(),
            );
            if sparse && seq >= 1 && (seq as usize) < ops.len() {
                let flags = u16::from_ne_bytes([bytes[offset + 6], bytes[offset + 7]]) & !NLM_F_ACK;
                bytes[offset + 6..offset + 8].copy_from_slice(&flags.to_ne_bytes());
            }
            last = base.wrapping_add(seq);
            bytes[offset + 8..offset + 12].copy_from_slice(&last.to_ne_bytes());
            offset += len.max(NLMSG_HDRLEN).next_multiple_of(4);
        }
        sock.set_last_seq(last);
        // Room for the whole transaction in one datagram, and for the refusals of a
        // large one (small ones fit the default buffers, and save the system calls).
        if sparse || bytes.len() > SMALL_BATCH_BYTES {
            sock.reserve_buffers(bytes.len(), 1 << 20);
        }
        sock.send(&bytes).map_err(|e| netlink_error(target, e))?;

        let mut acked = vec![sparse; ops.len()];
        if let Some(last) = acked.last_mut() {
            *last = false;
        }
        let mut errors = Vec::new();
        while let Some(datagram) = sock.recv(true).map_err(|e| netlink_error(target, e))? {
            for msg in messages(datagram) {
                let msg = msg.map_err(|e| nl_error(target, e.to_string()))?;
                if msg.ty != NLMSG_ERROR {
                    continue;
                }
                let code = msg.error_code().unwrap_or(libc::EINVAL);
                let index = msg.seq.wrapping_sub(base).wrapping_sub(1) as usize;
                let refusal = |what: String| kernel_error(what, code, msg.ext_ack_message());
                match ops.get(index) {
                    Some(_) if code == 0 => acked[index] = true,
                    Some((_, what)) => {
                        acked[index] = true;
                        errors.push(refusal(what.clone()));
                    }
                    // The batch framing itself (begin/end) or the commit.
                    None if code != 0 => {
                        errors.push(refusal(format!("{target} (transaction)")));
                    }
                    None => {}
                }
            }
        }
        if errors.is_empty() && acked.iter().any(|a| !a) {
            errors.push(nl_error(
                target,
                "the kernel did not acknowledge every change of the transaction",
            ));
        }
        Error::collect(errors)
    }

    /// Sends a one-message request and returns the answers of a dump (or
    /// the single reply of a get), failing on a kernel error.
    pub(super) fn request(
        &mut self,
        ty: u16,
        flags: u16,
        family: u8,
        attrs: impl FnOnce(&mut Writer),
        target: &str,
    ) -> Result<Vec<(u16, u16, Vec<u8>)>> {
        let sock = self.socket(target)?;
        let mut w = Writer::default();
        let msg = w.begin_msg(
            (NFNL_SUBSYS_NFTABLES << 8) | ty,
            NLM_F_REQUEST | flags,
            sock.next_seq(),
            family,
            0,
        );
        attrs(&mut w);
        w.end_msg(msg);
        let mut out = Vec::new();
        sock.request(w.as_bytes(), |msg| {
            out.push((msg.ty, msg.flags, msg.payload.to_vec()));
        })
        .map_err(|e| netlink_error(target, e))?;
        Ok(out)
    }

    /// Runs a dump request of type `ty` and returns the payloads of its `answer`
    /// messages. A dump that overlaps a change is flagged as interrupted, and read
    /// again.
    pub(super) fn dump(
        &mut self,
        ty: u16,
        answer: u16,
        family: u8,
        attrs: impl Fn(&mut Writer),
        target: &str,
    ) -> Result<Vec<Vec<u8>>> {
        for _ in 0..10 {
            let answers = self.request(ty, NLM_F_DUMP, family, &attrs, target)?;
            if answers
                .iter()
                .any(|(_, flags, _)| flags & NLM_F_DUMP_INTR != 0)
            {
                continue;
            }
            return Ok(answers
                .into_iter()
                .filter(|(t, _, _)| *t == (NFNL_SUBSYS_NFTABLES << 8) | answer)
                .map(|(_, _, payload)| payload)
                .collect());
        }
        Err(nl_error(
            target,
            "the rule set kept changing during the dump",
        ))
    }

    /// All rules of `table` (of one chain if given), in chain order.
    pub(crate) fn rules(
        &mut self,
        family: u8,
        table: &str,
        chain: Option<&str>,
    ) -> Result<Vec<Rule>> {
        self.rules_decoding(family, table, chain, &|_| true)
    }

    /// [`Nfnl::rules`], with the expressions decoded only for the chains `decode`
    /// names.
    pub(crate) fn rules_decoding(
        &mut self,
        family: u8,
        table: &str,
        chain: Option<&str>,
        decode: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Rule>> {
        let target = match chain {
            Some(c) => format!("list chain {} {table} {c}", family_name(family)),
            None => format!("list table {} {table}", family_name(family)),
        };
        self.dump(
            NFT_MSG_GETRULE,
            NFT_MSG_NEWRULE,
            family,
            |w| {
                w.attr_str(NFTA_RULE_TABLE, table);
                if let Some(chain) = chain {
                    w.attr_str(NFTA_RULE_CHAIN, chain);
                }
            },
            &target,
        )?
        .iter()
        .map(|payload| {
            parse_rule_of(payload, decode)
                .ok_or_else(|| nl_error(&target, "malformed rule in dump"))
        })
        .collect()
    }

    /// Whether table `table` exists.
    pub(crate) fn has_table(&mut self, family: u8, table: &str) -> Result<bool> {
        let target = format!("table {} {table}", family_name(family));
        absent_is_false(self.request(
            NFT_MSG_GETTABLE,
            0,
            family,
            |w| w.attr_str(NFTA_TABLE_NAME, table),
            &target,
        ))
    }

    /// Whether chain `chain` exists in table `table`.
    pub(crate) fn has_chain(&mut self, family: u8, table: &str, chain: &str) -> Result<bool> {
        let target = format!("chain {} {table} {chain}", family_name(family));
        absent_is_false(self.request(
            NFT_MSG_GETCHAIN,
            0,
            family,
            |w| {
                w.attr_str(NFTA_CHAIN_TABLE, table);
                w.attr_str(NFTA_CHAIN_NAME, chain);
            },
            &target,
        ))
    }

    /// Names of the chains of `table` (empty when the table does not exist).
    pub(crate) fn chain_names(&mut self, family: u8, table: &str) -> Result<Vec<String>> {
        let target = format!("list chains {} {table}", family_name(family));
        Ok(self
            .dump(NFT_MSG_GETCHAIN, NFT_MSG_NEWCHAIN, family, |_| {}, &target)?
            .iter()
            .filter_map(|payload| {
                let body = payload.get(NFGENMSG_LEN..)?;
                let in_table = attr(body, NFTA_CHAIN_TABLE).map(c_string)? == table;
                in_table.then(|| attr(body, NFTA_CHAIN_NAME).map(c_string))?
            })
            .collect())
    }

    /// Whether set `set` has an element with key `key` (false when the set is missing).
    pub(crate) fn has_element(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        key: &[u8],
    ) -> Result<bool> {
        let target = format!(
            "get element {} {table} {set} {{ {} }}",
            family_name(family),
            printable_key(key)
        );
        absent_is_false(self.request(
            NFT_MSG_GETSETELEM,
            0,
            family,
            |w| {
                w.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
                w.attr_str(NFTA_SET_ELEM_LIST_SET, set);
                let list = w.nest_start(NFTA_SET_ELEM_LIST_ELEMENTS);
                let elem = w.nest_start(NFTA_LIST_ELEM);
                w.data_value(NFTA_SET_ELEM_KEY, key);
                w.nest_end(elem);
                w.nest_end(list);
            },
            &target,
        ))
    }

    /// Asks for the rule set generation: succeeds when nf_tables is
    /// available and we may use it.
    pub(crate) fn generation(&mut self) -> Result<()> {
        self.generation_id().map(drop)
    }

    /// The rule set's generation, which every committed change moves on.
    pub(crate) fn generation_id(&mut self) -> Result<u32> {
        let target = "nf_tables generation";
        self.request(NFT_MSG_GETGEN, 0, 0, |_| {}, target)?
            .iter()
            .find_map(|(_, _, payload)| attr_u32(payload.get(NFGENMSG_LEN..)?, NFTA_GEN_ID))
            .ok_or_else(|| nl_error(target, "no generation in the answer"))
    }
}

pub(super) fn absent_is_false(answer: Result<Vec<(u16, u16, Vec<u8>)>>) -> Result<bool> {
    match answer {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether nf_tables works here: the socket opens and the kernel answers.
pub(crate) fn usable() -> bool {
    Nfnl::open().and_then(|mut nl| nl.generation()).is_ok()
}
