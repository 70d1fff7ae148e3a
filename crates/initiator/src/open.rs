//! `open_url`: URL -> discovery -> one session per portal -> multipath volume.

use crate::login::{random_isid, LoginOptions};
use crate::lun::{IscsiLun, LunOptions};
use crate::multipath::{Multipath, MultipathOptions, PathPolicy};
use crate::url::parse_iscsi_url;
use crate::{discover, InitiatorError};
use block::Volume;
use std::net::SocketAddr;
use std::sync::Arc;

/// How [`open_url`] connects.
#[derive(Clone)]
pub struct OpenOptions {
    /// InitiatorName (IQN).
    pub initiator_name: String,
    /// Use only the portal of the URL (no discovery, one path).
    pub single_path: bool,
    /// Path selection policy (overrides `multipath.policy`).
    pub policy: PathPolicy,
    /// CHAP user and secret when the URL carries none (the URL's win).
    pub chap: Option<(String, String)>,
    /// Ask for HeaderDigest=CRC32C.
    pub header_digest: bool,
    /// Ask for DataDigest=CRC32C.
    pub data_digest: bool,
    /// Target credentials for mutual CHAP (user, secret), if wanted.
    pub mutual_chap: Option<(String, String)>,
    /// Per-LUN behaviour (queue depth per path, retries).
    pub lun: LunOptions,
    /// Multipath behaviour (reconnection, retry delays; its policy is ignored).
    pub multipath: MultipathOptions,
    /// Longest a command may wait; a timeout counts as a path failure.
    pub command_timeout_ms: u64,
    /// Longest one login may take.
    pub login_timeout_ms: u64,
}

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("initiator_name", &self.initiator_name)
            .field("single_path", &self.single_path)
            .field("policy", &self.policy)
            .field("chap_user", &self.chap.as_ref().map(|c| &c.0))
            .field("header_digest", &self.header_digest)
            .field("data_digest", &self.data_digest)
            .field("lun", &self.lun)
            .field("multipath", &self.multipath)
            .field("command_timeout_ms", &self.command_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            initiator_name: "iqn.2026-01.org.freesan:initiator".to_string(),
            single_path: false,
            policy: PathPolicy::RoundRobin,
            chap: None,
            header_digest: false,
            data_digest: false,
            mutual_chap: None,
            lun: LunOptions::default(),
            multipath: MultipathOptions::default(),
            command_timeout_ms: 15_000,
            login_timeout_ms: 10_000,
        }
    }
}

/// Opens the LUN named by `url` as a [`Multipath`] volume: discovers every portal
/// of the target with SendTargets on the URL's portal (unless `single_path`), logs
/// in once per portal with distinct ISIDs, checks every path is the same LUN.
/// Portals that cannot be logged in to are left out (logged); at least one must work.
pub async fn open_multipath(url: &str, opts: &OpenOptions) -> Result<Multipath, InitiatorError> {
    let u = parse_iscsi_url(url).map_err(|e| InitiatorError::InvalidRequest(url_err(e)))?;
    let addr = u
        .socket_addr()
        .map_err(|_| InitiatorError::NotFound(format!("cannot resolve {}", u.host)))?;
    let chap = u.chap().or_else(|| opts.chap.clone());
    let mut portals: Vec<SocketAddr> = vec![addr];
    if !opts.single_path {
        match discover(addr, &opts.initiator_name, chap.clone()).await {
            Ok(targets) => {
                let t = targets
                    .into_iter()
                    .find(|(iqn, _)| *iqn == u.target_iqn)
                    .ok_or_else(|| InitiatorError::NotFound(u.target_iqn.clone()))?;
                for (a, _tpgt) in t.1 {
                    if !portals.contains(&a) {
                        portals.push(a);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "discovery failed; using the URL's portal only")
            }
        }
    }
    let base = random_isid(0);
    let logins = portals.iter().enumerate().map(|(i, a)| {
        let mut lo = LoginOptions::new(&opts.initiator_name, &u.target_iqn);
        lo.isid = base;
        lo.isid[5] = i as u8;
        lo.isid[4] = (i >> 8) as u8;
        lo.chap = chap.clone();
        lo.mutual_chap = opts.mutual_chap.clone();
        lo.header_digest = opts.header_digest;
        lo.data_digest = opts.data_digest;
        lo.command_timeout_ms = opts.command_timeout_ms;
        lo.login_timeout_ms = opts.login_timeout_ms;
        let (a, lun, lun_opts) = (*a, u.lun, opts.lun);
        async move { (a, IscsiLun::connect(a, &lo, lun, lun_opts).await) }
    });
    let mut paths = Vec::new();
    let mut first_err = None;
    for (a, r) in join_all(logins).await {
        match r {
            Ok(l) => paths.push(l),
            Err(e) => {
                tracing::warn!(addr = %a, error = %e, "path login failed; left out");
                first_err.get_or_insert(e);
            }
        }
    }
    if paths.is_empty() {
        return Err(first_err.unwrap_or(InitiatorError::NotFound(u.target_iqn)));
    }
    let mp_opts = MultipathOptions {
        policy: opts.policy,
        ..opts.multipath
    };
    Multipath::new(paths, mp_opts)
}

/// [`open_multipath`] as a plain volume (what `freesan bench` uses).
pub async fn open_url(url: &str, opts: &OpenOptions) -> Result<Arc<dyn Volume>, InitiatorError> {
    Ok(Arc::new(open_multipath(url, opts).await?))
}

fn url_err(e: crate::UrlError) -> &'static str {
    match e {
        crate::UrlError::Scheme => "not an iscsi:// URL",
        crate::UrlError::Host(h) => h,
        crate::UrlError::Port => "bad port in URL",
        crate::UrlError::Target => "missing target name in URL",
        crate::UrlError::Lun => "bad LUN in URL",
        crate::UrlError::Resolve(_) => "cannot resolve host",
    }
}

/// Runs futures concurrently on the current task and collects their outputs in order.
async fn join_all<F: std::future::Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = (0..handles.len()).map(|_| None).collect();
    let mut handles: Vec<Option<_>> = handles.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (h, o) in handles.iter_mut().zip(outs.iter_mut()) {
            if let Some(f) = h {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *o = Some(v);
                        *h = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
}
