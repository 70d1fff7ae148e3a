//! Persistent reservations across an HA pair: the glue between the SCSI layer's
//! [`scsi::PrReplication`] hook and the replicated volume's [`replica::ScsiPeer`]
//! channel to the partner.
//!
//! The node that orders writes (the leader, or a node alone) also orders PR
//! changes: a PERSISTENT RESERVE OUT arriving at the follower is run on the
//! leader (with the follower's nexus), and the leader installs its new state on
//! the follower before answering, so every node enforces the same reservations.
//! A resync source hands its state to the partner before the partner serves.
//!
//! SPC-2 RESERVE and RELEASE are forwarded and pushed like a PR OUT; an SPC-2
//! reservation that ended on the follower without a command (its holder's nexus
//! lost, a reset) is ended on the leader too ([`ScsiMsg::EndSpc2`]), which
//! installs its new state back before answering.
//!
//! The explicit ALUA states (SET TARGET PORT GROUPS) follow the same path: the
//! leader (or a node alone) applies a SET TARGET PORT GROUPS and installs its
//! whole explicit state on the partner before answering; a follower, or a node
//! being resynchronised, forwards the validated changes to the leader, which
//! installs the result back on it before the forwarded request is answered. A
//! resync source hands its explicit states to the partner together with its
//! reservations, so a node that rejoins (and was perhaps changed while cut off)
//! takes the states of the node that kept serving. A node that is deciding or
//! down (it cannot reach the partner and does not serve) refuses the command
//! with NOT READY: a change it made alone would be overwritten when it rejoins.
//!
//! Who may reach the LUN (the target's initiator ACL and CHAP users, the host
//! groups that map it) is each node's own configuration. The nodes compare it
//! ([`ScsiMsg::CompareAccess`], a digest of [`scsi::ScsiTarget::access_lines`])
//! when they come in sync and whenever it changes on either, and each records
//! what it found in the replica status (`access_mismatch`), which raises the
//! `replica_access_differs` event: an initiator kept out on one node only would
//! reach the LUN through the other node's portals. Nothing is refused on that
//! ground; which node's rules are meant is the operator's call.

use block::Bytes;
use replica::{ReplicatedVolume, Role};
use replica_proto::scsi::{ScsiAnswer, ScsiMsg};
use sha2::Digest;
use std::sync::{Arc, OnceLock, Weak};

/// One replicated LUN's PR link to the partner.
pub struct PrLink {
    lun: u64,
    vol: Arc<ReplicatedVolume>,
    target: OnceLock<Weak<scsi::ScsiTarget>>,
    /// Itself, for the comparison a change starts in the background.
    me: Weak<PrLink>,
    /// One access comparison at a time, each with the rules as they are when
    /// it starts: the last one's finding stays.
    comparing: tokio::sync::Mutex<()>,
}

/// How the partner answered a request.
enum Asked {
    Installed,
    /// It refused (why).
    Failed(String),
    /// Its access rules differ ([`ScsiMsg::CompareAccess`]).
    Differs,
    /// No answer (link lost, malformed answer).
    Unanswered(String),
}

impl Asked {
    fn into_result(self) -> Result<(), String> {
        match self {
            Asked::Installed => Ok(()),
            Asked::Failed(why) | Asked::Unanswered(why) => Err(why),
            Asked::Differs => Err("unexpected answer from the partner".into()),
        }
    }
}

/// How often the access rules are compared again while the nodes are
/// together: a finding that raced a change on the other node (an answer
/// computed before that node's change, recorded after its own comparison)
/// lasts this long at most.
const ACCESS_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);

impl PrLink {
    /// Connects LUN `lun` of `target` (served from `vol`) to the partner.
    pub fn install(lun: u64, vol: Arc<ReplicatedVolume>, target: &Arc<scsi::ScsiTarget>) {
        let link = PrLink::new(lun, vol, target);
        target.set_pr_replication(lun, link);
    }

    /// The link of `lun` (not yet installed on the target: [`scsi::ScsiTarget::add_lun`]
    /// takes it for a LUN added at run time); `vol` answers the partner through it.
    pub fn new(
        lun: u64,
        vol: Arc<ReplicatedVolume>,
        target: &Arc<scsi::ScsiTarget>,
    ) -> Arc<PrLink> {
        let link = Arc::new_cyclic(|me| PrLink {
            lun,
            vol: vol.clone(),
            target: OnceLock::new(),
            me: me.clone(),
            comparing: tokio::sync::Mutex::new(()),
        });
        let _ = link.target.set(Arc::downgrade(target));
        vol.set_scsi_peer(link.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let me = Arc::downgrade(&link);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(ACCESS_RECHECK).await;
                    // (ends once the LUN or its target is gone)
                    let Some(link) = me.upgrade().filter(|l| l.access_digest().is_some()) else {
                        return;
                    };
                    link.compare_access().await;
                }
            });
        }
        link
    }

    /// Whether a change made here must reach the partner now: yes while this
    /// node leads it, no while it serves alone. Any other role means the role
    /// changed under the command (the link lost while it waited for the LU's
    /// order or its aborts): an error, so the command is not answered GOOD for
    /// a change on this node only, which the partner, if it goes on alone,
    /// never had (a fenced initiator writing through it), and overwrites at
    /// the next meeting (review of 2026-12-06; before, "not attached" was
    /// taken for "alone").
    fn must_push(&self) -> Result<bool, String> {
        if self.vol.partner_attached() {
            return Ok(true);
        }
        match self.vol.role() {
            Role::Solo => Ok(false),
            r => Err(format!(
                "this node no longer orders changes ({r:?}): the change may not reach the partner"
            )),
        }
    }

    fn target(&self) -> Option<Arc<scsi::ScsiTarget>> {
        self.target.get().and_then(|w| w.upgrade())
    }

    /// Sends `req` to the partner (`who`: how to call it in a message).
    async fn ask(&self, req: ScsiMsg, who: &str) -> Asked {
        match self.vol.scsi_request(req.encode()).await {
            Ok(b) => match ScsiAnswer::decode(b) {
                Some(ScsiAnswer::Installed) => Asked::Installed,
                Some(ScsiAnswer::Failed(why)) => Asked::Failed(why),
                Some(ScsiAnswer::Differs) => Asked::Differs,
                _ => Asked::Unanswered(format!("malformed answer from the {who}")),
            },
            Err(e) => Asked::Unanswered(e.to_string()),
        }
    }

    /// The digest of who may reach the LUN on this node; None if the target
    /// or the LUN is gone.
    fn access_digest(&self) -> Option<Bytes> {
        let lines = self.target()?.access_lines(self.lun)?;
        Some(Bytes::from(
            sha2::Sha256::digest(lines.join("\n").as_bytes()).to_vec(),
        ))
    }

    /// What an operator reads when the rules differ.
    fn mismatch(&self) -> String {
        format!(
            "who may reach LUN {} differs between the two nodes (initiator ACL, CHAP \
             users or host groups): an initiator kept out on one node reaches the LUN \
             through the other's portals; make them the same on both",
            self.lun
        )
    }

    /// Compares who may reach the LUN with the partner and records the finding
    /// (nothing when the partner cannot be asked).
    async fn compare_access(&self) {
        let _one = self.comparing.lock().await;
        // (a resync source leads; a follower asks its leader)
        if !matches!(self.vol.role(), Role::Leader | Role::Follower) {
            return;
        }
        let Some(digest) = self.access_digest() else {
            return;
        };
        let req = ScsiMsg::CompareAccess {
            lun: self.lun,
            digest,
        };
        match self.ask(req, "partner").await {
            Asked::Installed => self.record_access(None),
            Asked::Differs => self.record_access(Some(self.mismatch())),
            // (a partner of an earlier version does not know the request)
            Asked::Failed(why) | Asked::Unanswered(why) => {
                tracing::debug!(lun = self.lun, why, "access rules not compared")
            }
        }
    }

    /// Records a comparison's finding, saying so when it changes.
    fn record_access(&self, mismatch: Option<String>) {
        let now = mismatch.clone();
        match (self.vol.set_access_mismatch(mismatch), now) {
            (None, Some(why)) => tracing::warn!(lun = self.lun, "{why}"),
            (Some(_), None) => {
                tracing::info!(
                    lun = self.lun,
                    "who may reach the LUN is the same on both nodes again"
                )
            }
            _ => {}
        }
    }

    /// Sends `req` to the node that orders changes when that is the partner
    /// (this node follows, or is being resynced by it); None when this node
    /// orders them; an error when it serves nothing now.
    async fn to_the_orderer(&self, req: impl FnOnce() -> ScsiMsg) -> Option<Result<(), String>> {
        match self.vol.role() {
            Role::Leader | Role::Solo => None,
            Role::Follower | Role::Target => Some(self.ask(req(), "leader").await.into_result()),
            Role::Deciding | Role::Down => Some(Err("this node does not serve the LUN now".into())),
        }
    }

    /// NOT READY (the partner cannot be asked): multipath retries elsewhere.
    fn not_ready(&self, why: &str) -> scsi::Response {
        tracing::warn!(
            lun = self.lun,
            why,
            "persistent reservation change not possible now"
        );
        let sense = self
            .target()
            .map(|t| t.encode_sense(self.lun, &scsi::sense::codes::PORT_UNAVAILABLE));
        scsi::Response {
            status: scsi::status::CHECK_CONDITION,
            sense,
            data_in: Bytes::new(),
            transfer_len_bytes: 0,
        }
    }
}

#[async_trait::async_trait]
impl scsi::PrReplication for PrLink {
    async fn forward_out(
        &self,
        lun: u64,
        nexus: &scsi::ItNexus,
        cdb: &Bytes,
        data: &Bytes,
    ) -> Option<scsi::Response> {
        match self.vol.role() {
            // this node orders reservation changes
            Role::Leader | Role::Solo => return None,
            Role::Follower => {}
            // not serving (the command passed the ALUA gate before the role
            // changed): run here, a change would exist on this node only and
            // be overwritten, or refused half-way, when the nodes meet
            Role::Deciding | Role::Down | Role::Target => {
                return Some(self.not_ready("this node does not serve the LUN now"))
            }
        }
        let req = ScsiMsg::ForwardPrOut {
            lun,
            initiator_name: nexus.initiator_name.to_string(),
            initiator_port: nexus.initiator_port.to_string(),
            relative_port_id: nexus.relative_port_id,
            cdb: cdb.clone(),
            data: data.clone(),
        };
        Some(match self.vol.scsi_request(req.encode()).await {
            Ok(b) => match ScsiAnswer::decode(b) {
                Some(ScsiAnswer::Response {
                    status,
                    sense,
                    data_in,
                    transfer_len_bytes,
                }) => scsi::Response {
                    status,
                    sense,
                    data_in,
                    transfer_len_bytes,
                },
                Some(ScsiAnswer::Failed(why)) => self.not_ready(&why),
                _ => self.not_ready("malformed answer from the leader"),
            },
            Err(e) => self.not_ready(&e.to_string()),
        })
    }

    async fn push_state(&self, lun: u64, state: Bytes) -> Result<(), String> {
        if !self.must_push()? {
            return Ok(());
        }
        let req = ScsiMsg::InstallPrState { lun, state };
        self.ask(req, "partner").await.into_result()
    }

    async fn forward_set_tpg(
        &self,
        lun: u64,
        nexus: &scsi::ItNexus,
        changes: &[(u16, scsi::AluaState)],
    ) -> Option<Result<(), String>> {
        let req = || ScsiMsg::ForwardSetTpg {
            lun,
            initiator_port: nexus.initiator_port.to_string(),
            relative_port_id: nexus.relative_port_id,
            changes: changes.iter().map(|&(g, s)| (g, s.code())).collect(),
        };
        self.to_the_orderer(req).await
    }

    async fn push_alua_state(
        &self,
        lun: u64,
        origin: Option<&scsi::ItNexus>,
        states: &[(u16, scsi::AluaState)],
    ) -> Result<(), String> {
        if !self.must_push()? {
            return Ok(());
        }
        let req = ScsiMsg::InstallAluaState {
            lun,
            origin: origin.map(|n| (n.initiator_port.to_string(), n.relative_port_id)),
            states: states.iter().map(|&(g, s)| (g, s.code())).collect(),
        };
        self.ask(req, "partner").await.into_result()
    }

    async fn forward_spc2_end(
        &self,
        lun: u64,
        holder: Option<&scsi::pr::NexusId>,
    ) -> Option<Result<(), String>> {
        let req = || ScsiMsg::EndSpc2 {
            lun,
            holder: holder.map(|h| (h.initiator_port.to_string(), h.relative_port_id)),
        };
        self.to_the_orderer(req).await
    }

    async fn reset_elsewhere(&self, lun: u64, kind: scsi::ResetKind) -> Result<(), String> {
        // whichever node leads: each raises the unit attention on its own
        // nexuses. Alone, no partner serves the LU; a partner that does not
        // answer costs the link's exchange time at most.
        if !matches!(
            self.vol.role(),
            Role::Leader | Role::Follower | Role::Target
        ) {
            return Ok(());
        }
        let req = ScsiMsg::Reset {
            lun,
            kind: kind.code(),
        };
        self.ask(req, "partner").await.into_result()
    }

    fn access_changed(&self) {
        let (Some(me), Ok(rt)) = (self.me.upgrade(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        rt.spawn(async move { me.compare_access().await });
    }
}

/// (group, state) pairs from the wire; None if a state code is not one the
/// device supports.
fn alua_states(pairs: &[(u16, u8)]) -> Option<Vec<(u16, scsi::AluaState)>> {
    pairs
        .iter()
        .map(|&(g, code)| scsi::AluaState::from_code(code).map(|s| (g, s)))
        .collect()
}

/// What a request from the partner needs of this node.
#[derive(Clone, Copy)]
enum Needs {
    /// A command to run here: this node orders the LUN's changes.
    Ordering,
    /// State to install here: the partner orders them (this node follows or is
    /// being resynced by it).
    Following(&'static str),
}

impl PrLink {
    /// The refusal of a request for `lun` this node may not take now; None when
    /// it may.
    fn refusal(&self, lun: u64, needs: Needs) -> Option<ScsiAnswer> {
        if lun != self.lun {
            tracing::warn!(
                lun = self.lun,
                asked = lun,
                "the partner named another LUN: refused"
            );
            return Some(ScsiAnswer::Failed("request for another LUN".into()));
        }
        let role = self.vol.role();
        match needs {
            Needs::Ordering if !matches!(role, Role::Leader | Role::Solo) => Some(
                ScsiAnswer::Failed("this node does not order changes".into()),
            ),
            Needs::Following(what) if !matches!(role, Role::Follower | Role::Target) => {
                tracing::warn!(
                    lun = self.lun,
                    what,
                    "state from a partner that does not lead: refused"
                );
                Some(ScsiAnswer::Failed(
                    "this node orders its own changes".into(),
                ))
            }
            _ => None,
        }
    }
}

#[async_trait::async_trait]
impl replica::ScsiPeer for PrLink {
    async fn handle(&self, request: Bytes) -> Bytes {
        let Some(t) = self.target() else {
            return ScsiAnswer::Failed("the target is not running".into()).encode();
        };
        let answer = match ScsiMsg::decode(request) {
            Some(ScsiMsg::ForwardPrOut {
                lun,
                initiator_name,
                initiator_port,
                relative_port_id,
                cdb,
                data,
            }) => {
                if let Some(no) = self.refusal(lun, Needs::Ordering) {
                    no
                } else {
                    let nexus = scsi::ItNexus {
                        initiator_name: initiator_name.into(),
                        initiator_port: initiator_port.into(),
                        relative_port_id,
                        chap_user: None,
                    };
                    let r = t.execute_pr_out_here(lun, &nexus, cdb, data).await;
                    ScsiAnswer::Response {
                        status: r.status,
                        sense: r.sense,
                        data_in: r.data_in,
                        transfer_len_bytes: r.transfer_len_bytes,
                    }
                }
            }
            Some(ScsiMsg::InstallPrState { lun, state }) => {
                // reservation state comes only from the node that orders changes:
                // this one must be its follower or resync target, for this LUN
                if let Some(no) = self.refusal(lun, Needs::Following("reservation")) {
                    no
                } else {
                    match t.install_pr_state(lun, &state).await {
                        Ok(()) => ScsiAnswer::Installed,
                        Err(e) => ScsiAnswer::Failed(e.to_string()),
                    }
                }
            }
            Some(ScsiMsg::ForwardSetTpg {
                lun,
                initiator_port,
                relative_port_id,
                changes,
            }) => {
                if let Some(no) = self.refusal(lun, Needs::Ordering) {
                    no
                } else if let Some(changes) = alua_states(&changes) {
                    let origin = (initiator_port.as_str(), relative_port_id);
                    match t.set_target_port_groups_here(lun, origin, &changes).await {
                        Ok(()) => ScsiAnswer::Installed,
                        Err(why) => ScsiAnswer::Failed(why),
                    }
                } else {
                    ScsiAnswer::Failed("unsupported ALUA state".into())
                }
            }
            Some(ScsiMsg::InstallAluaState {
                lun,
                origin,
                states,
            }) => {
                // like reservation state: only from the node that orders changes
                if let Some(no) = self.refusal(lun, Needs::Following("ALUA")) {
                    no
                } else if let Some(states) = alua_states(&states) {
                    let origin = origin.as_ref().map(|(p, rel)| (p.as_str(), *rel));
                    match t.install_alua_state(lun, origin, &states) {
                        Ok(()) => ScsiAnswer::Installed,
                        Err(e) => ScsiAnswer::Failed(e.to_string()),
                    }
                } else {
                    ScsiAnswer::Failed("unsupported ALUA state".into())
                }
            }
            Some(ScsiMsg::EndSpc2 { lun, holder }) => {
                if let Some(no) = self.refusal(lun, Needs::Ordering) {
                    no
                } else {
                    let holder = holder.map(|(port, rel)| scsi::pr::NexusId {
                        initiator_port: port.into(),
                        relative_port_id: rel,
                    });
                    match t.end_spc2_here(lun, holder.as_ref()).await {
                        Ok(()) => ScsiAnswer::Installed,
                        Err(why) => ScsiAnswer::Failed(why),
                    }
                }
            }
            Some(ScsiMsg::Reset { lun, kind }) => {
                // either node may send it, whatever the roles: its initiators
                // reach the same LU
                if lun != self.lun {
                    ScsiAnswer::Failed("request for another LUN".into())
                } else if let Some(kind) = scsi::ResetKind::from_code(kind) {
                    match t.reset_from_partner(lun, kind).await {
                        Ok(()) => ScsiAnswer::Installed,
                        Err(why) => ScsiAnswer::Failed(why),
                    }
                } else {
                    ScsiAnswer::Failed("unknown reset".into())
                }
            }
            Some(ScsiMsg::CompareAccess { lun, digest }) => {
                if lun != self.lun {
                    ScsiAnswer::Failed("request for another LUN".into())
                } else {
                    match self.access_digest() {
                        Some(mine) if mine == digest => {
                            self.record_access(None);
                            ScsiAnswer::Installed
                        }
                        Some(_) => {
                            self.record_access(Some(self.mismatch()));
                            ScsiAnswer::Differs
                        }
                        None => ScsiAnswer::Failed("no such LUN here".into()),
                    }
                }
            }
            None => {
                tracing::warn!(lun = self.lun, "malformed SCSI request from the partner");
                ScsiAnswer::Failed("malformed request".into())
            }
        };
        answer.encode()
    }

    async fn before_in_sync(&self) -> Result<(), String> {
        let t = self.target().ok_or("the target is not running")?;
        // under the LU's PR ordering lock: a PR OUT running now cannot be
        // overwritten on the partner by this older snapshot
        t.push_pr_state(self.lun).await?;
        // the explicit ALUA states likewise, under the LU's ALUA ordering lock
        t.push_alua_state(self.lun).await?;
        // who may reach the LUN: compared, not copied (each node's own)
        self.compare_access().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::VolumeRef;
    use replica::ScsiPeer;
    use replica::{secure::ClusterKeys, Mode, ReplicaConfig};

    /// Node 2 of a pair, not preferred, with no partner reachable and no
    /// witness: it never orders changes and follows nobody.
    fn lonely_node2(dir: &std::path::Path) -> (Arc<ReplicatedVolume>, Arc<scsi::ScsiTarget>) {
        let keys = ClusterKeys::generate("c").unwrap().swap_remove(1);
        let cfg = ReplicaConfig {
            name: "c/iqn.2026-12.org.freesan:t/lun0".into(),
            cluster: "c".into(),
            node_id: 2,
            preferred_node: 1,
            peer_sync: Vec::new(),
            witness: None,
            mode: Mode::ActiveActive,
            region_bytes: 64 << 10,
            heartbeat_interval_ms: 50,
            peer_timeout_ms: 400,
            io_wait_ms: 3000,
            state_dir: dir.join("replica"),
            keys: Arc::new(keys),
            buffers: block::BufferBudget::unlimited(),
        };
        let local: VolumeRef = Arc::new(block::MemVolume::new(512, 64));
        let (vol, _sink) = ReplicatedVolume::open(cfg, local).unwrap();
        let vol = Arc::new(vol);
        let lun = scsi::LunConfig {
            naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
            serial: "HA0".into(),
            vendor: "FREESAN".into(),
            product: "VIRTUAL DISK".into(),
            revision: "0001".into(),
            read_only: false,
            state_file: None,
            physical_block_exponent: 0,
            sanitize_rate_bytes_per_s: 0,
        };
        let target = Arc::new(
            scsi::ScsiTarget::new(scsi::TargetConfig::one_port_group(
                "iqn.2026-12.org.freesan:t",
                1,
                vec![(0, lun, vol.clone() as VolumeRef)],
            ))
            .unwrap(),
        );
        (vol, target)
    }

    /// What the partner asks through the authenticated link is still checked
    /// against this node's role and the LUN: a node that does not order
    /// changes refuses a forwarded RESERVE and an SPC-2 end (`EndSpc2`), a
    /// node that follows nobody refuses reservation state, and a request
    /// naming another LUN is refused; none changes the reservations here.
    #[tokio::test]
    async fn requests_this_node_may_not_take_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, target) = lonely_node2(dir.path());
        let link = PrLink::new(0, vol.clone(), &target);
        let before = target.pr_state(0).unwrap();
        let state = Bytes::from_static(
            br#"{"version":1,"generation":0,"aptpl":false,"registrations":[],"reservation":null,"spc2_holder":{"initiator_port":"iqn.2026-12.org.example:h,i,0x000000000001","relative_port_id":1}}"#,
        );
        let requests = [
            ScsiMsg::EndSpc2 {
                lun: 0,
                holder: None,
            },
            ScsiMsg::ForwardPrOut {
                lun: 0,
                initiator_name: "iqn.2026-12.org.example:h".into(),
                initiator_port: "iqn.2026-12.org.example:h,i,0x000000000001".into(),
                relative_port_id: 1,
                cdb: Bytes::from_static(&[0x16, 0, 0, 0, 0, 0]),
                data: Bytes::new(),
            },
            ScsiMsg::InstallPrState {
                lun: 0,
                state: state.clone(),
            },
            ScsiMsg::EndSpc2 {
                lun: 7,
                holder: None,
            },
            ScsiMsg::InstallPrState { lun: 7, state },
            // a reset is taken whatever the roles, but not for another LUN
            // nor of a kind this version does not know
            ScsiMsg::Reset { lun: 7, kind: 0 },
            ScsiMsg::Reset { lun: 0, kind: 9 },
        ];
        for req in requests {
            assert!(
                !matches!(
                    vol.role(),
                    Role::Leader | Role::Solo | Role::Follower | Role::Target
                ),
                "the node took a role: {:?}",
                vol.role()
            );
            let answer = ScsiAnswer::decode(link.handle(req.encode()).await);
            assert!(
                matches!(answer, Some(ScsiAnswer::Failed(_))),
                "{req:?} was taken: {answer:?}"
            );
            assert_eq!(
                target.pr_state(0).unwrap(),
                before,
                "{req:?} changed the state"
            );
        }
        // a reset of this LUN is taken whatever the roles, and leaves the
        // reservations to the node that orders them
        let answer = ScsiAnswer::decode(
            link.handle(ScsiMsg::Reset { lun: 0, kind: 0 }.encode())
                .await,
        );
        assert!(matches!(answer, Some(ScsiAnswer::Installed)), "{answer:?}");
        assert_eq!(target.pr_state(0).unwrap(), before);
    }
}
