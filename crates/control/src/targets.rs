//! A target as the node serves it: its LUNs opened, its SCSI device with this
//! node's ports in their ALUA groups, its iSCSI authentication, and the
//! node's portals with their TPGTs. Used at start ([`crate::serve`]) and by a
//! reload ([`crate::reload`]) that adds targets or changes portals.

use crate::cluster::{port_id, Cluster};
use crate::config::Config;
use crate::lun::{nbd_exports, open_lun};
use crate::pools::Pools;
use anyhow::{Context, Result};
use std::sync::Arc;

/// One opened LUN, for the banner.
pub(crate) struct OpenedLun {
    pub(crate) target: String,
    pub(crate) id: u64,
    pub(crate) path: String,
    pub(crate) size_bytes: u64,
}

fn chap(c: &Option<crate::config::Chap>) -> Option<iscsi::ChapSecret> {
    c.as_ref().map(|c| iscsi::ChapSecret {
        user: c.user.clone(),
        secret: c.secret.clone(),
    })
}

/// Who must authenticate how to log in to target `t`.
pub(crate) fn target_auth(t: &crate::config::TargetConfig) -> iscsi::Auth {
    iscsi::Auth {
        chap: chap(&t.chap),
        mutual: chap(&t.mutual_chap),
        per_initiator: t
            .chap_initiators
            .iter()
            .map(|c| {
                let secret = iscsi::ChapSecret {
                    user: c.user.clone(),
                    secret: c.secret.clone(),
                };
                (c.initiator.clone(), secret)
            })
            .collect(),
        refuse_md5: !t.chap_md5,
    }
}

/// Who target `t` admits, one line each, without secrets, for
/// [`scsi::ScsiTarget::set_admission`]: the nodes of an HA pair compare them.
pub(crate) fn admission_lines(t: &crate::config::TargetConfig) -> Vec<String> {
    let mut out = Vec::new();
    if t.allowed_initiators.is_empty() {
        out.push("any initiator".to_string());
    }
    // (folded, as the ACL compares them)
    out.extend(
        t.allowed_initiators
            .iter()
            .map(|i| format!("initiator {}", i.to_ascii_lowercase())),
    );
    if let Some(c) = &t.chap {
        out.push(format!("CHAP user {}", c.user));
    }
    if let Some(c) = &t.mutual_chap {
        out.push(format!("mutual CHAP user {}", c.user));
    }
    out.extend(t.chap_initiators.iter().map(|c| {
        let initiator = c.initiator.to_ascii_lowercase();
        format!("CHAP user {} for initiator {initiator}", c.user)
    }));
    out
}

/// Who must authenticate how for discovery sessions.
pub(crate) fn discovery_auth(cfg: &Config) -> iscsi::Auth {
    iscsi::Auth {
        chap: chap(&cfg.discovery_chap),
        mutual: None,
        refuse_md5: !cfg.discovery_chap_md5,
        ..iscsi::Auth::default()
    }
}

/// Opens the LUNs of target `t` (number `ti` in the configuration) and builds its
/// SCSI device and iSCSI description, its banner lines and NBD exports.
pub(crate) fn build_target(
    cfg: &Config,
    ti: usize,
    t: &crate::config::TargetConfig,
    portals: &[iscsi::Portal],
    pools: &Pools,
    cluster: Option<&Cluster>,
) -> Result<(iscsi::TargetSpec, Vec<OpenedLun>, Vec<nbd::NbdExport>)> {
    let mut opened = Vec::new();
    let mut exports = Vec::new();
    let mut export_luns = Vec::new();
    let mut luns = Vec::new();
    let mut replicated = Vec::new();
    for (i, l) in t.luns.iter().enumerate() {
        let lun_id = l.id.unwrap_or(i as u64);
        let b = open_lun(&cfg.data_dir, pools, cluster, &t.iqn, l, lun_id)
            .with_context(|| format!("target {} LUN {}", t.iqn, lun_id))?;
        let g = b.volume.geometry();
        let e = nbd_exports(ti == 0, &t.iqn, lun_id, &b, l.read_only);
        export_luns.extend(e.iter().map(|_| lun_id));
        exports.extend(e);
        opened.push(OpenedLun {
            target: t.iqn.clone(),
            id: lun_id,
            path: b.backing.clone(),
            size_bytes: g.size_bytes(),
        });
        if let Some(r) = b.replicated {
            replicated.push((lun_id, r));
        }
        luns.push((lun_id, b.scsi, b.volume));
    }
    let scsi_cfg = match &cfg.cluster {
        // one ALUA port group per node: this node's portals and the partner's
        Some(c) => {
            let peer = 3 - c.node_id;
            let ports = target_ports(&t.iqn, portals, c.node_id as u16);
            let mut groups = vec![
                scsi::PortGroup {
                    id: c.node_id as u16,
                    state: scsi::AluaState::Unavailable,
                    relative_port_ids: ports.iter().map(|p| p.relative_id).collect(),
                },
                scsi::PortGroup {
                    id: peer as u16,
                    state: scsi::AluaState::Unavailable,
                    relative_port_ids: (0..c.peer_portals.len())
                        .map(|j| port_id(peer, j))
                        .collect(),
                },
            ];
            // LUNs that are not replicated are served here only; every
            // replicated LUN's states follow its replica (Cluster::drive_alua)
            groups[0].state = scsi::AluaState::ActiveOptimized;
            groups.sort_by_key(|g| g.id);
            scsi::TargetConfig {
                name: t.iqn.clone(),
                ports,
                port_groups: groups,
                luns,
            }
        }
        // one port group of them all
        None => {
            let ports = target_ports(&t.iqn, portals, SINGLE_NODE_GROUP);
            scsi::TargetConfig {
                name: t.iqn.clone(),
                port_groups: vec![scsi::PortGroup {
                    id: SINGLE_NODE_GROUP,
                    state: scsi::AluaState::ActiveOptimized,
                    relative_port_ids: ports.iter().map(|p| p.relative_id).collect(),
                }],
                ports,
                luns,
            }
        }
    };
    let scsi_target =
        Arc::new(scsi::ScsiTarget::new(scsi_cfg).with_context(|| format!("target {}", t.iqn))?);
    scsi_target
        .set_host_groups(t.host_groups.iter().map(|g| g.to_scsi()).collect())
        .with_context(|| format!("target {}", t.iqn))?;
    for (i, l) in t.luns.iter().enumerate() {
        if l.thin_threshold_percent.is_some() {
            scsi_target.set_thin_threshold(l.id.unwrap_or(i as u64), l.thin_threshold_percent);
        }
    }
    for (e, lun) in exports.iter_mut().zip(export_luns) {
        e.access = Some(Arc::new(crate::lun::LunAccess::new(
            scsi_target.clone(),
            lun,
        )));
    }
    scsi_target.set_admission(admission_lines(t));
    for (lun_id, vol) in replicated {
        crate::ha_scsi::PrLink::install(lun_id, vol.clone(), &scsi_target);
        if let Some(c) = cluster {
            c.drive_alua(&scsi_target, lun_id, vol);
        }
    }
    let spec = iscsi::TargetSpec {
        iqn: t.iqn.clone(),
        alias: t.alias.clone(),
        scsi: scsi_target,
        auth: target_auth(t),
        allowed_initiators: t.allowed_initiators.clone(),
    };
    Ok((spec, opened, exports))
}

/// The ALUA port group of every portal of a node outside an HA pair.
pub(crate) const SINGLE_NODE_GROUP: u16 = 1;

/// Target `iqn`'s SCSI ports for `portals` (relative port id = TPGT), all in
/// ALUA group `group_id`, named as iSCSI target ports.
pub(crate) fn target_ports(
    iqn: &str,
    portals: &[iscsi::Portal],
    group_id: u16,
) -> Vec<scsi::TargetPort> {
    portals
        .iter()
        .map(|p| scsi::TargetPort {
            relative_id: p.tpgt,
            group_id,
            name: format!("{iqn},t,0x{:04x}", p.tpgt),
        })
        .collect()
}

/// The portals of `cfg` with their TPGTs (this node's port ids, in order).
pub(crate) fn iscsi_portals(cfg: &Config) -> Vec<iscsi::Portal> {
    let node_id = cfg.cluster.as_ref().map_or(1, |c| c.node_id);
    cfg.portals
        .iter()
        .enumerate()
        .map(|(i, p)| iscsi::Portal {
            addr: p.address,
            tpgt: port_id(node_id, i),
        })
        .collect()
}
