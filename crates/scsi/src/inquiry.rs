//! INQUIRY: standard data and the vital product data pages 0x00 (supported pages),
//! 0x80 (unit serial number), 0x83 (device identification), 0xB0 (block limits),
//! 0xB1 (block device characteristics) and 0xB2 (logical block provisioning).
//!
//! The block limits advertised here are the same constants the read/write family
//! enforces ([`Limits`]), so what an initiator reads is what it gets.

use crate::cdb::{put_ascii, Cdb};
use crate::lu::{CmdResult, Done, LogicalUnit};
use crate::{ItNexus, TargetPort};
use block::Geometry;

/// Most blocks one COMPARE AND WRITE may cover.
pub const CAW_BLOCKS_MAX: u32 = 255;
/// Most unmap block descriptors in one UNMAP.
pub const UNMAP_DESCRIPTORS_MAX: u32 = 256;
/// Most blocks one UNMAP may deallocate (sum over its descriptors).
pub const UNMAP_BLOCKS_MAX: u32 = 1 << 20;
/// Largest WRITE SAME, in bytes of the volume (converted to blocks per LU).
pub const WRITE_SAME_BYTES_MAX: u64 = 1 << 30;
/// Largest WRITE SAME in blocks, whatever the block size: 65535, what a 16-bit
/// length can say and what Linux's LIO target advertises. Initiators split larger
/// zeroing or unmapping by MAXIMUM WRITE SAME LENGTH (Linux, ESXi, Windows do);
/// one that sends more gets INVALID FIELD IN CDB (libiscsi's WriteSame16.Unmap
/// checks exactly that instead of writing 65536 blocks in one WRITE(16), which
/// would exceed the MAXIMUM TRANSFER LENGTH).
pub const WRITE_SAME_BLOCKS_MAX: u64 = 0xffff;

/// Block limits of one logical unit, derived from its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// MAXIMUM TRANSFER LENGTH in blocks (READ/WRITE/VERIFY/ORWRITE).
    pub transfer_blocks_max: u32,
    /// OPTIMAL TRANSFER LENGTH in blocks.
    pub transfer_blocks_optimal: u32,
    /// MAXIMUM WRITE SAME LENGTH in blocks.
    pub write_same_blocks_max: u64,
}

impl Limits {
    /// Limits for a volume of this geometry.
    pub fn of(geo: &Geometry) -> Limits {
        Limits {
            transfer_blocks_max: geo.max_io_blocks.max(1),
            transfer_blocks_optimal: geo.optimal_io_blocks.max(1),
            write_same_blocks_max: (WRITE_SAME_BYTES_MAX / geo.block_size_bytes.max(1) as u64)
                .clamp(1, WRITE_SAME_BLOCKS_MAX),
        }
    }
}

const VPD_SUPPORTED: u8 = 0x00;
const VPD_SERIAL: u8 = 0x80;
const VPD_DEVICE_ID: u8 = 0x83;
const VPD_BLOCK_LIMITS: u8 = 0xb0;
const VPD_BLOCK_CHARACTERISTICS: u8 = 0xb1;
const VPD_LB_PROVISIONING: u8 = 0xb2;
const VPD_THIRD_PARTY_COPY: u8 = 0x8f;
const VPD_PAGES: [u8; 7] = [
    VPD_SUPPORTED,
    VPD_SERIAL,
    VPD_DEVICE_ID,
    VPD_THIRD_PARTY_COPY,
    VPD_BLOCK_LIMITS,
    VPD_BLOCK_CHARACTERISTICS,
    VPD_LB_PROVISIONING,
];

/// Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00a0, 0x0960, 0x0460, 0x04c0];

/// Peripheral qualifier 011b + device type 1Fh: no logical unit here.
const NO_LUN_PERIPHERAL: u8 = 0x7f;

/// INQUIRY for `lu` (None when the LUN does not exist).
pub(crate) fn inquiry(
    target: &str,
    ports: &[TargetPort],
    lu: Option<&LogicalUnit>,
    nexus: &ItNexus,
    cdb: &Cdb,
) -> CmdResult {
    let evpd = cdb.b(1) & 0x01 != 0;
    let page = cdb.b(2);
    let alloc_len = cdb.u16_at(3) as u32;
    if cdb.b(1) & 0x02 != 0 {
        return Err(cdb.invalid(1, Some(1)).into());
    }
    if !evpd {
        if page != 0 {
            return Err(cdb.invalid(2, None).into());
        }
        return Ok(Done::alloc(standard(ports, lu), alloc_len));
    }
    let Some(lu) = lu else {
        return Err(crate::sense::codes::LUN_NOT_SUPPORTED.into());
    };
    let geo = lu.geometry();
    let data = match page {
        VPD_SUPPORTED => vpd(page, &VPD_PAGES),
        VPD_SERIAL => {
            let mut s = vec![0u8; lu.config.serial.len().min(250)];
            put_ascii(&mut s, &lu.config.serial);
            vpd(page, &s)
        }
        VPD_DEVICE_ID => vpd(page, &device_id(target, ports, lu, nexus)),
        VPD_THIRD_PARTY_COPY => vpd(page, &crate::copy::vpd_page(lu)),
        VPD_BLOCK_LIMITS => vpd(
            page,
            &block_limits(&geo, lu.volume.atomic_write_max_blocks()),
        ),
        VPD_BLOCK_CHARACTERISTICS => {
            let mut b = vec![0u8; 0x3c];
            b[1] = 0x01; // MEDIUM ROTATION RATE: non-rotating medium
            if crate::target::sanitize_offered(lu) && geo.thin {
                // WABEREQ 01b: a read after a SANITIZE BLOCK ERASE returns GOOD
                // (and zeroes: LBPRZ); WACEREQ 00b: no CRYPTOGRAPHIC ERASE
                b[3] = 0x40;
            }
            vpd(page, &b)
        }
        VPD_LB_PROVISIONING => {
            let mut b = vec![0u8; 4];
            if geo.thin {
                // THRESHOLD EXPONENT: soft thresholds are supported (nonzero)
                b[0] = crate::thin::ThinThreshold::exponent(&geo).max(1);
                b[1] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU, LBPWS, LBPWS10, LBPRZ
                b[2] = 0x02; // PROVISIONING TYPE: thin
            }
            vpd(page, &b)
        }
        _ => return Err(cdb.invalid(2, None).into()),
    };
    Ok(Done::alloc(data, alloc_len))
}

fn vpd(page: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&[0, page]);
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn standard(ports: &[TargetPort], lu: Option<&LogicalUnit>) -> Vec<u8> {
    let mut d = vec![0u8; 96];
    d[0] = if lu.is_some() {
        0x00
    } else {
        NO_LUN_PERIPHERAL
    };
    d[2] = 0x06; // SPC-4
    d[3] = 0x10 | 0x02; // HiSup, response data format 2
    d[4] = (d.len() - 5) as u8;
    d[5] = 0x30 | 0x08; // TPGS = 11b: implicit and explicit ALUA; 3PC: EXTENDED COPY
    d[6] = if ports.len() > 1 { 0x10 } else { 0 }; // MultiP
    d[7] = 0x02; // CmdQue
    let (vendor, product, revision) = match lu {
        Some(lu) => (
            lu.config.vendor.as_str(),
            lu.config.product.as_str(),
            lu.config.revision.as_str(),
        ),
        None => ("FREESAN", "NO LUN", "0001"),
    };
    put_ascii(&mut d[8..16], vendor);
    put_ascii(&mut d[16..32], product);
    put_ascii(&mut d[32..36], revision);
    for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
        d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
    }
    d
}

/// Appends one designation descriptor.
fn designator(out: &mut Vec<u8>, proto_codeset: u8, piv_assoc_type: u8, value: &[u8]) {
    out.extend_from_slice(&[proto_codeset, piv_assoc_type, 0, value.len() as u8]);
    out.extend_from_slice(value);
}

/// A SCSI name string: UTF-8, null terminated, padded to a multiple of 4 bytes.
fn name_string(name: &str) -> Vec<u8> {
    let mut v: Vec<u8> = name.bytes().take(251).collect();
    v.push(0);
    while v.len() & 3 != 0 {
        v.push(0);
    }
    v
}

fn device_id(target: &str, ports: &[TargetPort], lu: &LogicalUnit, nexus: &ItNexus) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    // Logical unit: NAA (binary), then T10 vendor id + serial (ASCII).
    designator(&mut out, 0x01, 0x03, &lu.config.naa);
    let mut t10 = vec![0u8; 8];
    put_ascii(&mut t10, &lu.config.vendor);
    let serial: String = lu.config.serial.chars().take(200).collect();
    let mut s = vec![0u8; serial.len()];
    put_ascii(&mut s, &serial);
    t10.extend_from_slice(&s);
    designator(&mut out, 0x02, 0x01, &t10);
    // Target port the command came through (iSCSI protocol id 5, PIV=1, assoc 01b).
    let rel = nexus.relative_port_id;
    let mut v = [0u8; 4];
    v[2..].copy_from_slice(&rel.to_be_bytes());
    designator(&mut out, 0x51, 0x94, &v);
    if let Some(port) = ports.iter().find(|p| p.relative_id == rel) {
        let mut g = [0u8; 4];
        g[2..].copy_from_slice(&port.group_id.to_be_bytes());
        designator(&mut out, 0x51, 0x95, &g);
        designator(&mut out, 0x53, 0x98, &name_string(&port.name));
    }
    // Target device name (assoc 10b).
    designator(&mut out, 0x53, 0xa8, &name_string(target));
    out
}

/// The Block Limits page; `atomic_blocks` is the volume's largest atomic write (0:
/// none). Atomic writes have no alignment or granularity rule and no atomic
/// boundaries here, so those fields stay zero.
fn block_limits(geo: &Geometry, atomic_blocks: u32) -> Vec<u8> {
    let lim = Limits::of(geo);
    let mut b = vec![0u8; 0x3c];
    // byte 4 of the page = b[0]: WSNZ = 0 (zero length WRITE SAME means "to the end")
    // (a COMPARE AND WRITE moves its blocks in one transfer: no more than that)
    b[1] = CAW_BLOCKS_MAX.min(lim.transfer_blocks_max) as u8;
    let gran = u16::try_from(lim.transfer_blocks_optimal).unwrap_or(u16::MAX);
    b[2..4].copy_from_slice(&gran.to_be_bytes());
    b[4..8].copy_from_slice(&lim.transfer_blocks_max.to_be_bytes());
    b[8..12].copy_from_slice(&lim.transfer_blocks_optimal.to_be_bytes());
    b[12..16].copy_from_slice(&lim.transfer_blocks_max.to_be_bytes()); // MAX PREFETCH
    if geo.thin {
        b[16..20].copy_from_slice(&UNMAP_BLOCKS_MAX.to_be_bytes());
        b[20..24].copy_from_slice(&UNMAP_DESCRIPTORS_MAX.to_be_bytes());
        b[24..28].copy_from_slice(&1u32.to_be_bytes()); // OPTIMAL UNMAP GRANULARITY
        b[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, alignment 0
    }
    b[32..40].copy_from_slice(&lim.write_same_blocks_max.to_be_bytes());
    // MAXIMUM ATOMIC TRANSFER LENGTH (page byte 44)
    let atomic = atomic_write_blocks_max(geo, atomic_blocks);
    b[40..44].copy_from_slice(&atomic.to_be_bytes());
    b
}

/// The largest WRITE ATOMIC(16) an LU accepts: its volume's atomic limit, within
/// the maximum transfer length and the CDB's 16-bit TRANSFER LENGTH.
pub(crate) fn atomic_write_blocks_max(geo: &Geometry, atomic_blocks: u32) -> u32 {
    atomic_blocks
        .min(Limits::of(geo).transfer_blocks_max)
        .min(u16::MAX as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_strings_are_padded() {
        assert_eq!(name_string("abc").len(), 4);
        assert_eq!(name_string("abcd").len(), 8);
        assert_eq!(*name_string("abcd").last().unwrap(), 0);
    }

    #[test]
    fn limits_follow_geometry() {
        let g = Geometry {
            block_size_bytes: 4096,
            block_count: 10,
            thin: false,
            volatile_cache: false,
            optimal_io_blocks: 0,
            max_io_blocks: 256,
        };
        let l = Limits::of(&g);
        assert_eq!(l.transfer_blocks_max, 256);
        assert_eq!(l.transfer_blocks_optimal, 1);
        assert_eq!(l.write_same_blocks_max, 0xffff);
        let small = Geometry {
            block_size_bytes: 1 << 20,
            ..g
        };
        assert_eq!(Limits::of(&small).write_same_blocks_max, 1024);
        let bl = block_limits(&g, 0);
        assert_eq!(&bl[16..24], &[0u8; 8]); // no UNMAP on a thick volume
    }
}
