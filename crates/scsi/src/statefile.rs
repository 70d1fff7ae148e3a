//! Small per-LUN state files (reservations, explicit ALUA states, a sanitize in
//! progress), written so that a crash leaves either the old or the new file:
//! temporary file, fsync, rename over the name, fsync of the folder.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::File::open(dir)?.sync_all()
}

/// The state file `kind` of the LU whose reservation state file is
/// `pr_state_file`: `lunN.pr.json` gives `lunN.KIND.json`.
pub(crate) fn beside(pr_state_file: &Path, kind: &str) -> std::path::PathBuf {
    let name = pr_state_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".pr.json").unwrap_or(&name);
    pr_state_file.with_file_name(format!("{stem}.{kind}.json"))
}

/// Replaces `path` with `bytes` atomically (creating its folder if needed).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    {
        let mut f = fs::File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(tmp, path)?;
    sync_parent(path)
}

/// Removes `path` and syncs its folder; a missing file is fine.
pub(crate) fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sync_parent(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
