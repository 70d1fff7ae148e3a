//! The life of a replicated volume's connection to its partner: connecting
//! (node 1 dials, node 2 waits), the handshake and its plan, the session with its
//! resync, and the decision taken when the partner is lost; plus the cleaner of
//! the write-intent bitmap and the keeper of the witness's grant. The I/O paths
//! are in `volume.rs`.

use crate::link::{Framed, Link, LinkLost};
use crate::meta::Meta;
use crate::plan::{plan, Plan};
use crate::volume::{Inner, PartnerSeen, Role, RoleState};
use block::{Bytes, LockMode};
use replica_proto::{hello_flags, Message, OpResult};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Bitmap chunk sent per message in the handshake.
const BITMAP_CHUNK_BYTES: usize = 256 << 10;
/// Largest resync copy in one message.
const RESYNC_COPY_BYTES_MAX: u64 = 1 << 20;
/// Resync copies in flight at once.
const RESYNC_IN_FLIGHT_MAX: usize = 4;
/// Passes copying again the regions that writes failing on one side pinned
/// during a resync, before the resync gives up (and is tried again).
const RESYNC_PINNED_PASSES_MAX: usize = 4;
/// Pause between connection attempts.
const RECONNECT_PAUSE: Duration = Duration::from_millis(300);
/// Longest pause between attempts to resync a copy whose disk keeps failing.
const FAILING_RETRY_MAX: Duration = Duration::from_secs(10);
/// Cleaning period of the write-intent bitmap.
const CLEAN_PERIOD: Duration = Duration::from_secs(1);
/// Longest wait for a client's flush of both copies before the cleaner has
/// them flushed itself.
const CLEAN_FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Clears idle regions of the write-intent bitmap while in sync, once both
/// copies have been flushed since their last write ended. A region's bit is
/// all that says the copies may differ there: cleared while a write still sat
/// in either node's volatile cache, a power loss of both nodes could leave the
/// copies different where no bitmap says so, and the next meeting would copy
/// nothing there. A client's flush of both copies (any flush: the leader has
/// a forwarded one made on both) covers the regions idle before it began;
/// without one within [`CLEAN_FLUSH_WAIT`] the cleaner asks for one itself.
pub(crate) async fn cleaner(inner: std::sync::Weak<Inner>) {
    // regions idle at the last pass, with the flush mark and meeting then
    let mut waiting: Option<(Vec<u64>, u64, u64, Instant)> = None;
    loop {
        tokio::time::sleep(CLEAN_PERIOD).await;
        let Some(i) = inner.upgrade() else { return };
        let meeting = i.meetings.load(Ordering::Acquire);
        let Some((candidates, mark, met, since)) = waiting.take() else {
            // (the candidates' writes have all ended: a flush begun after
            // this covers them)
            let candidates = i.bitmap.idle_candidates();
            if !candidates.is_empty() {
                waiting = Some((candidates, i.flush_mark(), meeting, Instant::now()));
            }
            continue;
        };
        let st = i.role();
        if met != meeting || !matches!(st.role, Role::Leader | Role::Follower) || st.peer_resyncing
        {
            // the copies left sync or met again since (bits are kept while
            // out of sync): start over
            continue;
        }
        if !i.flushed(mark) {
            if since.elapsed() < CLEAN_FLUSH_WAIT {
                waiting = Some((candidates, mark, met, since));
                continue;
            }
            if let Err(e) = i.flush_both().await {
                tracing::warn!(volume = %i.cfg.name, "flushing both copies to clear the write intent: {e}");
                waiting = Some((candidates, mark, met, since));
                continue;
            }
            if !i.flushed(mark) || i.meetings.load(Ordering::Acquire) != met {
                continue;
            }
        }
        if i.bitmap.clear_if_still_idle(&candidates) > 0 {
            if let Err(e) = i.bitmap.persist().await {
                tracing::warn!(volume = %i.cfg.name, "persisting the bitmap: {e}");
            }
        }
    }
}

/// Authenticates the partner on a dialed sync connection (and it this node).
async fn dial_secure(
    inner: &Arc<Inner>,
    s: TcpStream,
) -> Result<crate::secure::SecureStream, crate::secure::SecureError> {
    let partner = crate::secure::Member::node(3u8.saturating_sub(inner.cfg.node_id))
        .ok_or(crate::secure::SecureError::Frame("node id"))?;
    crate::secure::connect(s, &inner.cfg.keys, partner, crate::secure::Purpose::Sync).await
}

/// Connects, handshakes, resyncs and decides, for the life of the volume.
pub(crate) async fn manager(inner: Arc<Inner>, conns: mpsc::Receiver<(Framed, Message)>) {
    let mut stop = inner.stop_tx.subscribe();
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => {}
        _ = manage(&inner, conns) => {}
    }
}

async fn manage(inner: &Arc<Inner>, mut conns: mpsc::Receiver<(Framed, Message)>) {
    let timeout = Duration::from_millis(inner.cfg.peer_timeout_ms);
    let mut peer_seen = Instant::now();
    // when a handshake last failed, perhaps after the partner finished its side
    let mut half_met: Option<Instant> = None;
    let mut next_peer = 0usize;
    let mut last_decide: Option<Instant> = None;
    let mut conns_open = true;
    // the partner answered but the copies cannot be joined (split brain...):
    // never go on alone automatically then, an operator must choose
    let mut unjoinable = false;
    // sessions in a row in which this node's copy failed again (back off)
    let mut failing = 0u32;
    let mut operator_changes = inner.operator_changes.load(Ordering::Acquire);
    loop {
        if *inner.stop_tx.borrow() {
            return;
        }
        let changes = inner.operator_changes.load(Ordering::Acquire);
        if changes != operator_changes {
            // the operator kept this copy: what was refused before is
            // judged afresh
            operator_changes = changes;
            unjoinable = false;
            last_decide = None;
        }
        let dial = inner.cfg.node_id == 1 && !inner.cfg.peer_sync.is_empty();
        let conn: Option<(Framed, Option<Message>)> = tokio::select! {
            c = conns.recv(), if conns_open => match c {
                Some((f, hello)) => Some((f, Some(hello))),
                None => {
                    // nobody hands this volume connections (it only dials)
                    conns_open = false;
                    None
                }
            },
            c = async {
                // the next link in turn, or the first after it that answers heartbeats
                let n = inner.cfg.peer_sync.len();
                let monitor = inner.monitor.read().clone();
                let pick = monitor
                    .and_then(|m| (0..n).map(|k| (next_peer + k) % n).find(|&i| m.is_up(i)))
                    .unwrap_or(next_peer % n);
                let addr = inner.cfg.peer_sync[pick];
                match tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await {
                    Ok(Ok(s)) => match dial_secure(inner, s).await {
                        Ok(s) => Some(Framed::new(s)),
                        Err(e) => {
                            tracing::warn!(volume = %inner.cfg.name, %addr, "sync link handshake failed: {e}");
                            tokio::time::sleep(RECONNECT_PAUSE).await;
                            None
                        }
                    },
                    _ => {
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                        None
                    }
                }
            }, if dial => {
                if c.is_none() { next_peer += 1; }
                c.map(|f| (f, None))
            },
            _ = tokio::time::sleep(RECONNECT_PAUSE), if !dial => None,
        };
        if let Some((f, hello)) = conn {
            // the operator's changes of the copy wait for the meeting's end
            let meeting = inner.meeting.lock().await;
            match handshake(inner, f, hello).await {
                Ok((f, p, peer_meta, peer_bits, hello_sent)) => {
                    unjoinable = false;
                    // joined: what the partner's copy was is no longer known
                    // once this session ends (`keep_copy` needs a refusal)
                    *inner.partner_seen.lock() = PartnerSeen::NotMet;
                    // copies under way here fail from now on (see write_copy)
                    inner.meetings.fetch_add(1, Ordering::AcqRel);
                    let detaches = inner.detaches.load(Ordering::Acquire);
                    let (link, writing) =
                        session(inner, f, p, peer_meta, peer_bits, hello_sent).await;
                    partner_writes_done(inner, &writing, &mut conns, &mut conns_open).await;
                    peer_seen = link.last_ping_recv();
                    // the link in use failed: dial the next sync link first
                    next_peer += 1;
                    if !matches!(inner.role().role, Role::Solo | Role::Down) {
                        inner.set_role(
                            Role::Deciding,
                            None,
                            false,
                            format!("lost the partner ({})", link.peer),
                        );
                    }
                    // and this node's own ordered writes of the session (its
                    // clients', the partner's forwarded ones, read repairs),
                    // whose partner part is over with the link, but whose
                    // local write may still wait at a slow disk: a later
                    // meeting that makes this copy a resync target writes
                    // it outside the range locks, and such a write landing
                    // after the resync's copy of its region would put back
                    // data the survivor wrote over meanwhile (review of
                    // 2026-12-06)
                    waiting_alone(
                        inner,
                        inner.locks.lock(0, u64::MAX, LockMode::Exclusive),
                        "this node's writes in flight",
                        &mut conns,
                        &mut conns_open,
                    )
                    .await;
                    let failed_again = inner.detaches.load(Ordering::Acquire) != detaches;
                    last_decide = None;
                    if let Some(why) = link.partner_refused() {
                        // refused after this side's handshake: only the
                        // partner's plan said no, which an honest partner's
                        // does only to an unfinished copy (serving nothing
                        // alone): show why, as a refusal found here is shown.
                        // A consistent copy takes it as a lost link and decides
                        // for itself: no partner keeps it down by saying so
                        if let Some(why) = partner_refusal(inner, &why) {
                            if inner.role().role != Role::Solo {
                                inner.set_role(Role::Down, None, false, why);
                            }
                            unjoinable = true;
                        }
                    }
                    if let Some(why) = link.partner_detached() {
                        // the partner's copy failed and it stopped serving: no
                        // tie to break, no lease to wait out
                        tracing::warn!(volume = %inner.cfg.name, %why, "the partner detached its copy");
                        decide(inner, peer_seen, true).await;
                        last_decide = Some(Instant::now());
                    }
                    drop(meeting);
                    if failed_again {
                        // the disk failed again: retry less and less often, up to
                        // every FAILING_RETRY_MAX, until it works (or is replaced)
                        failing = (failing + 1).min(8);
                        let pause = (RECONNECT_PAUSE * (1 << failing)).min(FAILING_RETRY_MAX);
                        tracing::warn!(volume = %inner.cfg.name, ?pause, "this copy failed again; retrying later");
                        tokio::time::sleep(pause).await;
                    } else {
                        failing = 0;
                    }
                    continue;
                }
                Err(HandshakeError::Failed(e)) => {
                    drop(meeting);
                    tracing::warn!(volume = %inner.cfg.name, "handshake with the partner failed: {e}");
                    // The partner may have read this node's hello and finished
                    // its side: its link, and its lease on serving, start from
                    // its own hello, sent at most now. Deciding from the last
                    // ping of an older meeting, this node went on alone while
                    // the partner still served as resync source (review of
                    // 2026-12-06). (Not `peer_seen`: the decision stays due on
                    // time, a partner failing every handshake cannot put it off
                    // for ever; it waits that lease out.)
                    half_met = Some(Instant::now());
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    // a partner that accepts connections but cannot complete a
                    // handshake is no partner: the decision below still applies
                }
                Err(HandshakeError::Unjoinable(e)) => {
                    tracing::warn!(volume = %inner.cfg.name, "handshake with the partner failed: {e}");
                    unjoinable = true;
                    if inner.role().role != Role::Solo {
                        inner.set_role(Role::Down, None, false, e);
                    }
                    drop(meeting);
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
            }
        }
        let role = inner.role().role;
        let due = match last_decide {
            None => {
                peer_seen.elapsed() >= timeout
                    || role == Role::Deciding && peer_seen.elapsed() >= timeout
            }
            Some(t) => t.elapsed() >= Duration::from_secs(2),
        };
        if matches!(role, Role::Deciding | Role::Down) && due && !unjoinable {
            let _deciding = inner.meeting.lock().await;
            decide(inner, peer_seen.max(half_met.unwrap_or(peer_seen)), false).await;
            last_decide = Some(Instant::now());
        }
    }
}

/// After losing the partner: goes on alone if the witness (or, without one, the
/// preference) says so, once the partner's lease has run out; otherwise stops.
/// A partner that `detached` its failed copy has stopped serving and can never
/// be a resync source: this node goes on alone at once (it still claims the
/// witness's grant, so the witness knows who holds the data).
async fn decide(inner: &Arc<Inner>, peer_last_ping: Instant, detached: bool) {
    let meta = *inner.meta.lock();
    if !meta.consistent {
        inner.set_role(
            Role::Down,
            None,
            false,
            "this copy is an unfinished resync target; waiting for the partner".into(),
        );
        return;
    }
    let me = inner.cfg.node_id;
    let granted = match inner.cfg.witness {
        Some(addr) => {
            match inner
                .ask_witness(addr, true, || true)
                .await
                .expect("asked unconditionally")
            {
                Ok(holder) => {
                    if holder == me {
                        Ok(())
                    } else {
                        Err(format!(
                            "the witness gave the survivor grant to node {holder}"
                        ))
                    }
                }
                Err(e) => Err(format!("partner and witness ({addr}) unreachable: {e}")),
            }
        }
        None if inner.cfg.preferred_node == me => Ok(()),
        None => Err("partner unreachable and this is not the preferred node (no witness)".into()),
    };
    match granted {
        Err(why) if !detached => {
            // what the partner's unfinished copies overwrote is kept: at the
            // next meeting this node undoes them as the resync source (or
            // drops it, if the partner wrote alone since)
            inner.set_role(
                Role::Down,
                None,
                false,
                why + &partner_seen_elsewhere(inner),
            );
            return;
        }
        Err(why) => {
            tracing::warn!(volume = %inner.cfg.name, %why, "going on alone anyway: the partner's copy failed");
        }
        Ok(()) => {}
    }
    if !detached {
        // the partner's lease on serving ends at most one timeout after its last ping
        // (its own peer timeout, when longer than this node's)
        let lease_end = peer_last_ping + Duration::from_millis(inner.partner_timeout_ms());
        tokio::time::sleep_until(lease_end.into()).await;
    }
    if !meta.solo() {
        let m = Meta {
            current: Meta::new_generation(meta.current),
            ..meta
        };
        let stored = {
            let _one = inner.meta_write.lock().await;
            if *inner.meta.lock() != meta {
                // changed while the lease ran out (a copy failing under a
                // write is marked so): judged again at the next decision
                return;
            }
            inner.store_meta(m)
        };
        if let Err(e) = stored {
            inner.set_role(
                Role::Down,
                None,
                false,
                format!("cannot persist the new generation: {e}"),
            );
            return;
        }
    }
    // the partner's copies cut short by its loss are undone before this node
    // serves: each range as it was before its copy (a lone write, tracked for
    // the partner's resync)
    match inner.undo.put_back(&inner.local, &inner.bitmap).await {
        Ok(0) => {}
        Ok(blocks) => {
            tracing::warn!(volume = %inner.cfg.name, blocks, "undid the lost partner's unfinished copies")
        }
        Err(e) => {
            tracing::error!(volume = %inner.cfg.name, "could not undo the lost partner's unfinished copies: {e}; their ranges stay as the copies left them")
        }
    }
    // serving alone only a copy still consistent: a write in flight from
    // before (or the undo above) may have failed it meanwhile, and `detach`
    // marks it and stands down under the same lock
    let _one = inner.meta_write.lock().await;
    if !inner.meta.lock().consistent {
        tracing::warn!(volume = %inner.cfg.name, "this copy failed while deciding: not serving alone");
        return;
    }
    inner.set_role(
        Role::Solo,
        None,
        false,
        if detached {
            "the partner's copy failed: serving alone, tracking changes".into()
        } else {
            "partner lost: serving alone, tracking changes".into()
        },
    );
}

/// What the heartbeats over the client-facing networks say about the partner,
/// for the reason a node gives when it stops: alive there means the sync links
/// failed, not the partner.
fn partner_seen_elsewhere(inner: &Inner) -> String {
    let Some(m) = inner.client_monitor.read().clone() else {
        return String::new();
    };
    let links = m.links();
    if links.is_empty() {
        return String::new();
    }
    match links.iter().find(|l| l.up) {
        Some(l) => format!(
            "; the partner still answers on the client network ({}): the sync links failed, not the partner",
            l.peer
        ),
        None => "; the partner is silent on the client networks too".into(),
    }
}

type Handshake = (Framed, Plan, Meta, Vec<u8>, Instant);

/// Why a handshake did not end in a session.
#[derive(Debug)]
enum HandshakeError {
    /// The copies cannot be joined without an operator (split brain, copies
    /// that diverged, an unfinished copy the consistent side has no record of,
    /// the nodes disagreeing on `preferred_node`, or the partner's refusal of
    /// this unfinished copy): the node stops deciding by itself.
    Unjoinable(String),
    /// Anything else (the link, a partner not ready, copies of different
    /// sizes being matched): tried again.
    Failed(String),
}

impl From<String> for HandshakeError {
    fn from(e: String) -> Self {
        HandshakeError::Failed(e)
    }
}

impl From<&str> for HandshakeError {
    fn from(e: &str) -> Self {
        HandshakeError::Failed(e.to_string())
    }
}

async fn handshake(
    inner: &Arc<Inner>,
    mut f: Framed,
    hello: Option<Message>,
) -> Result<Handshake, HandshakeError> {
    let io = |e: std::io::Error| e.to_string();
    let cfg = &inner.cfg;
    let mut flags = 0;
    if cfg.preferred_node == cfg.node_id {
        flags |= hello_flags::PREFERRED;
    }
    // the partner's copies cut short when this node lost it (and did not go on
    // alone): undone here before anything else, while this node serves nothing;
    // the partner is then told, so that this copy is the source
    if inner.undo.open_copies() > 0 {
        match inner.undo.put_back(&inner.local, &inner.bitmap).await {
            Ok(blocks) => {
                tracing::warn!(volume = %cfg.name, blocks, "undid the partner's copies cut short by its loss")
            }
            // let go all the same: retried, it would fail at every meeting
            Err(e) => {
                tracing::error!(volume = %cfg.name, "could not undo the partner's unfinished copies: {e}; this copy is no longer consistent, the partner's is the source");
                // a range put back in part is neither the copy done nor not
                // done: not consistent, so the partner (which ran the copies
                // and holds their ranges as they wrote them) is the source,
                // and never kept by the operator (`keep_copy`)
                let marked = inner.update_meta(Meta::mark_partial).await;
                if let Err(e) = marked {
                    // judged consistent, it would be the source of a torn copy
                    return Err(
                        format!("cannot mark this copy partial after a failed undo: {e}").into(),
                    );
                }
            }
        }
    }
    // the copies of the meetings before are over (ended, lost or undone)
    inner.undo.clear();
    let undo = inner.undo.undone();
    if undo {
        flags |= hello_flags::UNDO;
    }
    flags |= hello_flags::REPAIR;
    flags |= settings_flags(cfg);
    // read after the undo: one that failed marked the copy partial, and such
    // a copy is no source (before, this meeting still judged it as it was,
    // and a copy half put back resynchronised the partner)
    let meta = *inner.meta.lock();
    if meta.consistent {
        flags |= hello_flags::CONSISTENT;
    }
    // the partner starts its link (and counts this node's first lease from
    // there) only after it read this hello: this node counts it from here
    let hello_sent = Instant::now();
    f.send(&Message::Hello {
        node_id: cfg.node_id,
        volume: cfg.name.clone(),
        block_size_bytes: inner.geo().block_size_bytes,
        block_count: inner.geo().block_count,
        region_bytes: cfg.region_bytes,
        gens: meta.gens(),
        flags,
    })
    .await
    .map_err(io)?;
    let bits = inner.bitmap.snapshot();
    for (i, chunk) in bits.chunks(BITMAP_CHUNK_BYTES).enumerate() {
        f.send(&Message::Bitmap {
            first_region: (i * BITMAP_CHUNK_BYTES * 8) as u64,
            bits: Bytes::copy_from_slice(chunk),
        })
        .await
        .map_err(io)?;
    }
    f.send(&Message::BitmapDone).await.map_err(io)?;
    let hello = match hello {
        Some(h) => h,
        None => tokio::time::timeout(Duration::from_secs(5), f.recv())
            .await
            .map_err(|_| "no hello from the partner".to_string())?
            .map_err(io)?,
    };
    if let Message::Refused { reason } = &hello {
        return Err(refused_handshake(inner, reason));
    }
    let Message::Hello {
        node_id,
        volume,
        block_size_bytes,
        block_count,
        region_bytes,
        gens,
        flags,
    } = hello
    else {
        return Err("the partner did not start with a hello".into());
    };
    if volume != cfg.name
        || node_id == cfg.node_id
        || !(1..=2).contains(&node_id)
        || node_id != f.stream.peer.node_id()
    {
        return Err(format!("unexpected partner: node {node_id}, volume {volume:?}").into());
    }
    let here = inner.geo().block_count;
    if block_size_bytes == inner.geo().block_size_bytes
        && region_bytes == cfg.region_bytes
        && block_count != here
    {
        // one copy grew while the other was away (or a grow was cut short): the
        // smaller grows to match (its new blocks read as zeroes, as the larger's
        // did before anything was written there; what was written there since is
        // in the larger's bitmap and is resynchronised), then both reconnect
        if block_count < here {
            return Err(format!(
                "the partner's copy has {block_count} blocks, this one {here}: it grows to match, then reconnects"
            ).into());
        }
        inner.grow_local(block_count).await.map_err(|e| {
            format!("cannot grow this copy to the partner's {block_count} blocks: {e}")
        })?;
        inner.expose(block_count);
        return Err(format!(
            "grew this copy from {here} to the partner's {block_count} blocks; reconnecting"
        )
        .into());
    }
    if block_size_bytes != inner.geo().block_size_bytes
        || block_count != inner.geo().block_count
        || region_bytes != cfg.region_bytes
    {
        return Err(format!(
            "the copies differ in shape: {block_count} blocks of {block_size_bytes} bytes, region {region_bytes} (here {} of {}, region {})",
            inner.geo().block_count, inner.geo().block_size_bytes, cfg.region_bytes
        ).into());
    }
    let mut peer_bits = vec![0u8; bits.len()];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), f.recv()).await {
            Ok(Ok(Message::Bitmap { first_region, bits })) => {
                let at = (first_region / 8) as usize;
                if first_region % 8 != 0 || at + bits.len() > peer_bits.len() {
                    return Err("partner's bitmap does not fit the volume".into());
                }
                peer_bits[at..at + bits.len()].copy_from_slice(&bits);
            }
            Ok(Ok(Message::BitmapDone)) => break,
            Ok(Ok(Message::Refused { reason })) => return Err(refused_handshake(inner, &reason)),
            Ok(Ok(_)) => return Err("unexpected message during the handshake".into()),
            Ok(Err(e)) => return Err(e.to_string().into()),
            Err(_) => return Err("the partner's bitmap did not arrive".into()),
        }
    }
    let peer_meta = Meta {
        current: gens.current,
        synced: gens.synced,
        consistent: flags & hello_flags::CONSISTENT != 0,
        // not on the wire: only the consistent side uses its own (plan::resume)
        target_from: 0,
        partial: false,
    };
    // what the partner's copy was at this meeting (for `keep_copy`)
    *inner.partner_seen.lock() = if peer_meta.consistent {
        PartnerSeen::Consistent
    } else {
        PartnerSeen::NotConsistent
    };
    let p = match plan(
        cfg.node_id,
        meta,
        node_id,
        peer_meta,
        cfg.preferred_node,
        (undo, flags & hello_flags::UNDO != 0),
    ) {
        Ok(p) => p,
        Err(e) => return Err(HandshakeError::Unjoinable(refuse(&mut f, e).await)),
    };
    // plan() is the same function on both nodes only if they agree on which
    // node is preferred (and so is the choice of who serves alone when they
    // lose each other): each says whether it is, in its hello. Checked after
    // plan(), whose refusals (split brain) say more
    inner
        .partner_repairs
        .store(flags & hello_flags::REPAIR != 0, Ordering::SeqCst);
    match partner_settings(cfg, flags) {
        Ok(t) => inner.note_partner_timeout(t),
        Err(e) => return Err(HandshakeError::Unjoinable(refuse(&mut f, e).await)),
    }
    let peer_preferred = flags & hello_flags::PREFERRED != 0;
    if peer_preferred != (cfg.preferred_node == node_id) {
        let e = format!(
            "the nodes disagree on preferred_node: this node's configuration names node {}, \
             node {node_id} says it is {}preferred",
            cfg.preferred_node,
            if peer_preferred { "" } else { "not " }
        );
        return Err(HandshakeError::Unjoinable(refuse(&mut f, e).await));
    }
    Ok((f, p, peer_meta, peer_bits, hello_sent))
}

/// The hello flags that say which shared settings this node runs with
/// ([`hello_flags::SETTINGS`]).
fn settings_flags(cfg: &crate::volume::ReplicaConfig) -> u32 {
    let mut flags = hello_flags::SETTINGS;
    if cfg.witness.is_some() {
        flags |= hello_flags::WITNESS;
    }
    if cfg.mode == crate::volume::Mode::ActivePassive {
        flags |= hello_flags::ACTIVE_PASSIVE;
    }
    // the peer timeout in units rounded up (the partner waits at least it)
    let units = cfg
        .peer_timeout_ms
        .div_ceil(hello_flags::TIMEOUT_UNIT_MS)
        .min(u64::from(u16::MAX)) as u32;
    flags | units << hello_flags::TIMEOUT_SHIFT
}

/// What a partner's hello `flags` say of the shared settings: Ok(its peer
/// timeout in ms, when it says) if this node can join it, Err(why) if not.
/// Each node decides alone from these when the links fail, so with one
/// preferred and without a witness and the other asking a witness, both
/// went on alone; one active-passive and the other active-active answer
/// ALUA differently (review of 2026-12-06: joined all the same). The
/// witness's address may differ (each node may reach it by another). A
/// partner's longer peer timeout is no refusal: a survivor waits out the
/// longer of the two ([`Inner::partner_timeout_ms`]).
fn partner_settings(cfg: &crate::volume::ReplicaConfig, flags: u32) -> Result<Option<u64>, String> {
    if flags & hello_flags::SETTINGS == 0 {
        return Ok(None);
    }
    let mine = settings_flags(cfg);
    let what = if (flags ^ mine) & hello_flags::WITNESS != 0 {
        "one node asks a witness when it loses the other, the other does not"
    } else if (flags ^ mine) & hello_flags::ACTIVE_PASSIVE != 0 {
        "one node is active-passive, the other active-active"
    } else {
        let units = u64::from(flags >> hello_flags::TIMEOUT_SHIFT);
        return Ok(Some(units * hello_flags::TIMEOUT_UNIT_MS));
    };
    Err(format!(
        "the nodes' HA settings differ: {what} ([cluster] witness, and the LUN's \
         replica_mode, must be the same on both nodes; here: witness {}, {:?})",
        cfg.witness.map_or("none".to_string(), |w| w.to_string()),
        cfg.mode,
    ))
}

/// Tells the partner why this node will not join the copies (best effort:
/// the link closes next whatever happens), and returns the reason. Only the
/// refusing side may know it: a copy with no record of an unfinished resync
/// is refused by the consistent side alone (`plan::resume`), and the other
/// side would otherwise show only that it waits for the partner.
async fn refuse(f: &mut Framed, reason: String) -> String {
    // then the write side is shut and what the partner sent meanwhile is read
    // until it closes: closing over unread bytes would reset the connection,
    // and the partner could lose the refusal with it (1 s in all)
    let told = tokio::time::timeout(Duration::from_secs(1), async {
        f.send(&Message::Refused {
            reason: reason.clone(),
        })
        .await?;
        f.stream.writer.shutdown().await?;
        let mut sink = bytes::BytesMut::with_capacity(64 << 10);
        while f.stream.reader.read_buf(&mut sink).await? > 0 {
            sink.clear();
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
    if !matches!(told, Ok(Ok(()))) {
        tracing::debug!("could not tell the partner why it was refused, or it did not close");
    }
    reason
}

/// What a refusal from the partner means here: for an unfinished copy, the
/// status reason (the copies are then unjoinable: the session loop stops
/// deciding); for a consistent one None, after a line in the log: it decides
/// for itself (a partner, buggy, newer or hostile, must not keep a copy that
/// can serve down by saying no). The reason comes through [`crate::link::shown`].
fn partner_refusal(inner: &Inner, reason: &str) -> Option<String> {
    if inner.meta.lock().consistent {
        tracing::warn!(volume = %inner.cfg.name, partner_says = %reason,
            "the partner will not join the copies; this copy is consistent and decides for itself");
        return None;
    }
    let why = format!("the partner refused to join the copies: {reason}");
    tracing::error!(volume = %inner.cfg.name, "{why}");
    Some(why)
}

/// The handshake's error for a refusal from the partner: for an unfinished
/// copy the copies are unjoinable, with the status reason; a consistent one
/// tries again (and decides for itself meanwhile).
fn refused_handshake(inner: &Inner, reason: &str) -> HandshakeError {
    match partner_refusal(inner, &crate::link::shown(reason)) {
        Some(why) => HandshakeError::Unjoinable(why),
        None => HandshakeError::Failed(
            "the partner closed the link saying no; this copy can serve, so it decides for itself (see the log)".into(),
        ),
    }
}

/// Runs a connected session until the link is lost; returns the dead link and
/// the permits of the partner's writes being applied (see [`partner_writes_done`]).
async fn session(
    inner: &Arc<Inner>,
    f: Framed,
    p: Plan,
    peer_meta: Meta,
    peer_bits: Vec<u8>,
    hello_sent: Instant,
) -> (Arc<Link>, Arc<tokio::sync::Semaphore>) {
    // a target records that it is being resynchronised (and what remains to
    // copy) before it handles a single message of the partner
    let target_ready = match p {
        Plan::Target => inner.bitmap.merge(0, &peer_bits).await,
        Plan::Source { .. } => Ok(()),
    };
    let (tx, mut rx) = mpsc::channel::<Message>(256);
    let link = Link::start(
        f,
        tx,
        Duration::from_millis(inner.cfg.heartbeat_interval_ms),
        Duration::from_millis(inner.cfg.peer_timeout_ms),
        hello_sent,
    );
    tracing::info!(volume = %inner.cfg.name, peer = %link.peer, ?p, "partner connected");
    // the link dies with the session, even when the session is cancelled
    struct CloseOnDrop(Arc<Link>);
    impl Drop for CloseOnDrop {
        fn drop(&mut self) {
            self.0.close("session ended");
        }
    }
    let _close = CloseOnDrop(link.clone());
    match (&p, target_ready) {
        (Plan::Target, Ok(())) => inner.set_role(
            Role::Target,
            Some(link.clone()),
            false,
            "being resynchronised by the partner".into(),
        ),
        (Plan::Target, Err(e)) => link.close(&format!("cannot persist resync state: {e}")),
        (Plan::Source { .. }, _) => inner.set_role(
            Role::Leader,
            Some(link.clone()),
            true,
            "resynchronising the partner".into(),
        ),
    }
    // the partner's requests that write this copy outside the range locks
    // (a leader's writes applied here, resync data and its end): see
    // partner_writes_done
    let writing = Arc::new(tokio::sync::Semaphore::new(
        crate::link::HANDLED_IN_FLIGHT_MAX,
    ));
    // the partner's messages are handled only once the role is set
    let dispatch = {
        let inner = inner.clone();
        let link = link.clone();
        let writing = writing.clone();
        tokio::spawn(async move {
            // the partner's requests handled at once are bounded: an honest
            // partner keeps below the bound (crate::link::REQUESTS_IN_FLIGHT_MAX)
            let handled = Arc::new(tokio::sync::Semaphore::new(
                crate::link::HANDLED_IN_FLIGHT_MAX,
            ));
            while let Some(m) = rx.recv().await {
                let Ok(permit) = handled.clone().try_acquire_owned() else {
                    link.close("the partner exceeded the bound on requests in flight");
                    return;
                };
                let writes = if matches!(
                    m,
                    Message::Apply { .. }
                        | Message::ApplyForwarded { .. }
                        | Message::ResyncData { .. }
                        | Message::ResyncDone { .. }
                        | Message::RepairData { .. }
                ) {
                    // (no more are in flight than `handled` allows: short only
                    // once the session's end waits for them all, and then
                    // nothing more is applied)
                    match writing.clone().try_acquire_owned() {
                        Ok(p) => Some(p),
                        Err(_) => {
                            link.close("a partner write after the session ended");
                            return;
                        }
                    }
                } else {
                    None
                };
                // counted against the node's buffer budget while applied, never
                // waiting for it (see ReplicaConfig::buffers)
                let held = inner
                    .cfg
                    .buffers
                    .charge(payload_bytes(&m, inner.geo().block_size_bytes as u64));
                let (inner, link) = (inner.clone(), link.clone());
                tokio::spawn(async move {
                    inner.handle(link, m).await;
                    drop((permit, held, writes));
                });
            }
        })
    };
    if let Plan::Source { full } = p {
        if let Err(e) = resync(inner, &link, full, peer_meta, &peer_bits).await {
            link.close(&format!("resync failed: {e}"));
        }
    }
    link.closed().await;
    dispatch.abort();
    // stopped: it hands out no message after this
    let _ = dispatch.await;
    (link, writing)
}

/// Waits until the partner's writes still being applied here (those of the
/// session that just ended: `writing`'s permits) have finished, before the
/// caller decides what this node does next: they take no range lock (the
/// partner ordered them), so one landing after the node went on alone (or
/// after a new session's resync copied its region) would overwrite newer
/// data. The end of a resync counts as one: taken after the decision, it made
/// this node a follower of the dead link, serving as if in sync and never
/// deciding again until the partner returned. None is cut short midway; a disk that stalls holds the decision (the
/// node could not serve from it either). Connections the partner makes
/// meanwhile are closed at once, so that it decides without this node instead
/// of waiting on a handshake. Other requests (a write the partner forwarded to
/// this leader, SCSI state) go through this node's own ordering and may wait
/// for its decision: they are not waited for here. The caller waits for the
/// writes this node ordered once it is deciding (the range locks: none of
/// them waits for the decision while it holds its range).
async fn partner_writes_done(
    inner: &Arc<Inner>,
    writing: &tokio::sync::Semaphore,
    conns: &mut mpsc::Receiver<(Framed, Message)>,
    conns_open: &mut bool,
) {
    let all = writing.acquire_many(crate::link::HANDLED_IN_FLIGHT_MAX as u32);
    waiting_alone(
        inner,
        all,
        "the partner's writes in flight",
        conns,
        conns_open,
    )
    .await;
}

/// Waits for `done`, closing at once the connections the partner makes
/// meanwhile (so that it decides without this node instead of waiting on a
/// handshake, and no handshake is answered late on a socket its partner gave
/// up), and saying every 5 s that it still waits for `what`.
async fn waiting_alone<T>(
    inner: &Arc<Inner>,
    done: impl std::future::Future<Output = T>,
    what: &str,
    conns: &mut mpsc::Receiver<(Framed, Message)>,
    conns_open: &mut bool,
) {
    tokio::pin!(done);
    loop {
        tokio::select! {
            _ = &mut done => return,
            c = conns.recv(), if *conns_open => match c {
                Some((f, _)) => {
                    tracing::info!(volume = %inner.cfg.name, "partner connection closed: the last session's writes are still being applied");
                    drop(f);
                }
                None => *conns_open = false,
            },
            _ = tokio::time::sleep(Duration::from_secs(5)) => tracing::warn!(
                volume = %inner.cfg.name,
                "waiting for {what} to end before going on"
            ),
        }
    }
}

/// Data bytes a message from the partner carries.
fn payload_bytes(m: &Message, bs: u64) -> u64 {
    use replica_proto::Op;
    let op_bytes = |op: &Op| match op {
        Op::Write { data, .. } | Op::CopyWrite { data, .. } => data.len() as u64,
        Op::CompareAndWrite { compare, data, .. } => (compare.len() + data.len()) as u64,
        _ => 0,
    };
    match m {
        Message::Apply { op, .. } | Message::Forward { op, .. } => op_bytes(op),
        Message::ResyncData { data, .. }
        | Message::ScsiRequest { data, .. }
        | Message::RepairData { data, .. } => data.len() as u64,
        // what handling them reads (refused past REPAIR_BYTES_MAX)
        Message::Repair { blocks, .. } | Message::ReadCopy { blocks, .. } => blocks
            .saturating_mul(bs)
            .min(replica_proto::REPAIR_BYTES_MAX),
        _ => 0,
    }
}

async fn resync(
    inner: &Arc<Inner>,
    link: &Arc<Link>,
    full: bool,
    peer_meta: Meta,
    peer_bits: &[u8],
) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    // writes started alone must finish before the set of regions to copy is taken
    inner.solo_writes.zero().await;
    if full {
        inner.bitmap.set_all().await.map_err(io)?;
    } else {
        inner.bitmap.merge(0, peer_bits).await.map_err(io)?;
    }
    let regions = inner.bitmap.set_regions();
    let nothing_to_copy = regions.is_empty();
    let rb = inner.bitmap.region_blocks();
    let bs = inner.geo().block_size_bytes as u64;
    inner
        .resync_total
        .store(regions.len() as u64, Ordering::Relaxed);
    inner.resync_done.store(0, Ordering::Relaxed);
    tracing::info!(volume = %inner.cfg.name, regions = regions.len(), full, peer = ?peer_meta, "resync starts");
    let copy = |start: u64, n: u64| {
        let inner = inner.clone();
        let link = link.clone();
        async move {
            let lba = start * rb;
            // regions past the served size (a grow whose partner half failed
            // marks them) have nothing to copy yet
            let blocks = (n * rb).min(inner.geo().block_count.saturating_sub(lba));
            if blocks == 0 {
                return Ok(());
            }
            // the budget before the range lock: waiting for it holds nothing
            let bytes = blocks * inner.geo().block_size_bytes as u64;
            let _held = inner.cfg.buffers.acquire(bytes).await;
            let _g = inner
                .locks
                .lock(lba, lba + blocks, LockMode::Exclusive)
                .await;
            let data = inner
                .local
                .read(lba, blocks as u32)
                .await
                .map_err(|e| e.to_string())?;
            let len = data.len() as u64;
            match link
                .request(|id| Message::ResyncData { id, lba, data })
                .await
            {
                Ok(OpResult::Ok) => {}
                Ok(other) => return Err(format!("partner refused resync data: {other:?}")),
                Err(LinkLost) => return Err("link lost".into()),
            }
            // The partner wrote the range durably; this copy of it may still
            // sit in the local volatile cache (writes made alone, or led
            // during the resync, not flushed yet). Its bits go only once it
            // is durable here too: a clear that reached the bitmap file first
            // (any later page write takes it along) and a power loss here
            // would leave the copies different with no bit to say so.
            inner.local.flush().await.map_err(|e| e.to_string())?;
            for r in start..start + n {
                inner.bitmap.clear_region(r);
            }
            inner.resync_done.fetch_add(n, Ordering::Relaxed);
            inner.resynced_bytes.fetch_add(len, Ordering::Relaxed);
            Ok::<(), String>(())
        }
    };
    // runs of adjacent regions, at most RESYNC_COPY_BYTES_MAX each, up to
    // RESYNC_IN_FLIGHT_MAX at once
    let copy_all = |regions: Vec<u64>| async {
        let per_copy = (RESYNC_COPY_BYTES_MAX / bs / rb).max(1);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for r in regions {
            match runs.last_mut() {
                Some((s, n)) if *s + *n == r && *n < per_copy => *n += 1,
                _ => runs.push((r, 1)),
            }
        }
        let mut set = tokio::task::JoinSet::new();
        for (s, n) in runs {
            if set.len() >= RESYNC_IN_FLIGHT_MAX {
                if let Some(r) = set.join_next().await {
                    r.map_err(|e| e.to_string())??;
                }
            }
            set.spawn(copy(s, n));
        }
        while let Some(r) = set.join_next().await {
            r.map_err(|e| e.to_string())??;
        }
        Ok::<(), String>(())
    };
    copy_all(regions).await?;
    inner.local.flush().await.map_err(|e| e.to_string())?;
    let peer = inner.scsi_peer.read().clone();
    if let Some(p) = peer {
        p.before_in_sync().await?;
    }
    // A write during the resync that failed on one side pinned its regions
    // (the copies differ there; the write failed): one copied before it
    // would stay different once in sync, until the next meeting. They are
    // copied again, and the end is taken with every write held off, so none
    // can fail on one side between the last look and the in-sync state
    // (once in sync, such a failure detaches the failing copy). Regions past
    // the served size (a grow the partner missed) have nothing to copy yet.
    let mut passes = 0;
    let _all = loop {
        let all = inner.locks.lock(0, u64::MAX, LockMode::Exclusive).await;
        let served_regions = inner.geo().block_count.div_ceil(rb);
        let again: Vec<u64> = inner
            .bitmap
            .pinned_regions()
            .into_iter()
            .filter(|&r| r < served_regions)
            .collect();
        if again.is_empty() {
            break all;
        }
        drop(all);
        passes += 1;
        if passes > RESYNC_PINNED_PASSES_MAX {
            return Err(format!(
                "{} regions kept failing on one side during the resync",
                again.len()
            ));
        }
        tracing::info!(volume = %inner.cfg.name, regions = again.len(),
            "writes failed on one side during the resync: copying their regions again");
        inner
            .resync_total
            .fetch_add(again.len() as u64, Ordering::Relaxed);
        copy_all(again).await?;
    };
    let mut m = *inner.meta.lock();
    if nothing_to_copy
        && !full
        && peer_meta.consistent
        && peer_meta.current != 0
        && !peer_meta.solo()
    {
        // nothing was copied: this copy holds the data of the partner's
        // generation (the one it took when it went on alone, with no write
        // since), and the partner may have received no change at all, so it
        // stays consistent at its generation if it misses the end. Ending at
        // that generation, both meet at one generation either way
        m.current = peer_meta.current;
    }
    if m.current == 0 {
        m.current = Meta::new_generation(0);
    }
    m.synced = m.current;
    m.consistent = true;
    m.partial = false;
    // a partner that misses the end stays an unfinished target of this
    // generation: recorded, so that it is resumed, not refused, whatever
    // this node's generations become meanwhile (it may go on alone)
    m.target_from = peer_meta.current;
    let gens = m.gens();
    // stored here before the partner is told: from now on the partner holds
    // either this generation (it took the end) or an unfinished copy (it did
    // not, after a change of the resync reached it), or its own generation,
    // which this is then (above): the next meeting joins them. Stored after
    // its answer, a lost answer left the partner in sync at a generation this
    // copy had not recorded, and the next meeting judged the copies diverged
    let mut failed = false;
    inner
        .update_meta(|stored| {
            // a source is consistent; should it not be any more (marked
            // partial meanwhile), the mark stays and the resync fails
            failed = !stored.consistent;
            if !failed {
                *stored = m;
            }
            !failed
        })
        .await
        .map_err(io)?;
    if failed {
        return Err("this copy failed during the resync".into());
    }
    inner.bitmap.persist().await.map_err(io)?;
    match link.request(|id| Message::ResyncDone { id, gens }).await {
        Ok(OpResult::Ok) => {}
        Ok(other) => return Err(format!("partner refused the end of the resync: {other:?}")),
        Err(LinkLost) => return Err("link lost".into()),
    }
    inner.set_role(Role::Leader, Some(link.clone()), false, "in sync".into());
    tracing::info!(volume = %inner.cfg.name, bytes = inner.resynced_bytes.load(Ordering::Relaxed), "resync done: in sync");
    Ok(())
}

/// Longest pause between attempts to release the witness's grant.
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(10);

/// Gives the witness's survivor grant back each time the copies come in sync,
/// on both nodes (only the holder's release changes anything) and until the
/// witness has taken it: in sync, either copy may survive the other. Released
/// once by the resync source only, the grant stayed with a holder whose
/// release met an unreachable witness, or with a node that had claimed it
/// without learning the answer and then became the target: if that node died
/// later, the other was refused and the volume stopped.
pub(crate) async fn witness_keeper(inner: std::sync::Weak<Inner>) {
    let Some(addr) = inner.upgrade().and_then(|i| i.cfg.witness) else {
        return;
    };
    let in_sync =
        |st: &RoleState| matches!(st.role, Role::Leader | Role::Follower) && !st.peer_resyncing;
    let Some(mut roles) = inner.upgrade().map(|i| i.role_tx.subscribe()) else {
        return;
    };
    loop {
        // until the copies are in sync
        if roles.wait_for(in_sync).await.is_err() {
            return;
        }
        let mut pause = Duration::from_secs(1);
        loop {
            let Some(i) = inner.upgrade() else { return };
            if *i.stop_tx.borrow() {
                return;
            }
            // (asked only if still in sync once any claim of this node's has
            // ended: a claim is made after the node left the in-sync roles)
            match i.ask_witness(addr, false, || in_sync(&i.role())).await {
                None => break,
                Some(Ok(holder)) => {
                    tracing::info!(volume = %i.cfg.name, holder, "in sync: the witness's grant is released");
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!(volume = %i.cfg.name, ?pause, "in sync, but the witness's grant could not be released ({e}); retrying")
                }
            }
            drop(i);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                r = roles.wait_for(|st| !in_sync(st)) => if r.is_err() { return },
            }
            pause = (pause * 2).min(RELEASE_RETRY_MAX);
        }
        // until they are not
        if roles.wait_for(|st| !in_sync(st)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::payload_bytes;
    use replica_proto::{Message, Op, REPAIR_BYTES_MAX};

    /// What a partner's message is charged to the node's buffer budget while
    /// it is handled: the data it carries, or for a repair or a read of this
    /// copy, what handling it reads (the blocks asked, at most one repair's
    /// worth: more is refused unread).
    #[test]
    fn a_partners_message_is_charged_what_handling_it_holds() {
        let data = bytes::Bytes::from(vec![0u8; 4096]);
        let write = Op::Write {
            lba: 0,
            fua: false,
            data: data.clone(),
        };
        assert_eq!(
            payload_bytes(&Message::Apply { id: 1, op: write }, 512),
            4096
        );
        let repair_data = Message::RepairData {
            id: 1,
            lba: 0,
            data,
        };
        assert_eq!(payload_bytes(&repair_data, 512), 4096);
        for (blocks, charged) in [(8, 4096), (1 << 40, REPAIR_BYTES_MAX)] {
            let repair = Message::Repair {
                id: 1,
                lba: 0,
                blocks,
            };
            let read = Message::ReadCopy {
                id: 1,
                lba: 0,
                blocks,
            };
            assert_eq!(payload_bytes(&repair, 512), charged);
            assert_eq!(payload_bytes(&read, 512), charged);
        }
        assert_eq!(payload_bytes(&Message::Ping { seq: 1 }, 512), 0);
    }
}
