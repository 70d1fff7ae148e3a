//! Wire messages between the two nodes of a replicated LUN (over the sync links)
//! and between a node and the witness: a pure codec, no I/O.
//!
//! What it does not do: sockets, timing, ordering decisions (that is `replica` and
//! `cluster`); it only turns [`Message`]s into bytes and back.
//!
//! Key invariant: [`decode`] never panics and never allocates more than the frame
//! header announces, and the header's length is bounded by
//! [`PAYLOAD_BYTES_MAX`]; any malformed frame is a [`ProtoError`], after which the
//! connection must be closed (there is no resynchronisation inside a stream).
//!
//! Frame layout (all integers big-endian):
//!
//! ```text
//! 0  magic    u32  "FSRP" (0x46535250)
//! 4  version  u16  PROTO_VERSION
//! 6  kind     u16  message kind
//! 8  length   u32  body length in bytes (<= PAYLOAD_BYTES_MAX)
//! 12 crc      u32  CRC-32C of the body
//! 16 body
//! ```

mod codec;
pub mod scsi;

pub use codec::{decode, encode};

use bytes::Bytes;

/// Version of the protocol spoken by this build; a peer with another version is
/// refused at the handshake (the header of every frame carries it). 2
/// (2026-12-04): witness requests carry a number, and the leader makes a
/// forwarded flush on both copies (a follower of version 1 flushed its own
/// after the answer; paired with a version 1 leader, a version 2 follower's
/// copy would not be flushed at all).
pub const PROTO_VERSION: u16 = 2;
/// First four bytes of every frame: "FSRP".
pub const MAGIC: u32 = 0x4653_5250;
/// Bytes of the frame header.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest body a frame may carry: 16 MiB of data plus room for the fields.
pub const PAYLOAD_BYTES_MAX: u32 = (16 << 20) + 4096;
/// Longest name (volume or cluster) carried in a message.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest reason a [`Message::Refused`] carries (a refusal names generations
/// and the remedy).
pub const REASON_BYTES_MAX: usize = 1024;

/// Errors of the codec: every one means the stream is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// The peer speaks another protocol version.
    #[error("protocol version {0} (this node speaks {PROTO_VERSION})")]
    Version(u16),
    /// The body length exceeds [`PAYLOAD_BYTES_MAX`].
    #[error("frame body of {0} bytes is too long")]
    TooLong(u32),
    /// The body does not match its CRC.
    #[error("frame CRC mismatch")]
    Crc,
    /// Unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u16),
    /// The body is shorter or longer than its kind requires, or a field is invalid.
    #[error("malformed {0} message")]
    Malformed(&'static str),
}

/// Generation ids of one node's copy of a replicated volume (see docs/0004-replication.md).
///
/// `current` names the data the copy holds; `synced` the last generation both
/// nodes held together. A node that writes alone first sets `current` to a fresh
/// id, so `current != synced` means "has writes the partner lacks". 0 means none
/// (a brand-new copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generations {
    /// Id of the data this copy holds.
    pub current: u64,
    /// Id of the last generation held in sync with the partner.
    pub synced: u64,
}

/// Flags of a [`Message::Hello`].
pub mod hello_flags {
    /// The copy is consistent (not a partly resynchronised target).
    pub const CONSISTENT: u32 = 1;
    /// The sender is the preferred node of the pair.
    pub const PREFERRED: u32 = 2;
    /// The sender holds the witness's survivor grant.
    pub const SURVIVOR: u32 = 4;
    /// The sender keeps what the receiver's unfinished offloaded copies
    /// overwrote (it lost the receiver mid-copy and did not go on alone): with
    /// the same generation on both, the sender is the resync source, so that
    /// those copies are undone on both copies.
    pub const UNDO: u32 = 8;
    /// The sender takes [`Message::Repair`](crate::Message::Repair) and
    /// [`Message::ReadCopy`](crate::Message::ReadCopy): a node whose own copy
    /// cannot read some blocks (a lost block of a pool, a bad sector) gets them
    /// from the partner. Neither is sent to a partner that did not say so.
    pub const REPAIR: u32 = 16;
    /// The sender says which of the pair's shared settings it runs with:
    /// [`WITNESS`], [`ACTIVE_PASSIVE`] and, in the bits from
    /// [`TIMEOUT_SHIFT`] up, its peer timeout in [`TIMEOUT_UNIT_MS`] units
    /// (rounded up). Nodes that both say so and differ in the first two are
    /// not joined: with one node preferred and no witness and the other asking
    /// a witness, both would go on alone when the links fail. Of two peer
    /// timeouts, a survivor waits out the longer.
    pub const SETTINGS: u32 = 32;
    /// With [`SETTINGS`]: the sender asks a witness when it loses its partner.
    pub const WITNESS: u32 = 64;
    /// With [`SETTINGS`]: the sender's pair is active-passive.
    pub const ACTIVE_PASSIVE: u32 = 128;
    /// With [`SETTINGS`]: where the 16-bit peer timeout starts.
    pub const TIMEOUT_SHIFT: u32 = 16;
    /// The unit of the peer timeout in the hello.
    pub const TIMEOUT_UNIT_MS: u64 = 100;
}

/// Most bytes one [`Message::Repair`] or [`Message::ReadCopy`] asks for.
pub const REPAIR_BYTES_MAX: u64 = 8 << 20;

/// One block operation carried between the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Write `data` (whole blocks) at `lba`.
    Write {
        /// First block.
        lba: u64,
        /// Durable when acknowledged.
        fua: bool,
        /// The blocks.
        data: Bytes,
    },
    /// Write zeroes over a range.
    WriteZeroes {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
        /// A thin volume may deallocate the range.
        may_unmap: bool,
    },
    /// Discard a range.
    Discard {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
    },
    /// Make every acknowledged write durable.
    Flush,
    /// Grow the volume to `block_count` blocks (never shrinks); the new blocks read
    /// as zeroes on both copies.
    Grow {
        /// The new size in blocks.
        block_count: u64,
    },
    /// A write of an offloaded copy (EXTENDED COPY, WRITE USING TOKEN) that the
    /// node receiving the command runs: the partner keeps what the blocks held
    /// before, so that it can put them back if that node is lost before the copy
    /// ends ([`Message::CopyEnd`]).
    CopyWrite {
        /// The copy, numbered by the node running it.
        copy: u64,
        /// First block.
        lba: u64,
        /// Durable when acknowledged.
        fua: bool,
        /// The blocks.
        data: Bytes,
    },
    /// Compare `compare` with the blocks at `lba`; if equal, write `data` there.
    /// Both buffers have the same whole-block length.
    CompareAndWrite {
        /// First block.
        lba: u64,
        /// Durable when acknowledged.
        fua: bool,
        /// Expected contents.
        compare: Bytes,
        /// New contents.
        data: Bytes,
    },
}

/// Outcome of an operation or a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// Done.
    Ok,
    /// COMPARE AND WRITE found a difference at this byte offset and wrote nothing.
    Miscompare {
        /// Byte offset of the first difference.
        offset: u32,
    },
    /// Failed; `code` is one of [`error_codes`], `lba` the block concerned (0 if none).
    Error {
        /// What failed.
        code: u8,
        /// The block concerned.
        lba: u64,
    },
}

/// Error codes of [`OpResult::Error`].
pub mod error_codes {
    /// Unrecoverable read error on the medium.
    pub const MEDIUM: u8 = 1;
    /// Write fault.
    pub const WRITE_FAULT: u8 = 2;
    /// Outside the volume.
    pub const OUT_OF_RANGE: u8 = 3;
    /// The volume is read-only.
    pub const READ_ONLY: u8 = 4;
    /// The receiver cannot serve the operation now (not in sync, not the leader...).
    pub const UNAVAILABLE: u8 = 5;
    /// Any other I/O error.
    pub const IO: u8 = 6;
    /// The operation is not supported.
    pub const NOT_SUPPORTED: u8 = 7;
}

/// Replication messages (over a sync link) and witness messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// First message on a sync connection, sent by both sides.
    Hello {
        /// 1 or 2.
        node_id: u8,
        /// The replicated volume's name (the same on both nodes).
        volume: String,
        /// Logical block size.
        block_size_bytes: u32,
        /// Volume size in blocks.
        block_count: u64,
        /// Bytes covered by one bit of the dirty bitmap.
        region_bytes: u32,
        /// The sender's generations.
        gens: Generations,
        /// [`hello_flags`].
        flags: u32,
    },
    /// Part of the sender's dirty bitmap: bit `i` of `bits` (LSB first in each
    /// byte) is region `first_region + i`.
    Bitmap {
        /// Region of the first bit.
        first_region: u64,
        /// The bits.
        bits: Bytes,
    },
    /// The sender's bitmap is complete.
    BitmapDone,
    /// Leader to follower: perform `op` and answer [`Message::Done`] with `id`.
    Apply {
        /// Request id chosen by the sender.
        id: u64,
        /// The operation.
        op: Op,
    },
    /// Follower to leader: order `op` against every other write, perform it on
    /// both nodes and answer [`Message::Done`] with `id`.
    Forward {
        /// Request id chosen by the sender.
        id: u64,
        /// The operation.
        op: Op,
    },
    /// Leader to follower: perform the write part of the op the follower
    /// forwarded as `forward_id` (its data is not sent again); answer
    /// [`Message::Done`] with `id`.
    ApplyForwarded {
        /// Request id chosen by the leader.
        id: u64,
        /// The follower's id of the forwarded op.
        forward_id: u64,
    },
    /// Source to target during a resync: these blocks are the source's current data.
    ResyncData {
        /// Request id chosen by the sender.
        id: u64,
        /// First block.
        lba: u64,
        /// The blocks.
        data: Bytes,
    },
    /// Source to target: the resync is complete, the target now holds `gens`.
    ResyncDone {
        /// Request id chosen by the sender.
        id: u64,
        /// Generations both copies hold from now on.
        gens: Generations,
    },
    /// Answer to a request with the same `id`.
    Done {
        /// The request's id.
        id: u64,
        /// Its outcome.
        result: OpResult,
    },
    /// A request of the SCSI layer to the partner (a persistent reservation
    /// command to run on the leader, or the leader's new reservation state to
    /// install); opaque to replication. Answered with [`Message::ScsiReply`].
    ScsiRequest {
        /// Request id chosen by the sender.
        id: u64,
        /// Opaque request.
        data: Bytes,
    },
    /// The answer to the [`Message::ScsiRequest`] with the same `id`.
    ScsiReply {
        /// The request's id.
        id: u64,
        /// Opaque answer.
        data: Bytes,
    },
    /// The sender's copy failed (an I/O error on its disk): it has marked the
    /// copy inconsistent (it will never serve it or resync from it until the
    /// partner has repaired it), stopped serving, and is closing the link; the
    /// receiver may go on alone at once, with no tie to break.
    Detach {
        /// What failed, for the log.
        reason: String,
    },
    /// The sender will not join its copy with the receiver's (the handshake's
    /// plan refused it: split brain, a copy with no record of an unfinished
    /// resync...) and is closing the link; the receiver shows `reason` as why
    /// it waits (it was refused, not left), and does not ask again until the
    /// operator acts.
    Refused {
        /// Why, as the refusing side's status says it (cut to
        /// [`REASON_BYTES_MAX`] bytes).
        reason: String,
    },
    /// The sender's copy `copy` ended (done or failed: its command is answered
    /// next): the receiver forgets what its writes overwrote. Answered with
    /// [`Message::Done`].
    CopyEnd {
        /// Request id chosen by the sender.
        id: u64,
        /// The copy, as numbered in its [`Op::CopyWrite`]s.
        copy: u64,
    },
    /// Follower to leader: the follower's copy cannot read these blocks; the
    /// leader writes them to it from its own copy ([`Message::RepairData`],
    /// holding their range as any write of theirs) and answers [`Message::Done`].
    Repair {
        /// Request id chosen by the sender.
        id: u64,
        /// First block.
        lba: u64,
        /// Blocks (at most [`REPAIR_BYTES_MAX`] bytes' worth).
        blocks: u64,
    },
    /// The sender's copy cannot read these blocks: the receiver's, answered
    /// with [`Message::CopyData`], or [`Message::Done`] with an error. From a
    /// leader (holding their range, so no write of theirs is in flight), to
    /// repair its copy; from a follower whose disk still cannot read them
    /// after the leader's [`Message::RepairData`], to serve its read.
    ReadCopy {
        /// Request id chosen by the sender.
        id: u64,
        /// First block.
        lba: u64,
        /// Blocks (at most [`REPAIR_BYTES_MAX`] bytes' worth).
        blocks: u64,
    },
    /// The blocks a [`Message::ReadCopy`] with the same `id` asked for.
    CopyData {
        /// The request's id.
        id: u64,
        /// The blocks.
        data: Bytes,
    },
    /// Leader to follower, answering its [`Message::Repair`]: the leader's
    /// blocks, which the follower's copy already holds logically (only its
    /// disk could not read them): written there without changing what the
    /// follower keeps to undo an unfinished copy; answered [`Message::Done`].
    RepairData {
        /// Request id chosen by the sender.
        id: u64,
        /// First block.
        lba: u64,
        /// The blocks.
        data: Bytes,
    },
    /// Heartbeat request; answered with [`Message::Pong`] carrying the same `seq`.
    Ping {
        /// Sequence number.
        seq: u64,
    },
    /// Heartbeat answer.
    Pong {
        /// The ping's sequence number.
        seq: u64,
    },
    /// Node to witness: may `node_id` keep accepting writes alone for `cluster`?
    WitnessClaim {
        /// The pair's cluster name.
        cluster: String,
        /// 1 or 2.
        node_id: u8,
        /// Rises with every request the node makes for `cluster`: the witness
        /// refuses one not above the last it took from that node (a request
        /// the node gave up on, arriving after a later one).
        seq: u64,
    },
    /// Node to witness: the pair is in sync again; the grant held by `node_id` is released.
    WitnessRelease {
        /// The pair's cluster name.
        cluster: String,
        /// 1 or 2.
        node_id: u8,
        /// As [`Message::WitnessClaim`]'s.
        seq: u64,
    },
    /// Witness to node: the answer to a claim or release. `holder` is the node
    /// holding the grant afterwards (0 when none); a claim succeeded when it
    /// names the claimant.
    WitnessAnswer {
        /// The holder of the survivor grant, 0 when none.
        holder: u8,
    },
}
