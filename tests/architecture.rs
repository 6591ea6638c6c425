//! The rules of who may use whom (ARCHITECTURE.md, "Invariants"), checked from the source. A
//! rule that matters is a check, not a good intention (rust-analyzer's tidy tests do the same).
//!
//! * Rooms (the folders under `src/`) form a strict order; a room may use only the rooms
//!   [`ALLOWED`] lists for it.
//! * The pure rooms and the controller never name openraft or sled.
//! * A room's wings (its sub-folders that [`WINGS`] lists) use only the modules of the room
//!   beside them that the rule names: `raft::storage` uses nothing of the consensus side but
//!   the types openraft's storage traits are written in and the commit stages it times.
//! * In every folder, at any depth, the modules (its files and its sub-folders) use each other
//!   without a circle, so that each can be read after the ones it uses. A folder's `mod.rs` is
//!   its map, not one of its modules.
//! * The two ports that serve callers, tarpc (`ports::client`) and gRPC (`ports::grpc`),
//!   re-state no rule: credentials, roles, budgets and the replica's request paths are
//!   `ports::calls`'s alone, so that both refuse the same requests the same way.
//!
//! The source is parsed with `syn`, whole: every path of the crate's modules (`crate::…`,
//! `super::…`, `self::…`, a child module named by its parent) in `use` trees however nested,
//! in code and in macro bodies. A name that a `mod.rs` (or `lib.rs`) imports or re-exports,
//! glob or not, counts as a use of the module that defines it. Items under `#[cfg(test)]`, and
//! modules declared under it, count for the rooms' order but not for circles: unit tests may
//! use any sibling.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::visit::Visit;

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

/// Each wing (a sub-folder of a room), and the modules of its room beside it that it may use:
/// everything else in the room may use the wing, never the other way round.
///
/// `raft::storage` is the log, the snapshots and their fault model; the consensus side
/// (node, elector, network, state machine...) is built on it. It may use `raft::types`, the
/// types openraft's storage traits are written in (entries, log ids, votes, snapshot
/// metadata), and `raft::stages`, the commit path's histograms, a leaf that the log store
/// feeds with each append's `fdatasync`.
const WINGS: &[(&str, &str, &[&str])] = &[("raft", "storage", &["types", "stages"])];

/// A module's place in the crate: `["log", "command"]` is `crate::log::command`.
type ModPath = Vec<String>;

/// One path written in a module, as written, and whether only tests see it.
struct Written {
    segments: Vec<String>,
    in_test: bool,
    /// How many inline modules (`mod tests { … }`) of the file enclose it: as many leading
    /// `super`s stay in the file.
    inline_depth: usize,
}

/// One module of the crate, read from its file.
#[derive(Default)]
struct Module {
    file: PathBuf,
    /// Child modules declared by `mod name;` (or inline), and whether under `#[cfg(test)]`.
    children: BTreeMap<String, bool>,
    /// Names the module defines itself (types, functions, constants...).
    defined: BTreeSet<String>,
    /// Names brought in by `use` (outside tests): the name and the path it stands for.
    imported: BTreeMap<String, Vec<String>>,
    /// Modules whose names a glob `use path::*` brings in (outside tests).
    globs: Vec<Vec<String>>,
    /// Every path written in the module that may name one of the crate's modules.
    written: Vec<Written>,
    /// Whether the module itself is declared under `#[cfg(test)]`.
    test_only: bool,
}

/// The crate's modules, from `lib.rs` down.
struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

fn is_test_cfg(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The name an item defines in its module, if any.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Every leaf of a `use` tree, with `prefix` before it: `(path, name bound, glob)`.
fn use_leaves(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            // `use super::kinds::{self, Kind}`: `self` is the prefix itself.
            let bound = if name == "self" {
                prefix.last().cloned()
            } else {
                path.push(name.clone());
                Some(name)
            };
            out.push((path, bound));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_leaves(tree, prefix, out);
            }
        }
    }
}

/// Collects the paths a module's code writes, and what its items define and import.
struct Reader<'m> {
    module: &'m mut Module,
    /// How many `#[cfg(test)]` items enclose the one being read.
    test_depth: usize,
    /// How many inline modules enclose it: names they define or import are not the file's.
    inline_depth: usize,
}

impl Reader<'_> {
    fn write(&mut self, segments: Vec<String>) {
        if !segments.is_empty() {
            self.module.written.push(Written {
                segments,
                in_test: self.test_depth > 0 || self.module.test_only,
                inline_depth: self.inline_depth,
            });
        }
    }

    /// Paths in a macro body, read token by token: `a::b::c` runs of identifiers.
    fn write_tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        for token in tokens {
            match token {
                TokenTree::Ident(ident) if run.is_empty() || colons == 2 => {
                    run.push(ident.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                other => {
                    if run.len() > 1 {
                        self.write(std::mem::take(&mut run));
                    }
                    run.clear();
                    colons = 0;
                    match other {
                        TokenTree::Group(group) => self.write_tokens(group.stream()),
                        TokenTree::Ident(ident) => run.push(ident.to_string()),
                        _ => {}
                    }
                }
            }
        }
        if run.len() > 1 {
            self.write(run);
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test = is_test_cfg(item_attrs(item));
        self.test_depth += usize::from(test);
        let own = self.test_depth == 0 && self.inline_depth == 0;
        if own {
            if let Some(name) = item_name(item) {
                self.module.defined.insert(name);
            }
        }
        match item {
            syn::Item::Mod(m) if m.content.is_none() => {
                self.module.children.insert(m.ident.to_string(), test);
            }
            syn::Item::Mod(m) => {
                if own {
                    self.module.defined.insert(m.ident.to_string());
                }
                self.inline_depth += 1;
                syn::visit::visit_item(self, item);
                self.inline_depth -= 1;
            }
            syn::Item::Use(u) => {
                let mut leaves = Vec::new();
                use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
                for (path, bound) in leaves {
                    if own {
                        match &bound {
                            Some(name) => {
                                self.module.imported.insert(name.clone(), path.clone());
                            }
                            None => self.module.globs.push(path.clone()),
                        }
                    }
                    self.write(path);
                }
            }
            _ => syn::visit::visit_item(self, item),
        }
        self.test_depth -= usize::from(test);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let test = is_test_cfg(&f.attrs);
        self.test_depth += usize::from(test);
        syn::visit::visit_impl_item_fn(self, f);
        self.test_depth -= usize::from(test);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.write(segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        syn::visit::visit_macro(self, mac);
        self.write_tokens(mac.tokens.clone());
    }
}

impl Crate {
    /// Reads the crate whose `lib.rs` is in `src`.
    fn read(src: &Path) -> Crate {
        let mut krate = Crate {
            modules: BTreeMap::new(),
        };
        krate.read_module(Vec::new(), src.join("lib.rs"), src.to_path_buf(), false);
        krate
    }

    /// Reads the module `at` from `file`; its children's files are in `dir`.
    fn read_module(&mut self, at: ModPath, file: PathBuf, dir: PathBuf, test_only: bool) {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        let mut module = Module {
            file,
            test_only,
            ..Module::default()
        };
        Reader {
            module: &mut module,
            test_depth: 0,
            inline_depth: 0,
        }
        .visit_file(&parsed);
        let children = module.children.clone();
        self.modules.insert(at.clone(), module);
        for (child, test) in children {
            let mut path = at.clone();
            path.push(child.clone());
            let flat = dir.join(format!("{child}.rs"));
            let folder = dir.join(&child).join("mod.rs");
            let file = if flat.exists() { flat } else { folder };
            self.read_module(path, file, dir.join(&child), test_only || test);
        }
    }

    /// The module where `written`, a path of module `from`, leads: the module itself when it
    /// names one, or the module that defines the item it names. `None` for a path that does
    /// not start in this crate (`std::…`, a local variable, a type in scope).
    fn resolve(&self, from: &[String], written: &Written) -> Option<ModPath> {
        let supers = (written.segments.iter())
            .take_while(|s| *s == "super")
            .count();
        let segments = match supers.min(written.inline_depth) {
            // An inline module's `super`s up to the file's own module: `self`.
            0 => written.segments.clone(),
            within => [
                vec!["self".to_string()],
                written.segments[within..].to_vec(),
            ]
            .concat(),
        };
        self.resolve_from(from, &segments, 0)
            .map(|(module, _)| module)
    }

    /// Follows `rest` from the module `at`: into child modules, through imports and globs;
    /// the module reached, and whether `rest` named a module (rather than an item in one).
    fn walk(&self, at: ModPath, rest: &[String], depth: usize) -> (ModPath, bool) {
        let Some((name, after)) = rest.split_first() else {
            return (at, true);
        };
        let module = &self.modules[&at];
        if depth > 32 {
            return (at, false);
        }
        if module.children.contains_key(name) {
            let mut child = at.clone();
            child.push(name.clone());
            return self.walk(child, after, depth + 1);
        }
        if module.defined.contains(name) {
            return (at, false);
        }
        if let Some(path) = module.imported.get(name) {
            return match self.resolve_from(&at, path, depth + 1) {
                Some((target, true)) => self.walk(target, after, depth + 1),
                Some(item) => item,
                // Imported from another crate.
                None => (at, false),
            };
        }
        for glob in &module.globs {
            if let Some((source, true)) = self.resolve_from(&at, glob, depth + 1) {
                if self.provides(&source, name, depth + 1) {
                    return self.walk(source, rest, depth + 1);
                }
            }
        }
        (at, false)
    }

    /// Whether module `at` has `name` to give: a child module, an item, an import, or one of
    /// its globs'.
    fn provides(&self, at: &ModPath, name: &str, depth: usize) -> bool {
        let module = &self.modules[at];
        module.children.contains_key(name)
            || module.defined.contains(name)
            || module.imported.contains_key(name)
            || (depth < 32
                && module.globs.iter().any(|glob| {
                    self.resolve_from(at, glob, depth + 1)
                        .is_some_and(|(source, is_module)| {
                            is_module && self.provides(&source, name, depth + 1)
                        })
                }))
    }

    /// Where `segments`, written in module `from`, lead, and whether they name a module.
    fn resolve_from(
        &self,
        from: &[String],
        segments: &[String],
        depth: usize,
    ) -> Option<(ModPath, bool)> {
        let (first, rest) = segments.split_first()?;
        let mut base: ModPath = from.to_vec();
        let mut rest = rest;
        match first.as_str() {
            "crate" => base.clear(),
            "self" => {}
            "super" => {
                base.pop()?;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            child if self.modules[from].children.contains_key(child) => base.push(child.into()),
            _ => return None,
        }
        Some(self.walk(base, rest, depth))
    }

    /// Every use of one module by another that crosses between two modules of one folder:
    /// `(folder, user, used, in_test, file)`, where `user` and `used` are modules of `folder`.
    fn crossings(&self) -> Vec<(ModPath, String, String, bool, PathBuf)> {
        let mut crossings = Vec::new();
        for (at, module) in &self.modules {
            for written in &module.written {
                let Some(target) = self.resolve(at, written) else {
                    continue;
                };
                let common = at.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if let (Some(user), Some(used)) = (at.get(common), target.get(common)) {
                    crossings.push((
                        at[..common].to_vec(),
                        user.clone(),
                        used.clone(),
                        written.in_test,
                        module.file.clone(),
                    ));
                }
            }
        }
        crossings
    }

    /// Whether module `name` of `folder` is declared under `#[cfg(test)]`.
    fn is_test_module(&self, folder: &[String], name: &str) -> bool {
        self.modules[folder].children.get(name) == Some(&true)
    }
}

/// The rooms' order broken in the crate at `src`: a room using one `allowed` does not list
/// for it, or a room of `no_openraft_or_sled` naming either.
fn rooms_broken(
    src: &Path,
    allowed: &[(&str, &[&str])],
    no_openraft_or_sled: &[&str],
) -> Vec<String> {
    let krate = Crate::read(src);
    let allowed: BTreeMap<&str, &[&str]> = allowed.iter().copied().collect();
    let rooms: BTreeSet<&String> = krate.modules[&Vec::new()].children.keys().collect();
    let mut broken = Vec::new();
    for room in &rooms {
        if !allowed.contains_key(room.as_str()) {
            broken.push(format!("room {room} has no rule here"));
        }
    }
    for room in allowed.keys() {
        if !rooms.iter().any(|r| r == room) {
            broken.push(format!("the rule for {room} names no room"));
        }
    }
    for (folder, user, used, _, file) in krate.crossings() {
        let permitted = allowed
            .get(user.as_str())
            .is_some_and(|a| a.contains(&used.as_str()));
        if folder.is_empty() && !permitted {
            broken.push(format!("{} ({user}) uses {used}", file.display()));
        }
    }
    for (at, module) in &krate.modules {
        let Some(room) = at.first() else { continue };
        if !no_openraft_or_sled.contains(&room.as_str()) {
            continue;
        }
        for written in module.written.iter().filter(|w| w.segments.len() > 1) {
            let first = written.segments[0].as_str();
            if first == "openraft" || first == "sled" {
                broken.push(format!("{} names {first}", module.file.display()));
            }
        }
    }
    broken.sort();
    broken.dedup();
    broken
}

/// The uses, outside tests, by a wing of `wings` of a module of its room beside it that the
/// rule does not list for it.
fn wings_broken(src: &Path, wings: &[(&str, &str, &[&str])]) -> Vec<String> {
    let krate = Crate::read(src);
    let mut broken = Vec::new();
    for &(room, wing, may_use) in wings {
        if !krate
            .modules
            .contains_key(&vec![room.to_string(), wing.to_string()])
        {
            broken.push(format!("the rule for {room}/{wing} names no wing"));
        }
        for (folder, user, used, in_test, file) in krate.crossings() {
            let uses_beside = folder == [room] && user == wing && !in_test;
            if uses_beside
                && !krate.is_test_module(&folder, &user)
                && !may_use.contains(&used.as_str())
            {
                broken.push(format!(
                    "{} ({room}::{wing}) uses {room}::{used}",
                    file.display()
                ));
            }
        }
    }
    broken.sort();
    broken.dedup();
    broken
}

/// The circles among the modules of each folder of the crate at `src` (tests left out).
fn circles(src: &Path) -> Vec<String> {
    let krate = Crate::read(src);
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (folder, user, used, in_test, _) in krate.crossings() {
        if folder.is_empty()
            || in_test
            || krate.is_test_module(&folder, &user)
            || krate.is_test_module(&folder, &used)
        {
            continue;
        }
        let graph = graphs.entry(folder).or_default();
        graph.entry(used.clone()).or_default();
        graph.entry(user).or_default().insert(used);
    }
    let mut circles = Vec::new();
    for (folder, graph) in &graphs {
        let mut done = BTreeSet::new();
        for module in graph.keys() {
            find_circles(module, graph, &mut Vec::new(), &mut done, &mut |circle| {
                circles.push(format!("src/{}: {circle}", folder.join("/")))
            });
        }
    }
    circles
}

/// Depth-first search from `module` for a back edge, telling `found` each circle.
fn find_circles(
    module: &str,
    uses: &BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
    found: &mut impl FnMut(String),
) {
    if let Some(at) = path.iter().position(|m| m == module) {
        found(format!("{} -> {module}", path[at..].join(" -> ")));
        return;
    }
    if !done.insert(module.to_string()) {
        return;
    }
    path.push(module.to_string());
    for next in &uses[module] {
        find_circles(next, uses, path, done, found);
    }
    path.pop();
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Goal: every room uses only the rooms below it, and the pure rooms and the controller never
/// touch openraft or sled.
#[test]
fn every_room_uses_only_the_rooms_below_it() {
    let broken = rooms_broken(&src(), ALLOWED, NO_OPENRAFT_OR_SLED);
    assert!(broken.is_empty(), "rules broken:\n{}", broken.join("\n"));
}

/// Goal: each wing uses of its room only what its rule lists (the storage, nothing of the
/// consensus side but the storage traits' types and the stage timings).
#[test]
fn each_wing_uses_only_what_its_rule_lists_of_its_room() {
    let broken = wings_broken(&src(), WINGS);
    assert!(
        broken.is_empty(),
        "wings' rules broken:\n{}",
        broken.join("\n")
    );
}

/// Goal: in every folder the modules use each other without a circle.
#[test]
fn the_modules_of_each_folder_use_each_other_without_a_circle() {
    let circles = circles(&src());
    assert!(circles.is_empty(), "circles:\n{}", circles.join("\n"));
}

/// Writes the files of a small crate (`(path, text)` pairs) into a temporary folder.
fn small_crate(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// Goal: the checks can fail. A circle that passes through a re-export of `mod.rs` (`y` uses
/// `X`, which the folder re-exports from `x`, and `x` uses `y`), a circle between two
/// sub-folders, a room used from a file in a sub-folder, a nested group naming a room, a use
/// in a macro body, and a path after a unit test module are each seen; a test module's uses
/// are not circles.
#[test]
fn the_checker_sees_re_exports_sub_folders_nested_groups_and_whole_files() {
    let dir = small_crate(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        (
            "a/mod.rs",
            "mod x;\nmod y;\nmod inner;\n#[cfg(test)]\nmod tests;\npub use x::*;\n",
        ),
        ("a/x.rs", "pub struct X;\nfn f() { super::y::g(); }\n"),
        ("a/y.rs", "use super::X;\npub fn g() {}\n"),
        ("a/tests.rs", "use super::y;\n"),
        ("a/inner/mod.rs", "mod deep;\nmod p;\nmod q;\n"),
        (
            "a/inner/deep.rs",
            "#[cfg(test)]\nmod tests {}\nfn h() { let _ = crate::c::Z; }\n",
        ),
        ("a/inner/p/mod.rs", "use super::q::Q;\npub struct P;\n"),
        (
            "a/inner/q/mod.rs",
            "pub struct Q;\nfn k() { format!(\"{:?}\", super::p::P); }\n",
        ),
        ("b/mod.rs", "use crate::{a::{X, inner}, c};\n"),
        ("c/mod.rs", "pub struct Z;\n"),
    ]);
    let allowed: &[(&str, &[&str])] = &[("a", &[]), ("b", &["a"]), ("c", &[])];
    let broken = rooms_broken(dir.path(), allowed, &[]);
    assert_eq!(broken.len(), 2, "{broken:#?}");
    assert!(
        broken[0].ends_with("a/inner/deep.rs (a) uses c"),
        "{broken:#?}"
    );
    assert!(broken[1].ends_with("b/mod.rs (b) uses c"), "{broken:#?}");

    let circles = circles(dir.path());
    assert_eq!(
        circles,
        [
            "src/a: x -> y -> x".to_string(),
            "src/a/inner: p -> q -> p".to_string()
        ],
    );
}

/// Goal: the wings' check can fail. A wing that uses a module of its room it may not (in
/// code, and through its room's re-export) is seen; a use it may make, a use in its unit
/// tests, and the room's use of the wing are not.
#[test]
fn the_wing_check_sees_a_wing_that_uses_its_room() {
    let dir = small_crate(&[
        ("lib.rs", "pub mod r;\n"),
        (
            "r/mod.rs",
            "pub mod types;\npub mod node;\npub mod store;\npub use node::Node;\n",
        ),
        ("r/types.rs", "pub struct Id;\n"),
        (
            "r/node.rs",
            "pub struct Node;\nfn f() { let _ = super::store::S; }\n",
        ),
        (
            "r/store/mod.rs",
            "pub mod log;\npub mod open;\npub struct S;\n",
        ),
        (
            "r/store/log.rs",
            "use crate::r::types::Id;\n#[cfg(test)]\nmod tests { use crate::r::node::Node; }\n",
        ),
        ("r/store/open.rs", "fn g() { let _ = crate::r::Node; }\n"),
    ]);
    let broken = wings_broken(dir.path(), &[("r", "store", &["types"])]);
    assert_eq!(broken.len(), 1, "{broken:#?}");
    assert!(
        broken[0].ends_with("r/store/open.rs (r::store) uses r::node"),
        "{broken:#?}"
    );
    let unknown = wings_broken(dir.path(), &[("r", "missing", &[])]);
    assert_eq!(
        unknown,
        ["the rule for r/missing names no wing".to_string()]
    );
}

/// The ports that serve callers (tarpc and gRPC); each must leave every rule to
/// `server::ports::calls`.
const CALLER_PORTS: &[&str] = &["server/ports/client.rs", "server/ports/grpc.rs"];

/// Names that only `ports::calls` may use: the role check, the credentials' lookups and the
/// budgets' semaphores.
const RULE_NAMES: &[&str] = &[
    "authorize",
    "by_token",
    "by_certificate",
    "Semaphore",
    "try_acquire_owned",
    "try_acquire_many_owned",
];

/// What a port may ask the replica itself, rather than through its `Caller`: nothing that
/// serves a request.
const REPLICA_CALLS_ALLOWED: &[&str] = &["clone", "readiness", "applied_offset", "grpc_addr_of"];

/// Where `text` (a port's source) re-states a rule: a name of [`RULE_NAMES`], or a call on
/// the replica that is not one of [`REPLICA_CALLS_ALLOWED`].
fn rules_restated(text: &str) -> Vec<String> {
    struct Calls(Vec<String>);
    impl<'ast> Visit<'ast> for Calls {
        fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
            let receiver = call.receiver.to_token_stream().to_string().replace(' ', "");
            let method = call.method.to_string();
            let on_replica = receiver.ends_with("replica") || receiver.ends_with("replica()");
            if on_replica && !REPLICA_CALLS_ALLOWED.contains(&method.as_str()) {
                self.0.push(format!(
                    "`{receiver}.{method}(..)` serves a request past its Caller"
                ));
            }
            syn::visit::visit_expr_method_call(self, call);
        }
    }
    fn idents(stream: TokenStream, found: &mut Vec<String>) {
        for tree in stream {
            match tree {
                TokenTree::Ident(ident) => {
                    let name = ident.to_string();
                    if RULE_NAMES.contains(&name.as_str()) {
                        found.push(format!("names `{name}`, which only ports::calls may"));
                    }
                }
                TokenTree::Group(group) => idents(group.stream(), found),
                _ => {}
            }
        }
    }
    let file = syn::parse_file(text).expect("the port parses");
    let mut calls = Calls(Vec::new());
    calls.visit_file(&file);
    let mut found = calls.0;
    idents(text.parse().expect("the port lexes"), &mut found);
    found
}

/// Goal: neither client-facing port re-states a rule of `ports::calls` (credentials, roles,
/// budgets, the replica's request paths): both serve through one `Caller`.
#[test]
fn the_caller_ports_leave_every_rule_to_one_implementation() {
    let mut broken = Vec::new();
    for port in CALLER_PORTS {
        let text = std::fs::read_to_string(src().join(port)).unwrap();
        broken.extend(
            rules_restated(&text)
                .into_iter()
                .map(|r| format!("{port}: {r}")),
        );
    }
    assert!(broken.is_empty(), "rules re-stated:\n{}", broken.join("\n"));
}

/// Goal: the check can fail: a port that appends through the replica, or checks a role or
/// takes a budget itself, is seen.
#[test]
fn the_rule_check_sees_a_port_that_serves_past_its_caller() {
    let port = "fn append(&self, p: Proposal) { self.replica.append(p); }\n\
                fn check(&self) { authorize(&self.principal, &action); }\n\
                fn budget(&self) { self.answer_bytes.try_acquire_many_owned(1); }\n";
    let found = rules_restated(port);
    assert_eq!(found.len(), 3, "{found:#?}");
}
