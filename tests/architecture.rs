//! The rules of who may use whom (ARCHITECTURE.md, "Invariants"), checked from the source:
//! every `crate::room::…` and `super::file` path in `src/`, outside comments. A rule that
//! matters is a check, not a good intention (rust-analyzer's tidy tests do the same).
//!
//! * Rooms (the folders under `src/`) form a strict order; a room may use only the rooms
//!   [`ALLOWED`] lists for it.
//! * The pure rooms and the controller never name openraft or sled.
//! * Inside a room, files use each other without a circle (`mod.rs`, the room's map, and
//!   unit tests aside).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each room and the rooms it may use besides itself.
const ALLOWED: &[(&str, &[&str])] = &[
    ("log", &[]),
    ("jobs", &["log"]),
    ("wire", &["log", "jobs"]),
    ("client", &["log", "jobs", "wire"]),
    ("controller", &["log", "jobs", "wire", "client"]),
    ("raft", &["log", "jobs", "wire"]),
    (
        "server",
        &["log", "jobs", "wire", "client", "raft", "controller"],
    ),
    (
        "tools",
        &[
            "log",
            "jobs",
            "wire",
            "client",
            "raft",
            "server",
            "controller",
        ],
    ),
];

/// Rooms that must stay free of the storage and consensus crates.
const NO_OPENRAFT_OR_SLED: &[&str] = &["log", "jobs", "wire", "client", "controller"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The code of a file without its comments (so prose may name anything).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers that follow `prefix` in `code` (`crate::raft::x` gives `raft` for
/// `crate::`), including each name of a `prefix{a, b}` group.
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        // `xcrate::` is not `crate::`.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        let group = match rest.strip_prefix('{') {
            Some(inner) => &inner[..inner.find('}').unwrap_or(inner.len())],
            None => rest,
        };
        for part in group.split(',') {
            let name: String = part
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
            if rest.starts_with('{') {
                continue;
            }
            break;
        }
    }
    names
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

/// Goal: every room uses only the rooms below it, and the pure rooms and the controller never
/// touch openraft or sled.
#[test]
fn every_room_uses_only_the_rooms_below_it() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let rooms: BTreeSet<String> = std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && p.file_name().unwrap() != "bin")
        .map(|p| stem(&p))
        .collect();
    assert_eq!(
        rooms,
        allowed.keys().map(|r| r.to_string()).collect(),
        "every room under src/ has a rule here, and every rule a room"
    );
    let mut broken = Vec::new();
    for room in &rooms {
        for file in rust_files(&src().join(room)) {
            let code = code_of(&file);
            for used in names_after(&code, "crate::") {
                let is_room = rooms.contains(&used);
                if is_room && used != *room && !allowed[room.as_str()].contains(&used.as_str()) {
                    broken.push(format!("{} uses {used}", file.display()));
                }
            }
            if NO_OPENRAFT_OR_SLED.contains(&room.as_str()) {
                for forbidden in ["openraft", "sled"] {
                    if !names_after(&code, &format!("{forbidden}::")).is_empty()
                        || code.contains(&format!("use {forbidden}"))
                    {
                        broken.push(format!("{} names {forbidden}", file.display()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "rules broken:\n{}", broken.join("\n"));
}

/// Goal: inside each room the files use each other without a circle, so that each file can be
/// read after the ones it uses. `mod.rs` only maps the room and is left out.
#[test]
fn files_in_a_room_use_each_other_without_a_circle() {
    let mut circles = Vec::new();
    for entry in std::fs::read_dir(src()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() || dir.file_name().unwrap() == "bin" {
            continue;
        }
        let room = stem(&dir);
        let files: BTreeSet<String> = rust_files(&dir)
            .iter()
            .map(|p| stem(p))
            .filter(|s| s != "mod")
            .collect();
        let uses: BTreeMap<String, BTreeSet<String>> = files
            .iter()
            .map(|file| {
                let code = code_of(&dir.join(format!("{file}.rs")));
                // A file's unit tests may use any sibling: they are not part of the build
                // that the order is about.
                let code = code.split("#[cfg(test)]").next().unwrap_or_default();
                let mut used = names_after(code, "super::");
                used.extend(names_after(code, &format!("crate::{room}::")));
                used.retain(|u| files.contains(u) && u != file);
                (file.clone(), used)
            })
            .collect();
        // Depth-first search for a back edge.
        fn visit(
            file: &str,
            uses: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
            circles: &mut Vec<String>,
        ) {
            if let Some(at) = path.iter().position(|f| f == file) {
                circles.push(format!("{} -> {file}", path[at..].join(" -> ")));
                return;
            }
            if !done.insert(file.to_string()) {
                return;
            }
            path.push(file.to_string());
            for next in &uses[file] {
                visit(next, uses, path, done, circles);
            }
            path.pop();
        }
        let mut done = BTreeSet::new();
        let mut found = Vec::new();
        for file in &files {
            visit(file, &uses, &mut Vec::new(), &mut done, &mut found);
        }
        circles.extend(found.into_iter().map(|c| format!("src/{room}: {c}")));
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// Goal: the checks above can fail: a use of a room above and a circle are both seen.
#[test]
fn the_reader_of_paths_sees_rooms_groups_and_siblings() {
    let code = "use crate::server::ReplicaHandle;\nuse crate::{log::Offset, jobs};\nlet x = super::wal::Wal::open();\nxcrate::nothing";
    assert_eq!(
        names_after(code, "crate::"),
        BTreeSet::from(["server".into(), "log".into(), "jobs".into()])
    );
    assert_eq!(names_after(code, "super::"), BTreeSet::from(["wal".into()]));
}
