//! A write's payload held in a kernel pipe instead of a buffer.
//!
//! A frontend that receives a large write from a TCP socket can move the bytes
//! from the socket into a pipe with `splice(2)` (the pipe then refers to the
//! socket buffer's pages: no copy), and a volume whose backing file takes them
//! can move them from the pipe into the file the same way
//! ([`crate::Volume::write_pipe`]): the kernel copies the payload once, into the
//! file's pages, where reading it into a buffer and writing the buffer costs two
//! copies. Volumes that cannot take a pipe read it into a buffer (the default).

use bytes::{Bytes, BytesMut};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Capacity asked of every pipe: the most a payload held in one may be is a
/// quarter of it (see [`PipePayload::fits`]).
pub const PIPE_CAPACITY_BYTES: usize = 1 << 20;

/// A pipe holding (part of) one write's payload. The bytes leave it in order,
/// once: into a file ([`PipePayload::drain_to`]) or a buffer
/// ([`PipePayload::take_bytes`]).
#[derive(Debug)]
pub struct PipePayload {
    rd: OwnedFd,
    wr: OwnedFd,
    /// Bytes in the pipe.
    held: usize,
    capacity: usize,
}

/// `n` bytes counted by a system call that returned `r`.
fn moved(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

impl PipePayload {
    /// A new empty pipe of [`PIPE_CAPACITY_BYTES`], both ends non-blocking.
    /// Fails when the system refuses a pipe that large (over the per-user pipe
    /// page limit, `fs.pipe-user-pages-soft`, or out of descriptors).
    pub fn new() -> io::Result<PipePayload> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned by nobody else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = PIPE_CAPACITY_BYTES as libc::c_int;
        // SAFETY: F_SETPIPE_SZ takes an int and touches no memory of ours.
        let got = unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        if (got as usize) < PIPE_CAPACITY_BYTES {
            return Err(io::Error::other("the pipe is smaller than asked"));
        }
        Ok(PipePayload {
            rd,
            wr,
            held: 0,
            capacity: got as usize,
        })
    }

    /// Whether a payload of `len` bytes may be held in a pipe: at most a
    /// quarter of its capacity, so that even payloads arriving in small socket
    /// fragments (one pipe slot each, whatever their size) find room.
    pub fn fits(len: usize) -> bool {
        len <= PIPE_CAPACITY_BYTES / 4
    }

    /// Bytes the pipe holds.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Copies `bytes` into the pipe (the part of a payload already read into a
    /// buffer). All of it or an error.
    pub fn push(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        if self.held + bytes.len() > self.capacity {
            return Err(io::Error::other("payload larger than its pipe"));
        }
        while !bytes.is_empty() {
            // SAFETY: the pointer and length describe `bytes`.
            let r = unsafe { libc::write(self.wr.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            match moved(r) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.held += n;
                    bytes = &bytes[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Moves up to `max` bytes from the socket `sock` into the pipe without
    /// copying them, as many as it has now. `Ok(0)`: the peer closed the
    /// stream. `WouldBlock`: nothing to move now, or the pipe is out of room
    /// (see [`readable_bytes`]).
    pub fn fill_from(&mut self, sock: RawFd, max: usize) -> io::Result<usize> {
        let max = max.min(self.capacity - self.held);
        // SAFETY: splice reads `sock` and writes the pipe; no memory of ours.
        let r = unsafe {
            libc::splice(
                sock,
                std::ptr::null_mut(),
                self.wr.as_raw_fd(),
                std::ptr::null_mut(),
                max,
                libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
            )
        };
        let n = moved(r)?;
        self.held += n;
        Ok(n)
    }

    /// Moves everything the pipe holds into the file `fd` at byte `offset`.
    /// On an error, the bytes that went before it are in the file and
    /// [`PipePayload::len`] says how many are still held.
    pub fn drain_to(&mut self, fd: RawFd, offset: u64) -> io::Result<()> {
        let mut done = 0u64;
        while self.held > 0 {
            let mut at = (offset + done) as libc::loff_t;
            // SAFETY: splice reads the pipe and writes `fd` at `at`, a local it
            // advances; no memory of ours is read or written.
            let r = unsafe {
                libc::splice(
                    self.rd.as_raw_fd(),
                    std::ptr::null_mut(),
                    fd,
                    &mut at,
                    self.held,
                    libc::SPLICE_F_MOVE,
                )
            };
            match moved(r) {
                Ok(0) => return Err(io::Error::other("the pipe ran dry before its count")),
                Ok(n) => {
                    self.held -= n;
                    done += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Everything the pipe holds, read into a buffer.
    pub fn take_bytes(&mut self) -> io::Result<Bytes> {
        let mut out = BytesMut::zeroed(self.held);
        let mut got = 0;
        while got < out.len() {
            let rest = &mut out[got..];
            // SAFETY: the pointer and length describe `rest`.
            let r =
                unsafe { libc::read(self.rd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
            match moved(r) {
                Ok(0) => return Err(io::Error::other("the pipe ran dry before its count")),
                Ok(n) => {
                    got += n;
                    self.held -= n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out.freeze())
    }
}

/// Bytes waiting in the receive queue of socket `sock` (`FIONREAD`); 0 when
/// the call fails. A pipe that cannot take more while the socket has bytes is
/// out of room, not waiting for the peer.
pub fn readable_bytes(sock: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int, `n`.
    let r = unsafe { libc::ioctl(sock, libc::FIONREAD, &mut n) };
    if r < 0 {
        0
    } else {
        n.max(0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Bytes pushed and spliced from a socket come out in order, into a file
    /// at an offset or into a buffer; an empty socket says WouldBlock and a
    /// closed one 0.
    #[test]
    fn a_payload_goes_through_a_pipe_in_order() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        rx.set_nonblocking(true).unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut p = PipePayload::new().unwrap();
        assert!(PipePayload::fits(payload.len()));
        p.push(&payload[..1000]).unwrap();
        tx.write_all(&payload[1000..]).unwrap();
        while p.len() < payload.len() {
            match p.fill_from(rx.as_raw_fd(), payload.len() - p.len()) {
                Ok(n) => assert!(n > 0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        let e = p.fill_from(rx.as_raw_fd(), 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(readable_bytes(rx.as_raw_fd()), 0);
        let mut f = tempfile::tempfile().unwrap();
        p.drain_to(f.as_raw_fd(), 4096).unwrap();
        assert!(p.is_empty());
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert_eq!(&back[4096..], &payload[..]);
        assert!(back[..4096].iter().all(|b| *b == 0));

        tx.write_all(&payload[..5000]).unwrap();
        while p.len() < 5000 {
            let _ = p.fill_from(rx.as_raw_fd(), 5000 - p.len());
        }
        assert_eq!(&p.take_bytes().unwrap()[..], &payload[..5000]);
        drop(tx);
        let closed = loop {
            match p.fill_from(rx.as_raw_fd(), 10) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                r => break r,
            }
        };
        assert_eq!(closed.unwrap(), 0);
    }
}
