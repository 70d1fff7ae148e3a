//! Readers of recorded block-I/O traces, for replaying real workloads through the
//! cache ([`crate::replay`]).
//!
//! Every reader turns its format into [`Request`]s (byte offset, byte length, read
//! or write) in trace order; timing is dropped (the cache's decisions do not depend
//! on it). Formats ([`Format`]):
//! - `vscsi`: VMware vscsiStats binary records, versions 1 (32 bytes) and 2 (40
//!   bytes), as CloudPhysics published them and libCacheSim ships
//!   (`data/cloudPhysicsIO.vscsi`): SCSI opcode, length in bytes, LBA in 512-byte
//!   sectors.
//! - `oracle`: libCacheSim's oracleGeneral binary (24-byte records: time u32,
//!   object id u64, size u32, next access i64); for a block trace the id is the
//!   512-byte sector and the size the length in bytes. It carries no operation,
//!   so every request is a read.
//! - `msr`: the SNIA/MSR Cambridge CSV: `Timestamp,Hostname,DiskNumber,Type,
//!   Offset,Size,ResponseTime`, offset and size in bytes, type `Read`/`Write`.
//! - `csv`: a plain CSV `time,offset,size,op` (bytes; op `R`/`W`, `read`/`write` or
//!   `0`/`1` with 1 = write); a header line is skipped.
//! - `disksim`: the DiskSim ASCII format `time device block size flags` (512-byte
//!   sectors; flags bit 0 set = read), as the MSN file-server sample is stored.
//! - `arc`: the ARC paper's `.lis` traces: `start count ignored id` in 512-byte
//!   sectors, reads only.
//! - `tencent`: the Tencent cloud block storage CSV (SNIA IOTTA):
//!   `Timestamp,Offset,Size,IOType,VolumeID`, offset and size in 512-byte
//!   sectors, type 1 = write; each volume is placed at `VolumeID << 40` bytes so
//!   volumes never share a block.
//! - `keys`: one block number a line, as the LIRS paper's traces are stored
//!   (`*` breakpoint lines are skipped); each a read of one 4 KiB block.
//! - `keys-be32`: big-endian u32 block numbers, as caffeine's simulator stores
//!   the CloudPhysics w106 trace; each a read of one 4 KiB block.
//!
//! The two key formats carry no sizes: replay them with 4 KiB cache blocks
//! (`--block 4K`), one key per block.
//!
//! Malformed lines and records are counted and skipped, never a panic.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// Bytes of a sector in formats that count in sectors.
const SECTOR: u64 = 512;
/// Bytes set apart for each volume of a Tencent trace (1 TiB).
const TENCENT_VOLUME_BYTES: u64 = 1 << 40;
/// Bytes of a block in the formats that record block numbers only.
const KEY_BLOCK_BYTES: u64 = 4096;

/// One recorded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Byte offset on the volume.
    pub offset_bytes: u64,
    /// Bytes transferred (> 0).
    pub len_bytes: u64,
    /// A write (else a read).
    pub write: bool,
}

/// A trace file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// VMware vscsiStats binary (v1 or v2).
    Vscsi,
    /// libCacheSim oracleGeneral binary.
    Oracle,
    /// SNIA/MSR Cambridge CSV.
    Msr,
    /// Plain CSV: time, offset, size, op.
    Csv,
    /// DiskSim ASCII.
    Disksim,
    /// ARC `.lis`.
    Arc,
    /// Tencent cloud block storage CSV.
    Tencent,
    /// One block number a line.
    Keys,
    /// Big-endian u32 block numbers.
    KeysBe32,
}

impl Format {
    /// The format a file name suggests (`.vscsi`, `.oracleGeneral.bin`, `.lis`,
    /// `.disksim`/`.trace`, `.msr.csv`, other `.csv`).
    pub fn guess(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        Some(if name.ends_with(".vscsi") {
            Format::Vscsi
        } else if name.contains("oraclegeneral") || name.ends_with(".bin") {
            Format::Oracle
        } else if name.ends_with(".lis") {
            Format::Arc
        } else if name.ends_with(".disksim") || name.ends_with(".trace") {
            Format::Disksim
        } else if name.ends_with(".msr.csv") || name.starts_with("msr") {
            Format::Msr
        } else if name.ends_with(".csv") {
            Format::Csv
        } else {
            return None;
        })
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "vscsi" => Format::Vscsi,
            "oracle" | "oraclegeneral" => Format::Oracle,
            "msr" => Format::Msr,
            "csv" => Format::Csv,
            "disksim" => Format::Disksim,
            "arc" | "lis" => Format::Arc,
            "tencent" => Format::Tencent,
            "keys" => Format::Keys,
            "keys-be32" => Format::KeysBe32,
            _ => return Err(format!("unknown trace format {s:?}")),
        })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Vscsi => "vscsi",
            Format::Oracle => "oracle",
            Format::Msr => "msr",
            Format::Csv => "csv",
            Format::Disksim => "disksim",
            Format::Arc => "arc",
            Format::Tencent => "tencent",
            Format::Keys => "keys",
            Format::KeysBe32 => "keys-be32",
        })
    }
}

/// A parsed trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The requests, in trace order.
    pub requests: Vec<Request>,
    /// Records or lines that could not be parsed (skipped).
    pub skipped: u64,
}

/// Reads `path` in `format` (guessed from the name when `None`).
pub fn read(path: &Path, format: Option<Format>) -> Result<Trace, String> {
    let format = format
        .or_else(|| Format::guess(path))
        .ok_or_else(|| format!("{}: cannot tell the trace format", path.display()))?;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&bytes, format)
}

/// Parses a whole trace held in memory.
pub fn parse(bytes: &[u8], format: Format) -> Result<Trace, String> {
    match format {
        Format::Vscsi => parse_vscsi(bytes),
        Format::Oracle => Ok(parse_oracle(bytes)),
        Format::KeysBe32 => Ok(parse_keys_be32(bytes)),
        _ => {
            let text = std::str::from_utf8(bytes).map_err(|e| format!("not text: {e}"))?;
            Ok(parse_text(text, format))
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// SCSI READ(6/10/12/16) and WRITE(6/10/12/16) opcodes.
fn scsi_op(cmd: u16) -> Option<bool> {
    match cmd {
        0x08 | 0x28 | 0xa8 | 0x88 => Some(false),
        0x0a | 0x2a | 0xaa | 0x8a => Some(true),
        _ => None,
    }
}

fn parse_vscsi(b: &[u8]) -> Result<Trace, String> {
    // the version sits in the high byte of `ver`: at 2 in a v2 record, at 14 in v1
    let v2 = b.len() >= 80 && (0..2).all(|i| u16_at(b, i * 40 + 2) >> 8 == 2);
    let v1 = b.len() >= 64 && (0..2).all(|i| u16_at(b, i * 32 + 14) >> 8 == 1);
    let (size, cmd_at, len_at, lbn_at) = if v2 {
        (40, 0, 8, 16)
    } else if v1 {
        (32, 12, 4, 16)
    } else {
        return Err("not a vscsi trace (no version 1 or 2 records)".into());
    };
    let mut t = Trace::default();
    for r in b.chunks_exact(size) {
        let len = u64::from(u32_at(r, len_at));
        match scsi_op(u16_at(r, cmd_at)) {
            Some(write) if len > 0 => t.requests.push(Request {
                offset_bytes: u64_at(r, lbn_at).saturating_mul(SECTOR),
                len_bytes: len,
                write,
            }),
            _ => t.skipped += 1,
        }
    }
    Ok(t)
}

fn parse_oracle(b: &[u8]) -> Trace {
    let mut t = Trace::default();
    for r in b.chunks_exact(24) {
        let len = u64::from(u32_at(r, 12));
        if len == 0 {
            t.skipped += 1;
            continue;
        }
        t.requests.push(Request {
            offset_bytes: u64_at(r, 4).saturating_mul(SECTOR),
            len_bytes: len,
            write: false,
        });
    }
    t
}

/// A read of the 4 KiB block `key`, as the key formats record their accesses.
fn key_read(key: u64) -> Option<Request> {
    Some(Request {
        offset_bytes: key.checked_mul(KEY_BLOCK_BYTES)?,
        len_bytes: KEY_BLOCK_BYTES,
        write: false,
    })
}

fn parse_keys_be32(b: &[u8]) -> Trace {
    let mut t = Trace::default();
    for r in b.chunks_exact(4) {
        let key = u32::from_be_bytes(r.try_into().unwrap_or([0; 4]));
        t.requests.extend(key_read(u64::from(key)));
    }
    t.skipped = u64::from(!b.len().is_multiple_of(4));
    t
}

fn parse_text(text: &str, format: Format) -> Trace {
    let mut t = Trace::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line, format) {
            Some(r) if r.len_bytes > 0 => t.requests.push(r),
            _ => t.skipped += 1,
        }
    }
    // a header line is not a request
    if t.skipped > 0 && matches!(format, Format::Csv | Format::Msr) {
        let first = text.lines().find(|l| !l.trim().is_empty());
        if first.is_some_and(|l| parse_line(l.trim(), format).is_none()) {
            t.skipped -= 1;
        }
    }
    t
}

fn parse_line(line: &str, format: Format) -> Option<Request> {
    match format {
        Format::Msr => {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let write = match f.get(3)?.to_ascii_lowercase().as_str() {
                "read" => false,
                "write" => true,
                _ => return None,
            };
            Some(Request {
                offset_bytes: f.get(4)?.parse().ok()?,
                len_bytes: f.get(5)?.parse().ok()?,
                write,
            })
        }
        Format::Csv => {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let write = match f.get(3)?.to_ascii_lowercase().as_str() {
                "r" | "read" | "0" => false,
                "w" | "write" | "1" => true,
                _ => return None,
            };
            Some(Request {
                offset_bytes: f.get(1)?.parse().ok()?,
                len_bytes: f.get(2)?.parse().ok()?,
                write,
            })
        }
        Format::Disksim => {
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags: u64 = f.get(4)?.parse().ok()?;
            Some(Request {
                offset_bytes: f.get(2)?.parse::<u64>().ok()?.checked_mul(SECTOR)?,
                len_bytes: f.get(3)?.parse::<u64>().ok()?.checked_mul(SECTOR)?,
                write: flags & 1 == 0,
            })
        }
        Format::Arc => {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(Request {
                offset_bytes: f.first()?.parse::<u64>().ok()?.checked_mul(SECTOR)?,
                len_bytes: f.get(1)?.parse::<u64>().ok()?.checked_mul(SECTOR)?,
                write: false,
            })
        }
        Format::Tencent => {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let write = match *f.get(3)? {
                "0" => false,
                "1" => true,
                _ => return None,
            };
            let volume = f
                .get(4)?
                .parse::<u64>()
                .ok()?
                .checked_mul(TENCENT_VOLUME_BYTES)?;
            let sector = f.get(1)?.parse::<u64>().ok()?.checked_mul(SECTOR)?;
            Some(Request {
                offset_bytes: volume.checked_add(sector)?,
                len_bytes: f.get(2)?.parse::<u64>().ok()?.checked_mul(SECTOR)?,
                write,
            })
        }
        Format::Keys => key_read(line.parse().ok()?),
        Format::Vscsi | Format::Oracle | Format::KeysBe32 => None,
    }
}

/// The cache blocks of `block_bytes` a request covers, first to last.
pub fn blocks_of(r: &Request, block_bytes: u64) -> std::ops::RangeInclusive<u64> {
    let first = r.offset_bytes / block_bytes;
    let last = (r.offset_bytes + r.len_bytes.max(1) - 1) / block_bytes;
    first..=last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(offset_bytes: u64, len_bytes: u64, write: bool) -> Request {
        Request {
            offset_bytes,
            len_bytes,
            write,
        }
    }

    #[test]
    fn text_formats_parse_and_skip_headers_and_junk() {
        let msr = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n\
                   128166372003061629,hm,0,Write,7014912,4096,26\n\
                   128166372016382155,hm,0,Read,1074696192,8192,113\n\
                   garbage\n";
        let t = parse(msr.as_bytes(), Format::Msr).unwrap();
        assert_eq!(t.skipped, 1);
        assert_eq!(
            t.requests,
            vec![req(7014912, 4096, true), req(1074696192, 8192, false)]
        );
        let csv = "time,offset,size,op\n1,4096,512,W\n2,0,4096,read\n";
        let t = parse(csv.as_bytes(), Format::Csv).unwrap();
        assert_eq!((t.requests.len(), t.skipped), (2, 0));
        assert!(t.requests[0].write && !t.requests[1].write);
        let disksim = "0.000 5 174224064 16 1\n0.221 5 8 16 0\n";
        let t = parse(disksim.as_bytes(), Format::Disksim).unwrap();
        assert_eq!(t.requests[0].offset_bytes, 174224064 * 512);
        assert_eq!(t.requests[0].len_bytes, 8192);
        assert!(!t.requests[0].write && t.requests[1].write);
        let arc = "110765 64 0 0\n110888 1 0 1\n";
        let t = parse(arc.as_bytes(), Format::Arc).unwrap();
        assert_eq!(t.requests[0].len_bytes, 64 * 512);
        let tencent = "1538323200,4247200,128,1,1058\n1538323199,8,16,0,1063\nx,1,1,2,3\n";
        let t = parse(tencent.as_bytes(), Format::Tencent).unwrap();
        assert_eq!(t.skipped, 1);
        assert_eq!(
            t.requests,
            vec![
                req((1058 << 40) + 4247200 * 512, 128 * 512, true),
                req((1063 << 40) + 8 * 512, 16 * 512, false),
            ]
        );
        let keys = "0 1\n7\n*\n3\n";
        let t = parse(keys.as_bytes(), Format::Keys).unwrap();
        let at: Vec<u64> = t.requests.iter().map(|r| r.offset_bytes).collect();
        assert_eq!((at, t.skipped), (vec![7 * 4096, 3 * 4096], 2));
        assert!(t.requests.iter().all(|r| r.len_bytes == 4096 && !r.write));
    }

    #[test]
    fn big_endian_keys_are_4k_reads() {
        let b = [0u8, 0, 1, 2, 0xff, 0xff, 0xff, 0xff, 9];
        let t = parse(&b, Format::KeysBe32).unwrap();
        let at: Vec<u64> = t.requests.iter().map(|r| r.offset_bytes).collect();
        assert_eq!(at, vec![0x102 * 4096, 0xffff_ffff * 4096]);
        assert_eq!(t.skipped, 1, "a trailing partial key is skipped");
    }

    #[test]
    fn binary_formats_parse() {
        let mut v1 = Vec::new();
        for (cmd, lbn) in [(0x2au16, 10u64), (0x28, 20), (0x12, 0)] {
            v1.extend_from_slice(&1u32.to_le_bytes()); // sn
            v1.extend_from_slice(&4096u32.to_le_bytes()); // len
            v1.extend_from_slice(&1u32.to_le_bytes()); // nSG
            v1.extend_from_slice(&cmd.to_le_bytes());
            v1.extend_from_slice(&0x100u16.to_le_bytes()); // version 1
            v1.extend_from_slice(&lbn.to_le_bytes());
            v1.extend_from_slice(&7u64.to_le_bytes()); // ts
        }
        let t = parse(&v1, Format::Vscsi).unwrap();
        assert_eq!(t.skipped, 1, "an INQUIRY is not I/O");
        assert_eq!(
            t.requests,
            vec![req(5120, 4096, true), req(10240, 4096, false)]
        );
        assert!(parse(&[0u8; 100], Format::Vscsi).is_err());
        let mut og = Vec::new();
        og.extend_from_slice(&1u32.to_le_bytes());
        og.extend_from_slice(&3u64.to_le_bytes());
        og.extend_from_slice(&512u32.to_le_bytes());
        og.extend_from_slice(&(-1i64).to_le_bytes());
        let t = parse(&og, Format::Oracle).unwrap();
        assert_eq!(t.requests, vec![req(1536, 512, false)]);
    }

    #[test]
    fn blocks_cover_the_request() {
        let r = req(131071, 2, false);
        assert_eq!(blocks_of(&r, 131072), 0..=1);
        let r = req(131072, 131072, false);
        assert_eq!(blocks_of(&r, 131072), 1..=1);
    }
}
