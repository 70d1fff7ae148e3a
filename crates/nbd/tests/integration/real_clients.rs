//! The server driven by real NBD clients from Debian: qemu-img, nbdinfo (libnbd)
//! and fio's nbd engine (libnbd). Each test skips with a message when its tool is
//! missing, and fails instead when FREESAN_REQUIRE_TOOLS=1.

use crate::common;

use block::{Bytes, Volume};
use common::{pattern, start};
use nbd::NbdLimits;
use std::process::{Command, Output};

const MIB: usize = 1 << 20;

fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("FREESAN_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{tool} is required (FREESAN_REQUIRE_TOOLS=1) but not installed");
        }
        eprintln!("SKIP: {tool} is not installed");
    }
    ok
}

async fn run(tool: &str, args: Vec<String>) -> Output {
    let tool = tool.to_string();
    let shown = format!("{tool} {}", args.join(" "));
    // Tools that drop state files (fio) do it in a scratch directory.
    let cwd = tempfile::tempdir().unwrap();
    let dir = cwd.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&tool).args(&args).current_dir(&dir).output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("{shown}: {e}"));
    eprintln!(
        "$ {shown}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{shown} failed: {:?}", out.status);
    out
}

async fn volume_bytes(v: &block::MemVolume) -> Vec<u8> {
    let g = v.geometry();
    let step = (8 * MIB) as u64 / g.block_size_bytes as u64;
    let mut out = Vec::with_capacity(g.size_bytes() as usize);
    let mut lba = 0;
    while lba < g.block_count {
        let n = step.min(g.block_count - lba);
        out.extend_from_slice(&v.read(lba, n as u32).await.unwrap());
        lba += n;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_convert_in_and_out() {
    if !have("qemu-img") {
        return;
    }
    let size = 64 * MIB;
    let srv = start(&[(4096, (size / 4096) as u64, false)], NbdLimits::default()).await;
    let url = format!("nbd://{}/lun0", srv.addr);
    let dir = tempfile::tempdir().unwrap();
    // Data with holes, so qemu-img uses both WRITE and WRITE_ZEROES.
    let mut src = pattern(42, size);
    for mib in (0..64).step_by(5) {
        src[mib * MIB..(mib + 1) * MIB].fill(0);
    }
    let src_path = dir.path().join("src.img");
    std::fs::write(&src_path, &src).unwrap();
    // Something already on the LUN where the image has zeroes: must be overwritten.
    srv.volumes[0]
        .write(0, Bytes::from(vec![0xEEu8; MIB]), false)
        .await
        .unwrap();

    run(
        "qemu-img",
        vec![
            "convert".into(),
            "-n".into(),
            "-f".into(),
            "raw".into(),
            "-O".into(),
            "raw".into(),
            src_path.display().to_string(),
            url.clone(),
        ],
    )
    .await;
    let on_lun = volume_bytes(&srv.volumes[0]).await;
    assert!(
        on_lun == src,
        "LUN differs from the image after qemu-img convert in"
    );

    // Change the LUN directly, then copy it out.
    let patch = pattern(7, 3 * MIB);
    srv.volumes[0]
        .write(1000, Bytes::from(patch.clone()), false)
        .await
        .unwrap();
    let mut expect = src;
    expect[1000 * 4096..1000 * 4096 + 3 * MIB].copy_from_slice(&patch);
    let out_path = dir.path().join("out.img");
    run(
        "qemu-img",
        vec![
            "convert".into(),
            "-f".into(),
            "raw".into(),
            "-O".into(),
            "raw".into(),
            url.clone(),
            out_path.display().to_string(),
        ],
    )
    .await;
    let out = std::fs::read(&out_path).unwrap();
    assert_eq!(out.len(), size);
    assert!(
        out == expect,
        "image differs from the LUN after qemu-img convert out"
    );

    let info = run(
        "qemu-img",
        vec!["info".into(), "-f".into(), "raw".into(), url],
    )
    .await;
    assert!(String::from_utf8_lossy(&info.stdout).contains("64 MiB"));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_shows_size_and_list() {
    if !have("nbdinfo") {
        return;
    }
    let srv = start(
        &[(4096, 16384, false), (512, 2048, true)],
        NbdLimits::default(),
    )
    .await;
    let out = run("nbdinfo", vec![format!("nbd://{}/lun0", srv.addr)]).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("export-size: 67108864"), "{text}");
    assert!(text.contains("block_size_preferred: 4096"), "{text}");
    assert!(text.contains("can_multi_conn: true"), "{text}");
    assert!(text.contains("is_read_only: false"), "{text}");

    let out = run("nbdinfo", vec![format!("nbd://{}/lun1", srv.addr)]).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("export-size: 1048576"), "{text}");
    assert!(text.contains("is_read_only: true"), "{text}");

    let out = run(
        "nbdinfo",
        vec!["--list".into(), format!("nbd://{}", srv.addr)],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("lun0") && text.contains("lun1"), "{text}");
    assert!(text.contains("freesan test LUN 1"), "{text}");

    // Empty export name: the default export.
    let out = run(
        "nbdinfo",
        vec!["--size".into(), format!("nbd://{}", srv.addr)],
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "67108864");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_nbd_engine_write_verify_and_randrw() {
    if !have("fio") {
        return;
    }
    let srv = start(&[(4096, 16384, false)], NbdLimits::default()).await;
    let uri = format!("--uri=nbd://{}/lun0", srv.addr);
    let common = |name: &str| -> Vec<String> {
        vec![
            format!("--name={name}"),
            "--ioengine=nbd".into(),
            uri.clone(),
            "--bs=4k".into(),
            "--iodepth=16".into(),
            "--size=32m".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--verify_state_save=0".into(),
        ]
    };
    // Every block written at queue depth 16, then read back and checked.
    let mut args = common("writeverify");
    args.extend(["--rw=randwrite".to_string(), "--do_verify=1".into()]);
    let out = run("fio", args).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("err= 0"), "{text}");
    // Mixed random I/O for three seconds, verifying what it reads back.
    let mut args = common("randrw");
    args.extend([
        "--rw=randrw".to_string(),
        "--runtime=3".into(),
        "--time_based".into(),
    ]);
    let out = run("fio", args).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("err= 0"), "{text}");
    srv.stop().await;
}
