//! The payloads of [`crate::Message::ScsiRequest`] and [`crate::Message::ScsiReply`]:
//! what the SCSI layers of the two nodes say to each other to keep persistent
//! reservations identical (a PR OUT forwarded to the leader; the leader's new
//! state installed on the follower). Big-endian, length-prefixed; decoding never
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
}

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
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
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
        ];
        for a in answers {
            assert_eq!(ScsiAnswer::decode(a.encode()), Some(a));
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ScsiMsg::decode(Bytes::from(b.clone()));
            let _ = ScsiAnswer::decode(Bytes::from(b));
        }
    }
}
