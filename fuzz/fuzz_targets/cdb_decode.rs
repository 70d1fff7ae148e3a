//! Arbitrary bytes as a short sequence of SCSI commands (CDB + Data-Out) executed by
//! a `ScsiTarget` over a small memory volume: every command must get an answer with a
//! valid status and never panic, whatever the CDB or parameter data (EXTENDED COPY's
//! parameter lists included: the LU's NAA is all 0x60).
#![no_main]

use block::{Bytes, MemVolume};
use libfuzzer_sys::fuzz_target;
use scsi::{Command, ItNexus, LunConfig, ScsiTarget, TargetConfig, TargetPort, TaskAttr};
use std::sync::Arc;

/// Most commands one input may carry.
const COMMANDS_MAX: usize = 8;

fn target() -> ScsiTarget {
    let lun = LunConfig {
        naa: [0x60; 16],
        serial: "FUZZ0001".into(),
        vendor: "FREESAN".into(),
        product: "FUZZ".into(),
        revision: "0001".into(),
        read_only: false,
        state_file: None,
    };
    ScsiTarget::new(TargetConfig {
        name: "iqn.2026-11.org.freesan:fuzz".into(),
        ports: vec![TargetPort {
            relative_id: 1,
            group_id: 1,
            name: "iqn.2026-11.org.freesan:fuzz,t,0x0001".into(),
        }],
        port_groups: vec![],
        luns: vec![(0, lun, Arc::new(MemVolume::new(512, 128)))],
    })
    .expect("static configuration is valid")
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
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
        for _ in 0..COMMANDS_MAX {
            let Some((hdr, tail)) = rest.split_first_chunk::<4>() else {
                break;
            };
            let cdb_len = (hdr[1] as usize % 33).min(tail.len());
            let (cdb, tail) = tail.split_at(cdb_len);
            let data_len = (u16::from_le_bytes([hdr[2], hdr[3]]) as usize).min(tail.len());
            let (data_out, tail) = tail.split_at(data_len);
            rest = tail;
            let cmd = Command {
                cdb: Bytes::copy_from_slice(cdb),
                lun: u64::from(hdr[0] >> 7),
                data_out: Bytes::copy_from_slice(data_out),
                data_in_len_max: 1 << 16,
                attr: TaskAttr::Simple,
            };
            let n = nexus(hdr[0] & 3);
            let r = t.execute(&n, cmd).await;
            assert!(matches!(r.status, 0x00 | 0x02 | 0x08 | 0x18 | 0x28 | 0x40));
            assert_eq!(r.status == 0x02, r.sense.is_some());
            if hdr[0] & 0x40 != 0 {
                t.lun_reset(&n, 0).await;
            }
        }
    });
});
