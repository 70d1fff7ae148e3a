//! Implicit ALUA: target port group states, REPORT TARGET PORT GROUPS, and which
//! commands a port in Standby or Unavailable state still accepts (SPC-4 5.15.2.4).

use crate::cdb::{op, sa, Cdb};
use crate::lu::{CmdResult, Done};
use crate::sense::{codes, Sense};
use crate::{AluaState, PortGroup, TargetPort};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Port group states of one target, changeable at run time.
pub(crate) struct Alua {
    groups: RwLock<Vec<PortGroup>>,
    /// Relative port id -> group id.
    port_group: Vec<(u16, u16)>,
    /// Fast path: every group is active (no per-command lookup needed).
    all_active: AtomicBool,
}

fn active(s: AluaState) -> bool {
    matches!(
        s,
        AluaState::ActiveOptimized | AluaState::ActiveNonOptimized
    )
}

impl Alua {
    /// From the configuration; with no groups configured, one group per distinct
    /// `group_id` of the ports, active/optimized.
    pub fn new(ports: &[TargetPort], groups: &[PortGroup]) -> Alua {
        let mut groups = groups.to_vec();
        if groups.is_empty() {
            for p in ports {
                match groups.iter_mut().find(|g| g.id == p.group_id) {
                    Some(g) => g.relative_port_ids.push(p.relative_id),
                    None => groups.push(PortGroup {
                        id: p.group_id,
                        state: AluaState::ActiveOptimized,
                        relative_port_ids: vec![p.relative_id],
                    }),
                }
            }
        }
        let mut port_group: Vec<(u16, u16)> =
            ports.iter().map(|p| (p.relative_id, p.group_id)).collect();
        for g in &groups {
            for &rel in &g.relative_port_ids {
                if !port_group.iter().any(|&(r, _)| r == rel) {
                    port_group.push((rel, g.id));
                }
            }
        }
        let all_active = groups.iter().all(|g| active(g.state));
        Alua {
            groups: RwLock::new(groups),
            port_group,
            all_active: AtomicBool::new(all_active),
        }
    }

    /// A snapshot of the groups.
    pub fn groups(&self) -> Vec<PortGroup> {
        self.groups.read().clone()
    }

    /// Sets a group's state; false when no such group exists.
    pub fn set_state(&self, group_id: u16, state: AluaState) -> bool {
        let mut groups = self.groups.write();
        let Some(g) = groups.iter_mut().find(|g| g.id == group_id) else {
            return false;
        };
        g.state = state;
        let all = groups.iter().all(|g| active(g.state));
        self.all_active.store(all, Ordering::Release);
        true
    }

    /// State of the group the port belongs to (active when the port is unknown).
    pub fn port_state(&self, relative_port_id: u16) -> AluaState {
        if self.all_active.load(Ordering::Acquire) {
            return AluaState::ActiveOptimized;
        }
        let Some(&(_, gid)) = self
            .port_group
            .iter()
            .find(|&&(r, _)| r == relative_port_id)
        else {
            return AluaState::ActiveOptimized;
        };
        self.groups
            .read()
            .iter()
            .find(|g| g.id == gid)
            .map_or(AluaState::ActiveOptimized, |g| g.state)
    }

    /// NOT READY sense when `cdb` may not run through a port in `state`.
    pub fn check(&self, relative_port_id: u16, cdb: &Cdb) -> Result<(), Sense> {
        match self.port_state(relative_port_id) {
            AluaState::ActiveOptimized | AluaState::ActiveNonOptimized => Ok(()),
            AluaState::Standby if allowed_in_standby(cdb) => Ok(()),
            AluaState::Standby => Err(codes::PORT_STANDBY),
            AluaState::Unavailable if allowed_in_unavailable(cdb) => Ok(()),
            AluaState::Unavailable => Err(codes::PORT_UNAVAILABLE),
        }
    }

    /// REPORT TARGET PORT GROUPS (MAINTENANCE IN / 0x0a).
    pub fn report(&self, cdb: &Cdb) -> CmdResult {
        let extended = match cdb.b(1) >> 5 {
            0 => false,
            1 => true,
            _ => return Err(cdb.invalid(1, Some(7)).into()),
        };
        let alloc_len = cdb.u32_at(6);
        let mut d = vec![0u8; if extended { 8 } else { 4 }];
        if extended {
            d[4] = 0x10; // FORMAT TYPE 001b
        }
        for g in self.groups.read().iter() {
            let state = match g.state {
                AluaState::ActiveOptimized => 0,
                AluaState::ActiveNonOptimized => 1,
                AluaState::Standby => 2,
                AluaState::Unavailable => 3,
            };
            d.push(0x80 | state); // PREF, state
            d.push(0x0f); // U_SUP, S_SUP, AN_SUP, AO_SUP
            d.extend_from_slice(&g.id.to_be_bytes());
            d.push(0);
            d.push(0x02); // STATUS CODE: altered by implicit ALUA behaviour
            d.push(0);
            let ports = &g.relative_port_ids[..g.relative_port_ids.len().min(255)];
            d.push(ports.len() as u8);
            for &p in ports {
                d.extend_from_slice(&[0, 0]);
                d.extend_from_slice(&p.to_be_bytes());
            }
        }
        let n = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&n.to_be_bytes());
        Ok(Done::alloc(d, alloc_len))
    }
}

fn maintenance_in_mgmt(cdb: &Cdb) -> bool {
    cdb.opcode() == op::MAINTENANCE_IN
        && matches!(
            cdb.service_action(),
            sa::REPORT_TARGET_PORT_GROUPS
                | sa::REPORT_SUPPORTED_OPCODES
                | sa::REPORT_SUPPORTED_TMFS
        )
}

/// Commands a Standby port accepts.
fn allowed_in_standby(cdb: &Cdb) -> bool {
    matches!(
        cdb.opcode(),
        op::INQUIRY
            | op::REPORT_LUNS
            | op::REQUEST_SENSE
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::PR_IN
            | op::PR_OUT
    ) || maintenance_in_mgmt(cdb)
}

/// Commands an Unavailable port accepts.
fn allowed_in_unavailable(cdb: &Cdb) -> bool {
    matches!(
        cdb.opcode(),
        op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE
    ) || maintenance_in_mgmt(cdb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> Vec<TargetPort> {
        vec![
            TargetPort {
                relative_id: 1,
                group_id: 1,
                name: "t,t,0x1".into(),
            },
            TargetPort {
                relative_id: 2,
                group_id: 2,
                name: "t,t,0x2".into(),
            },
        ]
    }

    #[test]
    fn standby_blocks_io_but_not_inquiry() {
        let a = Alua::new(&ports(), &[]);
        assert_eq!(a.groups().len(), 2);
        assert!(a.set_state(2, AluaState::Standby));
        assert!(!a.set_state(9, AluaState::Standby));
        let read = Cdb::parse(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap();
        let inq = Cdb::parse(&[0x12, 0, 0, 0, 36, 0]).unwrap();
        assert!(a.check(1, &read).is_ok());
        assert_eq!(a.check(2, &read), Err(codes::PORT_STANDBY));
        assert!(a.check(2, &inq).is_ok());
        a.set_state(2, AluaState::Unavailable);
        assert_eq!(a.check(2, &read), Err(codes::PORT_UNAVAILABLE));
    }
}
