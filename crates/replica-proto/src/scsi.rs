//! The payloads of [`crate::Message::ScsiRequest`] and [`crate::Message::ScsiReply`]:
//! what the SCSI layers of the two nodes say to each other to keep persistent
//! reservations and explicit ALUA states identical (a PR OUT or a SET TARGET PORT
//! GROUPS forwarded to the leader; the leader's new state installed on the
//! follower, and on a partner that rejoins). Big-endian, length-prefixed; decoding never
//! panics.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// A request of one node's SCSI layer to the other's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScsiMsg {
    /// Run this PERSISTENT RESERVE OUT on the leader for an initiator connected
    /// to the sender.
    ForwardPrOut {
        /// The LUN.
        lun: u64,
        /// Initiator name of the nexus.
        initiator_name: String,
        /// Initiator port (name + ISID) of the nexus.
        initiator_port: String,
        /// Relative port id of the target port the command came through.
        relative_port_id: u16,
        /// The CDB.
        cdb: Bytes,
        /// The parameter list.
        data: Bytes,
    },
    /// Install this persistent-reservation state (the leader's, serialized).
    InstallPrState {
        /// The LUN.
        lun: u64,
        /// The serialized state.
        state: Bytes,
    },
    /// Apply these explicit ALUA states (a SET TARGET PORT GROUPS an initiator sent
    /// to the sender, already validated there) on the node that orders changes,
    /// which installs its new explicit states back on the sender before answering
    /// [`ScsiAnswer::Installed`].
    ForwardSetTpg {
        /// The LUN.
        lun: u64,
        /// Initiator port (name + ISID) of the nexus that sent the command.
        initiator_port: String,
        /// Relative port id of the target port the command came through.
        relative_port_id: u16,
        /// (target port group, ASYMMETRIC ACCESS STATE code) per descriptor.
        changes: Vec<(u16, u8)>,
    },
    /// Install these explicit ALUA states: the whole set of the sender (groups not
    /// named have none), after a SET TARGET PORT GROUPS or when the receiver rejoins.
    InstallAluaState {
        /// The LUN.
        lun: u64,
        /// Initiator port and relative target port id of the nexus that sent the
        /// SET TARGET PORT GROUPS, when it came through the receiver (it gets no
        /// unit attention there); None for a snapshot.
        origin: Option<(String, u16)>,
        /// (target port group, ASYMMETRIC ACCESS STATE code) per group.
        states: Vec<(u16, u8)>,
    },
    /// Who may reach the LUN on the sender (its target's admission rules and
    /// the host groups that map it), as a digest: the receiver compares it
    /// with its own and answers [`ScsiAnswer::Installed`] when they agree,
    /// [`ScsiAnswer::Differs`] when they do not ([`ScsiAnswer::Failed`]: it
    /// could not compare). An initiator the rules keep out
    /// on one node only would reach the LUN through the other.
    CompareAccess {
        /// The LUN.
        lun: u64,
        /// The sender's digest (at most [`ACCESS_DIGEST_MAX`] bytes).
        digest: Bytes,
    },
    /// The LUN's SPC-2 reservation ended on the sender without a command (its
    /// holder's I_T nexus was lost, or a reset): the node that orders changes
    /// ends it too if that nexus holds it there, and installs its new state back
    /// on the sender before answering [`ScsiAnswer::Installed`].
    EndSpc2 {
        /// The LUN.
        lun: u64,
        /// Initiator port and relative target port id of the holder; None: whoever
        /// holds it (a reset).
        holder: Option<(String, u16)>,
    },
    /// A reset reached the LUN on the sender (`kind`: 0 a LOGICAL UNIT RESET,
    /// 1 a target reset): the receiver raises the reset's unit attention on
    /// its own I_T nexuses of the LUN and answers [`ScsiAnswer::Installed`].
    /// Sent by either node. A partner of an earlier version answers it
    /// malformed, and its initiators learn nothing of the reset.
    Reset {
        /// The LUN.
        lun: u64,
        /// Which reset.
        kind: u8,
    },
}

/// Most bytes of a [`ScsiMsg::CompareAccess`] digest.
pub const ACCESS_DIGEST_MAX: usize = 64;

/// Most (group, state) pairs one ALUA message carries.
pub const ALUA_GROUPS_MAX: usize = 1024;

/// The answer to a [`ScsiMsg`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScsiAnswer {
    /// The SCSI response of a forwarded command.
    Response {
        /// SCSI status.
        status: u8,
        /// Sense data, if any.
        sense: Option<Bytes>,
        /// Data-In.
        data_in: Bytes,
        /// Transfer length the CDB called for.
        transfer_len_bytes: u32,
    },
    /// The state was installed.
    Installed,
    /// The request failed.
    Failed(String),
    /// [`ScsiMsg::CompareAccess`]: the receiver's rules differ.
    Differs,
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

/// (group, state) pairs: a u16 count, then 3 bytes each. At most
/// [`ALUA_GROUPS_MAX`] are written (the SCSI layer has far fewer groups).
fn put_groups(out: &mut BytesMut, g: &[(u16, u8)]) {
    let g = &g[..g.len().min(ALUA_GROUPS_MAX)];
    out.put_u16(g.len() as u16);
    for &(id, state) in g {
        out.put_u16(id);
        out.put_u8(state);
    }
}

/// An optional I_T nexus (initiator port, relative target port id): a flag byte,
/// then the two.
fn put_nexus(out: &mut BytesMut, n: Option<&(String, u16)>) {
    match n {
        Some((port, rel)) => {
            out.put_u8(1);
            put_bytes(out, port.as_bytes());
            out.put_u16(*rel);
        }
        None => out.put_u8(0),
    }
}

struct Rd(Bytes);

impl Rd {
    fn u8(&mut self) -> Option<u8> {
        (self.0.remaining() >= 1).then(|| self.0.get_u8())
    }
    fn u16(&mut self) -> Option<u16> {
        (self.0.remaining() >= 2).then(|| self.0.get_u16())
    }
    fn u32(&mut self) -> Option<u32> {
        (self.0.remaining() >= 4).then(|| self.0.get_u32())
    }
    fn u64(&mut self) -> Option<u64> {
        (self.0.remaining() >= 8).then(|| self.0.get_u64())
    }
    fn bytes(&mut self) -> Option<Bytes> {
        let n = self.u32()? as usize;
        (self.0.remaining() >= n).then(|| self.0.split_to(n))
    }
    fn string(&mut self) -> Option<String> {
        let b = self.bytes()?;
        (b.len() <= 1024).then_some(())?;
        String::from_utf8(b.to_vec()).ok()
    }
    fn groups(&mut self) -> Option<Vec<(u16, u8)>> {
        let n = self.u16()? as usize;
        (n <= ALUA_GROUPS_MAX && self.0.remaining() >= n * 3).then_some(())?;
        (0..n).map(|_| Some((self.u16()?, self.u8()?))).collect()
    }
    /// What [`put_nexus`] wrote: Some(None) for no nexus, None when malformed.
    fn nexus(&mut self) -> Option<Option<(String, u16)>> {
        match self.u8()? {
            0 => Some(None),
            1 => Some(Some((self.string()?, self.u16()?))),
            _ => None,
        }
    }
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

impl ScsiMsg {
    /// Encodes the request.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self {
            ScsiMsg::ForwardPrOut {
                lun,
                initiator_name,
                initiator_port,
                relative_port_id,
                cdb,
                data,
            } => {
                out.put_u8(1);
                out.put_u64(*lun);
                put_bytes(&mut out, initiator_name.as_bytes());
                put_bytes(&mut out, initiator_port.as_bytes());
                out.put_u16(*relative_port_id);
                put_bytes(&mut out, cdb);
                put_bytes(&mut out, data);
            }
            ScsiMsg::InstallPrState { lun, state } => {
                out.put_u8(2);
                out.put_u64(*lun);
                put_bytes(&mut out, state);
            }
            ScsiMsg::ForwardSetTpg {
                lun,
                initiator_port,
                relative_port_id,
                changes,
            } => {
                out.put_u8(3);
                out.put_u64(*lun);
                put_bytes(&mut out, initiator_port.as_bytes());
                out.put_u16(*relative_port_id);
                put_groups(&mut out, changes);
            }
            ScsiMsg::InstallAluaState {
                lun,
                origin,
                states,
            } => {
                out.put_u8(4);
                out.put_u64(*lun);
                put_nexus(&mut out, origin.as_ref());
                put_groups(&mut out, states);
            }
            ScsiMsg::CompareAccess { lun, digest } => {
                out.put_u8(5);
                out.put_u64(*lun);
                put_bytes(&mut out, &digest[..digest.len().min(ACCESS_DIGEST_MAX)]);
            }
            ScsiMsg::EndSpc2 { lun, holder } => {
                out.put_u8(6);
                out.put_u64(*lun);
                put_nexus(&mut out, holder.as_ref());
            }
            ScsiMsg::Reset { lun, kind } => {
                out.put_u8(7);
                out.put_u64(*lun);
                out.put_u8(*kind);
            }
        }
        out.freeze()
    }

    /// Decodes a request; `None` when malformed.
    pub fn decode(b: Bytes) -> Option<ScsiMsg> {
        let mut r = Rd(b);
        let m = match r.u8()? {
            1 => ScsiMsg::ForwardPrOut {
                lun: r.u64()?,
                initiator_name: r.string()?,
                initiator_port: r.string()?,
                relative_port_id: r.u16()?,
                cdb: r.bytes()?,
                data: r.bytes()?,
            },
            2 => ScsiMsg::InstallPrState {
                lun: r.u64()?,
                state: r.bytes()?,
            },
            3 => ScsiMsg::ForwardSetTpg {
                lun: r.u64()?,
                initiator_port: r.string()?,
                relative_port_id: r.u16()?,
                changes: r.groups()?,
            },
            4 => ScsiMsg::InstallAluaState {
                lun: r.u64()?,
                origin: r.nexus()?,
                states: r.groups()?,
            },
            5 => ScsiMsg::CompareAccess {
                lun: r.u64()?,
                digest: r.bytes().filter(|d| d.len() <= ACCESS_DIGEST_MAX)?,
            },
            6 => ScsiMsg::EndSpc2 {
                lun: r.u64()?,
                holder: r.nexus()?,
            },
            7 => ScsiMsg::Reset {
                lun: r.u64()?,
                kind: r.u8()?,
            },
            _ => return None,
        };
        r.end()?;
        Some(m)
    }
}

impl ScsiAnswer {
    /// Encodes the answer.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self {
            ScsiAnswer::Response {
                status,
                sense,
                data_in,
                transfer_len_bytes,
            } => {
                out.put_u8(1);
                out.put_u8(*status);
                match sense {
                    Some(s) => {
                        out.put_u8(1);
                        put_bytes(&mut out, s);
                    }
                    None => out.put_u8(0),
                }
                put_bytes(&mut out, data_in);
                out.put_u32(*transfer_len_bytes);
            }
            ScsiAnswer::Installed => out.put_u8(2),
            ScsiAnswer::Failed(why) => {
                out.put_u8(3);
                put_bytes(&mut out, why.as_bytes());
            }
            ScsiAnswer::Differs => out.put_u8(4),
        }
        out.freeze()
    }

    /// Decodes an answer; `None` when malformed.
    pub fn decode(b: Bytes) -> Option<ScsiAnswer> {
        let mut r = Rd(b);
        let a = match r.u8()? {
            1 => ScsiAnswer::Response {
                status: r.u8()?,
                sense: match r.u8()? {
                    0 => None,
                    1 => Some(r.bytes()?),
                    _ => return None,
                },
                data_in: r.bytes()?,
                transfer_len_bytes: r.u32()?,
            },
            2 => ScsiAnswer::Installed,
            3 => ScsiAnswer::Failed(r.string()?),
            4 => ScsiAnswer::Differs,
            _ => return None,
        };
        r.end()?;
        Some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let msgs = [
            ScsiMsg::ForwardPrOut {
                lun: 3,
                initiator_name: "iqn.a".into(),
                initiator_port: "iqn.a,i,0x1".into(),
                relative_port_id: 0x101,
                cdb: Bytes::from_static(&[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0]),
                data: Bytes::from(vec![7u8; 24]),
            },
            ScsiMsg::InstallPrState {
                lun: 0,
                state: Bytes::from_static(b"{}"),
            },
            ScsiMsg::ForwardSetTpg {
                lun: 1,
                initiator_port: "iqn.a,i,0x1".into(),
                relative_port_id: 0x102,
                changes: vec![(2, 1), (1, 2)],
            },
            ScsiMsg::InstallAluaState {
                lun: 1,
                origin: Some(("iqn.a,i,0x1".into(), 0x102)),
                states: vec![(1, 3)],
            },
            ScsiMsg::InstallAluaState {
                lun: 2,
                origin: None,
                states: vec![],
            },
            ScsiMsg::CompareAccess {
                lun: 4,
                digest: Bytes::from(vec![9u8; 32]),
            },
            ScsiMsg::EndSpc2 {
                lun: 5,
                holder: Some(("iqn.a,i,0x1".into(), 0x103)),
            },
            ScsiMsg::EndSpc2 {
                lun: 6,
                holder: None,
            },
            ScsiMsg::Reset { lun: 7, kind: 0 },
            ScsiMsg::Reset { lun: 8, kind: 1 },
        ];
        for m in msgs {
            assert_eq!(ScsiMsg::decode(m.encode()), Some(m));
        }
        let answers = [
            ScsiAnswer::Response {
                status: 0x18,
                sense: None,
                data_in: Bytes::new(),
                transfer_len_bytes: 0,
            },
            ScsiAnswer::Response {
                status: 2,
                sense: Some(Bytes::from_static(&[0x70, 0, 5])),
                data_in: Bytes::from_static(b"x"),
                transfer_len_bytes: 9,
            },
            ScsiAnswer::Installed,
            ScsiAnswer::Failed("no".into()),
            ScsiAnswer::Differs,
        ];
        for a in answers {
            assert_eq!(ScsiAnswer::decode(a.encode()), Some(a));
        }
    }

    #[test]
    fn malformed_alua_messages_are_refused() {
        let m = ScsiMsg::InstallAluaState {
            lun: 1,
            origin: Some(("p".into(), 3)),
            states: vec![(1, 0), (2, 3)],
        }
        .encode();
        // every truncation, and one byte too many
        for n in 0..m.len() {
            assert_eq!(ScsiMsg::decode(m.slice(..n)), None, "{n} bytes");
        }
        let mut long = m.to_vec();
        long.push(0);
        assert_eq!(ScsiMsg::decode(Bytes::from(long)), None);
        // an origin flag other than 0 or 1
        let mut bad = m.to_vec();
        bad[9] = 2;
        assert_eq!(ScsiMsg::decode(Bytes::from(bad)), None);
        // a count beyond the bound or beyond the data
        let mut huge = vec![4u8];
        huge.extend_from_slice(&0u64.to_be_bytes());
        huge.push(0);
        huge.extend_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(ScsiMsg::decode(Bytes::from(huge)), None);
    }

    #[test]
    fn an_access_digest_past_its_bound_is_refused() {
        let mut m = vec![5u8];
        m.extend_from_slice(&7u64.to_be_bytes());
        m.extend_from_slice(&(ACCESS_DIGEST_MAX as u32 + 1).to_be_bytes());
        m.extend_from_slice(&[1u8; ACCESS_DIGEST_MAX + 1]);
        assert_eq!(ScsiMsg::decode(Bytes::from(m)), None);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ScsiMsg::decode(Bytes::from(b.clone()));
            let _ = ScsiAnswer::decode(Bytes::from(b));
        }
    }
}
