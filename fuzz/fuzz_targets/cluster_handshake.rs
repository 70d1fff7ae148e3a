//! Arbitrary bytes where the cluster links read a peer's bytes before trusting
//! it: a Noise first message on a sync or witness listener, the listener's
//! answer read by the dialer, the channel setup record, the records of an
//! authenticated channel, and a heartbeat datagram. Nothing may panic; nothing
//! forged may authenticate (the fuzzer holds no keys, so a handshake that
//! names an allowed member, a record that opens or a datagram that verifies is
//! a failure).
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use replica::secure::{
    check_setup, fuzz_initiate, respond, test_pair, test_pair_authenticated, ClusterKeys, Member,
    Purpose,
};
use replica::HeartbeatAuth;
use std::sync::OnceLock;

fn keys() -> &'static [ClusterKeys] {
    static K: OnceLock<Vec<ClusterKeys>> = OnceLock::new();
    K.get_or_init(|| ClusterKeys::generate("fuzz").expect("keys"))
}

fuzz_target!(|data: &[u8]| {
    let k = keys();
    // a first handshake message, on node 2's sync listener and on the witness
    if let Ok((who, _, _)) = respond(&k[1], Purpose::Sync, &[Member::Node1], data) {
        panic!("a forged first message passed as {who:?}");
    }
    if let Ok((who, _, _)) = respond(
        &k[2],
        Purpose::Witness,
        &[Member::Node1, Member::Node2],
        data,
    ) {
        panic!("a forged first message passed the witness as {who:?}");
    }
    // the listener's answer, as node 1 dialing node 2 reads it
    assert!(!fuzz_initiate(&k[0], data), "a forged answer completed the handshake");
    // a channel setup record (opened from the channel: checked, never trusted
    // beyond its mode)
    for mode in [1u8, 2] {
        let _ = check_setup(data, mode);
    }
    // records of an established channel, fed in two pieces as a socket would
    let (_, mut opener) = test_pair(k).expect("handshake");
    let cut = data.first().map_or(0, |&b| b as usize).min(data.len());
    let mut out = BytesMut::new();
    opener.push_raw(&data[..cut]);
    let a = opener.open_records(&mut out);
    opener.push_raw(&data[cut..]);
    let b = opener.open_records(&mut out);
    assert!(
        !matches!(a, Ok(n) if n > 0) && !matches!(b, Ok(n) if n > 0),
        "a forged record opened"
    );
    // and the same in the authenticated-only mode of the sync links
    let (_, mut opener) = test_pair_authenticated(k).expect("handshake");
    opener.push_raw(&data[..cut]);
    let a = opener.open_records(&mut out);
    opener.push_raw(&data[cut..]);
    let b = opener.open_records(&mut out);
    assert!(
        !matches!(a, Ok(n) if n > 0) && !matches!(b, Ok(n) if n > 0),
        "a forged authenticated record opened"
    );
    // a heartbeat datagram
    assert!(
        HeartbeatAuth::new(&k[0]).open(data).is_none(),
        "a forged heartbeat verified"
    );
});
