//! How fast one core seals and opens the sync link's records, encrypted
//! (ChaCha20-Poly1305 under Noise) and authenticated only (keyed BLAKE3,
//! `[cluster] encrypt = false`), against copying the same bytes: the CPU price
//! per byte replicated. `cargo run --release -p replica --example channel_speed`
use bytes::BytesMut;
use replica::secure::{test_pair, test_pair_authenticated, ClusterKeys, Opener, Sealer};
use std::time::Instant;

fn main() {
    let keys = ClusterKeys::generate("speed").expect("keys");
    let (s, o) = test_pair(&keys).expect("handshake");
    run("encrypted", s, o);
    let (s, o) = test_pair_authenticated(&keys).expect("handshake");
    run("authenticated only", s, o);
}

fn run(what: &str, mut sealer: Sealer, mut opener: Opener) {
    let data = vec![0xA5u8; 1 << 20];
    let rounds = 512; // 512 MiB
    let mut raw = Vec::with_capacity(2 << 20);
    let mut out = BytesMut::with_capacity(2 << 20);
    let t = Instant::now();
    for _ in 0..rounds {
        raw.clear();
        sealer.seal(&data, &mut raw).expect("seal");
        opener.push_raw(&raw);
        out.clear();
        opener.open_records(&mut out).expect("open");
    }
    let secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut copy = vec![0u8; 1 << 20];
    for i in 0..rounds {
        copy.copy_from_slice(&data);
        copy[i % 1024] ^= 1;
    }
    let copy_secs = t.elapsed().as_secs_f64().max(1e-9);
    let mib = rounds as f64;
    println!(
        "{what:>18}: seal+open {:.0} MiB/s on one core ({:.2} ns/byte); memcpy {:.0} MiB/s",
        mib / secs,
        secs * 1e9 / (mib * 1048576.0),
        mib / copy_secs
    );
}
