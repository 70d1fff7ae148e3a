//! Property test: random operation sequences on a small file give the same reads as
//! `block::MemVolume`, for both engines, on disk and on tmpfs.

use crate::common;

use block::{Bytes, ExtentState, MemVolume, Volume};
use common::{create_opts, ENGINES};
use disk::{Engine, FileOptions, FileVolume};
use proptest::prelude::*;

const BLOCKS: u64 = 96;
const BS: u64 = 512;

#[derive(Debug, Clone)]
enum Step {
    Write {
        lba: u64,
        blocks: u64,
        seed: u8,
        fua: bool,
    },
    Read {
        lba: u64,
        blocks: u64,
    },
    Discard {
        lba: u64,
        blocks: u64,
    },
    WriteZeroes {
        lba: u64,
        blocks: u64,
        may_unmap: bool,
    },
    Flush,
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..BLOCKS).prop_flat_map(|lba| (Just(lba), 1..=(BLOCKS - lba).min(40)))
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (range(), any::<u8>(), any::<bool>())
            .prop_map(|((lba, blocks), seed, fua)| Step::Write { lba, blocks, seed, fua }),
        3 => range().prop_map(|(lba, blocks)| Step::Read { lba, blocks }),
        2 => range().prop_map(|(lba, blocks)| Step::Discard { lba, blocks }),
        2 => (range(), any::<bool>())
            .prop_map(|((lba, blocks), may_unmap)| Step::WriteZeroes { lba, blocks, may_unmap }),
        1 => Just(Step::Flush),
    ]
}

fn data(lba: u64, blocks: u64, seed: u8) -> Bytes {
    // Never all-zero, so a lost write shows.
    Bytes::from(common::pattern(lba, blocks, BS, seed | 0x80))
}

async fn run(
    engine: Engine,
    nowait_inline: bool,
    dir: &std::path::Path,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let path = dir.join(format!("oracle-{engine:?}-{nowait_inline}"));
    let _ = std::fs::remove_file(&path);
    let opts = FileOptions {
        nowait_inline,
        ..create_opts(engine, BLOCKS * BS)
    };
    let vol = FileVolume::open(&path, &opts).expect("open");
    let oracle = MemVolume::new(BS as u32, BLOCKS);
    for (i, s) in steps.iter().enumerate() {
        match *s {
            Step::Write {
                lba,
                blocks,
                seed,
                fua,
            } => {
                let d = data(lba, blocks, seed);
                vol.write(lba, d.clone(), fua).await.expect("write");
                oracle.write(lba, d, fua).await.expect("oracle write");
            }
            Step::Read { lba, blocks } => {
                let got = vol.read(lba, blocks as u32).await.expect("read");
                let want = oracle.read(lba, blocks as u32).await.expect("oracle read");
                prop_assert_eq!(got, want, "step {} {:?}", i, s);
            }
            Step::Discard { lba, blocks } => {
                vol.discard(lba, blocks).await.expect("discard");
                oracle.discard(lba, blocks).await.expect("oracle discard");
            }
            Step::WriteZeroes {
                lba,
                blocks,
                may_unmap,
            } => {
                vol.write_zeroes(lba, blocks, may_unmap)
                    .await
                    .expect("write_zeroes");
                oracle
                    .write_zeroes(lba, blocks, may_unmap)
                    .await
                    .expect("oracle wz");
            }
            Step::Flush => vol.flush().await.expect("flush"),
        }
    }
    let got = vol.read(0, BLOCKS as u32).await.expect("final read");
    let want = oracle
        .read(0, BLOCKS as u32)
        .await
        .expect("oracle final read");
    prop_assert_eq!(&got, &want);
    // Whatever block status calls deallocated must read as zero.
    for e in vol.block_status(0, BLOCKS).await.expect("block_status") {
        if e.state == ExtentState::Deallocated {
            let s = (e.lba * BS) as usize;
            let n = (e.blocks * BS) as usize;
            prop_assert!(want[s..s + n].iter().all(|&b| b == 0), "extent {:?}", e);
        }
    }
    Ok(())
}

fn dirs() -> &'static [tempfile::TempDir] {
    static DIRS: std::sync::OnceLock<Vec<tempfile::TempDir>> = std::sync::OnceLock::new();
    DIRS.get_or_init(common::dirs)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn file_volume_matches_memory_oracle(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        for dir in dirs() {
            for engine in ENGINES {
                for nowait_inline in [true, false] {
                    rt.block_on(run(engine, nowait_inline, dir.path(), &steps))?;
                }
            }
        }
    }
}
