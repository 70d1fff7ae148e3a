//! Operational key negotiation (RFC 7143 section 13): one function per key kind,
//! the target acting as responder.

use crate::login::OperationalLimits;

/// Values negotiated so far (RFC defaults until the initiator offers a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpState {
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub initiator_mrdsl_bytes: u32,
    pub max_burst_bytes: u32,
    pub first_burst_bytes: u32,
    pub default_time2wait_s: u32,
    pub default_time2retain_s: u32,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u32,
}

impl Default for OpState {
    fn default() -> Self {
        OpState {
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_mrdsl_bytes: 8192,
            max_burst_bytes: 262_144,
            first_burst_bytes: 65_536,
            default_time2wait_s: 2,
            default_time2retain_s: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

/// What to answer for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyAnswer {
    /// Send `key=value`.
    Answer(String),
    /// Declarative or target-only key: nothing to answer.
    Silent,
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yn(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

fn number(v: &str, min: u32, max: u32) -> Option<u32> {
    if v.is_empty() || v.len() > 10 {
        return None;
    }
    let n = crate::chap::parse_number(v).ok()?;
    (n >= min as u64 && n <= max as u64).then_some(n as u32)
}

fn digest_choice(v: &str) -> Option<bool> {
    v.split(',').find_map(|c| match c {
        "CRC32C" => Some(true),
        "None" => Some(false),
        _ => None,
    })
}

const SEGMENT_MAX: u32 = (1 << 24) - 1;

/// Negotiates one operational key offered by the initiator.
pub(crate) fn negotiate(
    key: &str,
    value: &str,
    st: &mut OpState,
    ours: &OperationalLimits,
    discovery: bool,
) -> KeyAnswer {
    use KeyAnswer::*;
    let reject = || Answer("Reject".to_string());
    let irrelevant_in_discovery = matches!(
        key,
        "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
    );
    if discovery && irrelevant_in_discovery {
        return Answer("Irrelevant".to_string());
    }
    match key {
        "HeaderDigest" | "DataDigest" => match digest_choice(value) {
            Some(crc) => {
                if key == "HeaderDigest" {
                    st.header_digest = crc;
                } else {
                    st.data_digest = crc;
                }
                Answer(if crc { "CRC32C" } else { "None" }.to_string())
            }
            None => reject(),
        },
        "MaxConnections" => match number(value, 1, 65535) {
            Some(_) => {
                st.max_connections = 1;
                Answer("1".into())
            }
            None => reject(),
        },
        "InitialR2T" => match yes_no(value) {
            Some(v) => {
                st.initial_r2t = v || ours.initial_r2t;
                Answer(yn(st.initial_r2t))
            }
            None => reject(),
        },
        "ImmediateData" => match yes_no(value) {
            Some(v) => {
                st.immediate_data = v && ours.immediate_data;
                Answer(yn(st.immediate_data))
            }
            None => reject(),
        },
        "DataPDUInOrder" | "DataSequenceInOrder" => match yes_no(value) {
            // OR with our Yes: both always end Yes.
            Some(_) => Answer(yn(true)),
            None => reject(),
        },
        "MaxRecvDataSegmentLength" => match number(value, 512, SEGMENT_MAX) {
            Some(n) => {
                st.initiator_mrdsl_bytes = n;
                Silent
            }
            None => reject(),
        },
        "MaxBurstLength" => match number(value, 512, SEGMENT_MAX) {
            Some(n) => {
                st.max_burst_bytes = n.min(ours.max_burst_bytes);
                Answer(st.max_burst_bytes.to_string())
            }
            None => reject(),
        },
        "FirstBurstLength" => match number(value, 512, SEGMENT_MAX) {
            Some(n) => {
                st.first_burst_bytes = n.min(ours.first_burst_bytes);
                Answer(st.first_burst_bytes.to_string())
            }
            None => reject(),
        },
        "DefaultTime2Wait" => match number(value, 0, 3600) {
            Some(n) => {
                st.default_time2wait_s = n.max(ours.default_time2wait_s);
                Answer(st.default_time2wait_s.to_string())
            }
            None => reject(),
        },
        "DefaultTime2Retain" => match number(value, 0, 3600) {
            Some(n) => {
                st.default_time2retain_s = n.min(ours.default_time2retain_s);
                Answer(st.default_time2retain_s.to_string())
            }
            None => reject(),
        },
        "MaxOutstandingR2T" => match number(value, 1, 65535) {
            Some(n) => {
                st.max_outstanding_r2t = n.min(ours.max_outstanding_r2t.max(1));
                Answer(st.max_outstanding_r2t.to_string())
            }
            None => reject(),
        },
        "ErrorRecoveryLevel" => match number(value, 0, 2) {
            Some(_) => {
                st.error_recovery_level = 0;
                Answer("0".into())
            }
            None => reject(),
        },
        // Markers were removed by RFC 7143; older initiators still offer them off.
        "IFMarker" | "OFMarker" => Answer("No".into()),
        "IFMarkInt" | "OFMarkInt" => Answer("Irrelevant".into()),
        // Declarative keys and keys only a target sends: nothing to answer.
        "InitiatorName"
        | "InitiatorAlias"
        | "TargetName"
        | "SessionType"
        | "TargetAlias"
        | "TargetAddress"
        | "TargetPortalGroupTag" => Silent,
        _ => Answer("NotUnderstood".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> OperationalLimits {
        OperationalLimits::default()
    }

    #[test]
    fn results_follow_the_rfc_functions() {
        let o = ours();
        let mut st = OpState::default();
        let a = |k: &str, v: &str, st: &mut OpState| negotiate(k, v, st, &o, false);
        assert_eq!(
            a("HeaderDigest", "CRC32C,None", &mut st),
            KeyAnswer::Answer("CRC32C".into())
        );
        assert!(st.header_digest);
        assert_eq!(
            a("DataDigest", "None", &mut st),
            KeyAnswer::Answer("None".into())
        );
        assert_eq!(
            a("DataDigest", "MD5", &mut st),
            KeyAnswer::Answer("Reject".into())
        );
        assert_eq!(
            a("MaxConnections", "8", &mut st),
            KeyAnswer::Answer("1".into())
        );
        assert_eq!(
            a("InitialR2T", "No", &mut st),
            KeyAnswer::Answer(yn(o.initial_r2t))
        );
        assert_eq!(
            a("ImmediateData", "Yes", &mut st),
            KeyAnswer::Answer(yn(o.immediate_data))
        );
        assert_eq!(
            a("MaxRecvDataSegmentLength", "65536", &mut st),
            KeyAnswer::Silent
        );
        assert_eq!(st.initiator_mrdsl_bytes, 65536);
        assert_eq!(
            a("MaxBurstLength", "16776192", &mut st),
            KeyAnswer::Answer(o.max_burst_bytes.to_string())
        );
        assert_eq!(
            a("FirstBurstLength", "512", &mut st),
            KeyAnswer::Answer("512".into())
        );
        assert_eq!(
            a("DefaultTime2Wait", "0", &mut st),
            KeyAnswer::Answer(o.default_time2wait_s.to_string())
        );
        assert_eq!(
            a("DefaultTime2Retain", "0", &mut st),
            KeyAnswer::Answer("0".into())
        );
        assert_eq!(
            a("MaxOutstandingR2T", "1", &mut st),
            KeyAnswer::Answer("1".into())
        );
        assert_eq!(
            a("ErrorRecoveryLevel", "2", &mut st),
            KeyAnswer::Answer("0".into())
        );
        assert_eq!(
            a("X-com.example.Foo", "1", &mut st),
            KeyAnswer::Answer("NotUnderstood".into())
        );
        assert_eq!(
            a("MaxBurstLength", "12", &mut st),
            KeyAnswer::Answer("Reject".into())
        );
        assert_eq!(
            a("InitialR2T", "Maybe", &mut st),
            KeyAnswer::Answer("Reject".into())
        );
        assert_eq!(a("IFMarker", "No", &mut st), KeyAnswer::Answer("No".into()));
    }

    #[test]
    fn discovery_irrelevant() {
        let mut st = OpState::default();
        assert_eq!(
            negotiate("MaxBurstLength", "262144", &mut st, &ours(), true),
            KeyAnswer::Answer("Irrelevant".into())
        );
    }
}
