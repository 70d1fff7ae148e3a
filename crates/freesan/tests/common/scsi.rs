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
pub use initiator::offload::{
    populate_token, receive_rod_token_information, token_of, write_using_token,
};
