//! WRITE ATOMIC(16) through a real node. Its LUN advertises atomic writes and
//! takes one. Then the crash the layer exists for is planted while the node is
//! down: an atomic write whose record reached `lun0.atomic` and whose in-place
//! write was torn half way, beside a record of another LUN. The next start must
//! complete the first, so its blocks hold all of the new data, and leave the
//! second alone. A later plain write to those blocks then survives another
//! SIGKILL and restart, so the record is not applied twice.

use crate::common;
use common::scsi::{self, past_uas as cmd};
use common::*;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const BS: u32 = 512;
const LBA: u64 = 1000;
const BLOCKS: u16 = 256;
const FOREIGN_LBA: u64 = 3000;

fn write_atomic_cdb(lba: u64, blocks: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9c;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[12..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

async fn read(s: &initiator::Session, lba: u64, blocks: u16) -> Vec<u8> {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&(blocks as u32).to_be_bytes());
    let r = cmd(s, 0, &c, Vec::new(), blocks as u32 * BS).await;
    assert_eq!(r.status, 0);
    r.data_in.to_vec()
}

fn pattern(byte: u8) -> Vec<u8> {
    vec![byte; BLOCKS as usize * BS as usize]
}

/// The record area of LUN 0, wherever the data directory keeps it.
fn records_file(dir: &Path) -> PathBuf {
    let targets = dir.join("data").join("targets");
    std::fs::read_dir(&targets)
        .unwrap()
        .map(|e| e.unwrap().path().join("lun0.atomic"))
        .find(|p| p.exists())
        .expect("lun0.atomic in the data directory")
}

fn write_at(path: &Path, offset: u64, data: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).unwrap();
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_atomic_write_is_completed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_file_lun(dir.path(), "64M", "first.log");
    let s = node.login("iqn.2026-11.test:atomic").await;
    // advertised in the Block Limits page, and taken
    let r = cmd(
        &s,
        0,
        &[0x12, 0x01, 0xb0, 0x00, 0xff, 0x00],
        Vec::new(),
        255,
    )
    .await;
    assert_eq!(r.status, 0);
    let max = u32::from_be_bytes(r.data_in[44..48].try_into().unwrap());
    assert!(max >= BLOCKS as u32, "MAXIMUM ATOMIC TRANSFER LENGTH {max}");
    let r = cmd(&s, 0, &write_atomic_cdb(LBA, BLOCKS), pattern(0x11), 0).await;
    assert_eq!(r.status, 0, "{:?}", scsi::condition(&r));
    assert_eq!(read(&s, LBA, BLOCKS).await, pattern(0x11));
    let key = block::AtomicWrites::key_of(&scsi::naa(&s, 0).await);
    drop(s);
    node.kill9();

    // what a crash in the middle of an atomic write of 0x22 leaves: its record,
    // and half of its blocks written in place
    let records = records_file(dir.path());
    let rec = block::AtomicWrites::record(BS, 7, LBA, key, pattern(0x22).into());
    write_at(&records, 0, &rec);
    let img = dir.path().join("lun0.img");
    let half = pattern(0x22)[..BLOCKS as usize * BS as usize / 2].to_vec();
    write_at(&img, LBA * BS as u64, &half);
    // and a record another LUN of that number once left
    let foreign = block::AtomicWrites::record(BS, 8, FOREIGN_LBA, key ^ 1, pattern(0x33).into());
    write_at(&records, block::AtomicWrites::slot_bytes(BS), &foreign);

    let mut node = start_file_lun(dir.path(), "64M", "second.log");
    let s = node.login("iqn.2026-11.test:atomic").await;
    assert_eq!(
        read(&s, LBA, BLOCKS).await,
        pattern(0x22),
        "the torn atomic write was not completed"
    );
    assert_eq!(
        read(&s, FOREIGN_LBA, BLOCKS).await,
        pattern(0),
        "another volume's record was applied"
    );
    assert_ne!(
        &read_at(&records, 0, 8)[..],
        b"FSATOMIC",
        "record not cleared"
    );

    // a plain write over the same blocks survives a SIGKILL and a restart: the
    // record is not applied again
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[1] = 0x08; // FUA
    c[2..10].copy_from_slice(&LBA.to_be_bytes());
    c[10..14].copy_from_slice(&(BLOCKS as u32).to_be_bytes());
    assert_eq!(cmd(&s, 0, &c, pattern(0x44), 0).await.status, 0);
    drop(s);
    node.kill9();
    let log = std::fs::read_to_string(dir.path().join("second.log")).unwrap_or_default();
    assert!(
        log.contains("applying an atomic write a crash interrupted"),
        "no log line for the replay"
    );
    assert!(log.contains("atomic write record of another volume: not applied"));
    let node = start_file_lun(dir.path(), "64M", "third.log");
    let s = node.login("iqn.2026-11.test:atomic").await;
    assert_eq!(read(&s, LBA, BLOCKS).await, pattern(0x44));
    let log = std::fs::read_to_string(dir.path().join("third.log")).unwrap_or_default();
    assert!(!log.contains("applying an atomic write"), "applied twice");
}
