//! Checking a downloaded file's digest as its bytes arrive.

use sha2::Digest as _;

use super::{Digest, RemoteFile};

/// SHA-256 or git blob sha1, fed as bytes arrive.
pub(super) enum Hasher {
    Sha256(sha2::Sha256),
    GitSha1(sha1::Sha1),
}

impl Hasher {
    pub(super) fn new(file: &RemoteFile) -> Self {
        match file.digest {
            Digest::Sha256(_) => Hasher::Sha256(sha2::Sha256::new()),
            Digest::GitSha1(_) => {
                let mut h = sha1::Sha1::new();
                h.update(format!("blob {}\0", file.size).as_bytes());
                Hasher::GitSha1(h)
            }
        }
    }

    pub(super) fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::GitSha1(h) => h.update(bytes),
        }
    }

    pub(super) fn finish(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::GitSha1(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashers_compute_sha256_and_git_blob_ids() {
        // `printf 'hello world\n' | git hash-object --stdin` and `| sha256sum`.
        let content = b"hello world\n";
        let git_file =
            RemoteFile { path: "a".into(), size: content.len() as u64, digest: Digest::GitSha1(String::new()) };
        let mut h = Hasher::new(&git_file);
        h.update(&content[..5]);
        h.update(&content[5..]);
        assert_eq!(h.finish(), "3b18e512dba79e4c8300dd08aeb37f8e728b8dad");
        let empty = RemoteFile { path: "e".into(), size: 0, digest: Digest::GitSha1(String::new()) };
        assert_eq!(Hasher::new(&empty).finish(), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        let lfs_file = RemoteFile { path: "b".into(), size: 12, digest: Digest::Sha256(String::new()) };
        let mut h = Hasher::new(&lfs_file);
        h.update(content);
        assert_eq!(h.finish(), "a948904f2f0f479b8f8197694b30184b0d2ed1c1cd2a1ec0fb85d299a192a447");
    }
}
