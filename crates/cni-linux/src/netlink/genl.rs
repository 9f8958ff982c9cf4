//! Generic netlink: the `genlmsghdr` every message of a generic family starts with,
//! and the controller (`nlctrl`) request that turns a family's name into the message
//! type its requests carry. A family's number is chosen by the kernel when the family
//! registers (when its module loads), so it is looked up by name, never written down.

use cni_netlink::wire::{NLM_F_ACK, NLM_F_REQUEST, attrs, c_string, u16_ne};
use cni_netlink::{Malformed, Message, Socket, Writer};

/// `NETLINK_GENERIC`, the protocol of generic netlink sockets.
pub(super) const NETLINK_GENERIC: isize = 16;

/// The controller's fixed family number (`GENL_ID_CTRL`).
const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_NEWFAMILY`: the controller's answer describing a family.
const CTRL_CMD_NEWFAMILY: u8 = 1;
/// `CTRL_CMD_GETFAMILY`.
const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID` (u16).
const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// `CTRL_ATTR_FAMILY_NAME` (string).
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// Length of `struct genlmsghdr`: command, version, two reserved bytes.
pub(super) const GENL_HDRLEN: usize = 4;

/// Writes a `genlmsghdr`.
pub(super) fn header(w: &mut Writer, cmd: u8, version: u8) {
    w.bytes(&[cmd, version, 0, 0]);
}

/// The command of a generic netlink message and the attributes after its header.
pub(super) fn split(payload: &[u8]) -> Result<(u8, &[u8]), Malformed> {
    let header = payload
        .get(..GENL_HDRLEN)
        .ok_or(Malformed("truncated genlmsghdr"))?;
    Ok((header[0], &payload[GENL_HDRLEN..]))
}

/// The controller's request for the family `name`.
fn get_family(w: &mut Writer, name: &str) {
    header(w, CTRL_CMD_GETFAMILY, 1);
    w.attr_str(CTRL_ATTR_FAMILY_NAME, name);
}

/// The family number in the controller's answer, if it is the answer about `name`.
fn family_id(msg: &Message<'_>, name: &str) -> Result<Option<u16>, Malformed> {
    if msg.ty != GENL_ID_CTRL {
        return Ok(None);
    }
    let (cmd, attributes) = split(msg.payload)?;
    if cmd != CTRL_CMD_NEWFAMILY {
        return Ok(None);
    }
    let (mut id, mut named) = (None, None);
    for attr in attrs(attributes) {
        let (ty, v) = attr?;
        match ty {
            CTRL_ATTR_FAMILY_ID => id = Some(u16_ne(v)?),
            CTRL_ATTR_FAMILY_NAME => named = Some(c_string(v)),
            _ => {}
        }
    }
    Ok(id.filter(|_| named.as_deref() == Some(name)))
}

/// Looks up the number of the generic netlink family `name` on `sock` (a
/// `NETLINK_GENERIC` socket). The kernel loads the family's module on demand; a
/// family it cannot find, loaded or loadable, is `ENOENT`.
pub(super) fn resolve(sock: &mut Socket, name: &str) -> Result<u16, cni_netlink::Error> {
    let mut w = Writer::new();
    let start = w.begin_msg(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, sock.next_seq());
    get_family(&mut w, name);
    w.end_msg(start);
    let mut found = None;
    let mut bad = None;
    sock.request(w.as_bytes(), |msg| match family_id(msg, name) {
        Ok(Some(id)) => found = Some(id),
        Ok(None) => {}
        Err(e) => bad = Some(e),
    })?;
    match (found, bad) {
        (Some(id), _) => Ok(id),
        (None, Some(malformed)) => Err(malformed.into()),
        (None, None) => Err(Malformed("the controller's answer names no family number").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::{hex, message};

    #[test]
    fn the_family_request_is_what_genl_ctrl_get_sends() {
        // nlmsghdr (type GENL_ID_CTRL, REQUEST|ACK), genlmsghdr (GETFAMILY, version
        // 1), CTRL_ATTR_FAMILY_NAME "wireguard\0" padded to 16.
        let got = message(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, |w| {
            get_family(w, "wireguard");
        });
        let want = hex("24000000 1000 0500 01000000 00000000 \
             03010000 \
             0e000200 77697265 67756172 64000000");
        assert_eq!(got, want);
    }

    #[test]
    fn the_answer_gives_the_number_of_the_family_asked_for_only() {
        let answer = message(GENL_ID_CTRL, 0, |w| {
            header(w, CTRL_CMD_NEWFAMILY, 2);
            w.attr_str(CTRL_ATTR_FAMILY_NAME, "wireguard");
            w.attr_u16(CTRL_ATTR_FAMILY_ID, 0x22);
            w.attr_u32(3, 1); // CTRL_ATTR_VERSION, skipped
        });
        let msg = cni_netlink::messages(&answer).next().unwrap().unwrap();
        assert_eq!(family_id(&msg, "wireguard"), Ok(Some(0x22)));
        assert_eq!(family_id(&msg, "other"), Ok(None));
        let short = message(GENL_ID_CTRL, 0, |_| {});
        let msg = cni_netlink::messages(&short).next().unwrap().unwrap();
        assert_eq!(
            family_id(&msg, "wireguard"),
            Err(Malformed("truncated genlmsghdr"))
        );
        let odd = message(GENL_ID_CTRL, 0, |w| {
            header(w, CTRL_CMD_NEWFAMILY, 2);
            w.attr_u32(CTRL_ATTR_FAMILY_ID, 0x22);
        });
        let msg = cni_netlink::messages(&odd).next().unwrap().unwrap();
        assert!(family_id(&msg, "wireguard").is_err());
    }

    #[test]
    fn a_family_the_kernel_does_not_have_is_enoent() {
        // Needs no privilege: any process may ask the controller. (A name is at
        // most 15 bytes, or the request is refused as invalid.)
        let mut sock = Socket::open(NETLINK_GENERIC).unwrap();
        let err = resolve(&mut sock, "cnirs-nofamily").unwrap_err();
        assert_eq!(
            err.errno(),
            Some(nix::errno::Errno::ENOENT as i32),
            "{err:?}"
        );
        assert_eq!(resolve(&mut sock, "nlctrl").unwrap(), GENL_ID_CTRL);
    }
}
