//! One LUN of one session as a [`block::Volume`].

use crate::login::LoginOptions;
use crate::scsi_cmd::{cdb, key, parse_sense, status, verdict, Verdict};
use crate::{InitiatorError, ScsiResult, Session};
use async_trait::async_trait;
use block::{BlockError, BlockResult, Bytes, Geometry, Volume};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Largest single transfer when the target does not say (16 MiB).
const TRANSFER_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024;
/// WRITE SAME blocks per command when the target does not say.
const WRITE_SAME_BLOCKS_DEFAULT: u64 = 1 << 16;

/// How a LUN volume behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LunOptions {
    /// Most commands in flight on this LUN (the CmdSN window may allow fewer).
    pub queue_depth: u32,
    /// TEST UNIT READY attempts at open before giving up (unit attentions, NOT READY).
    pub ready_attempts_max: u32,
    /// Retries of one command after UNIT ATTENTION, BUSY or TASK SET FULL.
    pub retries_max: u32,
}

impl Default for LunOptions {
    fn default() -> Self {
        LunOptions {
            queue_depth: 128,
            ready_attempts_max: 10,
            retries_max: 8,
        }
    }
}

/// A failure of one LUN operation: the path, or the data.
#[derive(Debug)]
pub(crate) enum LunError {
    /// The path (session, port) cannot serve I/O; another path may.
    Path(String),
    /// A definite answer about this request.
    Block(BlockError),
}

impl From<LunError> for BlockError {
    fn from(e: LunError) -> BlockError {
        match e {
            LunError::Path(s) => BlockError::Unavailable(s),
            LunError::Block(b) => b,
        }
    }
}

/// A SCSI logical unit reached through one [`Session`], as a block volume.
pub struct IscsiLun {
    session: Session,
    lun: u64,
    geometry: Geometry,
    naa: Option<Vec<u8>>,
    unmap: bool,
    write_same_unmap: bool,
    unmap_blocks_max: u64,
    write_same_blocks_max: u64,
    qd: Semaphore,
    opts: LunOptions,
    login: Option<LoginOptions>,
}

impl std::fmt::Debug for IscsiLun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiLun")
            .field("addr", &self.session.addr())
            .field("lun", &self.lun)
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}

fn be32(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
}

fn be64(b: &[u8], off: usize) -> Option<u64> {
    let x = b.get(off..off + 8)?;
    let mut v = [0u8; 8];
    v.copy_from_slice(x);
    Some(u64::from_be_bytes(v))
}

/// The NAA designator of the logical unit in a Device Identification VPD page.
pub(crate) fn naa_designator(page: &[u8]) -> Option<Vec<u8>> {
    let len = u16::from_be_bytes([*page.get(2)?, *page.get(3)?]) as usize;
    let body = page.get(4..(4 + len).min(page.len()))?;
    let mut i = 0;
    while i + 4 <= body.len() {
        let dlen = body[i + 3] as usize;
        let ty = body[i + 1] & 0x0f;
        let assoc = (body[i + 1] >> 4) & 0x03;
        if ty == 3 && assoc == 0 {
            return body.get(i + 4..i + 4 + dlen).map(|d| d.to_vec());
        }
        i += 4 + dlen;
    }
    None
}

impl IscsiLun {
    /// Logs in to `addr` and opens `lun`; the login options are kept so that the
    /// path can be re-established with the same ISID.
    pub async fn connect(
        addr: SocketAddr,
        login: &LoginOptions,
        lun: u64,
        opts: LunOptions,
    ) -> Result<IscsiLun, InitiatorError> {
        let s = Session::login(addr, login).await?;
        match IscsiLun::open(s.clone(), lun, opts).await {
            Ok(mut l) => {
                l.login = Some(login.clone());
                Ok(l)
            }
            Err(e) => {
                s.close("open failed");
                Err(e)
            }
        }
    }

    /// Opens `lun` on a session: clears unit attentions with TEST UNIT READY, reads
    /// the capacity, identity, limits and provisioning of the unit.
    pub async fn open(
        session: Session,
        lun: u64,
        opts: LunOptions,
    ) -> Result<IscsiLun, InitiatorError> {
        let mut ready = false;
        let mut last = String::new();
        for attempt in 0..opts.ready_attempts_max.max(1) {
            let r = session
                .command(lun, &cdb::test_unit_ready(), Bytes::new(), 0)
                .await?;
            if r.status == status::GOOD {
                ready = true;
                break;
            }
            let s = r.sense.as_deref().and_then(parse_sense).unwrap_or_default();
            last = format!(
                "status {:#04x} key {:#x} asc {:#04x} ascq {:#04x}",
                r.status, s.key, s.asc, s.ascq
            );
            if s.key != key::UNIT_ATTENTION {
                tokio::time::sleep(Duration::from_millis(20 * (attempt as u64 + 1))).await;
            }
        }
        if !ready {
            return Err(InitiatorError::Scsi(format!("LUN {lun} not ready: {last}")));
        }
        let mut l = IscsiLun {
            session,
            lun,
            geometry: Geometry {
                block_size_bytes: 512,
                block_count: 0,
                thin: false,
                volatile_cache: true,
                optimal_io_blocks: 1,
                max_io_blocks: 1,
            },
            naa: None,
            unmap: false,
            write_same_unmap: false,
            unmap_blocks_max: u32::MAX as u64,
            write_same_blocks_max: WRITE_SAME_BLOCKS_DEFAULT,
            qd: Semaphore::new(opts.queue_depth.max(1) as usize),
            opts,
            login: None,
        };
        l.read_capacity().await?;
        let bs = l.geometry.block_size_bytes as u64;
        let mut max_io = TRANSFER_BYTES_MAX_DEFAULT / bs;
        if let Some(p) = l.vpd(0x83).await {
            l.naa = naa_designator(&p);
        }
        if let Some(p) = l.vpd(0xb0).await {
            if let Some(n) = be32(&p, 8).filter(|n| *n > 0) {
                max_io = max_io.min(n as u64);
            }
            if let Some(n) = be32(&p, 12).filter(|n| *n > 0) {
                l.geometry.optimal_io_blocks = n;
            }
            if let Some(n) = be32(&p, 20).filter(|n| *n > 0) {
                l.unmap_blocks_max = n as u64;
            }
            if let Some(n) = be64(&p, 36).filter(|n| *n > 0) {
                l.write_same_blocks_max = n.min(u32::MAX as u64);
            }
        }
        if l.geometry.thin {
            if let Some(p) = l.vpd(0xb2).await {
                let b5 = p.get(5).copied().unwrap_or(0);
                l.unmap = b5 & 0x80 != 0;
                l.write_same_unmap = b5 & 0x40 != 0;
            }
        }
        if let Ok(r) = l
            .command(&cdb::mode_sense_6_caching(255), Bytes::new(), 255)
            .await
        {
            if r.status == status::GOOD {
                // Header (4 bytes; DBD set so no block descriptor), then page 0x08.
                let bdl = r.data_in.get(3).copied().unwrap_or(0) as usize;
                if let Some(b2) = r.data_in.get(4 + bdl + 2) {
                    l.geometry.volatile_cache = b2 & 0x04 != 0;
                }
            }
        }
        l.geometry.max_io_blocks = max_io.clamp(1, u32::MAX as u64) as u32;
        Ok(l)
    }

    async fn command(
        &self,
        c: &[u8],
        out: Bytes,
        in_len: u32,
    ) -> Result<ScsiResult, InitiatorError> {
        self.session.command(self.lun, c, out, in_len).await
    }

    async fn vpd(&self, page: u8) -> Option<Bytes> {
        let r = self
            .command(&cdb::inquiry_vpd(page, 1024), Bytes::new(), 1024)
            .await
            .ok()?;
        (r.status == status::GOOD && r.data_in.get(1) == Some(&page)).then_some(r.data_in)
    }

    async fn read_capacity(&mut self) -> Result<(), InitiatorError> {
        let r = self
            .command(&cdb::read_capacity_16(32), Bytes::new(), 32)
            .await?;
        let d = &r.data_in;
        if r.status == status::GOOD && d.len() >= 15 {
            let last = be64(d, 0).unwrap_or(0);
            let bs = be32(d, 8).unwrap_or(0);
            self.set_capacity(last, bs)?;
            self.geometry.thin = d[14] & 0x80 != 0;
            return Ok(());
        }
        let r = self
            .command(&cdb::read_capacity_10(), Bytes::new(), 8)
            .await?;
        let d = &r.data_in;
        if r.status != status::GOOD || d.len() < 8 {
            return Err(InitiatorError::Scsi("READ CAPACITY failed".into()));
        }
        self.set_capacity(be32(d, 0).unwrap_or(0) as u64, be32(d, 4).unwrap_or(0))
    }

    fn set_capacity(&mut self, last_lba: u64, bs: u32) -> Result<(), InitiatorError> {
        if !(512..=1 << 20).contains(&bs) || !bs.is_power_of_two() || last_lba == u64::MAX {
            return Err(InitiatorError::Scsi(format!(
                "unusable capacity: block size {bs}"
            )));
        }
        self.geometry.block_size_bytes = bs;
        self.geometry.block_count = last_lba + 1;
        Ok(())
    }

    /// The session this LUN is reached through.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The portal address.
    pub fn addr(&self) -> SocketAddr {
        self.session.addr()
    }

    /// The LUN number.
    pub fn lun(&self) -> u64 {
        self.lun
    }

    /// The NAA designator from VPD page 0x83 (the identity multipath groups by).
    pub fn identity(&self) -> Option<&[u8]> {
        self.naa.as_deref()
    }

    /// Whether UNMAP is supported (thin LUN with LBPU).
    pub fn unmap_supported(&self) -> bool {
        self.unmap
    }

    /// Logs in again to the same portal with the same ISID and reopens the LUN.
    pub(crate) async fn reopen(&self) -> Result<IscsiLun, InitiatorError> {
        let login = self.login.as_ref().ok_or(InitiatorError::InvalidRequest(
            "LUN opened without login options",
        ))?;
        IscsiLun::connect(self.addr(), login, self.lun, self.opts).await
    }

    /// Runs one data command with the queue depth limit and the retry policy.
    async fn exec(
        &self,
        c: &[u8],
        out: Bytes,
        in_len: u32,
        lba: u64,
        write: bool,
    ) -> Result<ScsiResult, LunError> {
        let _permit = self
            .qd
            .acquire()
            .await
            .map_err(|_| LunError::Path("LUN closed".into()))?;
        let mut attempt = 0u32;
        loop {
            let r = match self.session.command(self.lun, c, out.clone(), in_len).await {
                Ok(r) => r,
                Err(InitiatorError::InvalidRequest(m)) => {
                    return Err(LunError::Block(BlockError::NotSupported(m)))
                }
                Err(e) => return Err(LunError::Path(e.to_string())),
            };
            if r.status == status::GOOD || r.status == status::CONDITION_MET {
                return Ok(r);
            }
            match verdict(r.status, r.sense.as_deref(), lba, write) {
                Verdict::Retry if attempt < self.opts.retries_max => {
                    attempt += 1;
                    if r.status != status::CHECK_CONDITION {
                        tokio::time::sleep(Duration::from_millis(attempt as u64)).await;
                    }
                }
                Verdict::Retry => {
                    return Err(LunError::Path(format!(
                        "retries exhausted (status {:#04x})",
                        r.status
                    )))
                }
                Verdict::PathDown(why) => return Err(LunError::Path(why)),
                Verdict::Error(e) => {
                    return Err(LunError::Block(match e {
                        BlockError::OutOfRange { lba, .. } => BlockError::OutOfRange {
                            lba,
                            blocks: 0,
                            block_count: self.geometry.block_count,
                        },
                        other => other,
                    }))
                }
            }
        }
    }

    fn check(&self, lba: u64, blocks: u64) -> Result<(), LunError> {
        self.geometry
            .check_range(lba, blocks)
            .map_err(LunError::Block)
    }

    pub(crate) async fn io_read(&self, lba: u64, blocks: u32) -> Result<Bytes, LunError> {
        self.check(lba, blocks as u64)?;
        let bs = self.geometry.block_size_bytes as u64;
        if blocks <= self.geometry.max_io_blocks {
            return self.read_one(lba, blocks).await;
        }
        let mut out = bytes::BytesMut::with_capacity((blocks as u64 * bs) as usize);
        let mut done = 0u32;
        while done < blocks {
            let n = (blocks - done).min(self.geometry.max_io_blocks);
            out.extend_from_slice(&self.read_one(lba + done as u64, n).await?);
            done += n;
        }
        Ok(out.freeze())
    }

    async fn read_one(&self, lba: u64, blocks: u32) -> Result<Bytes, LunError> {
        let len = blocks as u64 * self.geometry.block_size_bytes as u64;
        let len = u32::try_from(len)
            .map_err(|_| LunError::Block(BlockError::NotSupported("read too large")))?;
        let r = self
            .exec(&cdb::read_16(lba, blocks), Bytes::new(), len, lba, false)
            .await?;
        if r.data_in.len() != len as usize {
            return Err(LunError::Path(format!(
                "short read: {} of {len} bytes",
                r.data_in.len()
            )));
        }
        Ok(r.data_in)
    }

    pub(crate) async fn io_write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), LunError> {
        let blocks = self
            .geometry
            .blocks_in(data.len())
            .map_err(LunError::Block)?;
        self.check(lba, blocks)?;
        let bs = self.geometry.block_size_bytes as usize;
        let max = self.geometry.max_io_blocks as u64;
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(max);
            let chunk = data.slice(done as usize * bs..(done + n) as usize * bs);
            let at = lba + done;
            self.exec(&cdb::write_16(at, n as u32, fua), chunk, 0, at, true)
                .await?;
            done += n;
        }
        Ok(())
    }

    pub(crate) async fn io_flush(&self) -> Result<(), LunError> {
        match self
            .exec(&cdb::sync_cache_16(), Bytes::new(), 0, 0, true)
            .await
        {
            Err(LunError::Block(BlockError::NotSupported(_))) => {
                self.exec(&cdb::sync_cache_10(), Bytes::new(), 0, 0, true)
                    .await?;
                Ok(())
            }
            r => r.map(|_| ()),
        }
    }

    pub(crate) async fn io_discard(&self, lba: u64, blocks: u64) -> Result<(), LunError> {
        self.check(lba, blocks)?;
        if !self.unmap {
            return Err(LunError::Block(BlockError::NotSupported(
                "UNMAP not supported by the LUN",
            )));
        }
        let max = self.unmap_blocks_max.clamp(1, u32::MAX as u64);
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(max);
            let p = Bytes::copy_from_slice(&cdb::unmap_params(lba + done, n as u32));
            self.exec(&cdb::unmap(p.len() as u16), p, 0, lba + done, true)
                .await?;
            done += n;
        }
        Ok(())
    }

    pub(crate) async fn io_write_zeroes(
        &self,
        lba: u64,
        blocks: u64,
        may_unmap: bool,
    ) -> Result<(), LunError> {
        self.check(lba, blocks)?;
        let unmap = may_unmap && self.write_same_unmap;
        let block = Bytes::from(vec![0u8; self.geometry.block_size_bytes as usize]);
        let max = self.write_same_blocks_max.clamp(1, u32::MAX as u64);
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(max);
            let at = lba + done;
            match self
                .exec(
                    &cdb::write_same_16(at, n as u32, unmap),
                    block.clone(),
                    0,
                    at,
                    true,
                )
                .await
            {
                Ok(_) => {}
                Err(LunError::Block(BlockError::NotSupported(_))) => {
                    return self.zero_by_writes(at, blocks - done).await;
                }
                Err(e) => return Err(e),
            }
            done += n;
        }
        Ok(())
    }

    async fn zero_by_writes(&self, lba: u64, blocks: u64) -> Result<(), LunError> {
        let bs = self.geometry.block_size_bytes as u64;
        let chunk = ((1u64 << 20) / bs)
            .min(self.geometry.max_io_blocks as u64)
            .max(1);
        let zeroes = Bytes::from(vec![0u8; (chunk * bs) as usize]);
        let mut done = 0u64;
        while done < blocks {
            let n = (blocks - done).min(chunk);
            self.io_write(lba + done, zeroes.slice(..(n * bs) as usize), false)
                .await?;
            done += n;
        }
        Ok(())
    }
}

#[async_trait]
impl Volume for IscsiLun {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, lba: u64, blocks: u32) -> BlockResult<Bytes> {
        Ok(self.io_read(lba, blocks).await?)
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> BlockResult<()> {
        Ok(self.io_write(lba, data, fua).await?)
    }

    async fn flush(&self) -> BlockResult<()> {
        Ok(self.io_flush().await?)
    }

    async fn discard(&self, lba: u64, blocks: u64) -> BlockResult<()> {
        Ok(self.io_discard(lba, blocks).await?)
    }

    async fn write_zeroes(&self, lba: u64, blocks: u64, may_unmap: bool) -> BlockResult<()> {
        Ok(self.io_write_zeroes(lba, blocks, may_unmap).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naa_from_vpd83() {
        // T10 vendor id descriptor, then an NAA one of the LU, then a port one.
        let mut p = vec![0, 0x83, 0, 0];
        p.extend_from_slice(&[0x02, 0x01, 0, 4, b'A', b'B', b'C', b'D']);
        p.extend_from_slice(&[0x01, 0x03, 0, 16]);
        p.extend_from_slice(&[0x60; 16]);
        p.extend_from_slice(&[0x01, 0x13, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
        let n = (p.len() - 4) as u16;
        p[2..4].copy_from_slice(&n.to_be_bytes());
        assert_eq!(naa_designator(&p), Some(vec![0x60; 16]));
        assert_eq!(naa_designator(&p[..10]), None);
        assert_eq!(naa_designator(&[]), None);
    }
}
