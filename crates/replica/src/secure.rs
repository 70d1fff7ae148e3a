//! Cluster trust: the keys of an HA pair and its witness, and the authenticated,
//! encrypted channel every cluster connection (sync link, witness) runs over.
//!
//! Keys. `freesan cluster init` makes one key file per member (node 1, node 2,
//! the witness). Each holds the cluster's pre-shared secret, the member's own
//! X25519 private key, and the public keys of all three members (pinned).
//!
//! Channel. A connection starts with a Noise handshake, `Noise_IKpsk2_25519_
//! ChaChaPoly_BLAKE2s` (the pattern WireGuard uses), made by the `snow` crate:
//! the dialer knows the static key of the member it calls; the listener learns
//! the dialer's static key from the first message and accepts only the members
//! allowed on that listener; both must also hold the cluster secret. The
//! prologue binds the cluster name and the purpose (`sync`, `witness`), so a
//! handshake made for one cannot be used for the other. After it, every byte
//! travels in records: a 2-byte big-endian length and a ChaCha20-Poly1305
//! ciphertext under a per-direction counter nonce, so a tampered, replayed,
//! reordered or dropped record fails to open and closes the connection.
//!
//! Nothing is said on a cluster connection before the handshake, and the
//! listener acts on nothing before the dialer's first record opens (which proves
//! it holds the cluster secret, since the secret enters at the second message).
//!
//! Right after the handshake each side sends one encrypted setup record: the
//! channel mode it is configured for and a fresh random 32-byte key for the
//! records it will send. Modes must match. In the default mode every record is
//! encrypted as above. With `[cluster] encrypt = false` (a dedicated sync
//! network) sync records are authenticated but not encrypted: a 4-byte length,
//! the plaintext and a 32-byte keyed BLAKE3 tag over the record counter, the
//! length and the plaintext, under the sender's setup key: still refused when
//! tampered, replayed, reordered or forged; only the privacy is gone.
//!
//! What it does not do: invent cryptography. The Noise state machine and every
//! primitive are `snow`'s (RustCrypto underneath); this file frames bytes.

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use snow::{Builder, HandshakeState, StatelessTransportState};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// The Noise protocol of every cluster connection.
const NOISE_PARAMS: &str = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
/// Largest Noise message (and so record) on the wire.
pub const RECORD_BYTES_MAX: usize = 65535;
/// The AEAD tag of every record.
const TAG_BYTES: usize = 16;
/// Largest plaintext carried by one record.
pub const RECORD_PLAINTEXT_BYTES_MAX: usize = RECORD_BYTES_MAX - TAG_BYTES;
/// Time allowed for a whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read from the socket at once.
const READ_CHUNK_BYTES: usize = 256 << 10;
/// Largest plaintext of one authenticated-only record.
const MAC_RECORD_PLAINTEXT_BYTES_MAX: usize = 256 << 10;
/// The tag of an authenticated-only record.
const MAC_TAG_BYTES: usize = 32;
/// The setup record: version, mode, the sender's record key.
const SETUP_BYTES: usize = 2 + 32;
const SETUP_VERSION: u8 = 1;
const MODE_ENCRYPTED: u8 = 1;
const MODE_AUTHENTICATED: u8 = 2;

/// Why a cluster connection was refused or closed.
#[derive(Debug, thiserror::Error)]
pub enum SecureError {
    /// The socket failed.
    #[error("i/o: {0}")]
    Io(std::io::Error),
    /// The peer's handshake or record did not verify (no cluster secret, wrong
    /// keys, tampered, replayed or reordered bytes).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The peer proved a key that is not allowed on this listener.
    #[error("peer not allowed here: {0}")]
    NotAllowed(String),
    /// A malformed frame.
    #[error("bad frame: {0}")]
    Frame(&'static str),
    /// The key file could not be used.
    #[error("cluster key: {0}")]
    Key(String),
}

// (the wrapped error's text is in the variant's own, so it is not also given
// as the source: an error chain printed whole said it twice)
impl From<std::io::Error> for SecureError {
    fn from(e: std::io::Error) -> SecureError {
        SecureError::Io(e)
    }
}

impl From<snow::Error> for SecureError {
    fn from(e: snow::Error) -> Self {
        SecureError::Auth(e.to_string())
    }
}

impl From<SecureError> for std::io::Error {
    fn from(e: SecureError) -> Self {
        match e {
            SecureError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::PermissionDenied, other.to_string()),
        }
    }
}

/// A member of a cluster: one of its two nodes, or its witness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Member {
    /// Node 1.
    Node1,
    /// Node 2.
    Node2,
    /// The witness.
    Witness,
}

impl Member {
    /// Every member, in key-file order.
    pub const ALL: [Member; 3] = [Member::Node1, Member::Node2, Member::Witness];

    /// The member of node `id` (1 or 2).
    pub fn node(id: u8) -> Option<Member> {
        match id {
            1 => Some(Member::Node1),
            2 => Some(Member::Node2),
            _ => None,
        }
    }

    /// The node id of a node member (0 for the witness).
    pub fn node_id(self) -> u8 {
        match self {
            Member::Node1 => 1,
            Member::Node2 => 2,
            Member::Witness => 0,
        }
    }

    fn index(self) -> usize {
        match self {
            Member::Node1 => 0,
            Member::Node2 => 1,
            Member::Witness => 2,
        }
    }

    /// The member's name in key files and logs.
    pub fn name(self) -> &'static str {
        match self {
            Member::Node1 => "node1",
            Member::Node2 => "node2",
            Member::Witness => "witness",
        }
    }
}

/// What a connection is for; bound into the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A sync link between the nodes.
    Sync,
    /// A node asking the witness.
    Witness,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Sync => "sync",
            Purpose::Witness => "witness",
        }
    }
}

/// One member's key file as stored (hex strings).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    cluster: String,
    member: Member,
    secret: String,
    private_key: String,
    node1_public: String,
    node2_public: String,
    witness_public: String,
}

/// The keys one member of a cluster holds.
pub struct ClusterKeys {
    cluster: String,
    me: Member,
    psk: [u8; 32],
    private: [u8; 32],
    public: [[u8; 32]; 3],
    /// Sync links encrypt their records (`[cluster] encrypt`); authentication
    /// is never off. Witness connections always encrypt.
    encrypt_sync: bool,
}

impl std::fmt::Debug for ClusterKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the secrets
        f.debug_struct("ClusterKeys")
            .field("cluster", &self.cluster)
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

fn params() -> snow::params::NoiseParams {
    NOISE_PARAMS
        .parse()
        .expect("the constant Noise parameters parse")
}

fn key32(what: &str, hex_str: &str) -> Result<[u8; 32], SecureError> {
    let v = hex::decode(hex_str.trim()).map_err(|e| SecureError::Key(format!("{what}: {e}")))?;
    v.try_into()
        .map_err(|_| SecureError::Key(format!("{what}: not 32 bytes")))
}

impl ClusterKeys {
    /// Makes a new cluster's keys: one [`ClusterKeys`] per member, in
    /// [`Member::ALL`] order, sharing a fresh secret and pinning each other.
    pub fn generate(cluster: &str) -> Result<Vec<ClusterKeys>, SecureError> {
        let builder = Builder::new(params());
        let mut privates = Vec::new();
        let mut public = [[0u8; 32]; 3];
        for p in public.iter_mut() {
            let kp = builder.generate_keypair()?;
            p.copy_from_slice(&kp.public);
            let mut k = [0u8; 32];
            k.copy_from_slice(&kp.private);
            privates.push(k);
        }
        let mut psk = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut psk);
        Ok(Member::ALL
            .iter()
            .zip(privates)
            .map(|(&me, private)| ClusterKeys {
                cluster: cluster.to_string(),
                me,
                psk,
                private,
                public,
                encrypt_sync: true,
            })
            .collect())
    }

    /// Whether sync links encrypt (default) or only authenticate their
    /// records; both nodes must agree.
    pub fn set_sync_encryption(&mut self, on: bool) {
        self.encrypt_sync = on;
    }

    fn mode(&self, purpose: Purpose) -> u8 {
        match purpose {
            Purpose::Sync if !self.encrypt_sync => MODE_AUTHENTICATED,
            _ => MODE_ENCRYPTED,
        }
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Which member these keys belong to.
    pub fn me(&self) -> Member {
        self.me
    }

    /// The key file's text (TOML; secret: store it 0600).
    pub fn to_file_text(&self) -> String {
        let f = KeyFile {
            cluster: self.cluster.clone(),
            member: self.me,
            secret: hex::encode(self.psk),
            private_key: hex::encode(self.private),
            node1_public: hex::encode(self.public[0]),
            node2_public: hex::encode(self.public[1]),
            witness_public: hex::encode(self.public[2]),
        };
        format!(
            "# freesan cluster key of {} in cluster {:?}: secret, keep it mode 0600\n{}",
            self.me.name(),
            self.cluster,
            toml::to_string(&f).unwrap_or_default()
        )
    }

    /// Parses a key file's text.
    pub fn from_file_text(text: &str) -> Result<ClusterKeys, SecureError> {
        // toml's own message quotes the line it stopped at: a secret's
        let f: KeyFile = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .and_then(|s| text.get(..s.start))
                .map_or(0, |before| before.matches('\n').count() + 1);
            SecureError::Key(format!("the key file does not parse (line {line})"))
        })?;
        let keys = ClusterKeys {
            cluster: f.cluster,
            me: f.member,
            psk: key32("secret", &f.secret)?,
            private: key32("private_key", &f.private_key)?,
            public: [
                key32("node1_public", &f.node1_public)?,
                key32("node2_public", &f.node2_public)?,
                key32("witness_public", &f.witness_public)?,
            ],
            encrypt_sync: true,
        };
        if keys.public[0] == keys.public[1]
            || keys.public[0] == keys.public[2]
            || keys.public[1] == keys.public[2]
        {
            return Err(SecureError::Key("two members share a public key".into()));
        }
        Ok(keys)
    }

    /// Reads a key file, refusing one that others than its owner may read.
    pub fn load(path: &Path) -> Result<ClusterKeys, SecureError> {
        let text = block::private::read_to_string(path)
            .map_err(|e| SecureError::Key(format!("{}: {e}", path.display())))?;
        Self::from_file_text(&text)
    }

    /// Writes the key file at `path`, mode 0600, refusing to overwrite one.
    pub fn store(&self, path: &Path) -> Result<(), SecureError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| SecureError::Key(format!("{}: {e}", path.display())))?;
        f.write_all(self.to_file_text().as_bytes())?;
        f.sync_all()?;
        Ok(())
    }

    fn prologue(&self, purpose: Purpose) -> Vec<u8> {
        let mut p = b"freesan cluster v1\0".to_vec();
        p.extend_from_slice(self.cluster.as_bytes());
        p.push(0);
        p.extend_from_slice(purpose.label().as_bytes());
        p
    }

    fn member_of(&self, public: &[u8]) -> Option<Member> {
        Member::ALL
            .into_iter()
            .find(|m| self.public[m.index()].as_slice() == public)
    }

    /// A key for heartbeat datagrams, derived from the cluster secret (nodes only
    /// use it; a holder of the secret is a member).
    pub fn heartbeat_key(&self) -> [u8; 32] {
        use hkdf::Hkdf;
        let hk = Hkdf::<sha2::Sha256>::new(Some(self.cluster.as_bytes()), &self.psk);
        let mut out = [0u8; 32];
        hk.expand(b"freesan heartbeat v1", &mut out)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        out
    }
}

/// The dialer's first handshake step: the message to send, and the state that
/// reads the answer.
fn initiate(
    keys: &ClusterKeys,
    to: Member,
    purpose: Purpose,
) -> Result<(HandshakeState, Vec<u8>), SecureError> {
    let prologue = keys.prologue(purpose);
    let mut hs = Builder::new(params())
        .local_private_key(&keys.private)
        .remote_public_key(&keys.public[to.index()])
        .psk(2, &keys.psk)
        .prologue(&prologue)
        .build_initiator()?;
    let mut msg = vec![0u8; RECORD_BYTES_MAX];
    let n = hs.write_message(&[], &mut msg)?;
    msg.truncate(n);
    Ok((hs, msg))
}

/// The dialer's last handshake step: reads the listener's `answer` (bytes
/// from whatever answered at the partner's or witness's address) and returns
/// the transport. Pure: the fuzz target drives it with arbitrary bytes (see
/// [`fuzz_initiate`]).
fn finish_initiate(
    mut hs: HandshakeState,
    answer: &[u8],
) -> Result<StatelessTransportState, SecureError> {
    let mut payload = vec![0u8; RECORD_BYTES_MAX];
    hs.read_message(answer, &mut payload)?;
    Ok(hs.into_stateless_transport_mode()?)
}

/// Checks the peer's channel setup record (`theirs`, opened from the Noise
/// channel) against this side's `mode`: Some(the peer's key) in
/// authenticated-only mode. Pure: fuzzed.
pub fn check_setup(theirs: &[u8], mode: u8) -> Result<Option<[u8; 32]>, SecureError> {
    if theirs.len() != SETUP_BYTES {
        return Err(SecureError::Frame("channel setup of a bad length"));
    }
    if theirs[0] != SETUP_VERSION {
        return Err(SecureError::Frame("unknown channel setup version"));
    }
    if theirs[1] != mode {
        return Err(SecureError::NotAllowed(
            "the peer's channel mode differs ([cluster] encrypt must be the same on both nodes)"
                .into(),
        ));
    }
    if mode != MODE_AUTHENTICATED {
        return Ok(None);
    }
    let mut k = [0u8; 32];
    k.copy_from_slice(&theirs[2..SETUP_BYTES]);
    Ok(Some(k))
}

/// For the fuzz target: node 1 dials node 2's sync listener (`keys` of node
/// 1) and reads `answer`; true if it would have accepted it.
pub fn fuzz_initiate(keys: &ClusterKeys, answer: &[u8]) -> bool {
    initiate(keys, Member::Node2, Purpose::Sync)
        .and_then(|(hs, _)| finish_initiate(hs, answer))
        .is_ok()
}

/// The listener's handshake step over the dialer's first message: who it is
/// (one of `allowed`), the answer to send, and the transport. Pure: the fuzz
/// target drives it with arbitrary bytes.
pub fn respond(
    keys: &ClusterKeys,
    purpose: Purpose,
    allowed: &[Member],
    first: &[u8],
) -> Result<(Member, Vec<u8>, StatelessTransportState), SecureError> {
    let prologue = keys.prologue(purpose);
    let mut hs = Builder::new(params())
        .local_private_key(&keys.private)
        .psk(2, &keys.psk)
        .prologue(&prologue)
        .build_responder()?;
    let mut payload = vec![0u8; RECORD_BYTES_MAX];
    hs.read_message(first, &mut payload)?;
    let remote = hs
        .get_remote_static()
        .ok_or(SecureError::Frame("no static key"))?;
    let who = keys
        .member_of(remote)
        .filter(|m| allowed.contains(m) && *m != keys.me)
        .ok_or_else(|| SecureError::NotAllowed("unknown or unexpected static key".into()))?;
    let mut msg = vec![0u8; RECORD_BYTES_MAX];
    let n = hs.write_message(&[], &mut msg)?;
    msg.truncate(n);
    Ok((who, msg, hs.into_stateless_transport_mode()?))
}

async fn read_frame(rd: &mut OwnedReadHalf) -> Result<Vec<u8>, SecureError> {
    let len = rd.read_u16().await? as usize;
    if len == 0 {
        return Err(SecureError::Frame("empty frame"));
    }
    let mut b = vec![0u8; len];
    rd.read_exact(&mut b).await?;
    Ok(b)
}

async fn write_frame(wr: &mut OwnedWriteHalf, b: &[u8]) -> Result<(), SecureError> {
    let len = u16::try_from(b.len()).map_err(|_| SecureError::Frame("frame too long"))?;
    let mut out = Vec::with_capacity(b.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(b);
    wr.write_all(&out).await?;
    Ok(())
}

/// Dials side: runs the handshake with member `to` over `stream`.
pub async fn connect(
    stream: TcpStream,
    keys: &ClusterKeys,
    to: Member,
    purpose: Purpose,
) -> Result<SecureStream, SecureError> {
    let peer = stream.peer_addr()?;
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let run = async {
        let (hs, first) = initiate(keys, to, purpose)?;
        write_frame(&mut wr, &first).await?;
        let answer = read_frame(&mut rd).await?;
        finish_initiate(hs, &answer)
    };
    let ts = tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .map_err(|_| SecureError::Io(std::io::ErrorKind::TimedOut.into()))??;
    let s = SecureStream::new(rd, wr, ts, peer, to);
    tokio::time::timeout(HANDSHAKE_TIMEOUT, s.setup(keys.mode(purpose)))
        .await
        .map_err(|_| SecureError::Io(std::io::ErrorKind::TimedOut.into()))?
}

/// Listening side: runs the handshake over an accepted `stream`; the dialer
/// must be one of `allowed`. The caller must act on nothing before the first
/// record from the dialer opens.
pub async fn accept(
    stream: TcpStream,
    keys: &ClusterKeys,
    purpose: Purpose,
    allowed: &[Member],
) -> Result<SecureStream, SecureError> {
    let peer = stream.peer_addr()?;
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let run = async {
        let first = read_frame(&mut rd).await?;
        let (who, answer, ts) = respond(keys, purpose, allowed, &first)?;
        write_frame(&mut wr, &answer).await?;
        Ok::<_, SecureError>((who, ts))
    };
    let (who, ts) = tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .map_err(|_| SecureError::Io(std::io::ErrorKind::TimedOut.into()))??;
    let s = SecureStream::new(rd, wr, ts, peer, who);
    tokio::time::timeout(HANDSHAKE_TIMEOUT, s.setup(keys.mode(purpose)))
        .await
        .map_err(|_| SecureError::Io(std::io::ErrorKind::TimedOut.into()))?
}

/// The opening half of a channel: records in, plaintext out.
pub struct Opener {
    ts: Arc<StatelessTransportState>,
    nonce: u64,
    raw: BytesMut,
    /// Authenticated-only records under this key (after the setup record).
    mac: Option<[u8; 32]>,
}

fn record_tag(key: &[u8; 32], counter: u64, data: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&counter.to_be_bytes());
    h.update(&(data.len() as u32).to_be_bytes());
    h.update(data);
    h.finalize()
}

impl Opener {
    /// Opens every whole record at the front of `raw` (consuming it) into
    /// `out`; returns the plaintext bytes added. Pure: fuzzed.
    pub fn open_records(&mut self, out: &mut BytesMut) -> Result<usize, SecureError> {
        if let Some(key) = self.mac {
            return self.open_mac_records(&key, out);
        }
        self.open_noise_records(out, usize::MAX).map(|(n, _)| n)
    }

    /// Opens at most `limit` encrypted records; returns the plaintext bytes
    /// added and the records opened.
    fn open_noise_records(
        &mut self,
        out: &mut BytesMut,
        limit: usize,
    ) -> Result<(usize, usize), SecureError> {
        let (mut added, mut records) = (0, 0);
        loop {
            if self.raw.len() < 2 || records == limit {
                return Ok((added, records));
            }
            let len = u16::from_be_bytes([self.raw[0], self.raw[1]]) as usize;
            if len < TAG_BYTES {
                return Err(SecureError::Frame("record shorter than its tag"));
            }
            if self.raw.len() < 2 + len {
                return Ok((added, records));
            }
            let at = out.len();
            out.resize(at + len - TAG_BYTES, 0);
            let n = match self
                .ts
                .read_message(self.nonce, &self.raw[2..2 + len], &mut out[at..])
            {
                Ok(n) => n,
                Err(e) => {
                    out.truncate(at);
                    return Err(SecureError::Auth(format!("record {}: {e}", self.nonce)));
                }
            };
            out.truncate(at + n);
            let _ = self.raw.split_to(2 + len);
            self.nonce += 1;
            added += n;
            records += 1;
        }
    }

    fn open_mac_records(
        &mut self,
        key: &[u8; 32],
        out: &mut BytesMut,
    ) -> Result<usize, SecureError> {
        let mut added = 0;
        loop {
            if self.raw.len() < 4 {
                return Ok(added);
            }
            let len =
                u32::from_be_bytes([self.raw[0], self.raw[1], self.raw[2], self.raw[3]]) as usize;
            if len == 0 || len > MAC_RECORD_PLAINTEXT_BYTES_MAX {
                return Err(SecureError::Frame("authenticated record of a bad length"));
            }
            let end = 4 + len + MAC_TAG_BYTES;
            if self.raw.len() < end {
                return Ok(added);
            }
            let data = &self.raw[4..4 + len];
            let tag: [u8; MAC_TAG_BYTES] = self.raw[4 + len..end]
                .try_into()
                .map_err(|_| SecureError::Frame("tag"))?;
            // blake3::Hash compares in constant time
            if record_tag(key, self.nonce, data) != blake3::Hash::from(tag) {
                return Err(SecureError::Auth(format!("record {}: bad tag", self.nonce)));
            }
            out.extend_from_slice(data);
            let _ = self.raw.split_to(end);
            self.nonce += 1;
            added += len;
        }
    }

    /// Appends raw bytes as they came off the wire (for tests and fuzzing).
    pub fn push_raw(&mut self, b: &[u8]) {
        self.raw.extend_from_slice(b);
    }
}

/// The sealing half of a channel: plaintext in, records out.
pub struct Sealer {
    ts: Arc<StatelessTransportState>,
    nonce: u64,
    /// Authenticated-only records under this key (after the setup record).
    mac: Option<[u8; 32]>,
}

impl Sealer {
    /// Seals `data` into records appended to `out`.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), SecureError> {
        if let Some(key) = self.mac {
            for chunk in data.chunks(MAC_RECORD_PLAINTEXT_BYTES_MAX) {
                out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(record_tag(&key, self.nonce, chunk).as_bytes());
                self.nonce += 1;
            }
            return Ok(());
        }
        for chunk in data.chunks(RECORD_PLAINTEXT_BYTES_MAX) {
            let at = out.len();
            let len = chunk.len() + TAG_BYTES;
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.resize(at + 2 + len, 0);
            let n = self
                .ts
                .write_message(self.nonce, chunk, &mut out[at + 2..])?;
            debug_assert_eq!(n, len);
            self.nonce += 1;
        }
        Ok(())
    }
}

/// The reading half of an authenticated connection.
pub struct SecureReader {
    rd: OwnedReadHalf,
    opener: Opener,
}

impl SecureReader {
    /// Reads until at least one record opens and appends its plaintext to
    /// `out`; `Ok(0)` at the end of the stream. A record that does not open is
    /// an error: the connection must close.
    pub async fn read_buf(&mut self, out: &mut BytesMut) -> std::io::Result<usize> {
        loop {
            let n = self.opener.open_records(out)?;
            if n > 0 {
                return Ok(n);
            }
            self.opener.raw.reserve(READ_CHUNK_BYTES);
            if self.rd.read_buf(&mut self.opener.raw).await? == 0 {
                if self.opener.raw.is_empty() {
                    return Ok(0);
                }
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// The writing half of an authenticated connection.
pub struct SecureWriter {
    wr: OwnedWriteHalf,
    sealer: Sealer,
    scratch: Vec<u8>,
}

impl SecureWriter {
    /// Seals and sends all of `data`.
    pub async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.scratch.clear();
        self.sealer.seal(data, &mut self.scratch)?;
        let r = self.wr.write_all(&self.scratch).await;
        if self.scratch.capacity() > (4 << 20) {
            self.scratch = Vec::new();
        }
        r
    }

    /// Closes the sending direction.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.wr.shutdown().await
    }
}

/// An authenticated, encrypted cluster connection.
pub struct SecureStream {
    /// Reading half.
    pub reader: SecureReader,
    /// Writing half.
    pub writer: SecureWriter,
    /// The peer's address.
    pub peer_addr: std::net::SocketAddr,
    /// The member the peer proved to be.
    pub peer: Member,
}

impl SecureStream {
    /// Sends this side's setup record and reads the peer's: the modes must
    /// match; in authenticated-only mode each direction switches to its key.
    async fn setup(mut self, mode: u8) -> Result<SecureStream, SecureError> {
        let mut mine = [0u8; SETUP_BYTES];
        mine[0] = SETUP_VERSION;
        mine[1] = mode;
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut mine[2..]);
        self.writer.write_all(&mine).await?;
        // exactly one record: what follows it may already be in the other mode
        let mut theirs = BytesMut::new();
        loop {
            let (_, records) = self.reader.opener.open_noise_records(&mut theirs, 1)?;
            if records == 1 {
                break;
            }
            self.reader.opener.raw.reserve(READ_CHUNK_BYTES);
            if self.reader.rd.read_buf(&mut self.reader.opener.raw).await? == 0 {
                return Err(SecureError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        if let Some(theirs) = check_setup(&theirs, mode)? {
            let mut k = [0u8; 32];
            k.copy_from_slice(&mine[2..]);
            self.writer.sealer.mac = Some(k);
            self.reader.opener.mac = Some(theirs);
        }
        Ok(self)
    }

    fn new(
        rd: OwnedReadHalf,
        wr: OwnedWriteHalf,
        ts: StatelessTransportState,
        peer_addr: std::net::SocketAddr,
        peer: Member,
    ) -> SecureStream {
        let ts = Arc::new(ts);
        SecureStream {
            reader: SecureReader {
                rd,
                opener: Opener {
                    ts: ts.clone(),
                    nonce: 0,
                    raw: BytesMut::with_capacity(64 << 10),
                    mac: None,
                },
            },
            writer: SecureWriter {
                wr,
                sealer: Sealer {
                    ts,
                    nonce: 0,
                    mac: None,
                },
                scratch: Vec::new(),
            },
            peer_addr,
            peer,
        }
    }
}

/// [`test_pair`] in the authenticated-only mode (`[cluster] encrypt = false`),
/// with a fresh record key.
pub fn test_pair_authenticated(keys: &[ClusterKeys]) -> Result<(Sealer, Opener), SecureError> {
    let (mut s, mut o) = test_pair(keys)?;
    let mut k = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut k);
    s.mac = Some(k);
    o.mac = Some(k);
    Ok((s, o))
}

/// A pair of in-memory channel ends (sealer of one side, opener of the
/// other) for tests and the fuzz target: runs a real handshake between node 1
/// (dialer) and node 2.
pub fn test_pair(keys: &[ClusterKeys]) -> Result<(Sealer, Opener), SecureError> {
    let (mut hs, first) = initiate(&keys[0], Member::Node2, Purpose::Sync)?;
    let (_, answer, responder) = respond(&keys[1], Purpose::Sync, &[Member::Node1], &first)?;
    let mut payload = vec![0u8; RECORD_BYTES_MAX];
    hs.read_message(&answer, &mut payload)?;
    let initiator = hs.into_stateless_transport_mode()?;
    Ok((
        Sealer {
            ts: Arc::new(initiator),
            nonce: 0,
            mac: None,
        },
        Opener {
            ts: Arc::new(responder),
            nonce: 0,
            raw: BytesMut::new(),
            mac: None,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip_and_hide_secrets() {
        let keys = ClusterKeys::generate("pair").unwrap();
        let text = keys[1].to_file_text();
        let back = ClusterKeys::from_file_text(&text).unwrap();
        assert_eq!(back.me(), Member::Node2);
        assert_eq!(back.psk, keys[1].psk);
        assert_eq!(back.public, keys[0].public);
        let dbg = format!("{:?}", keys[1]);
        assert!(!dbg.contains(&hex::encode(keys[1].psk)), "{dbg}");
        assert!(!dbg.contains(&hex::encode(keys[1].private)), "{dbg}");
        // a damaged file's error names the line, never the text on it (toml's
        // own message quoted the line, the secret with it)
        let secret = hex::encode(keys[1].psk);
        let cut = &text[..text.find(&secret).unwrap() + secret.len()];
        let err = ClusterKeys::from_file_text(cut).unwrap_err().to_string();
        assert!(err.contains("line"), "{err}");
        assert!(!err.contains(&secret[..16]), "{err}");
    }

    #[test]
    fn records_open_in_order_and_refuse_tampering_replay_and_reordering() {
        let keys = ClusterKeys::generate("pair").unwrap();
        let (mut s, mut o) = test_pair(&keys).unwrap();
        let mut r1 = Vec::new();
        s.seal(b"first", &mut r1).unwrap();
        let mut r2 = Vec::new();
        s.seal(b"second", &mut r2).unwrap();
        let mut out = BytesMut::new();
        o.push_raw(&r1);
        assert_eq!(o.open_records(&mut out).unwrap(), 5);
        // a replayed record does not open
        let mut replay = o_clone_state(&keys);
        replay.push_raw(&r1);
        replay.push_raw(&r1);
        let mut tmp = BytesMut::new();
        assert!(replay.open_records(&mut tmp).is_err(), "replay refused");
        // a tampered record does not open
        let mut bad = r2.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let mut o2 = o_clone_state(&keys);
        o2.push_raw(&bad);
        assert!(o2.open_records(&mut BytesMut::new()).is_err());
        // out of order: the second record first
        let mut o3 = o_clone_state(&keys);
        o3.push_raw(&r2);
        assert!(o3.open_records(&mut BytesMut::new()).is_err());
        // and in order it opens
        o.push_raw(&r2);
        assert_eq!(o.open_records(&mut out).unwrap(), 6);
        assert_eq!(&out[..], b"firstsecond");
    }

    /// A fresh session's opener cannot open another session's records.
    fn o_clone_state(keys: &[ClusterKeys]) -> Opener {
        test_pair(keys).unwrap().1
    }

    #[test]
    fn large_data_is_split_into_records() {
        let keys = ClusterKeys::generate("pair").unwrap();
        let (mut s, mut o) = test_pair(&keys).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut raw = Vec::new();
        s.seal(&data, &mut raw).unwrap();
        let mut out = BytesMut::new();
        // fed a byte range at a time, as a socket would
        for c in raw.chunks(10_000) {
            o.push_raw(c);
            o.open_records(&mut out).unwrap();
        }
        assert_eq!(&out[..], &data[..]);
    }

    #[test]
    fn handshake_refuses_strangers_and_wrong_purposes() {
        let keys = ClusterKeys::generate("pair").unwrap();
        let other = ClusterKeys::generate("pair").unwrap();
        // a stranger with its own keys (it knows node 2's public key)
        let mut stranger = ClusterKeys::from_file_text(&other[0].to_file_text()).unwrap();
        stranger.public[1] = keys[1].public[1];
        let (_, first) = initiate(&stranger, Member::Node2, Purpose::Sync).unwrap();
        assert!(respond(&keys[1], Purpose::Sync, &[Member::Node1], &first).is_err());
        // node 1's keys, but meant for the witness
        let (_, first) = initiate(&keys[0], Member::Node2, Purpose::Witness).unwrap();
        assert!(respond(&keys[1], Purpose::Sync, &[Member::Node1], &first).is_err());
        // the witness may not dial a sync listener
        let (_, first) = initiate(&keys[2], Member::Node2, Purpose::Sync).unwrap();
        assert!(matches!(
            respond(&keys[1], Purpose::Sync, &[Member::Node1], &first),
            Err(SecureError::NotAllowed(_))
        ));
        // the right dialer is let in
        let (_, first) = initiate(&keys[0], Member::Node2, Purpose::Sync).unwrap();
        let (who, _, _) = respond(&keys[1], Purpose::Sync, &[Member::Node1], &first).unwrap();
        assert_eq!(who, Member::Node1);
    }

    #[test]
    fn right_keys_without_the_secret_cannot_finish() {
        let keys = ClusterKeys::generate("pair").unwrap();
        // node 1's static key but a wrong cluster secret
        let mut thief = ClusterKeys::from_file_text(&keys[0].to_file_text()).unwrap();
        thief.psk = [7u8; 32];
        let (mut hs, first) = initiate(&thief, Member::Node2, Purpose::Sync).unwrap();
        let (_, answer, responder) =
            respond(&keys[1], Purpose::Sync, &[Member::Node1], &first).unwrap();
        let mut payload = vec![0u8; RECORD_BYTES_MAX];
        // the answer mixes in the secret: the thief cannot read it...
        assert!(hs.read_message(&answer, &mut payload).is_err());
        // ...and nothing it could send opens on the listener
        let mut o = Opener {
            ts: Arc::new(responder),
            nonce: 0,
            raw: BytesMut::new(),
            mac: None,
        };
        let mut fake = vec![0, 40];
        fake.extend_from_slice(&[0x55; 40]);
        o.push_raw(&fake);
        assert!(o.open_records(&mut BytesMut::new()).is_err());
    }

    #[test]
    fn authenticated_records_refuse_tampering_replay_and_reordering() {
        let keys = ClusterKeys::generate("pair").unwrap();
        let (mut s, mut o) = test_pair_authenticated(&keys).unwrap();
        let data: Vec<u8> = (0..600_000u32).map(|i| (i * 13) as u8).collect();
        let mut raw = Vec::new();
        s.seal(&data, &mut raw).unwrap();
        // the plaintext travels as is (that is the mode's point)...
        assert!(raw.windows(64).any(|w| w == &data[..64]));
        let mut out = BytesMut::new();
        for c in raw.chunks(7_000) {
            o.push_raw(c);
            o.open_records(&mut out).unwrap();
        }
        assert_eq!(&out[..], &data[..]);
        // ...but one flipped bit, a replay or a reordering is refused
        let mut r1 = Vec::new();
        s.seal(b"one", &mut r1).unwrap();
        let mut r2 = Vec::new();
        s.seal(b"two", &mut r2).unwrap();
        let mut bad = r1.clone();
        bad[5] ^= 1;
        o.push_raw(&bad);
        assert!(o.open_records(&mut BytesMut::new()).is_err(), "tampered");
        let (mut s, mut o) = test_pair_authenticated(&keys).unwrap();
        let mut r1 = Vec::new();
        s.seal(b"one", &mut r1).unwrap();
        let mut r2 = Vec::new();
        s.seal(b"two", &mut r2).unwrap();
        o.push_raw(&r2);
        assert!(o.open_records(&mut BytesMut::new()).is_err(), "reordered");
        let (mut s, mut o) = test_pair_authenticated(&keys).unwrap();
        let mut r1 = Vec::new();
        s.seal(b"one", &mut r1).unwrap();
        o.push_raw(&r1);
        o.push_raw(&r1);
        let mut out = BytesMut::new();
        assert!(o.open_records(&mut out).is_err(), "replayed");
        assert_eq!(&out[..], b"one");
    }

    async fn dial_and_accept(
        dialer: &ClusterKeys,
        listener: &ClusterKeys,
    ) -> (
        Result<SecureStream, SecureError>,
        Result<SecureStream, SecureError>,
    ) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let a = async {
            let (s, _) = l.accept().await.unwrap();
            accept(s, listener, Purpose::Sync, &[Member::Node1]).await
        };
        let c = async {
            let s = TcpStream::connect(addr).await.unwrap();
            connect(s, dialer, Member::Node2, Purpose::Sync).await
        };
        let (c, a) = tokio::join!(c, a);
        (c, a)
    }

    #[tokio::test]
    async fn both_modes_carry_data_and_mismatched_modes_are_refused() {
        for encrypt in [true, false] {
            let mut keys = ClusterKeys::generate("pair").unwrap();
            for k in keys.iter_mut() {
                k.set_sync_encryption(encrypt);
            }
            let (c, a) = dial_and_accept(&keys[0], &keys[1]).await;
            let (mut c, mut a) = (c.unwrap(), a.unwrap());
            // data sent at once after the setup, both ways
            c.writer.write_all(b"hello from node 1").await.unwrap();
            a.writer.write_all(b"and from node 2").await.unwrap();
            let mut b = BytesMut::new();
            while b.len() < 17 {
                a.reader.read_buf(&mut b).await.unwrap();
            }
            assert_eq!(&b[..], b"hello from node 1");
            let mut b = BytesMut::new();
            while b.len() < 15 {
                c.reader.read_buf(&mut b).await.unwrap();
            }
            assert_eq!(&b[..], b"and from node 2");
        }
        let mut keys = ClusterKeys::generate("pair").unwrap();
        keys[1].set_sync_encryption(false);
        let (c, a) = dial_and_accept(&keys[0], &keys[1]).await;
        assert!(c.is_err() && a.is_err(), "mismatched modes joined");
    }
}
