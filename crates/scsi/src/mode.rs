//! MODE SENSE(6/10) and MODE SELECT(6/10): the read-write error recovery (0x01),
//! caching (0x08), control (0x0a) and informational exceptions (0x1c) pages, and
//! on a thin LU the logical block provisioning subpage (0x1c/0x02) with its one
//! soft threshold descriptor (see `thin.rs`).
//!
//! Changeable fields: caching WCE, control D_SENSE and SWP. Saved values are not
//! supported (PC=11b and SP=1 are refused); changes last until a reset or restart.
//! The provisioning subpage is set by the administrator, not by MODE SELECT: a
//! MODE SELECT may restate it, not change it.

use crate::cdb::{param_u16, Cdb};
use crate::lu::{CmdResult, Done, Fail, LogicalUnit};
use crate::sense::codes;
use crate::ItNexus;
use block::Geometry;

/// Page codes.
pub const PAGE_RW_ERROR_RECOVERY: u8 = 0x01;
/// Caching mode page.
pub const PAGE_CACHING: u8 = 0x08;
/// Control mode page.
pub const PAGE_CONTROL: u8 = 0x0a;
/// Informational exceptions control mode page.
pub const PAGE_INFO_EXCEPTIONS: u8 = 0x1c;
/// "Return all pages".
pub const PAGE_ALL: u8 = 0x3f;
/// Logical block provisioning subpage of page 0x1c.
pub const SUBPAGE_LBP: u8 = 0x02;
/// "All subpages".
const SUBPAGE_ALL: u8 = 0xff;
/// Byte offset of the threshold descriptor in the provisioning subpage (the
/// INFORMATION of THIN PROVISIONING SOFT THRESHOLD REACHED).
pub const LBP_DESCRIPTOR_OFFSET: u64 = 16;

/// Page codes in the order MODE SENSE returns them for "all pages".
const PAGES: [u8; 4] = [
    PAGE_RW_ERROR_RECOVERY,
    PAGE_CACHING,
    PAGE_CONTROL,
    PAGE_INFO_EXCEPTIONS,
];

// Byte offsets / bits of the hot fields inside the pages.
const CACHING_WCE: (usize, u8) = (2, 0x04);
const CONTROL_D_SENSE: (usize, u8) = (2, 0x04);
const CONTROL_SWP: (usize, u8) = (4, 0x08);

/// The current values of every mode page of one logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModePages {
    rw_error_recovery: [u8; 12],
    caching: [u8; 20],
    control: [u8; 12],
    info_exceptions: [u8; 12],
}

impl ModePages {
    /// Default values: WCE follows the volume's volatile cache, fixed sense, no SWP.
    pub fn defaults(geo: &Geometry) -> ModePages {
        let mut rw = [0u8; 12];
        rw[0] = PAGE_RW_ERROR_RECOVERY;
        rw[1] = 10;
        rw[2] = 0xc0; // AWRE, ARRE
        if geo.thin {
            rw[7] = 0x80; // LBPERE: provisioning thresholds are reported
        }
        let mut caching = [0u8; 20];
        caching[0] = PAGE_CACHING;
        caching[1] = 18;
        if geo.volatile_cache {
            caching[CACHING_WCE.0] |= CACHING_WCE.1;
        }
        let mut control = [0u8; 12];
        control[0] = PAGE_CONTROL;
        control[1] = 10;
        control[3] = 0x10; // QUEUE ALGORITHM MODIFIER = 1 (unrestricted reordering)
        control[8] = 0xff; // BUSY TIMEOUT PERIOD: unlimited
        control[9] = 0xff;
        let mut ie = [0u8; 12];
        ie[0] = PAGE_INFO_EXCEPTIONS;
        ie[1] = 10;
        ie[2] = 0x08; // DEXCPT: no informational exceptions reported
        ModePages {
            rw_error_recovery: rw,
            caching,
            control,
            info_exceptions: ie,
        }
    }

    /// Write cache enabled.
    pub fn wce(&self) -> bool {
        self.caching[CACHING_WCE.0] & CACHING_WCE.1 != 0
    }

    /// Software write protect.
    pub fn swp(&self) -> bool {
        self.control[CONTROL_SWP.0] & CONTROL_SWP.1 != 0
    }

    /// Descriptor-format sense.
    pub fn d_sense(&self) -> bool {
        self.control[CONTROL_D_SENSE.0] & CONTROL_D_SENSE.1 != 0
    }

    fn page(&self, code: u8) -> Option<&[u8]> {
        match code {
            PAGE_RW_ERROR_RECOVERY => Some(&self.rw_error_recovery),
            PAGE_CACHING => Some(&self.caching),
            PAGE_CONTROL => Some(&self.control),
            PAGE_INFO_EXCEPTIONS => Some(&self.info_exceptions),
            _ => None,
        }
    }

    fn page_mut(&mut self, code: u8) -> Option<&mut [u8]> {
        match code {
            PAGE_RW_ERROR_RECOVERY => Some(&mut self.rw_error_recovery),
            PAGE_CACHING => Some(&mut self.caching),
            PAGE_CONTROL => Some(&mut self.control),
            PAGE_INFO_EXCEPTIONS => Some(&mut self.info_exceptions),
            _ => None,
        }
    }
}

/// The logical block provisioning subpage of a thin LU (None for a thick one):
/// SITUA clear (every nexus hears of a crossing), one soft threshold descriptor,
/// armed on increase of the used LBA mapping resource, enabled when a threshold
/// is set, its count the current threshold in threshold sets. With `mask`, the
/// changeable-values form (nothing changeable).
fn lbp_page(lu: &LogicalUnit, mask: bool) -> Option<Vec<u8>> {
    let geo = lu.geometry();
    if !geo.thin {
        return None;
    }
    let mut p = vec![0u8; 24];
    p[0] = 0x40 | PAGE_INFO_EXCEPTIONS; // SPF
    p[1] = SUBPAGE_LBP;
    p[2..4].copy_from_slice(&20u16.to_be_bytes());
    if mask {
        return Some(p);
    }
    let d = LBP_DESCRIPTOR_OFFSET as usize;
    let enabled = lu.thin.get().is_some();
    p[d] = if enabled { 0x80 } else { 0 } | 0x01; // soft, armed increasing
    p[d + 1] = 0x02; // used LBA mapping resource count
    let count = lu.thin.count(&geo, lu.volume.provisioning().as_ref());
    p[d + 4..d + 8].copy_from_slice(&count.to_be_bytes());
    Some(p)
}

/// The changeable-values mask of a page (same length as the page).
fn changeable(code: u8) -> Vec<u8> {
    let len = match code {
        PAGE_CACHING => 20,
        _ => 12,
    };
    let mut m = vec![0u8; len];
    m[0] = code;
    m[1] = (len - 2) as u8;
    match code {
        PAGE_CACHING => m[CACHING_WCE.0] = CACHING_WCE.1,
        PAGE_CONTROL => {
            m[CONTROL_D_SENSE.0] = CONTROL_D_SENSE.1;
            m[CONTROL_SWP.0] = CONTROL_SWP.1;
        }
        _ => {}
    }
    m
}

/// MODE SENSE(6) and MODE SENSE(10).
pub(crate) fn mode_sense(lu: &LogicalUnit, cdb: &Cdb) -> CmdResult {
    let ten = cdb.opcode() == crate::cdb::op::MODE_SENSE_10;
    let dbd = cdb.b(1) & 0x08 != 0;
    let llbaa = ten && cdb.b(1) & 0x10 != 0;
    let pc = cdb.b(2) >> 6;
    let page_code = cdb.b(2) & 0x3f;
    let subpage = cdb.b(3);
    let alloc_len = if ten {
        cdb.u16_at(7) as u32
    } else {
        cdb.b(4) as u32
    };
    if pc == 3 {
        return Err(codes::SAVING_PARAMETERS_NOT_SUPPORTED.into());
    }
    let thin = lu.geometry().thin;
    // (pages, then the provisioning subpage too)
    let (codes_wanted, lbp): (Vec<u8>, bool) = match (page_code, subpage) {
        (PAGE_ALL, 0x00) => (PAGES.to_vec(), false),
        (PAGE_ALL, SUBPAGE_ALL) => (PAGES.to_vec(), thin),
        (PAGE_INFO_EXCEPTIONS, SUBPAGE_LBP) if thin => (vec![], true),
        (PAGE_INFO_EXCEPTIONS, SUBPAGE_ALL) => (vec![PAGE_INFO_EXCEPTIONS], thin),
        (c, 0x00) if PAGES.contains(&c) => (vec![c], false),
        (c, SUBPAGE_ALL) if PAGES.contains(&c) => (vec![c], false),
        (_, 0x00) | (_, SUBPAGE_ALL) => return Err(cdb.invalid(2, Some(5)).into()),
        _ => return Err(cdb.invalid(3, None).into()),
    };
    let geo = lu.geometry();
    let current = lu.mode.lock().clone();
    let defaults = ModePages::defaults(&geo);
    let mut pages = Vec::with_capacity(64);
    for code in codes_wanted {
        match pc {
            0 => pages.extend_from_slice(current.page(code).unwrap_or(&[])),
            1 => pages.extend_from_slice(&changeable(code)),
            _ => pages.extend_from_slice(defaults.page(code).unwrap_or(&[])),
        }
    }
    if lbp {
        pages.extend(lbp_page(lu, pc == 1).unwrap_or_default());
    }
    // Block descriptor.
    let mut bd = Vec::new();
    if !dbd {
        if llbaa {
            bd.extend_from_slice(&geo.block_count.to_be_bytes());
            bd.extend_from_slice(&[0, 0, 0, 0]);
            bd.extend_from_slice(&geo.block_size_bytes.to_be_bytes());
        } else {
            let blocks = u32::try_from(geo.block_count).unwrap_or(u32::MAX);
            bd.extend_from_slice(&blocks.to_be_bytes());
            bd.push(0);
            bd.extend_from_slice(&geo.block_size_bytes.to_be_bytes()[1..]);
        }
        if pc == 1 {
            bd.iter_mut().for_each(|b| *b = 0);
        }
    }
    // Device-specific parameter: WP, DPOFUA.
    let dsp = if lu.write_protected() { 0x80 } else { 0 } | 0x10;
    let mut out = Vec::with_capacity(8 + bd.len() + pages.len());
    if ten {
        let len = (6 + bd.len() + pages.len()) as u16;
        out.extend_from_slice(&len.to_be_bytes());
        out.push(0);
        out.push(dsp);
        out.push(if llbaa && !dbd { 0x01 } else { 0 });
        out.push(0);
        out.extend_from_slice(&(bd.len() as u16).to_be_bytes());
    } else {
        let len = (3 + bd.len() + pages.len()).min(255) as u8;
        out.extend_from_slice(&[len, 0, dsp, bd.len() as u8]);
    }
    out.extend_from_slice(&bd);
    out.extend_from_slice(&pages);
    Ok(Done::alloc(out, alloc_len))
}

/// Checks a subpage in a MODE SELECT list at `off`: only the provisioning
/// subpage, restated unchanged, is accepted. Returns the offset past it.
fn restate_subpage(lu: &LogicalUnit, p: &[u8], off: usize) -> Result<usize, Fail> {
    let refuse = |at: usize, bit: Option<u8>| -> Fail {
        codes::INVALID_FIELD_IN_PARAM
            .with_field(false, at as u16, bit)
            .into()
    };
    let (Some(&sub), Some(len)) = (p.get(off + 1), p.get(off + 2..off + 4)) else {
        return Err(codes::PARAM_LIST_LENGTH_ERROR.into());
    };
    let page_len = u16::from_be_bytes([len[0], len[1]]) as usize + 4;
    let current = match (p[off] & 0x3f, sub) {
        (PAGE_INFO_EXCEPTIONS, SUBPAGE_LBP) => lbp_page(lu, false),
        _ => None,
    };
    let Some(current) = current else {
        return Err(refuse(off, Some(5)));
    };
    if page_len != current.len() {
        return Err(refuse(off + 2, None));
    }
    let Some(src) = p.get(off..off + page_len) else {
        return Err(codes::PARAM_LIST_LENGTH_ERROR.into());
    };
    if let Some(i) = (4..page_len).find(|&i| src[i] != current[i]) {
        let diff = src[i] ^ current[i];
        return Err(refuse(off + i, Some(7 - diff.leading_zeros() as u8)));
    }
    Ok(off + page_len)
}

/// MODE SELECT(6) and MODE SELECT(10). Returns whether any value changed (the caller
/// raises MODE PARAMETERS CHANGED on the other nexuses).
pub(crate) fn mode_select(
    lu: &LogicalUnit,
    nexus: &ItNexus,
    cdb: &Cdb,
    data_out: &[u8],
) -> CmdResult {
    let ten = cdb.opcode() == crate::cdb::op::MODE_SELECT_10;
    let pf = cdb.b(1) & 0x10 != 0;
    let sp = cdb.b(1) & 0x01 != 0;
    let plist_len = if ten {
        cdb.u16_at(7) as usize
    } else {
        cdb.b(4) as usize
    };
    if sp {
        return Err(cdb.invalid(1, Some(0)).into());
    }
    if plist_len == 0 {
        return Ok(Done::empty());
    }
    if data_out.len() < plist_len {
        return Err(Fail::Check(codes::INVALID_FIELD_IN_CIU, plist_len as u32));
    }
    let p = &data_out[..plist_len];
    let hdr_len = if ten { 8 } else { 4 };
    if p.len() < hdr_len {
        return Err(codes::PARAM_LIST_LENGTH_ERROR.into());
    }
    let bd_len = if ten {
        param_u16(p, 6) as usize
    } else {
        p[3] as usize
    };
    let geo = lu.geometry();
    let bd_end = hdr_len + bd_len;
    if bd_end > p.len() {
        return Err(codes::PARAM_LIST_LENGTH_ERROR.into());
    }
    // A block descriptor may restate the block length; it may not change it.
    if bd_len > 0 {
        let bd = &p[hdr_len..bd_end];
        let len_field = match bd_len {
            8 => u32::from_be_bytes([0, bd[5], bd[6], bd[7]]),
            16 => u32::from_be_bytes([bd[12], bd[13], bd[14], bd[15]]),
            _ => {
                return Err(codes::INVALID_FIELD_IN_PARAM
                    .with_field(false, if ten { 6 } else { 3 }, None)
                    .into())
            }
        };
        if len_field != 0 && len_field != geo.block_size_bytes {
            let off = hdr_len + if bd_len == 8 { 5 } else { 12 };
            return Err(codes::INVALID_FIELD_IN_PARAM
                .with_field(false, off as u16, None)
                .into());
        }
    }
    if bd_end < p.len() && !pf {
        return Err(cdb.invalid(1, Some(4)).into());
    }
    let mut mode = lu.mode.lock();
    let mut new = mode.clone();
    let mut off = bd_end;
    while off < p.len() {
        let code = p[off] & 0x3f;
        let spf = p[off] & 0x40 != 0;
        if spf {
            off = restate_subpage(lu, p, off)?;
            continue;
        }
        let Some(&plen) = p.get(off + 1) else {
            return Err(codes::PARAM_LIST_LENGTH_ERROR.into());
        };
        let page_len = plen as usize + 2;
        let mask = changeable(code);
        let Some(cur) = new.page_mut(code) else {
            return Err(codes::INVALID_FIELD_IN_PARAM
                .with_field(false, off as u16, Some(5))
                .into());
        };
        if page_len != cur.len() {
            return Err(codes::INVALID_FIELD_IN_PARAM
                .with_field(false, (off + 1) as u16, None)
                .into());
        }
        let Some(src) = p.get(off..off + page_len) else {
            return Err(codes::PARAM_LIST_LENGTH_ERROR.into());
        };
        for i in 2..page_len {
            let diff = (src[i] ^ cur[i]) & !mask[i];
            if diff != 0 {
                let bit = 7 - diff.leading_zeros() as u8;
                return Err(codes::INVALID_FIELD_IN_PARAM
                    .with_field(false, (off + i) as u16, Some(bit))
                    .into());
            }
        }
        for i in 2..page_len {
            cur[i] = (cur[i] & !mask[i]) | (src[i] & mask[i]);
        }
        off += page_len;
    }
    let changed = *mode != new;
    if changed {
        *mode = new;
        lu.sync_mode_flags(&mode);
        drop(mode);
        lu.uas
            .raise_all(codes::MODE_PARAMETERS_CHANGED, Some(nexus));
    }
    Ok(Done::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(volatile: bool) -> Geometry {
        Geometry {
            block_size_bytes: 512,
            block_count: 1000,
            thin: true,
            volatile_cache: volatile,
            optimal_io_blocks: 8,
            max_io_blocks: 2048,
        }
    }

    #[test]
    fn defaults_follow_volatile_cache() {
        assert!(ModePages::defaults(&geo(true)).wce());
        assert!(!ModePages::defaults(&geo(false)).wce());
        let m = ModePages::defaults(&geo(false));
        assert!(!m.swp() && !m.d_sense());
    }

    #[test]
    fn changeable_masks_have_page_headers() {
        for code in PAGES {
            let m = changeable(code);
            let d = ModePages::defaults(&geo(true));
            assert_eq!(m.len(), d.page(code).unwrap().len());
            assert_eq!(m[0], code);
        }
    }
}
