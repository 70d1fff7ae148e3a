//! Arbitrary bytes as a short sequence of SCSI commands (CDB + Data-Out) executed by
//! a `ScsiTarget` over a small memory volume: every command must get an answer with a
//! valid status and never panic, whatever the CDB or parameter data (EXTENDED COPY's
//! parameter lists included: the LU's NAA is all 0x60; WRITE ATOMIC(16), the LU having
//! atomic writes; and the ROD token commands':
//! after a POPULATE TOKEN that succeeds, its token is fetched with RECEIVE ROD TOKEN
//! INFORMATION, and a later WRITE USING TOKEN whose flags have bit 5 set carries that
//! real token, so that the copy itself is reached, not only the token checks).
#![no_main]

use block::{AtomicWrites, Bytes, MemVolume};
use libfuzzer_sys::fuzz_target;
use scsi::{Command, ItNexus, LunConfig, ScsiTarget, TargetConfig, TargetPort, TaskAttr};
use std::sync::Arc;

/// Most commands one input may carry.
const COMMANDS_MAX: usize = 8;

fn atomic_volume() -> Arc<AtomicWrites> {
    let records = MemVolume::new(512, AtomicWrites::records_bytes(512) / 512);
    let v = AtomicWrites::new(Arc::new(MemVolume::new(512, 128)), Arc::new(records), 1);
    Arc::new(v.expect("the record area fits"))
}

fn target() -> ScsiTarget {
    let lun = LunConfig {
        naa: [0x60; 16],
        serial: "FUZZ0001".into(),
        vendor: "FREESAN".into(),
        product: "FUZZ".into(),
        revision: "0001".into(),
        read_only: false,
        state_file: None,
        physical_block_exponent: 0,
        sanitize_rate_bytes_per_s: 0,
    };
    ScsiTarget::new(TargetConfig {
        name: "iqn.2026-11.org.freesan:fuzz".into(),
        ports: vec![TargetPort {
            relative_id: 1,
            group_id: 1,
            name: "iqn.2026-11.org.freesan:fuzz,t,0x0001".into(),
        }],
        port_groups: vec![],
        // with atomic writes, so WRITE ATOMIC(16) reaches its checks and the
        // record area, not only INVALID OPERATION CODE
        luns: vec![(0, lun, atomic_volume())],
    })
    .expect("static configuration is valid")
}

fuzz_target!(|data: &[u8]| {
    // (timers: a reset waits, bounded, for copies writing its LU)
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let t = target();
    let nexus = |isid: u8| ItNexus {
        initiator_name: Arc::from("iqn.fuzz"),
        initiator_port: Arc::from(format!("iqn.fuzz,i,0x{isid:012x}").as_str()),
        relative_port_id: 1,
        chap_user: None,
    };
    rt.block_on(async {
        // Each command: [flags, cdb_len, data_len_lo, data_len_hi, cdb.., data..].
        let mut rest = data;
        // The last ROD token POPULATE TOKEN made.
        let mut token: Option<Vec<u8>> = None;
        for _ in 0..COMMANDS_MAX {
            let Some((hdr, tail)) = rest.split_first_chunk::<4>() else {
                break;
            };
            let cdb_len = (hdr[1] as usize % 33).min(tail.len());
            let (cdb, tail) = tail.split_at(cdb_len);
            let data_len = (u16::from_le_bytes([hdr[2], hdr[3]]) as usize).min(tail.len());
            let (data_out, tail) = tail.split_at(data_len);
            rest = tail;
            let is = |sa: u8| cdb.len() >= 2 && cdb[0] == 0x83 && cdb[1] & 0x1f == sa;
            let mut data_out = data_out.to_vec();
            if let (true, true, Some(t)) = (hdr[0] & 0x20 != 0, is(0x11), &token) {
                if let Some(slot) = data_out.get_mut(16..528) {
                    slot.copy_from_slice(t);
                }
            }
            let cmd = Command {
                cdb: Bytes::copy_from_slice(cdb),
                lun: u64::from(hdr[0] >> 7),
                data_out: Bytes::from(data_out),
                data_in_len_max: 1 << 16,
                attr: TaskAttr::Simple,
            };
            let n = nexus(hdr[0] & 3);
            let r = t.execute(&n, cmd).await;
            assert!(matches!(r.status, 0x00 | 0x02 | 0x08 | 0x18 | 0x28 | 0x40));
            assert_eq!(r.status == 0x02, r.sense.is_some());
            if r.status == 0x00 && is(0x10) && cdb.len() >= 10 {
                // RECEIVE ROD TOKEN INFORMATION for the same list identifier.
                let mut rrti = [0u8; 16];
                rrti[0] = 0x84;
                rrti[1] = 0x07;
                rrti[2..6].copy_from_slice(&cdb[6..10]);
                rrti[10..14].copy_from_slice(&4096u32.to_be_bytes());
                let r = t
                    .execute(
                        &n,
                        Command {
                            cdb: Bytes::copy_from_slice(&rrti),
                            lun: u64::from(hdr[0] >> 7),
                            data_out: Bytes::new(),
                            data_in_len_max: 1 << 16,
                            attr: TaskAttr::Simple,
                        },
                    )
                    .await;
                let d = &r.data_in;
                if let Some(&x) = d.get(13) {
                    let at = 32 + usize::from(x) + 6;
                    token = d.get(at..at + 512).map(<[u8]>::to_vec).or(token);
                }
            }
            if hdr[0] & 0x40 != 0 {
                t.lun_reset(&n, 0).await;
            }
        }
    });
});
