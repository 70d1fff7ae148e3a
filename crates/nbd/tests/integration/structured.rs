//! Structured replies and `base:allocation` block status over a real socket:
//! a raw client negotiates `NBD_OPT_STRUCTURED_REPLY` and
//! `NBD_OPT_SET_META_CONTEXT`, then reads, writes, fails and asks for the
//! allocation map of a sparse memory volume.

use crate::common;
use bytes::BytesMut;
use common::*;
use nbd::proto::{
    cmdflag, decode_meta_context_reply, decode_option_reply_header, decode_server_greeting,
    decode_simple_reply, decode_structured_reply_header, encode_option, errno, opt, rep, rflag,
    rtype, state, ClientOption, Command, InfoRequest, MetaContextRequest, StructuredReplyHeader,
    BASE_ALLOCATION, OPTION_REPLY_HEADER_BYTES, SIMPLE_REPLY_BYTES,
};
use nbd::NbdLimits;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HZ: u32 = state::HOLE | state::ZERO;

struct Client {
    sock: TcpStream,
}

impl Client {
    /// Greeting and flags, then `opts` each answered until ACK or an error;
    /// returns every (option, reply type, data).
    async fn haggle(addr: SocketAddr, opts: &[ClientOption]) -> (Client, Vec<(u32, u32, Vec<u8>)>) {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        let mut g = [0u8; 18];
        sock.read_exact(&mut g).await.unwrap();
        decode_server_greeting(&g).unwrap();
        sock.write_all(&3u32.to_be_bytes()).await.unwrap();
        let mut c = Client { sock };
        let mut all = Vec::new();
        for o in opts {
            let mut b = BytesMut::new();
            encode_option(o, &mut b);
            c.sock.write_all(&b).await.unwrap();
            loop {
                let (code, t, d) = c.option_reply().await;
                all.push((code, t, d));
                if t == rep::ACK || t & rep::ERR_BIT != 0 {
                    break;
                }
            }
        }
        (c, all)
    }

    async fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; OPTION_REPLY_HEADER_BYTES];
        self.sock.read_exact(&mut h).await.unwrap();
        let h = decode_option_reply_header(&h).unwrap();
        let mut d = vec![0u8; h.data_len_bytes as usize];
        self.sock.read_exact(&mut d).await.unwrap();
        (h.option, h.reply_type, d)
    }

    /// One structured chunk: header and payload.
    async fn chunk(&mut self) -> (StructuredReplyHeader, Vec<u8>) {
        let mut h = [0u8; 20];
        tokio::time::timeout(Duration::from_secs(10), self.sock.read_exact(&mut h))
            .await
            .expect("reply timed out")
            .unwrap();
        let h = decode_structured_reply_header(&h).expect("structured magic");
        let mut d = vec![0u8; h.length_bytes as usize];
        self.sock.read_exact(&mut d).await.unwrap();
        (h, d)
    }

    /// A request answered by one chunk flagged DONE with the right cookie.
    async fn call(
        &mut self,
        command: Command,
        flags: u16,
        off: u64,
        len: u32,
        payload: &[u8],
    ) -> (u16, Vec<u8>) {
        send_request(&mut self.sock, command, flags, 42, (off, len), payload).await;
        let (h, d) = self.chunk().await;
        assert_eq!(h.cookie, 42);
        assert_eq!(h.flags, rflag::DONE, "one chunk per reply");
        (h.reply_type, d)
    }

    /// A request answered by a simple reply (what a success with no data
    /// gets even with structured replies): returns its error.
    async fn call_simple(
        &mut self,
        command: Command,
        flags: u16,
        off: u64,
        len: u32,
        payload: &[u8],
    ) -> u32 {
        send_request(&mut self.sock, command, flags, 43, (off, len), payload).await;
        let mut h = [0u8; SIMPLE_REPLY_BYTES];
        tokio::time::timeout(Duration::from_secs(10), self.sock.read_exact(&mut h))
            .await
            .expect("reply timed out")
            .unwrap();
        let r = decode_simple_reply(&h).expect("simple reply magic");
        assert_eq!(r.cookie, 43);
        r.error
    }

    async fn block_status(
        &mut self,
        flags: u16,
        off: u64,
        len: u32,
    ) -> Result<(u32, Vec<(u32, u32)>), u32> {
        let (t, d) = self.call(Command::BlockStatus, flags, off, len, &[]).await;
        if t == rtype::ERROR {
            return Err(be32(&d, 0));
        }
        assert_eq!(t, rtype::BLOCK_STATUS);
        assert_eq!(d.len() % 8, 4);
        let v = d[4..].chunks(8).map(|c| (be32(c, 0), be32(c, 4))).collect();
        Ok((be32(&d, 0), v))
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn meta(queries: &[&str]) -> MetaContextRequest {
    MetaContextRequest {
        name: "lun0".into(),
        queries: queries.iter().map(|q| q.to_string()).collect(),
    }
}

fn go() -> ClientOption {
    ClientOption::Go(InfoRequest {
        name: "lun0".into(),
        infos: vec![],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_replies_and_block_status_of_a_sparse_volume() {
    // 4 MiB of 512-byte blocks; the memory volume allocates 64 KiB chunks.
    let srv = start(&[(512, 8192, false)], NbdLimits::default()).await;
    let (mut c, r) = Client::haggle(
        srv.addr,
        &[
            ClientOption::StructuredReply,
            ClientOption::ListMetaContext(meta(&[])),
            ClientOption::SetMetaContext(meta(&["qemu:dirty-bitmap:x", BASE_ALLOCATION])),
            go(),
        ],
    )
    .await;
    assert_eq!((r[0].0, r[0].1), (opt::STRUCTURED_REPLY, rep::ACK));
    assert_eq!(r[1].1, rep::META_CONTEXT);
    let (id, name) = decode_meta_context_reply(&r[1].2).unwrap();
    assert_eq!(name, BASE_ALLOCATION);
    assert_eq!(r[2].1, rep::ACK);
    assert_eq!((r[3].0, r[3].1), (opt::SET_META_CONTEXT, rep::META_CONTEXT));
    assert_eq!(decode_meta_context_reply(&r[3].2).unwrap().0, id);
    assert_eq!(r[4].1, rep::ACK);
    assert_eq!(r.last().unwrap().1, rep::ACK);

    // Everything is a hole at first.
    assert_eq!(
        c.block_status(0, 0, 4 << 20).await,
        Ok((id, vec![(4 << 20, HZ)]))
    );
    // Two written regions (one write, one unaligned write): a write that
    // succeeds gets a simple reply (16 bytes, as nbdkit sends), allowed for
    // every command but READ.
    let data = pattern(1, 128 << 10);
    assert_eq!(
        c.call_simple(Command::Write, 0, 1 << 20, 128 << 10, &data)
            .await,
        0
    );
    assert_eq!(
        c.call_simple(Command::Write, cmdflag::FUA, (3 << 20) + 5, 3, b"abc")
            .await,
        0
    );
    // A write that fails is answered by an ERROR chunk.
    let (t, d) = c.call(Command::Write, 0, (4 << 20) - 1, 2, b"xy").await;
    assert_eq!((t, be32(&d, 0)), (rtype::ERROR, errno::ENOSPC));
    let k = 64 << 10;
    assert_eq!(
        c.block_status(0, 0, 4 << 20).await,
        Ok((
            id,
            vec![
                (1 << 20, HZ),
                (128 << 10, 0),
                ((2 << 20) - (128 << 10), HZ),
                (k, 0),
                ((1 << 20) - k, HZ)
            ]
        ))
    );
    // REQ_ONE, an unaligned window, errors as ERROR chunks.
    assert_eq!(
        c.block_status(cmdflag::REQ_ONE, 0, 4 << 20).await,
        Ok((id, vec![(1 << 20, HZ)]))
    );
    assert_eq!(
        c.block_status(0, (1 << 20) - 10, 20).await,
        Ok((id, vec![(10, HZ), (10, 0)]))
    );
    assert_eq!(c.block_status(0, 4 << 20, 512).await, Err(errno::EINVAL));
    // FUA is allowed on every command (it means nothing to a query); other
    // flags are not
    assert_eq!(
        c.block_status(cmdflag::FUA, 0, 512).await,
        Ok((id, vec![(512, HZ)]))
    );
    assert_eq!(
        c.block_status(cmdflag::NO_HOLE, 0, 512).await,
        Err(errno::EINVAL)
    );

    // READ: one OFFSET_DATA chunk with the offset, then the data.
    let (t, d) = c.call(Command::Read, 0, (1 << 20) + 100, 1000, &[]).await;
    assert_eq!(t, rtype::OFFSET_DATA);
    assert_eq!(&d[..8], &((1u64 << 20) + 100).to_be_bytes());
    assert_eq!(&d[8..], &data[100..1100]);
    let (t, d) = c.call(Command::Read, 0, (4 << 20) - 1, 2, &[]).await;
    assert_eq!(t, rtype::ERROR);
    assert_eq!((be32(&d, 0), d.len()), (errno::EINVAL, 6));
    for cmd in [Command::Flush, Command::Trim, Command::WriteZeroes] {
        assert_eq!(c.call_simple(cmd, 0, 0, 512, &[]).await, 0, "{cmd:?}");
    }
    // An empty READ is still a structured reply (NONE), never a simple one.
    assert_eq!(
        c.call(Command::Read, 0, 0, 0, &[]).await,
        (rtype::NONE, vec![])
    );
    send_request(&mut c.sock, Command::Disc, 0, 1, (0, 0), &[]).await;

    // Structured replies without a context: BLOCK_STATUS is EINVAL, in a chunk.
    let (mut c, r) = Client::haggle(srv.addr, &[ClientOption::StructuredReply, go()]).await;
    assert_eq!(r[0].1, rep::ACK);
    assert_eq!(c.block_status(0, 0, 512).await, Err(errno::EINVAL));
    let (t, d) = c.call(Command::Read, 0, 1 << 20, 4, &[]).await;
    assert_eq!((t, &d[8..]), (rtype::OFFSET_DATA, &data[..4]));

    // SET before STRUCTURED_REPLY is refused, and then no context is active.
    let (_, r) = Client::haggle(
        srv.addr,
        &[ClientOption::SetMetaContext(meta(&[BASE_ALLOCATION]))],
    )
    .await;
    assert_eq!(r[0].1, rep::ERR_INVALID);

    // A client that asks for nothing still gets simple replies.
    let mut raw = Raw::connect(srv.addr, "lun0").await;
    assert_eq!(raw.read(1 << 20, 4).await, Ok(data[..4].to_vec()));
    raw.send(Command::BlockStatus, 0, 4, 0, 512, &[]).await;
    assert_eq!(raw.reply().await.unwrap().error, errno::EINVAL);
    srv.stop().await;
}
