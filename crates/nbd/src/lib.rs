//! freesan's NBD frontend: a fixed-newstyle NBD server over [`block::Volume`]s and
//! an NBD client that is itself a `Volume`.
//!
//! What it does:
//! - [`proto`]: the wire protocol as a pure, fuzzable codec (handshake, options,
//!   `NBD_INFO_*`, requests, simple replies) and the server's option haggling as a
//!   byte-fed state machine;
//! - [`server`]: [`NbdServer`] serves named exports (freesan names them `lun0`,
//!   `lun1`, ...; an empty name picks the default export). Per connection one
//!   reader task decodes requests and runs each (bounded in count and bytes):
//!   a small one the volume completes at once (a page-cache transfer) right
//!   there, any other on a task of its own; one writer task batches replies
//!   (header + data `Bytes`) into vectored writes; replies may go out of order.
//!   Unaligned requests are served by reading covering blocks and by
//!   read-modify-write under a per-export range lock;
//! - [`tls`]: TLS as the NBD protocol defines it: with [`NbdConfig::tls`] set the
//!   server requires `NBD_OPT_STARTTLS` before anything else, runs the rustls
//!   handshake on the same socket (optionally demanding a client certificate from
//!   a given CA), and continues option haggling and the transmission phase inside
//!   TLS; a certificate can be made at first start;
//! - [`client`]: [`NbdClient`], one TCP connection with many requests in flight,
//!   used by `freesan bench --target nbd://HOST:PORT/EXPORT` (plaintext only).
//!
//! - [`psk`]: TLS with pre-shared keys (OpenSSL, the `psk` feature);
//! - structured replies (`NBD_OPT_STRUCTURED_REPLY`) and block status with the
//!   `base:allocation` metadata context, so clients such as `qemu-img map` and
//!   `convert` see the holes of a thin LUN. A request that succeeds with nothing
//!   to return (write, flush, trim, write zeroes) still gets a 16-byte simple
//!   reply, as the protocol allows and nbdkit does: libnbd reads it with one
//!   `recv` where a chunk header takes two (docs/nbd-performance.md).
//!
//! What it does not do: TLS offered but optional, `NBD_REPLY_TYPE_OFFSET_HOLE`
//! chunks and the DF flag, extended headers, oldstyle negotiation, resize. Those
//! options are refused with `NBD_REP_ERR_UNSUP`, which every client handles.
//!
//! Key invariant: nothing a peer sends can panic the process or make it allocate
//! beyond the configured bounds (option data, request payload, requests and bytes in
//! flight per connection); every violation ends in an NBD error reply or a closed
//! connection plus a `tracing::warn` line, and never disturbs another connection.
//! A reply is sent only after the volume finished the request, so a flush
//! acknowledges every write completed before it on any connection
//! (`NBD_FLAG_CAN_MULTI_CONN` is therefore advertised).

pub mod client;
mod io;
pub mod proto;
pub mod psk;
pub mod server;
pub mod tls;

pub use client::{parse_nbd_url, NbdClient, NBD_DEFAULT_PORT};
pub use server::{
    ExportAccess, ExportStats, IpRange, NbdConfig, NbdExport, NbdExports, NbdLimits, NbdServer,
    ServerTls,
};
