//! Arbitrary bytes as the target's side of a connection, fed to the initiator's
//! receive path: login responses through the login state machine, then full
//! feature PDUs through the frame decoder and the session core (Data-In
//! assembly, R2T, NOP-In, Reject, Async, Logout) with commands in flight.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    initiator::fuzzing::feed_target_bytes(data);
});
