//! A connection's read buffer in the full feature phase, and what its PDUs may
//! keep of it.
//!
//! [`decode_frame`] splits each PDU off the buffer it was read into without
//! copying, so a frame's data is a view, and a view keeps that whole
//! allocation (half a MiB) alive. Most PDUs are handled and dropped before the
//! next read; a SCSI command's immediate data is held until the command ends,
//! and its share of the buffer budget is its own length only. So no command's
//! data held longer than its PDU's handling is a view of the shared buffer:
//! - data up to [`OWN_BYTES_MIN`] is copied out of it (by the caller: the
//!   `iscsi` crate's `Conn::on_command`);
//! - a longer SCSI Command PDU is read into an allocation of its own, of its
//!   exact wire length, once its header shows its length: the bytes of it the
//!   shared buffer already holds are copied over, and the rest is read there;
//! - after such a PDU the next read that finds bytes waiting (the caller
//!   asks [`RecvBuf::guesses_next`], then waits for the socket to be
//!   readable, and calls [`RecvBuf::idle`] when a read finds none) goes to a
//!   new buffer of the same length,
//!   on the guess that a stream of writes of one size goes on: right, the PDU
//!   lands where it stays, no byte copied and no extra read; wrong (another
//!   length, another kind of PDU), what was read moves to the shared buffer
//!   and is decoded from there;
//! - a long command found whole in the shared buffer (where small PDUs came
//!   before it in one read) has its data copied out; if the start of the next
//!   PDU is there too, the next read takes the rest of its header alone.

use crate::frame::{decode_frame, reserve_for_next, wire_len, Frame, FrameError, FrameLimits};
use crate::pdu::{opcode, raw_data_len_bytes, BHS_LEN};
use bytes::{Bytes, BytesMut};

/// Size of a connection's shared read buffer once logged in.
pub const SHARED_BYTES: usize = 512 * 1024;
/// Immediate data longer than this is not copied out of the shared buffer but
/// read into a buffer of its own (see the module notes).
pub const OWN_BYTES_MIN: usize = 64 << 10;

/// The read buffer of a connection.
pub struct RecvBuf {
    /// The buffer the next read goes to: the shared one, or one PDU's own.
    buf: BytesMut,
    /// The shared buffer, set aside while `buf` is a PDU's own.
    shared: Option<BytesMut>,
    /// The wire length of the last PDU when it was a long command (else 0):
    /// the length the next one is guessed to have.
    last_long: usize,
    /// `buf` is a PDU's own buffer on that guess, not yet checked.
    guess: Option<usize>,
    /// Bytes copied to keep long commands' data out of the shared buffer.
    copied_bytes: u64,
    /// Data longer than this is a long command's ([`OWN_BYTES_MIN`]).
    own_min: usize,
}

/// Whether `buf` starts with the header of a SCSI Command carrying more than
/// `own_min` bytes of data.
fn long_command(buf: &[u8], own_min: usize) -> bool {
    let Some(header) = buf.get(..BHS_LEN) else {
        return false;
    };
    let mut raw = [0u8; BHS_LEN];
    raw.copy_from_slice(header);
    raw[0] & 0x3f == opcode::SCSI_COMMAND && raw_data_len_bytes(&raw) as usize > own_min
}

impl RecvBuf {
    /// Takes over the login's buffer (and what it holds of the next PDUs).
    pub fn new(buf: BytesMut) -> RecvBuf {
        RecvBuf::with_threshold(buf, OWN_BYTES_MIN)
    }

    /// As [`RecvBuf::new`], with commands of more than `own_min` bytes of
    /// data taken as long (fuzzing uses a few bytes, to reach every path
    /// with short inputs).
    pub fn with_threshold(mut buf: BytesMut, own_min: usize) -> RecvBuf {
        buf.reserve(SHARED_BYTES);
        RecvBuf {
            buf,
            shared: None,
            last_long: 0,
            guess: None,
            copied_bytes: 0,
            own_min,
        }
    }

    /// Splits off the next whole PDU, if the buffer holds one.
    pub fn next_frame(&mut self, limits: &FrameLimits) -> Result<Option<Frame>, FrameError> {
        if let Some(len) = self.guess {
            if self.buf.len() < BHS_LEN {
                return Ok(None);
            }
            self.guess = None;
            let right = matches!(wire_len(&self.buf, limits), Ok(Some(t)) if t == len)
                && long_command(&self.buf, self.own_min);
            if !right {
                // what the wrong guess read is decoded from the shared buffer
                let mut shared = self.shared.take().expect("a guess parks the shared buffer");
                shared.extend_from_slice(&self.buf);
                self.copied_bytes += self.buf.len() as u64;
                self.buf = shared;
            }
        }
        let from_own = self.shared.is_some();
        let total = wire_len(&self.buf, limits).ok().flatten();
        let r = decode_frame(&mut self.buf, limits);
        let consumed = match &r {
            Ok(Some(_)) => true,
            Ok(None) => false,
            Err(e) => e.consumed,
        };
        if consumed {
            self.last_long = 0;
            if let Some(shared) = self.shared.take() {
                // the PDU's own buffer held exactly it; its empty rest goes
                debug_assert!(self.buf.is_empty());
                self.buf = shared;
            }
        }
        let mut f = r?;
        if let Some(f) = f.as_mut() {
            if f.raw_header[0] & 0x3f == opcode::SCSI_COMMAND && f.data.len() > self.own_min {
                self.last_long = total.unwrap_or(0);
                if !from_own {
                    self.copied_bytes += f.data.len() as u64;
                    f.data = Bytes::copy_from_slice(&f.data);
                }
            }
        }
        Ok(f)
    }

    /// Makes room for the next read; returns the most it may take.
    pub fn room(&mut self, limits: &FrameLimits) -> usize {
        if self.shared.is_some() {
            // a PDU's own buffer: the rest of that PDU, nothing after it
            return self.buf.capacity() - self.buf.len();
        }
        if let Ok(Some(total)) = wire_len(&self.buf, limits) {
            if self.buf.len() < total && long_command(&self.buf, self.own_min) {
                self.own(total);
                return total - self.buf.len();
            }
        }
        if self.last_long > 0 && self.buf.is_empty() {
            self.own(self.last_long);
            self.guess = Some(self.last_long);
            return self.last_long;
        }
        reserve_for_next(&mut self.buf, limits);
        if self.last_long > 0 && self.buf.len() < BHS_LEN {
            // after a long command found whole in the shared buffer, the
            // next header alone, so that none of a long PDU's data lands here
            BHS_LEN - self.buf.len()
        } else {
            usize::MAX
        }
    }

    /// Parks the shared buffer and reads into one of `total` bytes, taking
    /// over what the shared one holds (the start of one PDU at most).
    fn own(&mut self, total: usize) {
        let mut own = BytesMut::with_capacity(total);
        own.extend_from_slice(&self.buf);
        self.copied_bytes += self.buf.len() as u64;
        self.buf.clear();
        self.shared = Some(std::mem::replace(&mut self.buf, own));
    }

    /// Whether the next [`RecvBuf::room`] makes a buffer on the guess that a
    /// PDU like the last long one comes next (wait for bytes to read first).
    pub fn guesses_next(&self) -> bool {
        self.shared.is_none() && self.last_long > 0 && self.buf.is_empty()
    }

    /// The read [`RecvBuf::room`] made room for found nothing to read: a
    /// buffer made on a guess and still empty is let go, so that a connection
    /// waiting for its next PDU holds its shared buffer alone.
    pub fn idle(&mut self) {
        if self.guess.is_some() && self.buf.is_empty() {
            self.guess = None;
            self.buf = self.shared.take().expect("a guess parks the shared buffer");
        }
    }

    /// The buffer the next read goes to (at most [`RecvBuf::room`] bytes).
    pub fn target(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes copied so far to keep long commands' data out of the shared
    /// buffer (what the own buffers and the guess save shows here).
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_frame;
    use crate::pdu::{encode_initiator_bhs, DataOut, InitiatorPdu, NopOut, ScsiCommand};

    /// A PDU as sent: its header and data.
    struct Sent {
        header: [u8; BHS_LEN],
        data: Vec<u8>,
    }

    fn command(itt: u32, data_len: usize) -> Sent {
        let header = encode_initiator_bhs(
            &InitiatorPdu::ScsiCommand(ScsiCommand {
                final_bit: true,
                read: false,
                write: true,
                attr: 1,
                lun: 0,
                itt,
                edtl_bytes: data_len as u32,
                cmd_sn: itt,
                exp_stat_sn: 1,
                cdb: [0x2a; 16],
            }),
            false,
            0,
            data_len as u32,
        );
        Sent {
            header,
            data: (0..data_len)
                .map(|i| (i as u32 ^ itt.wrapping_mul(77)) as u8)
                .collect(),
        }
    }

    fn data_out(itt: u32, data_len: usize) -> Sent {
        let header = encode_initiator_bhs(
            &InitiatorPdu::DataOut(DataOut {
                final_bit: true,
                lun: 0,
                itt,
                ttt: 5,
                exp_stat_sn: 1,
                data_sn: 0,
                buffer_offset_bytes: 0,
            }),
            false,
            0,
            data_len as u32,
        );
        Sent {
            header,
            data: vec![itt as u8; data_len],
        }
    }

    fn nop(itt: u32, data_len: usize) -> Sent {
        let header = encode_initiator_bhs(
            &InitiatorPdu::NopOut(NopOut {
                lun: 0,
                itt,
                ttt: 0xffff_ffff,
                cmd_sn: itt,
                exp_stat_sn: 1,
            }),
            true,
            0,
            data_len as u32,
        );
        Sent {
            header,
            data: vec![3; data_len],
        }
    }

    /// xorshift64*: the tests' chunk sizes and PDU mix, repeatable per seed.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    fn limits(digests: bool) -> FrameLimits {
        FrameLimits {
            header_digest: digests,
            data_digest: digests,
            max_data_segment_bytes: 1 << 20,
            max_ahs_bytes: 256,
        }
    }

    /// Feeds the PDUs' wire bytes to a `RecvBuf` as a socket would, each read
    /// taking at most what `room` allows, what the buffer has room for and
    /// what `chunk` picks; returns the frames and the bytes copied.
    fn receive(
        sent: &[Sent],
        limits: &FrameLimits,
        mut chunk: impl FnMut() -> usize,
    ) -> (Vec<Result<Received, FrameError>>, u64, usize) {
        let mut wire = Vec::new();
        for s in sent {
            wire.extend(encode_frame(
                &s.header,
                &[],
                &s.data,
                limits.header_digest,
                limits.data_digest,
            ));
        }
        let mut rb = RecvBuf::new(BytesMut::with_capacity(16 << 10));
        let (mut pos, mut frames, mut reads) = (0, Vec::new(), 0);
        loop {
            loop {
                match rb.next_frame(limits) {
                    Ok(Some(f)) => frames.push(Ok(Received::from(f))),
                    Ok(None) => break,
                    Err(e) => {
                        assert!(e.consumed, "{e:?}");
                        frames.push(Err(e));
                    }
                }
            }
            if pos == wire.len() {
                break;
            }
            let want = chunk();
            if want % 7 == 3 {
                // readable, but the read found nothing
                rb.room(limits);
                rb.idle();
            }
            let room = rb.room(limits);
            assert!(room > 0, "a read with no room reads as end of stream");
            let t = rb.target();
            let spare = t.capacity() - t.len();
            let n = room.min(spare).min(want).min(wire.len() - pos).max(1);
            let cap = t.capacity();
            t.extend_from_slice(&wire[pos..pos + n]);
            assert_eq!(t.capacity(), cap, "a read never grows the buffer");
            pos += n;
            reads += 1;
        }
        (frames, rb.copied_bytes, reads)
    }

    /// A frame as the test keeps it.
    struct Received {
        header: [u8; BHS_LEN],
        data: Bytes,
        /// When it came out, nothing but the frame's own views held its
        /// data's allocation: not the shared buffer, not another PDU.
        held_alone: bool,
    }

    impl From<Frame> for Received {
        fn from(f: Frame) -> Received {
            let Frame {
                raw_header,
                data,
                header_bytes,
                ahs,
                ..
            } = f;
            drop((header_bytes, ahs));
            Received {
                header: raw_header,
                held_alone: data.is_unique(),
                data,
            }
        }
    }

    #[test]
    fn frames_come_out_whole_and_long_commands_hold_only_their_own_bytes() {
        for seed in 1..=24u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let digests = seed % 2 == 0;
            let sent: Vec<Sent> = (0..40u32)
                .map(|i| match rng.below(6) {
                    0 | 1 => command(i, 65_537 + rng.below(300_000) as usize),
                    2 => command(i, rng.below(OWN_BYTES_MIN as u64 + 1) as usize),
                    3 => data_out(i, 1 + rng.below(400_000) as usize),
                    4 => nop(i, rng.below(100) as usize),
                    _ => command(i, OWN_BYTES_MIN + rng.below(2) as usize),
                })
                .collect();
            let lim = limits(digests);
            // reads as large as the socket allows, or small and ragged
            let greedy = seed % 3 == 0;
            let mut chunks = Rng(seed);
            let (frames, _, _) = receive(&sent, &lim, || {
                if greedy {
                    usize::MAX
                } else {
                    1 + chunks.below(200_000) as usize
                }
            });
            assert_eq!(frames.len(), sent.len(), "seed {seed}");
            for (f, s) in frames.into_iter().zip(&sent) {
                let f = f.unwrap();
                assert_eq!(f.header, s.header, "seed {seed}");
                assert_eq!(&f.data[..], &s.data[..], "seed {seed}");
                if s.header[0] & 0x3f == opcode::SCSI_COMMAND && s.data.len() > OWN_BYTES_MIN {
                    assert!(
                        f.held_alone,
                        "seed {seed}: a long command's data shares a buffer"
                    );
                }
            }
        }
    }

    #[test]
    fn a_stream_of_long_writes_of_one_size_lands_where_it_stays() {
        let sent: Vec<Sent> = (0..20).map(|i| command(i, 256 << 10)).collect();
        let pdu_bytes = (BHS_LEN + (256 << 10)) as u64;
        let (frames, copied, reads) = receive(&sent, &limits(false), || usize::MAX);
        assert_eq!(frames.len(), 20);
        // the first read brings a whole PDU and part of the next, copied; from
        // then on each PDU is read whole into the buffer it stays in
        assert!(
            copied <= 2 * pdu_bytes,
            "copied {copied} bytes for 20 PDUs of {pdu_bytes}"
        );
        assert!(reads <= 22, "{reads} reads for 20 PDUs");
        for f in frames {
            assert!(f.unwrap().held_alone);
        }
        // of two sizes, alternating: every guess is wrong, and what it read
        // (the next PDU's first bytes) is copied back, data included
        let sent: Vec<Sent> = (0..20)
            .map(|i| command(i, if i % 2 == 0 { 256 << 10 } else { 100 << 10 }))
            .collect();
        let (frames, _, _) = receive(&sent, &limits(false), || usize::MAX);
        assert_eq!(frames.len(), 20);
        for (f, s) in frames.into_iter().zip(&sent) {
            let f = f.unwrap();
            assert_eq!(&f.data[..], &s.data[..]);
            assert!(f.held_alone);
        }
    }

    #[test]
    fn a_connection_waiting_for_its_next_pdu_holds_its_shared_buffer_alone() {
        let lim = limits(false);
        let s = command(1, 200_000);
        let wire = encode_frame(&s.header, &[], &s.data, false, false);
        let mut rb = RecvBuf::new(BytesMut::from(&wire[..]));
        // (found whole in the login's leftover: copied out)
        let f = rb.next_frame(&lim).unwrap().unwrap();
        assert_eq!(&f.data[..], &s.data[..]);
        let copied = rb.copied_bytes();
        // readable: a buffer is made on the guess; the read finds nothing
        assert!(rb.guesses_next());
        assert_eq!(rb.room(&lim), wire.len());
        assert_eq!(rb.target().capacity(), wire.len());
        rb.idle();
        assert!(rb.shared.is_none() && rb.guess.is_none());
        assert!(rb.target().capacity() >= SHARED_BYTES);
        // and the guess is made again when bytes come
        assert_eq!(rb.room(&lim), wire.len());
        rb.target().extend_from_slice(&wire);
        let g = rb.next_frame(&lim).unwrap().unwrap();
        assert_eq!(&g.data[..], &s.data[..]);
        assert_eq!(
            rb.copied_bytes(),
            copied,
            "the guess was right: nothing copied"
        );
    }

    #[test]
    fn a_bad_digest_in_an_own_buffer_gives_the_shared_buffer_back() {
        let lim = limits(true);
        let sent = vec![command(1, 100_000), command(2, 100_000), nop(3, 8)];
        let mut wire = Vec::new();
        for s in &sent {
            wire.extend(encode_frame(&s.header, &[], &s.data, true, true));
        }
        // the second command's data digest (its last 4 bytes) is wrong
        let second_end = 2 * (BHS_LEN + 4 + 100_000 + 4);
        wire[second_end - 1] ^= 1;
        let mut rb = RecvBuf::new(BytesMut::new());
        let mut pos = 0;
        let mut out = Vec::new();
        while out.len() < 3 {
            match rb.next_frame(&lim) {
                Ok(Some(f)) => out.push(Ok(f.raw_header)),
                Err(e) => out.push(Err(e.error)),
                Ok(None) => {
                    let room = rb.room(&lim);
                    assert!(room > 0, "a read with no room reads as end of stream");
                    let room = room.min(4096).min(wire.len() - pos);
                    rb.target().extend_from_slice(&wire[pos..pos + room]);
                    pos += room;
                }
            }
        }
        assert_eq!(out[0], Ok(sent[0].header));
        assert_eq!(out[1], Err(crate::ProtoError::DataDigest));
        assert_eq!(out[2], Ok(sent[2].header));
    }
}
