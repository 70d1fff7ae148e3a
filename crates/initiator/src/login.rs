//! Initiator-side login as a pure state machine: SecurityNegotiation (None or CHAP
//! MD5, one-way or mutual) then LoginOperationalNegotiation, producing the Login
//! Requests to send and, at the end, the negotiated [`LoginParams`].

use crate::InitiatorError;
use iscsi_proto::chap;
use iscsi_proto::pdu::{encode_initiator_bhs, stage, InitiatorPdu, LoginRequest, BHS_LEN};
use iscsi_proto::target::{LoginResponse, SeqNumbers};
use iscsi_proto::text::{parse_text, push_pair, TextAccumulator};
use rand::RngCore;

/// Most Login Request/Response exchanges before giving up.
const LOGIN_STEPS_MAX: u32 = 16;
/// Largest segment the initiator accepts (MaxRecvDataSegmentLength it declares).
pub const RECV_DATA_SEGMENT_BYTES_DEFAULT: u32 = 256 * 1024;

/// How to log in.
#[derive(Clone)]
pub struct LoginOptions {
    /// InitiatorName (IQN).
    pub initiator_name: String,
    /// TargetName; ignored for discovery sessions.
    pub target_iqn: String,
    /// Initiator session id; keep it when re-logging in so the target reinstates.
    pub isid: [u8; 6],
    /// CHAP user name and secret the initiator proves itself with.
    pub chap: Option<(String, String)>,
    /// Target CHAP user name and secret: ask the target to prove itself (mutual CHAP).
    pub mutual_chap: Option<(String, String)>,
    /// Ask for HeaderDigest=CRC32C.
    pub header_digest: bool,
    /// Ask for DataDigest=CRC32C.
    pub data_digest: bool,
    /// MaxRecvDataSegmentLength declared to the target.
    pub max_recv_data_segment_bytes: u32,
    /// MaxBurstLength proposed.
    pub max_burst_bytes: u32,
    /// FirstBurstLength proposed.
    pub first_burst_bytes: u32,
    /// Longest the whole login (TCP connect included) may take.
    pub login_timeout_ms: u64,
    /// Longest a command may wait for its status; past that the session is closed.
    pub command_timeout_ms: u64,
}

impl std::fmt::Debug for LoginOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginOptions")
            .field("initiator_name", &self.initiator_name)
            .field("target_iqn", &self.target_iqn)
            .field("isid", &self.isid)
            .field("chap_user", &self.chap.as_ref().map(|c| &c.0))
            .field("header_digest", &self.header_digest)
            .field("data_digest", &self.data_digest)
            .finish_non_exhaustive()
    }
}

impl LoginOptions {
    /// Options with the defaults: no digests, no CHAP, a random ISID, 256 KiB
    /// segments, 16 MiB bursts, 10 s login and 15 s command timeouts.
    pub fn new(initiator_name: &str, target_iqn: &str) -> LoginOptions {
        LoginOptions {
            initiator_name: initiator_name.to_string(),
            target_iqn: target_iqn.to_string(),
            isid: random_isid(0),
            chap: None,
            mutual_chap: None,
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_bytes: RECV_DATA_SEGMENT_BYTES_DEFAULT,
            max_burst_bytes: 16 * 1024 * 1024 - 1024,
            first_burst_bytes: 256 * 1024,
            login_timeout_ms: 10_000,
            command_timeout_ms: 15_000,
        }
    }
}

/// A random-format ISID (type 10b) whose last byte is `qualifier`.
pub fn random_isid(qualifier: u8) -> [u8; 6] {
    let mut r = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut r);
    [0x80 | (r[0] & 0x3f), r[1], r[2], r[3], 0, qualifier]
}

/// What login ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginParams {
    /// TSIH the target assigned.
    pub tsih: u16,
    /// TargetPortalGroupTag the target declared (0 when it did not).
    pub tpgt: u16,
    /// HeaderDigest=CRC32C.
    pub header_digest: bool,
    /// DataDigest=CRC32C.
    pub data_digest: bool,
    /// The target's MaxRecvDataSegmentLength: largest segment we may send.
    pub send_data_segment_bytes_max: u32,
    /// Our MaxRecvDataSegmentLength: largest segment the target may send.
    pub recv_data_segment_bytes_max: u32,
    /// MaxBurstLength.
    pub max_burst_bytes: u32,
    /// FirstBurstLength.
    pub first_burst_bytes: u32,
    /// ImmediateData.
    pub immediate_data: bool,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u32,
    /// CmdSN of the first command (login requests are immediate and do not use one).
    pub cmd_sn: u32,
    /// ExpCmdSN from the last login response.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN from the last login response.
    pub max_cmd_sn: u32,
    /// StatSN of the last login response plus one.
    pub exp_stat_sn: u32,
}

/// The next thing to do in a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginStep {
    /// Send this Login Request (header and text data segment), then feed the answer.
    Send {
        /// The 48-byte header.
        header: [u8; BHS_LEN],
        /// The text.
        data: Vec<u8>,
    },
    /// Full feature phase reached.
    Done(LoginParams),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AuthMethod,
    ChapAlgorithm,
    ChapResponse,
    SecurityTransit,
    Operational,
}

/// Drives one login from the initiator side without doing any I/O.
pub struct LoginStateMachine {
    opts: LoginOptions,
    discovery: bool,
    phase: Phase,
    steps: u32,
    acc: TextAccumulator,
    /// The request last sent (CSG, NSG, T), repeated empty while the target continues.
    last: (u8, u8, bool),
    exp_stat_sn: u32,
    mutual_challenge: Option<(u8, Vec<u8>, chap::ChapAlgorithm)>,
    p: LoginParams,
}

const CMD_SN_INITIAL: u32 = 1;

impl LoginStateMachine {
    /// A login for a normal session (`discovery == false`) or a discovery session.
    pub fn new(opts: &LoginOptions, discovery: bool) -> LoginStateMachine {
        LoginStateMachine {
            opts: opts.clone(),
            discovery,
            phase: Phase::AuthMethod,
            steps: 0,
            acc: TextAccumulator::new(),
            last: (0, 0, false),
            exp_stat_sn: 0,
            mutual_challenge: None,
            p: LoginParams {
                tsih: 0,
                tpgt: 0,
                header_digest: false,
                data_digest: false,
                send_data_segment_bytes_max: 8192,
                recv_data_segment_bytes_max: opts
                    .max_recv_data_segment_bytes
                    .clamp(512, (1 << 24) - 1),
                max_burst_bytes: 262_144,
                first_burst_bytes: 65_536,
                immediate_data: true,
                initial_r2t: true,
                max_outstanding_r2t: 1,
                cmd_sn: CMD_SN_INITIAL,
                exp_cmd_sn: CMD_SN_INITIAL,
                max_cmd_sn: CMD_SN_INITIAL,
                exp_stat_sn: 0,
            },
        }
    }

    fn request(&mut self, csg: u8, nsg: u8, transit: bool, data: Vec<u8>) -> LoginStep {
        self.last = (csg, nsg, transit);
        let req = InitiatorPdu::Login(LoginRequest {
            transit,
            cont: false,
            csg,
            nsg: if transit { nsg } else { 0 },
            version_max: 0,
            version_min: 0,
            isid: self.opts.isid,
            tsih: 0,
            itt: 0,
            cid: 0,
            cmd_sn: CMD_SN_INITIAL,
            exp_stat_sn: self.exp_stat_sn,
        });
        LoginStep::Send {
            header: encode_initiator_bhs(&req, true, 0, data.len() as u32),
            data,
        }
    }

    fn identity(&self, out: &mut Vec<u8>) {
        push_pair(out, "InitiatorName", &self.opts.initiator_name);
        if self.discovery {
            push_pair(out, "SessionType", "Discovery");
        } else {
            push_pair(out, "SessionType", "Normal");
            push_pair(out, "TargetName", &self.opts.target_iqn);
        }
    }

    fn operational_keys(&self, out: &mut Vec<u8>) {
        let digest = |on: bool| if on { "CRC32C,None" } else { "None" };
        push_pair(out, "HeaderDigest", digest(self.opts.header_digest));
        push_pair(out, "DataDigest", digest(self.opts.data_digest));
        push_pair(
            out,
            "MaxRecvDataSegmentLength",
            &self.p.recv_data_segment_bytes_max.to_string(),
        );
        if self.discovery {
            return;
        }
        let max_burst = self.opts.max_burst_bytes.clamp(512, (1 << 24) - 1);
        let first_burst = self.opts.first_burst_bytes.clamp(512, max_burst);
        push_pair(out, "InitialR2T", "No");
        push_pair(out, "ImmediateData", "Yes");
        push_pair(out, "MaxBurstLength", &max_burst.to_string());
        push_pair(out, "FirstBurstLength", &first_burst.to_string());
        push_pair(out, "MaxOutstandingR2T", "8");
        push_pair(out, "MaxConnections", "1");
        push_pair(out, "ErrorRecoveryLevel", "0");
        push_pair(out, "DefaultTime2Wait", "2");
        push_pair(out, "DefaultTime2Retain", "0");
        push_pair(out, "DataPDUInOrder", "Yes");
        push_pair(out, "DataSequenceInOrder", "Yes");
    }

    /// The first Login Request.
    pub fn start(&mut self) -> LoginStep {
        let mut out = Vec::with_capacity(512);
        self.identity(&mut out);
        if self.opts.chap.is_some() {
            let methods = if self.opts.mutual_chap.is_some() {
                "CHAP"
            } else {
                "CHAP,None"
            };
            push_pair(&mut out, "AuthMethod", methods);
            self.phase = Phase::AuthMethod;
            self.request(stage::SECURITY, stage::OPERATIONAL, false, out)
        } else {
            self.operational_keys(&mut out);
            self.phase = Phase::Operational;
            self.request(stage::OPERATIONAL, stage::FULL_FEATURE, true, out)
        }
    }

    fn go_operational(&mut self) -> LoginStep {
        let mut out = Vec::with_capacity(512);
        self.operational_keys(&mut out);
        self.phase = Phase::Operational;
        self.request(stage::OPERATIONAL, stage::FULL_FEATURE, true, out)
    }

    /// Feeds one Login Response; returns the next request or the end of login.
    pub fn on_response(
        &mut self,
        resp: &LoginResponse,
        seq: &SeqNumbers,
        data: &[u8],
    ) -> Result<LoginStep, InitiatorError> {
        self.steps += 1;
        if self.steps > LOGIN_STEPS_MAX {
            return Err(InitiatorError::Protocol("login did not converge".into()));
        }
        if resp.status_class != 0 {
            return Err(InitiatorError::LoginFailed {
                class: resp.status_class,
                detail: resp.status_detail,
            });
        }
        self.exp_stat_sn = seq.stat_sn.wrapping_add(1);
        if sn_window_valid(seq.exp_cmd_sn, seq.max_cmd_sn) {
            self.p.exp_cmd_sn = seq.exp_cmd_sn;
            self.p.max_cmd_sn = seq.max_cmd_sn;
        }
        let Some(text) = self.acc.push(data, resp.cont)? else {
            // The target continues its text: ask for the rest with an empty request.
            let (csg, nsg, _) = self.last;
            return Ok(self.request(csg, nsg, false, Vec::new()));
        };
        let kv = parse_text(&text)?;
        let get = |k: &str| kv.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        if let Some(t) = get("TargetPortalGroupTag") {
            self.p.tpgt = chap::parse_number(t)
                .ok()
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(0);
        }
        if let Some(v) = get("MaxRecvDataSegmentLength") {
            self.p.send_data_segment_bytes_max = number(v, 512, (1 << 24) - 1)
                .ok_or_else(|| InitiatorError::Protocol("bad MaxRecvDataSegmentLength".into()))?;
        }
        match self.phase {
            Phase::AuthMethod => match get("AuthMethod") {
                Some("CHAP") => {
                    self.phase = Phase::ChapAlgorithm;
                    let mut out = Vec::new();
                    // every algorithm the target may know, strongest first
                    push_pair(&mut out, "CHAP_A", "8,7,6,5");
                    Ok(self.request(stage::SECURITY, stage::OPERATIONAL, false, out))
                }
                Some("None") if self.opts.mutual_chap.is_none() => self.security_transit(resp),
                Some(_) => Err(InitiatorError::Auth("target refused CHAP")),
                None if resp.transit => self.security_transit(resp),
                None => Err(InitiatorError::Auth("target did not choose an AuthMethod")),
            },
            Phase::ChapAlgorithm => {
                let alg = get("CHAP_A")
                    .and_then(|a| chap::parse_number(a).ok())
                    .and_then(chap::ChapAlgorithm::from_code)
                    .ok_or(InitiatorError::Auth(
                        "target did not pick one of the CHAP algorithms offered",
                    ))?;
                let id = get("CHAP_I")
                    .and_then(|i| chap::parse_number(i).ok())
                    .and_then(|i| u8::try_from(i).ok())
                    .ok_or(InitiatorError::Auth("missing or bad CHAP_I"))?;
                let challenge = get("CHAP_C")
                    .ok_or(InitiatorError::Auth("missing CHAP_C"))
                    .and_then(|c| {
                        chap::decode_binary(c).map_err(|_| InitiatorError::Auth("bad CHAP_C"))
                    })?;
                if challenge.is_empty() {
                    return Err(InitiatorError::Auth("empty CHAP challenge"));
                }
                let Some((user, secret)) = self.opts.chap.clone() else {
                    return Err(InitiatorError::Auth("CHAP asked without credentials"));
                };
                let r = alg.response(id, secret.as_bytes(), &challenge);
                let mut out = Vec::new();
                push_pair(&mut out, "CHAP_N", &user);
                push_pair(&mut out, "CHAP_R", &chap::encode_hex(&r));
                if self.opts.mutual_chap.is_some() {
                    let mut c = vec![0u8; alg.challenge_len_bytes()];
                    rand::thread_rng().fill_bytes(&mut c);
                    let mut our_id = [0u8; 1];
                    rand::thread_rng().fill_bytes(&mut our_id);
                    // Never reuse the target's identifier/challenge (reflection attack).
                    if our_id[0] == id {
                        our_id[0] = id.wrapping_add(1);
                    }
                    push_pair(&mut out, "CHAP_I", &our_id[0].to_string());
                    push_pair(&mut out, "CHAP_C", &chap::encode_hex(&c));
                    self.mutual_challenge = Some((our_id[0], c, alg));
                }
                self.phase = Phase::ChapResponse;
                Ok(self.request(stage::SECURITY, stage::OPERATIONAL, true, out))
            }
            Phase::ChapResponse => {
                if let Some((want_user, secret)) = &self.opts.mutual_chap {
                    let (id, c, alg) = self
                        .mutual_challenge
                        .as_ref()
                        .ok_or(InitiatorError::Auth("no mutual challenge"))?;
                    let n = get("CHAP_N").ok_or(InitiatorError::Auth("target sent no CHAP_N"))?;
                    let r = get("CHAP_R")
                        .ok_or(InitiatorError::Auth("target sent no CHAP_R"))
                        .and_then(|r| {
                            chap::decode_binary(r).map_err(|_| InitiatorError::Auth("bad CHAP_R"))
                        })?;
                    let want = alg.response(*id, secret.as_bytes(), c);
                    if n != want_user || !chap::constant_time_eq(&r, &want) {
                        return Err(InitiatorError::Auth("target failed mutual CHAP"));
                    }
                }
                self.security_transit(resp)
            }
            Phase::SecurityTransit => self.security_transit(resp),
            Phase::Operational => {
                self.apply_operational(&kv)?;
                if resp.transit && resp.nsg == stage::FULL_FEATURE {
                    self.p.tsih = resp.tsih;
                    self.p.exp_stat_sn = self.exp_stat_sn;
                    if self.p.tsih == 0 && !self.discovery {
                        return Err(InitiatorError::Protocol(
                            "final login response without TSIH".into(),
                        ));
                    }
                    Ok(LoginStep::Done(self.p.clone()))
                } else {
                    Ok(self.request(stage::OPERATIONAL, stage::FULL_FEATURE, true, Vec::new()))
                }
            }
        }
    }

    fn security_transit(&mut self, resp: &LoginResponse) -> Result<LoginStep, InitiatorError> {
        if resp.transit && resp.csg == stage::SECURITY {
            if resp.nsg == stage::FULL_FEATURE {
                return Err(InitiatorError::Protocol(
                    "target skipped operational negotiation".into(),
                ));
            }
            return Ok(self.go_operational());
        }
        self.phase = Phase::SecurityTransit;
        Ok(self.request(stage::SECURITY, stage::OPERATIONAL, true, Vec::new()))
    }

    fn apply_operational(&mut self, kv: &[(String, String)]) -> Result<(), InitiatorError> {
        for (k, v) in kv {
            let v = v.as_str();
            match k.as_str() {
                "HeaderDigest" => self.p.header_digest = v == "CRC32C",
                "DataDigest" => self.p.data_digest = v == "CRC32C",
                "InitialR2T" => self.p.initial_r2t = v != "No",
                "ImmediateData" => self.p.immediate_data = v == "Yes",
                "MaxBurstLength" => {
                    if let Some(n) = number(v, 512, (1 << 24) - 1) {
                        self.p.max_burst_bytes = n.min(self.opts.max_burst_bytes.max(512));
                    }
                }
                "FirstBurstLength" => {
                    if let Some(n) = number(v, 512, (1 << 24) - 1) {
                        self.p.first_burst_bytes = n.min(self.opts.first_burst_bytes.max(512));
                    }
                }
                "MaxOutstandingR2T" => {
                    if let Some(n) = number(v, 1, 65535) {
                        self.p.max_outstanding_r2t = n;
                    }
                }
                "ErrorRecoveryLevel" if v != "0" => {
                    return Err(InitiatorError::Protocol(
                        "target wants ErrorRecoveryLevel > 0".into(),
                    ));
                }
                _ => {}
            }
        }
        if self.opts.header_digest != self.p.header_digest
            || self.opts.data_digest != self.p.data_digest
        {
            tracing::info!(
                header_digest = self.p.header_digest,
                data_digest = self.p.data_digest,
                "target answered other digests than asked"
            );
        }
        self.p.first_burst_bytes = self.p.first_burst_bytes.min(self.p.max_burst_bytes);
        Ok(())
    }
}

fn sn_window_valid(exp: u32, max: u32) -> bool {
    iscsi_proto::sn_le(exp.wrapping_sub(1), max)
}

fn number(v: &str, min: u32, max: u32) -> Option<u32> {
    let n = chap::parse_number(v).ok()?;
    (n >= min as u64 && n <= max as u64).then_some(n as u32)
}

#[cfg(test)]
#[path = "login_tests.rs"]
mod tests;
