//! Serves one in-memory LUN for trying real initiators by hand:
//! `cargo run -p iscsi --example serve -- 127.0.0.1:3260`, then
//! `iscsi-ls iscsi://127.0.0.1:3260` or `iscsi-inq iscsi://127.0.0.1:3260/iqn.2026-01.org.freesan:mem/0`.

use block::MemVolume;
use iscsi::{Auth, Limits, Portal, Server, ServerConfig, TargetSpec};
use std::sync::Arc;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3260".into());
    let name = "iqn.2026-01.org.freesan:mem".to_string();
    let vol: block::VolumeRef = Arc::new(MemVolume::new(512, 1 << 21));
    let scsi = scsi::ScsiTarget::new(scsi::TargetConfig {
        name: name.clone(),
        ports: vec![scsi::TargetPort {
            relative_id: 1,
            group_id: 1,
            name: format!("{name},t,0x0001"),
        }],
        port_groups: vec![],
        luns: vec![(
            0,
            scsi::LunConfig {
                naa: [0x60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                serial: "MEM0001".into(),
                vendor: "FREESAN".into(),
                product: "MEMORY".into(),
                revision: "0001".into(),
                read_only: false,
                state_file: None,
                physical_block_exponent: 0,
                sanitize_rate_bytes_per_s: 0,
            },
            vol,
        )],
    })
    .map_err(std::io::Error::other)?;
    let server = Server::bind(ServerConfig {
        partner_portals: Vec::new(),
        portals: vec![Portal {
            addr: addr.parse().map_err(std::io::Error::other)?,
            tpgt: 1,
        }],
        targets: vec![TargetSpec {
            iqn: name,
            alias: Some("mem".into()),
            scsi: Arc::new(scsi),
            auth: Auth::default(),
            allowed_initiators: vec![],
        }],
        discovery_auth: Auth::default(),
        limits: Limits::default(),
        buffers: block::BufferBudget::unlimited(),
    })
    .await?;
    eprintln!("serving on {:?}", server.local_addrs());
    server
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}
