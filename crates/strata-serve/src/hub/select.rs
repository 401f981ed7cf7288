//! Which files of a repository make a Strata model directory.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{HubError, RemoteFile, RepoRef};

/// Single-file weights; the loader prefers it over an index.
pub(super) const SINGLE_WEIGHTS: &str = "model.safetensors";
/// Sharded weights: the index names the shards.
pub(super) const WEIGHTS_INDEX: &str = "model.safetensors.index.json";
/// Files a model directory cannot do without.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Files taken when the repo has them.
const OPTIONAL: [&str; 5] = [
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
];

/// A file name at the root of the repository that is safe to join to a directory.
pub(super) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0'])
}

/// Picks what a Strata model directory needs from a repository's files: the weights
/// (`model.safetensors`, or `model.safetensors.index.json` and the shards its
/// `weight_map` names — `index_json` is its content), `config.json`, `tokenizer.json`,
/// and those of `generation_config.json`, `tokenizer_config.json`,
/// `special_tokens_map.json`, `chat_template.jinja` and `tokenizer.model` it has. Only
/// files at the root count. Returns the files (weights first) and the skipped paths.
pub fn select_files(
    repo: &RepoRef,
    tree: &[RemoteFile],
    index_json: Option<&str>,
) -> Result<(Vec<RemoteFile>, Vec<String>), HubError> {
    let missing = |msg: String| HubError::MissingFiles { repo: format!("{}@{}", repo.repo, repo.revision), msg };
    let find = |name: &str| tree.iter().find(|f| f.path == name);
    let mut names: Vec<String> = Vec::new();
    if find(SINGLE_WEIGHTS).is_some() {
        names.push(SINGLE_WEIGHTS.into());
    } else if find(WEIGHTS_INDEX).is_some() {
        let index_json = index_json.ok_or_else(|| missing(format!("{WEIGHTS_INDEX} was not read")))?;
        #[derive(Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let index: Index = serde_json::from_str(index_json).map_err(|e| missing(format!("{WEIGHTS_INDEX}: {e}")))?;
        let mut shards: Vec<String> = index.weight_map.into_values().collect();
        shards.sort();
        shards.dedup();
        for shard in &shards {
            if !is_plain_name(shard) || !shard.ends_with(".safetensors") || find(shard).is_none() {
                return Err(missing(format!("{WEIGHTS_INDEX} names shard `{shard}`, which the repository lacks")));
            }
        }
        names.push(WEIGHTS_INDEX.into());
        names.extend(shards);
    } else {
        let gguf = tree.iter().any(|f| f.path.ends_with(".gguf"));
        let hint = if gguf { " (it has .gguf files: download one and give its path instead)" } else { "" };
        return Err(missing(format!("no {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}: Strata pulls safetensors weights{hint}")));
    }
    for name in REQUIRED {
        if find(name).is_none() {
            return Err(missing(format!("no {name}, which Strata needs to load the model")));
        }
        names.push(name.into());
    }
    names.extend(OPTIONAL.iter().filter(|n| find(n).is_some()).map(|n| n.to_string()));
    let files: Vec<RemoteFile> = names.iter().filter_map(|n| find(n).cloned()).collect();
    let skipped = tree.iter().filter(|f| !names.contains(&f.path)).map(|f| f.path.clone()).collect();
    Ok((files, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{Digest, parse_spec};

    fn repo(spec: &str) -> RepoRef {
        parse_spec(spec).unwrap()
    }

    fn lfs(path: &str) -> RemoteFile {
        RemoteFile { path: path.into(), size: 10, digest: Digest::Sha256("a".repeat(64)) }
    }

    fn git(path: &str) -> RemoteFile {
        RemoteFile { path: path.into(), size: 3, digest: Digest::GitSha1("b".repeat(40)) }
    }

    fn paths(files: &[RemoteFile]) -> Vec<&str> {
        files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn single_file_weights_and_tokenizer_files_are_selected() {
        let tree = [
            git(".gitattributes"),
            git("README.md"),
            git("config.json"),
            lfs("model.safetensors"),
            lfs("pytorch_model.bin"),
            git("tokenizer.json"),
            git("tokenizer_config.json"),
            lfs("tokenizer.model"),
            git("chat_template.jinja"),
            lfs("onnx/model.safetensors"),
            lfs("model-q4.gguf"),
        ];
        let (files, skipped) = select_files(&repo("hf:o/m"), &tree, None).unwrap();
        assert_eq!(
            paths(&files),
            [
                "model.safetensors",
                "config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "chat_template.jinja",
                "tokenizer.model"
            ]
        );
        assert_eq!(
            skipped,
            [".gitattributes", "README.md", "pytorch_model.bin", "onnx/model.safetensors", "model-q4.gguf"]
        );
    }

    #[test]
    fn sharded_weights_follow_the_index() {
        let tree = [
            git("config.json"),
            git("tokenizer.json"),
            git(WEIGHTS_INDEX),
            lfs("model-00001-of-00002.safetensors"),
            lfs("model-00002-of-00002.safetensors"),
            lfs("consolidated.safetensors"),
        ];
        let index = r#"{"metadata":{},"weight_map":{"a":"model-00002-of-00002.safetensors",
        "b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#;
        let (files, skipped) = select_files(&repo("hf:o/m"), &tree, Some(index)).unwrap();
        assert_eq!(
            paths(&files),
            [
                WEIGHTS_INDEX,
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "config.json",
                "tokenizer.json"
            ]
        );
        assert_eq!(skipped, ["consolidated.safetensors"]);

        // A single file wins over an index, as the loader prefers it.
        let mut with_single = tree.to_vec();
        with_single.push(lfs("model.safetensors"));
        let (files, _) = select_files(&repo("hf:o/m"), &with_single, None).unwrap();
        assert_eq!(paths(&files), ["model.safetensors", "config.json", "tokenizer.json"]);

        for bad in [
            r#"{"weight_map":{"a":"model-00003-of-00003.safetensors"}}"#,
            r#"{"weight_map":{"a":"../model-00001-of-00002.safetensors"}}"#,
            r#"{"weight_map":{"a":"config.json"}}"#,
        ] {
            let err = select_files(&repo("hf:o/m"), &tree, Some(bad)).unwrap_err();
            assert!(err.to_string().contains("names shard"), "{err}");
        }
        let err = select_files(&repo("hf:o/m"), &tree, Some("{}")).unwrap_err();
        assert!(err.to_string().contains(WEIGHTS_INDEX), "{err}");
    }

    #[test]
    fn missing_weights_or_tokenizer_are_named() {
        let err =
            select_files(&repo("hf:o/m@v2"), &[git("config.json"), git("tokenizer.json"), lfs("m.Q4_K_M.gguf")], None)
                .unwrap_err();
        assert_eq!(err.error_type(), "missing_files");
        let msg = err.to_string();
        assert!(msg.contains("hf:o/m@v2") && msg.contains("model.safetensors") && msg.contains(".gguf"), "{msg}");

        let err = select_files(&repo("hf:o/m"), &[git("config.json"), lfs("model.safetensors")], None).unwrap_err();
        assert!(err.to_string().contains("no tokenizer.json"), "{err}");
        let err = select_files(&repo("hf:o/m"), &[git("tokenizer.json"), lfs("model.safetensors")], None).unwrap_err();
        assert!(err.to_string().contains("no config.json"), "{err}");
    }

    #[test]
    fn plain_names_exclude_paths_and_hidden_files() {
        assert!(is_plain_name("model-00001-of-00002.safetensors"));
        for bad in ["", ".partial", "..", "a/b", "a\\b", "/etc/passwd"] {
            assert!(!is_plain_name(bad), "{bad}");
        }
    }
}
