//! SCSI commands the tests send through the project's own initiator: commands
//! retried past unit attentions, READ CAPACITY, the LU's NAA, and the parameter
//! lists of EXTENDED COPY and ODX (POPULATE TOKEN, WRITE USING TOKEN).

use initiator::{ScsiResult, Session};
use std::time::Duration;

/// Runs `cdb` on `lun`, again after a unit attention (the first commands of a
/// nexus meet them) or a NOT READY (a replica deciding its role): at most 200
/// times, 50 ms apart for NOT READY.
pub async fn past_uas(s: &Session, lun: u64, cdb: &[u8], out: Vec<u8>, din: u32) -> ScsiResult {
    for _ in 0..200 {
        let r = s
            .command(lun, cdb, bytes::Bytes::from(out.clone()), din)
            .await
            .expect("command");
        let key = (r.status == 2)
            .then(|| r.sense.as_deref().and_then(initiator::parse_sense))
            .flatten()
            .map(|x| x.key);
        match key {
            Some(6) => continue,
            Some(2) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return r,
        }
    }
    panic!("unit attentions or NOT READY without end");
}

/// (asc, ascq) of a CHECK CONDITION, None for GOOD.
pub fn condition(r: &ScsiResult) -> Option<(u8, u8)> {
    (r.status == 2).then(|| {
        let s = r
            .sense
            .as_deref()
            .and_then(initiator::parse_sense)
            .expect("sense");
        (s.asc, s.ascq)
    })
}

/// `cdb` on LUN 0, no data out, as it comes (unit attentions included).
pub async fn command(s: &Session, cdb: &[u8], din: u32) -> ScsiResult {
    s.command(0, cdb, bytes::Bytes::new(), din)
        .await
        .expect("command")
}

/// LUN 0's size in bytes (READ CAPACITY(16)).
pub async fn capacity_bytes(s: &Session) -> u64 {
    let r = command(
        s,
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        32,
    )
    .await;
    assert_eq!(r.status, 0);
    let last = u64::from_be_bytes(r.data_in[..8].try_into().unwrap());
    let bs = u32::from_be_bytes(r.data_in[8..12].try_into().unwrap()) as u64;
    (last + 1) * bs
}

/// The LU's NAA designator (VPD 0x83).
pub async fn naa(s: &Session, lun: u64) -> [u8; 16] {
    let r = past_uas(s, lun, &[0x12, 1, 0x83, 1, 0, 0], vec![], 256).await;
    assert_eq!(r.status, 0);
    let d = &r.data_in[4..];
    assert_eq!(
        (d[1] & 0x0f, d[3]),
        (3, 16),
        "the first designator is the NAA"
    );
    d[4..20].try_into().unwrap()
}

pub use initiator::offload::extended_copy as xcopy;

/// POPULATE TOKEN (0x10) or WRITE USING TOKEN (0x11) with list id `list` and a
/// parameter list of `len` bytes.
pub fn token_cdb(sa: u8, list: u32, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[1] = sa;
    c[6..10].copy_from_slice(&list.to_be_bytes());
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

/// One block device range descriptor.
pub fn range(lba: u64, blocks: u32) -> Vec<u8> {
    let mut d = vec![0u8; 16];
    d[0..8].copy_from_slice(&lba.to_be_bytes());
    d[8..12].copy_from_slice(&blocks.to_be_bytes());
    d
}

/// POPULATE TOKEN of `lba..lba + blocks`: (CDB, parameter list).
pub fn populate_token(lba: u64, blocks: u32, list: u32) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&(14u16 + 16).to_be_bytes());
    p[15] = 16;
    p.extend_from_slice(&range(lba, blocks));
    (token_cdb(0x10, list, p.len()), p)
}

/// RECEIVE ROD TOKEN INFORMATION of list id `list`.
pub fn receive_rod_token_information(list: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = 0x07;
    c[2..6].copy_from_slice(&list.to_be_bytes());
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

/// The ROD token in a RECEIVE ROD TOKEN INFORMATION answer.
pub fn token_of(data_in: &[u8]) -> Vec<u8> {
    let at = 32 + data_in[13] as usize + 6;
    data_in[at..at + 512].to_vec()
}

/// WRITE USING TOKEN of `token` onto `lba..lba + blocks`: (CDB, parameter list).
pub fn write_using_token(token: &[u8], lba: u64, blocks: u32, list: u32) -> (Vec<u8>, Vec<u8>) {
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&(534u16 + 16).to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[535] = 16;
    p.extend_from_slice(&range(lba, blocks));
    (token_cdb(0x11, list, p.len()), p)
}
