//! The netlink wire format (linux/netlink.h): 16-byte message headers, then a
//! family header, then attributes (`len: u16, type: u16, value`, padded to 4
//! bytes), which may nest. Integers are in host byte order unless a family says
//! otherwise (nf_tables: network order).

/// Length of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

/// Message types every netlink family shares.
pub const NLMSG_NOOP: u16 = 1;
/// An error, or with errno 0 an acknowledgement.
pub const NLMSG_ERROR: u16 = 2;
/// End of a dump.
pub const NLMSG_DONE: u16 = 3;

/// Request flags.
pub const NLM_F_REQUEST: u16 = 0x1;
/// Ask for an acknowledgement.
pub const NLM_F_ACK: u16 = 0x4;
/// A dump that overlapped a change and may be inconsistent.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// Dump everything (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// Fail if the object exists (NEW requests).
pub const NLM_F_EXCL: u16 = 0x200;
/// Create the object if it does not exist (NEW requests).
pub const NLM_F_CREATE: u16 = 0x400;
/// Add at the end of a list (NEW requests).
pub const NLM_F_APPEND: u16 = 0x800;
/// Replace an existing object in place (NEW requests).
pub const NLM_F_REPLACE: u16 = 0x100;
/// On an error: the request was not echoed back (`NETLINK_CAP_ACK`).
pub const NLM_F_CAPPED: u16 = 0x100;
/// On an error: extended-ack attributes follow.
pub const NLM_F_ACK_TLVS: u16 = 0x200;

/// Attribute type flag: the value is a list of attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type without its flags.
pub const NLA_TYPE_MASK: u16 = 0x3fff;

/// Extended ack: the kernel's text explaining a refusal.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// Framing or a value that does not match what it claims to be. Whatever the
/// kernel (or anyone) sends, decoding ends in this error, never in a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink data: {0}")]
pub struct Malformed(pub &'static str);

/// Builds netlink messages, one after the other, in one buffer.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a message with its netlink header (port id 0: the kernel);
    /// returns its offset for [`Writer::end_msg`]. The family header follows
    /// through [`Writer::bytes`].
    pub fn begin_msg(&mut self, ty: u16, flags: u16, seq: u32) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by end_msg
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        start
    }

    /// Writes the length of the message started at `start`.
    pub fn end_msg(&mut self, start: usize) {
        self.pad();
        let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Appends raw bytes (a family header such as `ifinfomsg`).
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// An attribute with `value` as it is, padded to 4 bytes.
    pub fn attr(&mut self, ty: u16, value: &[u8]) {
        let len = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, ty: u16, value: &str) {
        let len = u16::try_from(5 + value.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    /// A one-byte attribute.
    pub fn attr_u8(&mut self, ty: u16, value: u8) {
        self.attr(ty, &[value]);
    }

    /// A 16-bit attribute in host byte order.
    pub fn attr_u16(&mut self, ty: u16, value: u16) {
        self.attr(ty, &value.to_ne_bytes());
    }

    /// A 32-bit attribute in host byte order.
    pub fn attr_u32(&mut self, ty: u16, value: u32) {
        self.attr(ty, &value.to_ne_bytes());
    }

    /// A signed 32-bit attribute in host byte order.
    pub fn attr_i32(&mut self, ty: u16, value: i32) {
        self.attr(ty, &value.to_ne_bytes());
    }

    /// A 32-bit attribute in network byte order.
    pub fn attr_u32_be(&mut self, ty: u16, value: u32) {
        self.attr(ty, &value.to_be_bytes());
    }

    /// Starts a nested attribute of type `ty` (the caller adds
    /// [`NLA_F_NESTED`] where the family expects it); returns its offset for
    /// [`Writer::nest_end`].
    pub fn nest_start(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        start
    }

    /// Writes the length of the nested attribute started at `start`.
    pub fn nest_end(&mut self, start: usize) {
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        let padded = self.buf.len().next_multiple_of(4);
        self.buf.resize(padded, 0);
    }

    /// What was written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The finished buffer.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// One message of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// Message type.
    pub ty: u16,
    /// NLM_F_* flags.
    pub flags: u16,
    /// Sequence number (the request's, in an answer).
    pub seq: u32,
    /// Everything after the netlink header.
    pub payload: &'a [u8],
}

impl<'a> Message<'a> {
    /// For `NLMSG_ERROR`: the errno, positive, and 0 for an acknowledgement.
    pub fn error_code(&self) -> Result<i32, Malformed> {
        let code = i32_ne(
            self.payload
                .get(..4)
                .ok_or(Malformed("truncated error message"))?,
        )?;
        Ok(code.checked_neg().unwrap_or(i32::MAX))
    }

    /// For `NLMSG_ERROR`: the kernel's extended-ack text, if it sent one.
    pub fn ext_ack_message(&self) -> Option<String> {
        if self.flags & NLM_F_ACK_TLVS == 0 {
            return None;
        }
        // errno, then the request's header, then its payload unless capped.
        let original = self.payload.get(4..4 + NLMSG_HDRLEN)?;
        let skip = if self.flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            (u32_ne(&original[..4]).ok()? as usize).max(NLMSG_HDRLEN)
        };
        let tlvs = self.payload.get(4 + skip.next_multiple_of(4)..)?;
        attrs(tlvs)
            .map_while(Result::ok)
            .find(|(ty, _)| *ty == NLMSGERR_ATTR_MSG)
            .map(|(_, v)| c_string(v))
    }
}

/// Splits a datagram into messages. Framing that does not add up yields one
/// [`Malformed`] and ends the walk.
pub fn messages(datagram: &[u8]) -> impl Iterator<Item = Result<Message<'_>, Malformed>> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let Some(h) = rest.get(..NLMSG_HDRLEN) else {
            rest = &[];
            return Some(Err(Malformed("truncated netlink header")));
        };
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            rest = &[];
            return Some(Err(Malformed("netlink message length out of bounds")));
        }
        let msg = Message {
            ty: u16::from_ne_bytes([h[4], h[5]]),
            flags: u16::from_ne_bytes([h[6], h[7]]),
            seq: u32::from_ne_bytes([h[8], h[9], h[10], h[11]]),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some(Ok(msg))
    })
}

/// The attributes in `data`, as (type without flags, value). An attribute
/// whose length is below its header's or beyond the data yields one
/// [`Malformed`] and ends the walk; up to 3 bytes of trailing padding are fine.
pub fn attrs(data: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), Malformed>> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            // Padding after the last attribute, or nothing left.
            return if rest.iter().all(|b| *b == 0) {
                None
            } else {
                rest = &[];
                Some(Err(Malformed("truncated attribute header")))
            };
        }
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let ty = u16::from_ne_bytes([rest[2], rest[3]]) & NLA_TYPE_MASK;
        let Some(value) = rest.get(4..len).filter(|_| len >= 4) else {
            rest = &[];
            return Some(Err(Malformed("attribute length out of bounds")));
        };
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some(Ok((ty, value)))
    })
}

/// A one-byte value.
pub fn u8_value(v: &[u8]) -> Result<u8, Malformed> {
    match v {
        [b] => Ok(*b),
        _ => Err(Malformed("u8 attribute of another length")),
    }
}

/// A 16-bit value in host byte order.
pub fn u16_ne(v: &[u8]) -> Result<u16, Malformed> {
    Ok(u16::from_ne_bytes(v.try_into().map_err(|_| {
        Malformed("u16 attribute of another length")
    })?))
}

/// A 32-bit value in host byte order.
pub fn u32_ne(v: &[u8]) -> Result<u32, Malformed> {
    Ok(u32::from_ne_bytes(v.try_into().map_err(|_| {
        Malformed("u32 attribute of another length")
    })?))
}

/// A signed 32-bit value in host byte order.
pub fn i32_ne(v: &[u8]) -> Result<i32, Malformed> {
    Ok(i32::from_ne_bytes(v.try_into().map_err(|_| {
        Malformed("i32 attribute of another length")
    })?))
}

/// The text of a string attribute, up to its NUL (lossy on invalid UTF-8).
pub fn c_string(v: &[u8]) -> String {
    let text = v.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_with_nested_attributes_is_laid_out_as_the_kernel_expects() {
        let mut w = Writer::new();
        let msg = w.begin_msg(16, NLM_F_REQUEST | NLM_F_ACK, 7);
        w.bytes(&[0; 4]);
        w.attr_str(3, "ab");
        let nest = w.nest_start(18 | NLA_F_NESTED);
        w.attr_u8(1, 9);
        w.nest_end(nest);
        w.end_msg(msg);
        let mut want = Vec::new();
        want.extend_from_slice(&40u32.to_ne_bytes());
        want.extend_from_slice(&16u16.to_ne_bytes());
        want.extend_from_slice(&5u16.to_ne_bytes());
        want.extend_from_slice(&7u32.to_ne_bytes());
        want.extend_from_slice(&[0; 4]);
        want.extend_from_slice(&[0; 4]);
        // "ab\0": length 7, padded to 8.
        want.extend_from_slice(&7u16.to_ne_bytes());
        want.extend_from_slice(&3u16.to_ne_bytes());
        want.extend_from_slice(b"ab\0\0");
        // Nest of 12: its header and one 5-byte attribute padded to 8.
        want.extend_from_slice(&12u16.to_ne_bytes());
        want.extend_from_slice(&(18 | NLA_F_NESTED).to_ne_bytes());
        want.extend_from_slice(&5u16.to_ne_bytes());
        want.extend_from_slice(&1u16.to_ne_bytes());
        want.extend_from_slice(&[9, 0, 0, 0]);
        assert_eq!(w.as_bytes(), want);

        let msgs: Vec<_> = messages(&want).collect();
        assert_eq!(msgs.len(), 1);
        let m = msgs[0].unwrap();
        assert_eq!((m.ty, m.flags, m.seq), (16, 5, 7));
        let top: Vec<_> = attrs(&m.payload[4..]).map(Result::unwrap).collect();
        assert_eq!(top[0], (3, &b"ab\0"[..]));
        assert_eq!(top[1].0, 18, "flags are masked off");
        let inner: Vec<_> = attrs(top[1].1).map(Result::unwrap).collect();
        assert_eq!(inner, [(1, &[9u8][..])]);
    }

    #[test]
    fn truncated_and_odd_framing_is_an_error_not_a_panic() {
        assert_eq!(
            messages(&[20, 0, 0, 0, 1]).next(),
            Some(Err(Malformed("truncated netlink header")))
        );
        // Length below the header's own, and beyond the datagram.
        let mut short = [0u8; 16];
        short[0] = 8;
        assert!(messages(&short).next().unwrap().is_err());
        short[0] = 17;
        assert!(messages(&short).next().unwrap().is_err());
        // An attribute claiming less than its header would never advance.
        assert!(attrs(&[0, 0, 1, 0, 9, 9, 9, 9]).next().unwrap().is_err());
        // One claiming more than there is.
        assert!(attrs(&[9, 0, 1, 0, 1, 2, 3, 4]).next().unwrap().is_err());
        // Three bytes of junk after the last attribute.
        let items: Vec<_> = attrs(&[5, 0, 1, 0, 7, 0, 0, 0, 1, 2, 3]).collect();
        assert_eq!(items[0], Ok((1, &[7u8][..])));
        assert!(items[1].is_err());
        // An unpadded last attribute is fine.
        assert_eq!(attrs(&[5, 0, 1, 0, 7]).count(), 1);
        assert!(u32_ne(&[1, 2, 3]).is_err());
        assert!(u16_ne(&[1, 2, 3]).is_err());
        assert!(u8_value(&[]).is_err());
        for len in 0..80 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 256) as u8).collect();
            let _ = messages(&junk).count();
            let _ = attrs(&junk).count();
        }
    }

    fn error_message(errno: i32, flags: u16, tlvs: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        let msg = w.begin_msg(NLMSG_ERROR, flags, 1);
        w.bytes(&(-errno).to_ne_bytes());
        // The request's header, as NETLINK_CAP_ACK leaves it.
        w.bytes(&[16, 0, 0, 0, 16, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        w.bytes(tlvs);
        w.end_msg(msg);
        w.into_bytes()
    }

    #[test]
    fn errors_carry_their_errno_and_extended_ack_text() {
        let mut tlv = Writer::new();
        tlv.attr_str(NLMSGERR_ATTR_MSG, "Unknown device type");
        let bytes = error_message(95, NLM_F_CAPPED | NLM_F_ACK_TLVS, tlv.as_bytes());
        let m = messages(&bytes).next().unwrap().unwrap();
        assert_eq!(m.error_code(), Ok(95));
        assert_eq!(m.ext_ack_message().as_deref(), Some("Unknown device type"));
        let ack = error_message(0, NLM_F_CAPPED, &[]);
        let m = messages(&ack).next().unwrap().unwrap();
        assert_eq!(m.error_code(), Ok(0));
        assert_eq!(m.ext_ack_message(), None);
        let cut = Message {
            ty: NLMSG_ERROR,
            flags: NLM_F_ACK_TLVS,
            seq: 0,
            payload: &[1, 2],
        };
        assert!(cut.error_code().is_err());
        assert_eq!(cut.ext_ack_message(), None);
    }
}
