//! Models by name from a hub: downloads from a mock hub on loopback (fresh, resumed after
//! a cut, resumed from an earlier run, corrupt, offline, sharded, split, gated), checked
//! on the bytes and links they leave in the cache; then `tessera generate --model
//! org/repo:TAG` downloading the default model and answering from it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::mock_hub::{noise, MockFile, MockHub, COMMIT};
use tessera_server::hub::{fetch, HubError, HubSettings, ModelRef};

/// A fresh cache folder for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tessera-hub-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn settings(hub: &MockHub, cache: &Path) -> HubSettings {
    HubSettings {
        endpoint: hub.base.clone(),
        token: None,
        offline: false,
        cache_dir: cache.to_path_buf(),
        progress_bar: false,
    }
}

fn model(text: &str) -> ModelRef {
    ModelRef::parse(text, None).unwrap()
}

const MIB: usize = 1 << 20;

fn gguf_repo() -> Vec<MockFile> {
    vec![
        MockFile::new("README.md", b"# a model\n".to_vec(), false),
        MockFile::new("m-Q4_K_M.gguf", noise(3 * MIB + 17, 1), true),
        MockFile::new("m-Q8_0.gguf", noise(MIB, 2), true),
    ]
}

fn repo_folder(cache: &Path) -> PathBuf {
    cache.join("models--org--m-GGUF")
}

#[test]
fn a_fresh_download_lands_in_the_cache_layout_and_is_not_fetched_twice() {
    let files = gguf_repo();
    let hub = MockHub::start(vec![("org/m-GGUF", files.clone())]);
    let scratch = Scratch::new("fresh");
    let path = fetch(&model("org/m-GGUF:Q4_K_M"), &settings(&hub, &scratch.0)).unwrap();
    let repo = repo_folder(&scratch.0);
    assert_eq!(
        path,
        repo.join("snapshots").join(COMMIT).join("m-Q4_K_M.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), *files[1].bytes);
    assert_eq!(
        std::fs::read_link(&path).unwrap(),
        PathBuf::from("../../blobs").join(files[1].sha256())
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    let blobs: Vec<String> = std::fs::read_dir(repo.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        blobs,
        [files[1].sha256()],
        "only the chosen file, no partial left"
    );
    // One listing, one redirected transfer; the second run lists only.
    let transfers = hub.transfers();
    assert_eq!(transfers.len(), 2, "{transfers:?}");
    assert!(transfers[1].path.starts_with("/cdn/"), "{transfers:?}");
    let again = fetch(&model("org/m-GGUF:Q4_K_M"), &settings(&hub, &scratch.0)).unwrap();
    assert_eq!(again, path);
    assert_eq!(hub.transfers().len(), 2, "nothing downloaded again");
}

#[test]
fn a_cut_transfer_resumes_from_the_bytes_already_there() {
    let files = gguf_repo();
    let hub = MockHub::start(vec![("org/m-GGUF", files.clone())]);
    hub.behaviour
        .lock()
        .unwrap()
        .cut_first_transfer_at
        .insert("m-Q4_K_M.gguf".into(), MIB);
    let scratch = Scratch::new("cut");
    let path = fetch(&model("org/m-GGUF:Q4_K_M"), &settings(&hub, &scratch.0)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), *files[1].bytes);
    let cdn: Vec<_> = hub
        .transfers()
        .into_iter()
        .filter(|r| r.path.starts_with("/cdn/"))
        .collect();
    assert_eq!(cdn.len(), 2, "{cdn:?}");
    assert_eq!(cdn[0].range, None);
    // The second transfer asks only for what is missing: the cut came after at most
    // the first MiB.
    let from: usize = cdn[1]
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a range request: {cdn:?}"));
    assert!(from > 0 && from <= MIB, "resumed from {from}");
}

#[test]
fn a_partial_file_from_an_earlier_run_is_resumed() {
    let files = gguf_repo();
    let hub = MockHub::start(vec![("org/m-GGUF", files.clone())]);
    let scratch = Scratch::new("earlier");
    let blobs = repo_folder(&scratch.0).join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let partial = blobs.join(format!("{}.incomplete", files[1].sha256()));
    std::fs::write(&partial, &files[1].bytes[..12345]).unwrap();
    let path = fetch(&model("org/m-GGUF:Q4_K_M"), &settings(&hub, &scratch.0)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), *files[1].bytes);
    assert!(!partial.exists());
    let cdn = hub.transfers().pop().unwrap();
    assert_eq!(cdn.range.as_deref(), Some("bytes=12345-"));
}

#[test]
fn a_corrupt_download_is_refused_and_nothing_is_kept() {
    let files = gguf_repo();
    let hub = MockHub::start(vec![("org/m-GGUF", files.clone())]);
    hub.behaviour
        .lock()
        .unwrap()
        .corrupt
        .push("m-Q4_K_M.gguf".into());
    let scratch = Scratch::new("corrupt");
    let err = fetch(&model("org/m-GGUF:Q4_K_M"), &settings(&hub, &scratch.0)).unwrap_err();
    assert!(matches!(err, HubError::Corrupt { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("m-Q4_K_M.gguf"), "{text}");
    assert!(
        text.contains(&files[1].sha256()),
        "names the expected digest: {text}"
    );
    assert!(text.contains("sha256"), "{text}");
    let repo = repo_folder(&scratch.0);
    let left: Vec<_> = std::fs::read_dir(repo.join("blobs")).unwrap().collect();
    assert!(left.is_empty(), "no blob and no partial: {left:?}");
    assert!(!repo
        .join("snapshots")
        .join(COMMIT)
        .join("m-Q4_K_M.gguf")
        .exists());
    assert!(
        !repo.join("refs/main").exists(),
        "an unfinished model has no ref"
    );
}

#[test]
fn a_small_file_kept_in_git_is_checked_by_its_blob_id() {
    let mut files = gguf_repo();
    files.push(MockFile::new("config.json", b"{\"a\": 1}".to_vec(), false));
    files.push(MockFile::new("model.safetensors", noise(1000, 3), true));
    let hub = MockHub::start(vec![("org/m-GGUF", files)]);
    hub.behaviour
        .lock()
        .unwrap()
        .corrupt
        .push("config.json".into());
    let scratch = Scratch::new("gitblob");
    let err = fetch(&model("org/m-GGUF"), &settings(&hub, &scratch.0)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("config.json") && text.contains("git blob id"),
        "{text}"
    );
}

#[test]
fn offline_mode_reads_the_cache_without_a_request_or_names_what_is_missing() {
    let hub = MockHub::start(vec![("org/m-GGUF", gguf_repo())]);
    let scratch = Scratch::new("offline");
    let mut offline = settings(&hub, &scratch.0);
    offline.offline = true;
    let err = fetch(&model("org/m-GGUF:Q4_K_M"), &offline).unwrap_err();
    assert!(matches!(err, HubError::NotCached { .. }), "{err}");
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");
    assert!(hub.requests().is_empty(), "offline asks nothing");
    let online = fetch(&model("org/m-GGUF:Q4_K_M"), &settings(&hub, &scratch.0)).unwrap();
    let asked = hub.requests().len();
    assert_eq!(
        fetch(&model("org/m-GGUF:Q4_K_M"), &offline).unwrap(),
        online
    );
    // Another tag of the same repository was never downloaded.
    let err = fetch(&model("org/m-GGUF:Q8_0"), &offline).unwrap_err();
    assert!(err.to_string().contains("Q8_0"), "{err}");
    assert_eq!(hub.requests().len(), asked, "offline asks nothing");
}

#[test]
fn a_sharded_safetensors_folder_comes_whole_and_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/tiny-llama");
    let mut files: Vec<MockFile> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            let lfs = name.ends_with(".safetensors");
            MockFile::new(&name, std::fs::read(&path).unwrap(), lfs)
        })
        .collect();
    // Weights the index does not name are not downloaded.
    files.push(MockFile::new(
        "consolidated.safetensors",
        noise(5000, 9),
        true,
    ));
    files.push(MockFile::new("pytorch_model.bin", noise(5000, 8), true));
    let hub = MockHub::start(vec![("org/tiny-llama", files)]);
    let scratch = Scratch::new("sharded");
    let path = fetch(&model("org/tiny-llama"), &settings(&hub, &scratch.0)).unwrap();
    assert!(path.is_dir());
    let mut got: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "config.json",
            "embeddings.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            // The fixture's transformers logits and embeddings: every top-level JSON
            // file comes.
            "reference.json",
        ]
    );
    for name in &got {
        assert_eq!(
            std::fs::read(path.join(name)).unwrap(),
            std::fs::read(dir.join(name)).unwrap(),
            "{name}"
        );
    }
    let mut config = tessera_engine::EngineConfig::new(path.clone());
    config.kv_cache_bytes = 1 << 20;
    let engine = tessera_engine::Engine::load(&config).expect("the downloaded folder loads");
    assert_eq!(engine.model_config().num_layers, 2);
    // Offline, the folder is found again with every shard.
    let mut offline = settings(&hub, &scratch.0);
    offline.offline = true;
    assert_eq!(fetch(&model("org/tiny-llama"), &offline).unwrap(), path);
}

#[test]
fn a_split_gguf_file_comes_with_all_its_parts() {
    let parts: Vec<MockFile> = (1..=3)
        .map(|i| {
            MockFile::new(
                &format!("Q8_0/m-Q8_0-{i:05}-of-00003.gguf"),
                noise(4000 + i, i as u64),
                true,
            )
        })
        .collect();
    let mut files = parts.clone();
    files.push(MockFile::new("m-Q4_0.gguf", noise(100, 7), true));
    let hub = MockHub::start(vec![("org/split", files)]);
    let scratch = Scratch::new("split");
    let path = fetch(&model("org/split:Q8_0"), &settings(&hub, &scratch.0)).unwrap();
    let snapshot = scratch.0.join("models--org--split/snapshots").join(COMMIT);
    assert_eq!(path, snapshot.join("Q8_0/m-Q8_0-00001-of-00003.gguf"));
    for part in &parts {
        assert_eq!(
            std::fs::read(snapshot.join(&part.name)).unwrap(),
            *part.bytes
        );
    }
    assert!(!snapshot.join("m-Q4_0.gguf").exists());
}

#[test]
fn a_gated_repository_needs_the_token_which_never_reaches_the_cdn() {
    let hub = MockHub::start(vec![("org/m-GGUF", gguf_repo())]);
    hub.behaviour.lock().unwrap().token = Some("hf_secret".into());
    let scratch = Scratch::new("gated");
    let err = fetch(&model("org/m-GGUF:Q8_0"), &settings(&hub, &scratch.0)).unwrap_err();
    assert!(matches!(err, HubError::Unauthorized { .. }), "{err}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    let mut with_token = settings(&hub, &scratch.0);
    with_token.token = Some("hf_secret".into());
    fetch(&model("org/m-GGUF:Q8_0"), &with_token).unwrap();
    let requests = hub.requests();
    let listing = requests
        .iter()
        .rfind(|r| r.path.starts_with("/api/"))
        .unwrap();
    assert_eq!(listing.authorization.as_deref(), Some("Bearer hf_secret"));
    let cdn = requests
        .iter()
        .rfind(|r| r.path.starts_with("/cdn/"))
        .unwrap();
    assert_eq!(cdn.authorization, None, "the token stays with the hub");
}

#[test]
fn a_missing_repository_or_tag_names_what_there_is() {
    let hub = MockHub::start(vec![("org/m-GGUF", gguf_repo())]);
    let scratch = Scratch::new("missing");
    let err = fetch(&model("org/nothing"), &settings(&hub, &scratch.0)).unwrap_err();
    assert!(matches!(err, HubError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("`org/nothing`"), "{err}");
    let err = fetch(&model("org/m-GGUF:IQ2_XS"), &settings(&hub, &scratch.0)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("IQ2_XS") && text.contains("m-Q8_0.gguf"),
        "{text}"
    );
    let err = fetch(
        &ModelRef::parse("org/m-GGUF:Q8_0", Some("v9")).unwrap(),
        &settings(&hub, &scratch.0),
    )
    .unwrap_err();
    assert!(err.to_string().contains("`v9`"), "{err}");
}

/// The default model as a hub repository holds it, downloaded and served by the binary.
#[test]
fn generate_downloads_a_model_by_name_then_runs_offline() {
    let smollm2 = tessera_engine::default_model_path();
    let bytes = std::fs::read(&smollm2).unwrap_or_else(|e| {
        panic!(
            "the default model {} (scripts/fetch-model): {e}",
            smollm2.display()
        )
    });
    let hub = MockHub::start(vec![(
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
        vec![
            MockFile::new("smollm2-135m-instruct.Q4_1.gguf", bytes, true),
            MockFile::new("README.md", b"SmolLM2".to_vec(), false),
        ],
    )]);
    let scratch = Scratch::new("generate");
    let run = |env: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "generate",
                "--model",
                "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1",
                "--chat",
                "--prompt",
                "What is the capital of France? Answer in one sentence.",
                "--temperature",
                "0",
                "--threads-per-rank",
                "1",
            ])
            .env("HF_HOME", &scratch.0)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .output()
            .expect("run tessera")
    };
    let out = run(&[("HF_ENDPOINT", &hub.base)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        "The capital of France is Paris."
    );
    // Progress in the logs (standard error is no terminal here), and the check.
    assert!(
        stderr.contains("downloading smollm2-135m-instruct.Q4_1.gguf (98.4 MB)"),
        "{stderr}"
    );
    assert!(stderr.contains("sha256 checked"), "{stderr}");
    assert!(scratch
        .0
        .join("hub/models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF/snapshots")
        .join(COMMIT)
        .join("smollm2-135m-instruct.Q4_1.gguf")
        .is_file());
    // Offline, with no hub at all, the cached copy serves.
    let asked = hub.requests().len();
    drop(hub);
    let out = run(&[
        ("HF_HUB_OFFLINE", "1"),
        ("HF_ENDPOINT", "http://127.0.0.1:9"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Paris"));
    assert!(asked > 0);
}
