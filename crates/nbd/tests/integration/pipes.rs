//! Large WRITE payloads spliced from the socket into a pipe and handed to a
//! volume that takes pipes (`block::Volume::write_pipe`): which writes go
//! that way, that their bytes arrive whole and in place however the client
//! sends them, and that a client stopping mid-payload changes nothing. And
//! READs on a plain connection asked of the volume as reads bound for a
//! socket (`block::Volume::read_to_socket`).

use crate::common::{pattern, start_volumes, Raw};
use async_trait::async_trait;
use block::{BlockResult, Bytes, Geometry, MemVolume, PipePayload, Volume, VolumeRef};
use nbd::proto::{cmdflag, Command};
use nbd::NbdLimits;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// A memory volume that says it takes pipes and counts the writes it gets
/// from one (their bytes go through the trait's default: a buffer).
struct Piped {
    inner: MemVolume,
    piped: AtomicU64,
    piped_bytes: AtomicU64,
    socket_reads: AtomicU64,
}

#[async_trait]
impl Volume for Piped {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        self.inner.write(lba, data, fua).await
    }
    async fn read_to_socket(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        self.socket_reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(lba, blocks).await
    }
    fn takes_pipes(&self) -> bool {
        true
    }
    async fn write_pipe(&self, lba: u64, pipe: &mut PipePayload, fua: bool) -> BlockResult<()> {
        self.piped.fetch_add(1, Ordering::Relaxed);
        self.piped_bytes
            .fetch_add(pipe.len() as u64, Ordering::Relaxed);
        let data = pipe.take_bytes().map_err(block::BlockError::Io)?;
        self.inner.write(lba, data, fua).await
    }
    async fn flush(&self) -> BlockResult<()> {
        self.inner.flush().await
    }
    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        self.inner.discard(lba, blocks).await
    }
}

fn piped_volume() -> Arc<Piped> {
    Arc::new(Piped {
        inner: MemVolume::new(512, 16 << 11), // 16 MiB
        piped: AtomicU64::new(0),
        piped_bytes: AtomicU64::new(0),
        socket_reads: AtomicU64::new(0),
    })
}

/// Aligned unforced writes of 64 KiB to a quarter of a pipe are spliced,
/// whether the client sends them in one piece, in a trickle of small ones or
/// back to back; smaller, unaligned and FUA writes are not. Every byte reads
/// back where it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_aligned_writes_go_through_a_pipe() {
    let vol = piped_volume();
    let srv = start_volumes(
        vec![(vol.clone() as VolumeRef, false)],
        NbdLimits::default(),
    )
    .await;
    let mut c = Raw::connect(srv.addr, "lun0").await;
    let mut oracle = vec![0u8; 16 << 20];
    let mut put = |off: usize, d: &[u8]| oracle[off..off + d.len()].copy_from_slice(d);

    // The first request's header is read with whatever follows it (up to
    // 256 KiB): its payload may be all buffered already, and then needs no
    // pipe. After a large payload the next header is read alone, so the next
    // large payload is all in the socket: the counts below are exact.
    let first = pattern(1, 256 << 10);
    assert_eq!(c.write(0, &first).await, 0);
    put(0, &first);
    let primed = vol.piped.load(Ordering::Relaxed);
    assert!(primed <= 1);

    // the largest a pipe holds and the smallest piped, each in one piece
    for (off, len, seed) in [(1usize << 20, 256 << 10, 2u64), (3 << 19, 64 << 10, 3)] {
        let d = pattern(seed, len);
        assert_eq!(c.write(off as u64, &d).await, 0);
        put(off, &d);
    }
    assert_eq!(vol.piped.load(Ordering::Relaxed), primed + 2);

    // a payload trickling in: its header, then pieces with pauses between
    let d = pattern(3, 128 << 10);
    c.send(Command::Write, 0, 9, 2 << 20, d.len() as u32, &[])
        .await;
    for piece in d.chunks(10_000) {
        c.sock.write_all(piece).await.unwrap();
        c.sock.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = c.reply().await.expect("closed");
    assert_eq!((r.cookie, r.error), (9, 0));
    put(2 << 20, &d);
    assert_eq!(vol.piped.load(Ordering::Relaxed), primed + 3);

    // eight sent back to back before any reply is read
    let mut sent = Vec::new();
    for i in 0..8u64 {
        let off = (4 << 20) + i as usize * (256 << 10);
        let d = pattern(10 + i, 256 << 10);
        c.send(Command::Write, 0, 100 + i, off as u64, d.len() as u32, &d)
            .await;
        sent.push((off, d));
    }
    for _ in 0..8 {
        let r = c.reply().await.expect("closed");
        assert_eq!(r.error, 0);
    }
    for (off, d) in &sent {
        put(*off, d);
    }
    assert_eq!(vol.piped.load(Ordering::Relaxed), primed + 11);

    // not through a pipe: too large for one, too small, unaligned, forced
    let before = vol.piped.load(Ordering::Relaxed);
    for (off, len, flags) in [
        (8usize << 20, 512 << 10, 0u16),
        (9 << 20, 32 << 10, 0),
        ((10 << 20) + 100, 64 << 10, 0),
        (11 << 20, 128 << 10, cmdflag::FUA),
    ] {
        let d = pattern(off as u64, len);
        c.send(Command::Write, flags, 5, off as u64, len as u32, &d)
            .await;
        let r = c.reply().await.expect("closed");
        assert_eq!((r.cookie, r.error), (5, 0));
        put(off, &d);
    }
    assert_eq!(vol.piped.load(Ordering::Relaxed), before);
    assert_eq!(
        vol.piped_bytes.load(Ordering::Relaxed),
        (primed * 256 + 256 + 64 + 128 + 8 * 256) << 10
    );

    // (a plain connection: READs are reads bound for its socket)
    let before = vol.socket_reads.load(Ordering::Relaxed);
    for off in (0..16 << 20).step_by(1 << 20) {
        let got = c.read(off as u64, 1 << 20).await.unwrap();
        assert!(got == oracle[off..off + (1 << 20)], "MiB at {off} differs");
    }
    assert_eq!(vol.socket_reads.load(Ordering::Relaxed), before + 16);
    srv.stop().await;
}

/// A client that stops sending in the middle of a spliced payload is let go
/// after the payload stall time, one that ends its stream there at once;
/// neither payload reaches the volume, and the server serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_cut_short_in_its_pipe_writes_nothing() {
    let vol = piped_volume();
    let limits = NbdLimits {
        payload_stall_ms: 300,
        ..NbdLimits::default()
    };
    let srv = start_volumes(vec![(vol.clone() as VolumeRef, false)], limits).await;
    let d = pattern(7, 256 << 10);

    let mut stalled = Raw::connect(srv.addr, "lun0").await;
    stalled
        .send(Command::Write, 0, 1, 0, d.len() as u32, &d[..100_000])
        .await;
    assert!(
        stalled.closed().await,
        "a stalled payload keeps its connection"
    );

    let mut gone = Raw::connect(srv.addr, "lun0").await;
    gone.send(Command::Write, 0, 1, 0, d.len() as u32, &d[..100_000])
        .await;
    gone.sock.shutdown().await.unwrap();
    assert!(
        gone.closed().await,
        "a payload cut by the end of its stream keeps its connection"
    );

    let mut c = Raw::connect(srv.addr, "lun0").await;
    assert!(c.read(0, 256 << 10).await.unwrap().iter().all(|b| *b == 0));
    assert_eq!(vol.piped.load(Ordering::Relaxed), 0);
    // the first large write may come all buffered (see above), the second not
    assert_eq!(c.write(0, &d).await, 0);
    assert_eq!(c.write(256 << 10, &d).await, 0);
    assert_eq!(c.read(0, 256 << 10).await.unwrap(), d);
    assert_eq!(c.read(256 << 10, 256 << 10).await.unwrap(), d);
    assert!(vol.piped.load(Ordering::Relaxed) >= 1);
    srv.stop().await;
}
