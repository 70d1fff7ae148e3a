//! Small files replaced so that a crash leaves the old content or the new one
//! whole, never a mix or nothing: the state, keys and identities the layers
//! keep beside the data.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Replaces the file at `path` with `bytes`: a temporary file beside it (its
/// name with `.tmp` added, mode 0600: these files are the node's own, some
/// hold keys), fsync, rename over `path`, fsync of the folder (the rename
/// itself must survive a crash).
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)?;
    // (a temporary file left by an older version may have a looser mode)
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, path)?;
    sync_parent(path)
}

/// Fsyncs the folder holding `path` (the current folder for a bare name).
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_private() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        // a temporary file an older version left, readable by all
        let mut tmp = p.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, b"old").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        replace_file(&p, b"one").unwrap();
        replace_file(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // no temporary file left beside it
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
