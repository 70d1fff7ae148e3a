//! What a cache device's disk asks the cache before it gives itself up on a
//! command timeout ([`block::Keeper`]; the disk side is `disk::TimedDisk`).
//! The pool's members ask the same of their pool (raid's `keep.rs`).
//!
//! A device that stopped answering is failed, as on any device error, when
//! the cache can do without it:
//! - a replacement still being filled (its resilver gives it up);
//! - a device holding no dirty data nobody else holds: its loss costs hits;
//! - a mirror half whose partner is live and answers a read (at a place of
//!   its own, within half the timeout).
//!
//! It is waited for instead, one more timeout at a time, when it holds
//! the only copy of dirty data (the last live half of a mirror, or a device
//! of a cache without one): failing it would lose acknowledged writes that
//! the stall's end would have kept; and when its mirror partner is silent
//! too (a stall they share: one controller, one path). The disk gives up
//! after `disk::KEEP_TIMEOUT_FACTOR` timeouts all the same.
//!
//! While the cache opens (a node starting), before it knows what each
//! device holds, each device gets an [`OpeningKeeper`]: waited for while
//! every other device is silent to a read too (a stall they share), given
//! up when one answers (the open goes on without it, as before). Before
//! it, a stall both halves of a write-back mirror shared at start-up
//! failed them both, their dirty data with them.

use crate::ssd::DeviceLayout;
use crate::volume::Inner;
use async_trait::async_trait;
use block::{Keeper, Unanswered, VolumeRef};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The keeper of cache device `index`, while `volume` is that device (a
/// replaced one's keeper answers nothing for its successor).
struct DeviceKeeper {
    cache: Weak<Inner>,
    index: usize,
    volume: Weak<dyn block::Volume>,
}

/// The keeper of a device while its cache opens (see the module's header);
/// [`Inner::keep_devices`] replaces it once the cache is open. It asks the
/// others a read whatever went unanswered: where a write may go on a
/// device is known only once its header is read. It holds them weakly.
struct OpeningKeeper {
    name: String,
    others: Vec<Weak<dyn block::Volume>>,
}

#[async_trait]
impl Keeper for OpeningKeeper {
    async fn may_give_up(&self, limit: Duration, _unanswered: Unanswered) -> bool {
        let others: Vec<VolumeRef> = self.others.iter().filter_map(Weak::upgrade).collect();
        if others.is_empty() {
            return true;
        }
        let probes = others
            .into_iter()
            .map(|v| block::probe(v, Unanswered::Read, None));
        let alone = block::any_answers(probes, limit / 2).await;
        if !alone {
            tracing::warn!(device = %self.name,
                "cache device has stopped answering while the cache opens, and so have \
                 the others: a stall they share, waited for");
        }
        alone
    }
}

/// Gives each of `devices`, about to be opened as a cache, an
/// [`OpeningKeeper`].
pub(crate) fn keep_while_opening(devices: &[crate::volume::CacheDevice]) {
    for (i, d) in devices.iter().enumerate() {
        let others = devices
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, o)| Arc::downgrade(&o.volume))
            .collect();
        d.volume.keep_with(Arc::new(OpeningKeeper {
            name: d.name.clone(),
            others,
        }));
    }
}

impl Inner {
    /// Gives every device's disk this cache as its keeper (again: after a
    /// replacement took a device's place).
    pub(crate) fn keep_devices(self: &Arc<Self>) {
        for (index, d) in self.devs.iter().enumerate() {
            let v = d.vol();
            v.keep_with(Arc::new(DeviceKeeper {
                cache: Arc::downgrade(self),
                index,
                volume: Arc::downgrade(&v),
            }));
        }
    }

    /// Whether device `index` holds dirty data (the mirror's or its own).
    fn device_holds_dirty(&self, index: usize) -> bool {
        let st = self.state.lock();
        if st.dirty_frames == 0 {
            return false;
        }
        if self.mirrored {
            return true;
        }
        let n = self.devs.len();
        (index..self.frames as usize)
            .step_by(n)
            .any(|slot| st.dirty.get(slot as u32) != 0)
    }
}

#[async_trait]
impl Keeper for DeviceKeeper {
    async fn may_give_up(&self, limit: Duration, unanswered: Unanswered) -> bool {
        let Some(cache) = self.cache.upgrade() else {
            return true;
        };
        let Some(me) = cache.devs.get(self.index) else {
            return true;
        };
        let same = self
            .volume
            .upgrade()
            .is_some_and(|v| Arc::ptr_eq(&v, &me.vol()));
        if !same || me.is_failed() || me.resilver_cursor().is_some() {
            return true;
        }
        if !cache.device_holds_dirty(self.index) {
            return true;
        }
        // the live, filled partners holding the same dirty data
        let partners: Vec<_> = cache
            .devs
            .iter()
            .enumerate()
            .filter(|&(i, d)| {
                cache.mirrored && i != self.index && !d.is_failed() && d.resilver_cursor().is_none()
            })
            .map(|(_, d)| d.vol())
            .collect();
        let layout = cache.layout;
        let name = me.name();
        drop(cache);
        if partners.is_empty() {
            tracing::warn!(device = %name, "cache device has stopped answering, but \
                holds the only copy of dirty data: waited for, not failed");
            return false;
        }
        let probes = partners.into_iter().map(|v| probe(v, layout, unanswered));
        let alone = block::any_answers(probes, limit / 2).await;
        if !alone {
            tracing::warn!(device = %name, ?unanswered, "cache device has stopped \
                answering, and so has its mirror partner: a stall they share, waited for");
        }
        alone
    }
}

/// One question to the mirror partner of a silent device, of the kind the
/// device left unanswered ([`block::probe`]); a write goes to a page the
/// layout leaves free, so that a stall holding writes only (a frozen file
/// system under device files, which still answers reads) is seen as
/// shared. A device the layout fills to the page is asked a read.
async fn probe(partner: VolumeRef, layout: DeviceLayout, unanswered: Unanswered) -> bool {
    let g = partner.geometry();
    let spare = layout
        .free_page(g.size_bytes())
        .map(|at| at / u64::from(g.block_size_bytes));
    block::probe(partner, unanswered, spare).await
}
