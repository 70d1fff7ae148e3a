//! Target-side login negotiation as a pure state machine.
//!
//! Feed every Login Request (header + data) to [`LoginNegotiator::step`]; send the
//! Login Response it returns; stop when the outcome is [`LoginOutcome::Failed`]
//! (close the connection after sending) or [`LoginOutcome::Complete`] (set the TSIH
//! in the response, send it, enter full feature phase with [`Negotiated`]).
//!
//! Stages: SecurityNegotiation (0) -> LoginOperationalNegotiation (1) ->
//! FullFeaturePhase (3); the initiator may skip stage 0 only when no
//! authentication is required, and may skip stage 1.

use crate::chap;
use crate::params::{negotiate, KeyAnswer, OpState};
use crate::pdu::{stage, LoginRequest};
use crate::target::{LoginResponse, SeqNumbers};
use crate::text::{parse_text, push_pair, TextAccumulator};
use rand::RngCore;
use std::sync::Arc;

/// Login status (class << 8 | detail).
pub mod status {
    /// Success.
    pub const SUCCESS: u16 = 0x0000;
    /// Initiator error (bad request, wrong stage, bad bits).
    pub const INITIATOR_ERROR: u16 = 0x0200;
    /// Authentication failure.
    pub const AUTH_FAILURE: u16 = 0x0201;
    /// Authorization failure (ACL).
    pub const FORBIDDEN: u16 = 0x0202;
    /// Target not found.
    pub const NOT_FOUND: u16 = 0x0203;
    /// Target removed.
    pub const TARGET_REMOVED: u16 = 0x0204;
    /// Unsupported version.
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    /// Too many connections.
    pub const TOO_MANY_CONNECTIONS: u16 = 0x0206;
    /// Missing parameter.
    pub const MISSING_PARAMETER: u16 = 0x0207;
    /// Cannot include the connection in the session.
    pub const CANT_INCLUDE_IN_SESSION: u16 = 0x0208;
    /// Session type not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    /// Session does not exist.
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020a;
    /// Invalid request during login.
    pub const INVALID_DURING_LOGIN: u16 = 0x020b;
    /// Target error.
    pub const TARGET_ERROR: u16 = 0x0300;
    /// Service unavailable.
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
    /// Out of resources.
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

/// CHAP user name and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    /// CHAP name (CHAP_N).
    pub user: String,
    /// Shared secret.
    pub secret: String,
}

impl std::fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// CHAP credentials that one initiator name must log in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorChap {
    /// The InitiatorName these credentials belong to.
    pub initiator: String,
    /// Its CHAP user and secret.
    pub creds: ChapCredentials,
}

/// One target as login sees it: its name and who may log in how.
#[derive(Debug, Clone, Default)]
pub struct TargetAuth {
    /// Target IQN.
    pub name: String,
    /// TargetAlias, declared to initiators.
    pub alias: Option<String>,
    /// When set the initiator must authenticate with CHAP using these credentials
    /// (unless its name has its own entry in `chap_initiators`).
    pub chap: Option<ChapCredentials>,
    /// Credentials the target proves itself with when the initiator asks (mutual CHAP).
    pub mutual: Option<ChapCredentials>,
    /// Initiator names allowed to log in; empty allows every initiator.
    pub allowed_initiators: Vec<String>,
    /// Per-initiator CHAP credentials: a listed initiator must use its own entry
    /// (the target-wide `chap` is not accepted for it). When this is not empty the
    /// target requires CHAP, and an unlisted initiator needs `chap` to log in.
    pub chap_initiators: Vec<InitiatorChap>,
    /// Refuse CHAP with MD5 or SHA-1 (CHAP_A=5, 6): an initiator must offer
    /// SHA-256 or SHA3-256, so that a man in the middle cannot strip them from
    /// the offer and record a weaker exchange to guess the secret offline.
    pub refuse_md5: bool,
}

/// Whether `name` is an iSCSI name this node takes: `iqn.`, `eui.` or `naa.`
/// (any case), at most 223 bytes, and no control character. RFC 3720
/// 3.2.6.2 allows only letters, digits, '-', '.' and ':', but initiators
/// break it (QEMU makes `iqn.2008-11.org.linux-kvm:` + the VM's name, spaces
/// and all; names set by hand carry '_'), so only what would forge a log
/// line or reach a terminal (newlines, escapes) is refused; metrics escape
/// their label values, logs quote these names.
pub fn is_iscsi_name(name: &str) -> bool {
    let prefix = name.get(..4).map(|p| p.to_ascii_lowercase());
    matches!(prefix.as_deref(), Some("iqn." | "eui." | "naa."))
        && name.len() <= 223
        && !name.chars().any(char::is_control)
}

/// An iSCSI name (initiator or target) as compared: names are
/// case-insensitive (RFC 3722 folds them to lower case), so `IQN.X:Alice`
/// is `iqn.x:alice`, the same initiator, never another one.
pub fn iscsi_name(name: &str) -> String {
    // ASCII letters, as the reservation code compares transport IDs
    name.to_ascii_lowercase()
}

impl TargetAuth {
    /// Whether `initiator` passes the ACL.
    pub fn allows(&self, initiator: &str) -> bool {
        let initiator = iscsi_name(initiator);
        self.allowed_initiators.is_empty()
            || self
                .allowed_initiators
                .iter()
                .any(|a| iscsi_name(a) == initiator)
    }

    /// Whether CHAP is required on this target (of every initiator).
    pub fn chap_required(&self) -> bool {
        self.chap.is_some() || !self.chap_initiators.is_empty()
    }

    /// The credentials `initiator` must prove to log in: its own entry, else the
    /// target-wide ones (None: none fit; with [`TargetAuth::chap_required`] it
    /// cannot log in). The flag tells its own entry.
    pub fn chap_of(&self, initiator: &str) -> (Option<&ChapCredentials>, bool) {
        let initiator = iscsi_name(initiator);
        let own = self
            .chap_initiators
            .iter()
            .find(|e| iscsi_name(&e.initiator) == initiator)
            .map(|e| &e.creds);
        (own.or(self.chap.as_ref()), own.is_some())
    }
}

/// The target's side of operational negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationalLimits {
    /// MaxRecvDataSegmentLength the target declares.
    pub max_recv_data_segment_bytes: u32,
    /// Largest MaxBurstLength accepted.
    pub max_burst_bytes: u32,
    /// Largest FirstBurstLength accepted.
    pub first_burst_bytes: u32,
    /// Largest MaxOutstandingR2T accepted.
    pub max_outstanding_r2t: u32,
    /// The target's InitialR2T value (OR-ed with the initiator's).
    pub initial_r2t: bool,
    /// The target's ImmediateData value (AND-ed with the initiator's).
    pub immediate_data: bool,
    /// The target's DefaultTime2Wait.
    pub default_time2wait_s: u32,
    /// The target's DefaultTime2Retain.
    pub default_time2retain_s: u32,
    /// CmdSN window announced in login responses (MaxCmdSN = ExpCmdSN + window - 1).
    pub cmd_window: u32,
}

impl Default for OperationalLimits {
    fn default() -> Self {
        OperationalLimits {
            max_recv_data_segment_bytes: 256 * 1024,
            max_burst_bytes: 1024 * 1024,
            first_burst_bytes: 256 * 1024,
            max_outstanding_r2t: 4,
            initial_r2t: false,
            immediate_data: true,
            default_time2wait_s: 2,
            default_time2retain_s: 0,
            cmd_window: 128,
        }
    }
}

/// Everything login needs to know about the target side.
#[derive(Debug, Clone, Default)]
pub struct LoginConfig {
    /// Every target served.
    pub targets: Vec<TargetAuth>,
    /// CHAP credentials required for discovery sessions, if any.
    pub discovery_chap: Option<ChapCredentials>,
    /// Mutual CHAP credentials for discovery sessions.
    pub discovery_mutual: Option<ChapCredentials>,
    /// Refuse CHAP with MD5 or SHA-1 for discovery sessions ([`TargetAuth::refuse_md5`]).
    pub discovery_refuse_md5: bool,
    /// Operational limits.
    pub limits: OperationalLimits,
}

/// SessionType.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    /// Discovery: SendTargets only.
    Discovery,
    /// Normal: SCSI commands.
    Normal,
}

/// What the session and connection run with after login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Discovery or Normal.
    pub session_type: SessionType,
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias, if declared.
    pub initiator_alias: Option<String>,
    /// Index into [`LoginConfig::targets`] (Normal sessions).
    pub target_index: Option<usize>,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH the initiator sent (0 for a new session).
    pub tsih_requested: u16,
    /// CID.
    pub cid: u16,
    /// Target portal group tag of the connection.
    pub tpgt: u16,
    /// HeaderDigest=CRC32C.
    pub header_digest: bool,
    /// DataDigest=CRC32C.
    pub data_digest: bool,
    /// The initiator's MaxRecvDataSegmentLength: largest segment the target may send.
    pub send_data_segment_bytes_max: u32,
    /// The target's MaxRecvDataSegmentLength as the initiator knows it.
    pub recv_data_segment_bytes_max: u32,
    /// MaxBurstLength.
    pub max_burst_bytes: u32,
    /// FirstBurstLength (never above MaxBurstLength).
    pub first_burst_bytes: u32,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u32,
    /// DefaultTime2Wait.
    pub default_time2wait_s: u32,
    /// DefaultTime2Retain.
    pub default_time2retain_s: u32,
    /// ErrorRecoveryLevel (always 0).
    pub error_recovery_level: u32,
    /// The CHAP name the initiator proved it holds the secret of (None without CHAP).
    pub chap_user: Option<String>,
    /// True when those credentials were the initiator's own (a per-initiator
    /// entry), false for the target-wide or discovery credentials shared by many.
    pub chap_per_initiator: bool,
    /// CHAP_A used (5 MD5, 6 SHA-1, 7 SHA-256, 8 SHA3-256), if CHAP was.
    pub chap_algorithm: Option<u32>,
    /// The credentials proved (name and secret), if CHAP was used: what another
    /// target's login would ask of this initiator is compared with them.
    pub chap_proven: Option<ChapCredentials>,
    /// ExpCmdSN at the start of full feature phase.
    pub exp_cmd_sn: u32,
    /// Next StatSN to send.
    pub next_stat_sn: u32,
}

/// How a login step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginOutcome {
    /// More Login Requests are expected.
    Continue,
    /// Login failed with this status; close after sending the response.
    Failed(u16),
    /// Login succeeded: set the TSIH in the response, send it, go full feature.
    Complete(Box<Negotiated>),
}

/// One Login Response to send and what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginStep {
    /// The response header.
    pub header: LoginResponse,
    /// Sequence numbers for the response.
    pub seq: SeqNumbers,
    /// Text data segment.
    pub data: Vec<u8>,
    /// Outcome.
    pub outcome: LoginOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    /// AuthMethod not negotiated yet.
    Start,
    /// CHAP chosen; waiting for CHAP_A.
    WaitAlgorithm,
    /// Challenge sent; waiting for CHAP_N/CHAP_R.
    WaitResponse {
        id: u8,
        challenge: Vec<u8>,
        alg: chap::ChapAlgorithm,
    },
    /// Authenticated (or None chosen).
    Done,
}

/// Which credentials apply to the login in progress.
struct AuthCreds<'a> {
    /// CHAP is required (the target or discovery has credentials configured).
    required: bool,
    /// The credentials this initiator must prove (None: required but none fits).
    chap: Option<&'a ChapCredentials>,
    /// `chap` is the initiator's own entry.
    per_initiator: bool,
    /// Mutual CHAP credentials of the target.
    mutual: Option<&'a ChapCredentials>,
    /// CHAP with MD5 or SHA-1 is refused.
    refuse_md5: bool,
}

#[derive(Debug, Clone, Copy)]
struct First {
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    itt: u32,
}

/// Target-side login state machine for one connection.
pub struct LoginNegotiator {
    cfg: Arc<LoginConfig>,
    tpgt: u16,
    rng: Box<dyn RngCore + Send>,
    stage: u8,
    first: Option<First>,
    text: TextAccumulator,
    initiator_name: Option<String>,
    initiator_alias: Option<String>,
    session_type: Option<SessionType>,
    target_index: Option<usize>,
    /// Identity (initiator, target, ACL) checked after the first PDU.
    identified: bool,
    auth: Auth,
    /// Set once CHAP succeeded: (credentials, per-initiator credentials, CHAP_A).
    chap_done: Option<(ChapCredentials, bool, u32)>,
    /// The CHAP_N the initiator sent, if any (for logs; at most 255 bytes kept).
    chap_name_seen: Option<String>,
    ops: OpState,
    declared_mrdsl: bool,
    sent_tpgt: bool,
    sent_alias: bool,
    stat_sn: u32,
    exp_cmd_sn: u32,
    finished: bool,
}

impl LoginNegotiator {
    /// A negotiator for a connection on portal group `tpgt`; CHAP challenges come
    /// from the operating system's CSPRNG.
    pub fn new(cfg: Arc<LoginConfig>, tpgt: u16) -> Self {
        Self::with_rng(cfg, tpgt, Box::new(rand::rngs::OsRng))
    }

    /// Like [`LoginNegotiator::new`] with a deterministic generator seeded with
    /// `seed`: for tests and fuzzing only, never for a real target.
    pub fn with_seed(cfg: Arc<LoginConfig>, tpgt: u16, seed: u64) -> Self {
        use rand::SeedableRng;
        Self::with_rng(cfg, tpgt, Box::new(rand::rngs::StdRng::seed_from_u64(seed)))
    }

    /// Like [`LoginNegotiator::new`] with an explicit random source (tests, fuzzing).
    pub fn with_rng(cfg: Arc<LoginConfig>, tpgt: u16, rng: Box<dyn RngCore + Send>) -> Self {
        LoginNegotiator {
            cfg,
            tpgt,
            rng,
            stage: stage::SECURITY,
            first: None,
            text: TextAccumulator::new(),
            initiator_name: None,
            initiator_alias: None,
            session_type: None,
            target_index: None,
            identified: false,
            auth: Auth::Start,
            chap_done: None,
            chap_name_seen: None,
            ops: OpState::default(),
            declared_mrdsl: false,
            sent_tpgt: false,
            sent_alias: false,
            stat_sn: 0,
            exp_cmd_sn: 0,
            finished: false,
        }
    }

    /// The initiator name, once known (for logs).
    pub fn initiator_name(&self) -> Option<&str> {
        self.initiator_name.as_deref()
    }

    /// The CHAP name the initiator sent, if any (for logs).
    pub fn chap_name(&self) -> Option<&str> {
        self.chap_name_seen.as_deref()
    }

    /// Answers a login attempt with `status` without looking at it (resource limits,
    /// unknown TSIH); the connection is closed afterwards.
    pub fn refuse(&mut self, req: &LoginRequest, status: u16) -> LoginStep {
        if self.first.is_none() {
            self.stat_sn = req.exp_stat_sn;
            self.exp_cmd_sn = req.cmd_sn;
        }
        self.fail(req, status)
    }

    fn seq(&mut self) -> SeqNumbers {
        let s = SeqNumbers {
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self
                .exp_cmd_sn
                .wrapping_add(self.cfg.limits.cmd_window.max(1))
                .wrapping_sub(1),
        };
        self.stat_sn = self.stat_sn.wrapping_add(1);
        s
    }

    fn header(&self, req: &LoginRequest, transit: bool, nsg: u8, status: u16) -> LoginResponse {
        LoginResponse {
            transit,
            cont: false,
            csg: req.csg & 3,
            nsg: if transit { nsg } else { 0 },
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            status_class: (status >> 8) as u8,
            status_detail: status as u8,
        }
    }

    fn fail(&mut self, req: &LoginRequest, status: u16) -> LoginStep {
        self.finished = true;
        let header = self.header(req, false, 0, status);
        LoginStep {
            header,
            seq: self.seq(),
            data: Vec::new(),
            outcome: LoginOutcome::Failed(status),
        }
    }

    /// Processes one Login Request and returns the response to send.
    pub fn step(&mut self, req: &LoginRequest, data: &[u8]) -> LoginStep {
        if self.finished {
            return self.fail(req, status::INITIATOR_ERROR);
        }
        match self.first {
            None => {
                self.stat_sn = req.exp_stat_sn;
                self.exp_cmd_sn = req.cmd_sn;
                self.first = Some(First {
                    isid: req.isid,
                    tsih: req.tsih,
                    cid: req.cid,
                    itt: req.itt,
                });
                if req.csg != stage::SECURITY && req.csg != stage::OPERATIONAL {
                    return self.fail(req, status::INITIATOR_ERROR);
                }
                self.stage = req.csg;
            }
            Some(f) => {
                if f.isid != req.isid || f.tsih != req.tsih || f.cid != req.cid || f.itt != req.itt
                {
                    return self.fail(req, status::INITIATOR_ERROR);
                }
            }
        }
        if req.version_min > 0 {
            return self.fail(req, status::UNSUPPORTED_VERSION);
        }
        if req.csg != self.stage || (req.transit && req.cont) {
            return self.fail(req, status::INITIATOR_ERROR);
        }
        if req.transit
            && (req.nsg <= req.csg
                || !(req.nsg == stage::OPERATIONAL || req.nsg == stage::FULL_FEATURE))
        {
            return self.fail(req, status::INITIATOR_ERROR);
        }
        let text = match self.text.push(data, req.cont) {
            Err(_) => return self.fail(req, status::INITIATOR_ERROR),
            Ok(None) => {
                // Acknowledge a continued text with an empty response.
                let header = self.header(req, false, 0, status::SUCCESS);
                return LoginStep {
                    header,
                    seq: self.seq(),
                    data: Vec::new(),
                    outcome: LoginOutcome::Continue,
                };
            }
            Ok(Some(t)) => t,
        };
        let pairs = match parse_text(&text) {
            Ok(p) => p,
            Err(_) => return self.fail(req, status::INITIATOR_ERROR),
        };
        let mut out = Vec::new();
        if let Err(st) = self.process_keys(req, &pairs, &mut out) {
            return self.fail(req, st);
        }
        let auth_needed = self.auth_required();
        if self.stage == stage::OPERATIONAL && self.auth != Auth::Done {
            if auth_needed {
                return self.fail(req, status::AUTH_FAILURE);
            }
            self.auth = Auth::Done;
        }
        let mut transit = req.transit;
        if self.stage == stage::SECURITY && transit {
            match self.auth {
                Auth::Done => {}
                Auth::Start if !auth_needed => self.auth = Auth::Done,
                Auth::Start => return self.fail(req, status::AUTH_FAILURE),
                // CHAP exchange still going on: stay in the security stage.
                _ => transit = false,
            }
        }
        let discovery = self.session_type == Some(SessionType::Discovery);
        if !self.sent_tpgt {
            self.sent_tpgt = true;
            push_pair(&mut out, "TargetPortalGroupTag", &self.tpgt.to_string());
        }
        let going_full = transit && req.nsg == stage::FULL_FEATURE;
        if (self.stage == stage::OPERATIONAL || going_full) && !self.declared_mrdsl {
            self.declared_mrdsl = true;
            push_pair(
                &mut out,
                "MaxRecvDataSegmentLength",
                &self.cfg.limits.max_recv_data_segment_bytes.to_string(),
            );
        }
        if !discovery && !self.sent_alias && (self.stage == stage::OPERATIONAL || going_full) {
            self.sent_alias = true;
            if let Some(alias) = self
                .target_index
                .and_then(|i| self.cfg.targets.get(i))
                .and_then(|t| t.alias.clone())
            {
                push_pair(&mut out, "TargetAlias", &alias);
            }
        }
        let header = self.header(req, transit, req.nsg, status::SUCCESS);
        let seq = self.seq();
        let outcome = if going_full {
            self.finished = true;
            LoginOutcome::Complete(Box::new(self.negotiated()))
        } else {
            if transit {
                self.stage = req.nsg;
            }
            LoginOutcome::Continue
        };
        LoginStep {
            header,
            seq,
            data: out,
            outcome,
        }
    }

    fn auth_required(&self) -> bool {
        self.auth_creds().required
    }

    fn auth_creds(&self) -> AuthCreds<'_> {
        let none = AuthCreds {
            required: false,
            chap: None,
            per_initiator: false,
            mutual: None,
            refuse_md5: false,
        };
        match self.session_type {
            Some(SessionType::Discovery) => AuthCreds {
                required: self.cfg.discovery_chap.is_some(),
                chap: self.cfg.discovery_chap.as_ref(),
                per_initiator: false,
                mutual: self.cfg.discovery_mutual.as_ref(),
                refuse_md5: self.cfg.discovery_refuse_md5,
            },
            Some(SessionType::Normal) => {
                let Some(t) = self.target_index.and_then(|i| self.cfg.targets.get(i)) else {
                    return none;
                };
                let (chap, per_initiator) = match self.initiator_name.as_deref() {
                    Some(n) => t.chap_of(n),
                    None => (t.chap.as_ref(), false),
                };
                AuthCreds {
                    required: t.chap_required(),
                    chap,
                    per_initiator,
                    mutual: t.mutual.as_ref(),
                    refuse_md5: t.refuse_md5,
                }
            }
            None => none,
        }
    }

    fn identify(&mut self) -> Result<(), u16> {
        let Some(name) = self.initiator_name.clone() else {
            return Err(status::MISSING_PARAMETER);
        };
        let st = self.session_type.unwrap_or(SessionType::Normal);
        self.session_type = Some(st);
        if st == SessionType::Normal {
            let Some(i) = self.target_index else {
                return Err(status::MISSING_PARAMETER);
            };
            if !self.cfg.targets[i].allows(&name) {
                return Err(status::FORBIDDEN);
            }
        }
        Ok(())
    }

    fn process_keys(
        &mut self,
        req: &LoginRequest,
        pairs: &[(String, String)],
        out: &mut Vec<u8>,
    ) -> Result<(), u16> {
        let mut chap_n = None;
        let mut chap_r = None;
        let mut chap_i = None;
        let mut chap_c = None;
        let mut chap_a = None;
        let mut auth_method = None;
        for (k, v) in pairs {
            match k.as_str() {
                "InitiatorName" => {
                    if !is_iscsi_name(v) {
                        return Err(status::INITIATOR_ERROR);
                    }
                    // iSCSI names are case-insensitive (RFC 3722 folds them
                    // to lower case): one name, one identity everywhere (the
                    // ACL, CHAP entries, masking, sessions, reservations)
                    let v = iscsi_name(v);
                    if self.initiator_name.as_deref().is_some_and(|n| n != v) {
                        return Err(status::INITIATOR_ERROR);
                    }
                    self.initiator_name = Some(v);
                }
                "InitiatorAlias" => self.initiator_alias = Some(v.clone()),
                "SessionType" => {
                    let st = match v.as_str() {
                        "Discovery" => SessionType::Discovery,
                        "Normal" => SessionType::Normal,
                        _ => return Err(status::SESSION_TYPE_NOT_SUPPORTED),
                    };
                    if self.session_type.is_some_and(|s| s != st) {
                        return Err(status::INITIATOR_ERROR);
                    }
                    self.session_type = Some(st);
                }
                "TargetName" => {
                    let v = iscsi_name(v);
                    match self
                        .cfg
                        .targets
                        .iter()
                        .position(|t| iscsi_name(&t.name) == v)
                    {
                        Some(i) => {
                            if self.target_index.is_some_and(|j| j != i) {
                                return Err(status::INITIATOR_ERROR);
                            }
                            self.target_index = Some(i)
                        }
                        // A discovery session may name no target or any; ignore it.
                        None if self.session_type == Some(SessionType::Discovery) => {}
                        None => return Err(status::NOT_FOUND),
                    }
                }
                "AuthMethod" => auth_method = Some(v.as_str()),
                "CHAP_A" => chap_a = Some(v.as_str()),
                "CHAP_N" => chap_n = Some(v.as_str()),
                "CHAP_R" => chap_r = Some(v.as_str()),
                "CHAP_I" => chap_i = Some(v.as_str()),
                "CHAP_C" => chap_c = Some(v.as_str()),
                key => {
                    let discovery = self.session_type == Some(SessionType::Discovery);
                    if let KeyAnswer::Answer(a) =
                        negotiate(key, v, &mut self.ops, &self.cfg.limits, discovery)
                    {
                        push_pair(out, key, &a);
                    }
                }
            }
        }
        let any_chap = chap_a.is_some()
            || chap_n.is_some()
            || chap_r.is_some()
            || chap_i.is_some()
            || chap_c.is_some();
        if (auth_method.is_some() || any_chap) && req.csg != stage::SECURITY {
            return Err(status::INITIATOR_ERROR);
        }
        if !self.identified {
            self.identify()?;
            self.identified = true;
        }
        let (required, chap_cfg, per_initiator, mutual_cfg, refuse_md5) = {
            let c = self.auth_creds();
            (
                c.required,
                c.chap.cloned(),
                c.per_initiator,
                c.mutual.cloned(),
                c.refuse_md5,
            )
        };
        if let Some(list) = auth_method {
            if self.auth != Auth::Start {
                return Err(status::INITIATOR_ERROR);
            }
            let offers = |m: &str| list.split(',').any(|x| x == m);
            if required {
                if !offers("CHAP") {
                    push_pair(out, "AuthMethod", "Reject");
                    return Err(status::AUTH_FAILURE);
                }
                push_pair(out, "AuthMethod", "CHAP");
                self.auth = Auth::WaitAlgorithm;
            } else if offers("None") {
                push_pair(out, "AuthMethod", "None");
                self.auth = Auth::Done;
            } else {
                push_pair(out, "AuthMethod", "Reject");
                return Err(status::AUTH_FAILURE);
            }
        }
        if let Some(algs) = chap_a {
            if self.auth != Auth::WaitAlgorithm {
                return Err(status::INITIATOR_ERROR);
            }
            // the strongest offered (RFC 7143 12.1.3), unless it is a weak
            // one (MD5, SHA-1) and the target refuses those
            let Some(alg) =
                chap::ChapAlgorithm::choose(algs).filter(|a| !(refuse_md5 && a.is_weak()))
            else {
                push_pair(out, "CHAP_A", "Reject");
                return Err(status::AUTH_FAILURE);
            };
            let mut challenge = vec![0u8; alg.challenge_len_bytes()];
            self.rng.fill_bytes(&mut challenge);
            let id = (self.rng.next_u32() & 0xff) as u8;
            push_pair(out, "CHAP_A", &alg.code().to_string());
            push_pair(out, "CHAP_I", &id.to_string());
            push_pair(out, "CHAP_C", &chap::encode_hex(&challenge));
            self.auth = Auth::WaitResponse { id, challenge, alg };
        }
        if let Some(n) = chap_n {
            self.chap_name_seen = Some(n.chars().take(255).collect());
        }
        if chap_n.is_some() || chap_r.is_some() {
            let Auth::WaitResponse { id, challenge, alg } = &self.auth else {
                return Err(status::INITIATOR_ERROR);
            };
            let alg = *alg;
            let (Some(n), Some(r)) = (chap_n, chap_r) else {
                return Err(status::AUTH_FAILURE);
            };
            let Some(creds) = chap_cfg else {
                return Err(status::AUTH_FAILURE);
            };
            let r = chap::decode_binary(r).map_err(|_| status::AUTH_FAILURE)?;
            let want = alg.response(*id, creds.secret.as_bytes(), challenge);
            // Both compared before deciding, so timing does not tell which was wrong.
            let user_ok = chap::constant_time_eq(n.as_bytes(), creds.user.as_bytes());
            let resp_ok = chap::constant_time_eq(&r, &want);
            if !(user_ok & resp_ok) {
                return Err(status::AUTH_FAILURE);
            }
            match (chap_i, chap_c) {
                (Some(i), Some(c)) => {
                    let Some(m) = mutual_cfg else {
                        return Err(status::AUTH_FAILURE);
                    };
                    let i = chap::parse_number(i).map_err(|_| status::AUTH_FAILURE)?;
                    let i = u8::try_from(i).map_err(|_| status::AUTH_FAILURE)?;
                    let c = chap::decode_binary(c).map_err(|_| status::AUTH_FAILURE)?;
                    // A reflected challenge would let an attacker use us as an oracle.
                    if c.is_empty() || c.len() > chap::CHALLENGE_LEN_MAX_BYTES || c == *challenge {
                        return Err(status::AUTH_FAILURE);
                    }
                    let resp = alg.response(i, m.secret.as_bytes(), &c);
                    push_pair(out, "CHAP_N", &m.user);
                    push_pair(out, "CHAP_R", &chap::encode_hex(&resp));
                }
                (None, None) => {}
                _ => return Err(status::AUTH_FAILURE),
            }
            self.chap_done = Some((creds.clone(), per_initiator, alg.code()));
            self.auth = Auth::Done;
        } else if chap_i.is_some() || chap_c.is_some() {
            return Err(status::INITIATOR_ERROR);
        }
        Ok(())
    }

    fn negotiated(&self) -> Negotiated {
        let o = &self.ops;
        Negotiated {
            session_type: self.session_type.unwrap_or(SessionType::Normal),
            initiator_name: self.initiator_name.clone().unwrap_or_default(),
            initiator_alias: self.initiator_alias.clone(),
            target_index: self.target_index,
            isid: self.first.map(|f| f.isid).unwrap_or_default(),
            tsih_requested: self.first.map(|f| f.tsih).unwrap_or_default(),
            cid: self.first.map(|f| f.cid).unwrap_or_default(),
            tpgt: self.tpgt,
            header_digest: o.header_digest,
            data_digest: o.data_digest,
            send_data_segment_bytes_max: o.initiator_mrdsl_bytes,
            recv_data_segment_bytes_max: if self.declared_mrdsl {
                self.cfg.limits.max_recv_data_segment_bytes
            } else {
                8192
            },
            max_burst_bytes: o.max_burst_bytes,
            first_burst_bytes: o.first_burst_bytes.min(o.max_burst_bytes),
            initial_r2t: o.initial_r2t,
            immediate_data: o.immediate_data,
            max_outstanding_r2t: o.max_outstanding_r2t.max(1),
            default_time2wait_s: o.default_time2wait_s,
            default_time2retain_s: o.default_time2retain_s,
            error_recovery_level: 0,
            chap_user: self.chap_done.as_ref().map(|c| c.0.user.clone()),
            chap_per_initiator: self.chap_done.as_ref().is_some_and(|c| c.1),
            chap_algorithm: self.chap_done.as_ref().map(|c| c.2),
            chap_proven: self.chap_done.as_ref().map(|c| c.0.clone()),
            exp_cmd_sn: self.exp_cmd_sn,
            next_stat_sn: self.stat_sn,
        }
    }
}

#[cfg(test)]
#[path = "login_tests.rs"]
mod tests;
