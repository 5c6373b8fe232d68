//! No two files of the proxy import each other, directly or around a loop: a file is read
//! knowing only what it imports. And no two of its folders import each other but for the
//! seams ARCHITECTURE.md names.
//!
//! A file imports another when it names a path into it: `crate::a::b`, `super::x`,
//! `self::x` (each item of a `{…}` group counted), or, in a directory's `mod.rs`, a child
//! module by its bare name. Comments and unit-test modules are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Loops allowed, each as its sorted files: none since the cache's per-request state left
/// `stage/cache/mod.rs` for a file that does not import the context.
const ALLOWED: &[&[&str]] = &[];

/// Pairs of folders that import each other, each a seam ARCHITECTURE.md names.
const SEAMS: &[(&str, &str)] = &[("listener", "pipeline"), ("routing", "stage")];

type Module = Vec<String>;

/// Each file of the crate and the files it imports.
fn crate_imports() -> BTreeMap<Module, BTreeSet<Module>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules_under(&root);
    assert!(files.len() > 50, "read {} files only", files.len());
    let mut imports: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, (text, is_dir)) in &files {
        let named = imported(module, text, *is_dir);
        let targets = named
            .into_iter()
            .filter_map(|path| resolve(&files, &path))
            .filter(|target| target != module)
            .collect();
        imports.insert(module.clone(), targets);
    }
    imports
}

#[test]
fn only_the_named_seams_join_two_folders_both_ways() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let folder_of = |module: &Module| {
        let top = module.first()?;
        (module.len() > 1 || root.join(top).is_dir()).then(|| top.clone())
    };
    let mut folder_imports: BTreeSet<(String, String)> = BTreeSet::new();
    for (from, targets) in crate_imports() {
        for to in targets {
            if let (Some(a), Some(b)) = (folder_of(&from), folder_of(&to)) {
                if a != b {
                    folder_imports.insert((a, b));
                }
            }
        }
    }
    assert!(
        folder_imports.contains(&("listener".into(), "pipeline".into())),
        "the reader missed the listener's calls into the pipeline"
    );
    let both_ways: BTreeSet<(String, String)> = folder_imports
        .iter()
        .filter(|(a, b)| a < b && folder_imports.contains(&(b.clone(), a.clone())))
        .cloned()
        .collect();
    let seams: BTreeSet<(String, String)> = SEAMS
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(both_ways, seams, "pairs of folders that import each other");
    let architecture = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ARCHITECTURE.md"),
    )
    .expect("ARCHITECTURE.md");
    for (a, b) in SEAMS {
        assert!(
            architecture.contains(&format!("`{a}/` ↔ `{b}/`")),
            "ARCHITECTURE.md names the seam {a}/ ↔ {b}/"
        );
    }
}

#[test]
fn no_two_files_of_the_proxy_import_each_other() {
    let imports = crate_imports();
    let edges: usize = imports.values().map(BTreeSet::len).sum();
    assert!(
        edges > 150,
        "found {edges} imports only: the reader is broken"
    );
    let loops: Vec<Vec<String>> = strongly_connected(&imports)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| component.iter().map(name).collect())
        .collect();
    let unexpected: Vec<_> = loops
        .iter()
        .filter(|files| !ALLOWED.iter().any(|allowed| allowed == files))
        .map(|files| describe(files, &imports))
        .collect();
    assert!(
        unexpected.is_empty(),
        "import loops:\n{}",
        unexpected.join("\n")
    );
}

#[test]
fn the_reader_finds_a_loop_it_is_shown() {
    let mut files = BTreeMap::new();
    files.insert(module("a"), ("use crate::b::Thing;\n".to_string(), false));
    files.insert(module("b"), ("use super::a::Other;\n".to_string(), false));
    let mut imports = BTreeMap::new();
    for (m, (text, is_dir)) in &files {
        let targets = imported(m, text, *is_dir)
            .into_iter()
            .filter_map(|path| resolve(&files, &path))
            .filter(|target| target != m)
            .collect();
        imports.insert(m.clone(), targets);
    }
    let loops: Vec<_> = strongly_connected(&imports)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert_eq!(loops, vec![vec![module("a"), module("b")]]);
}

fn module(path: &str) -> Module {
    path.split('/').map(str::to_string).collect()
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "lib".into()
    } else {
        module.join("/")
    }
}

fn describe(files: &[String], imports: &BTreeMap<Module, BTreeSet<Module>>) -> String {
    let members: BTreeSet<&String> = files.iter().collect();
    let mut lines = vec![format!("- {}", files.join(", "))];
    for file in files {
        let inside: Vec<String> = imports[&module_of_name(file)]
            .iter()
            .map(name)
            .filter(|target| members.contains(target))
            .collect();
        lines.push(format!("    {file} -> {}", inside.join(", ")));
    }
    lines.join("\n")
}

fn module_of_name(name: &str) -> Module {
    if name == "lib" {
        Vec::new()
    } else {
        module(name)
    }
}

/// Every module file under `root`: its module path, its text, and whether it is a
/// directory's (`mod.rs`, `lib.rs`).
fn modules_under(root: &Path) -> BTreeMap<Module, (String, bool)> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).expect("under root");
            let mut parts: Module = relative
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let is_dir = matches!(parts.last().map(String::as_str), Some("mod" | "lib"));
            if is_dir {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("read file");
            found.insert(parts, (without_tests_and_comments(&text), is_dir));
        }
    }
    found
}

fn without_tests_and_comments(text: &str) -> String {
    let code = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    code.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths `text` (of `module`) names, as absolute paths from the crate root.
fn imported(module: &Module, text: &str, is_dir: bool) -> Vec<Module> {
    let mut named = Vec::new();
    let bytes = text.as_bytes();
    for anchor in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = text[from..].find(anchor) {
            let at = from + found;
            from = at + anchor.len();
            if at > 0 && is_ident_byte(bytes[at - 1]) {
                continue;
            }
            let start: Module = match anchor {
                "crate::" => Vec::new(),
                "super::" => module[..module.len().saturating_sub(1)].to_vec(),
                _ if is_dir => module.clone(),
                // `self::` in a file module names its own items.
                _ => continue,
            };
            named.extend(paths_from(start, &text[from..]));
        }
    }
    if is_dir {
        for child in child_modules(text) {
            let bare = format!("{child}::");
            let mut from = 0;
            while let Some(found) = text[from..].find(&bare) {
                let at = from + found;
                from = at + bare.len();
                let before = if at > 0 { bytes[at - 1] } else { b' ' };
                if !is_ident_byte(before) && before != b':' {
                    let mut path = module.clone();
                    path.push(child.clone());
                    named.push(path);
                    break;
                }
            }
        }
    }
    named
}

/// The paths a `crate::`/`super::`/`self::` prefix leads to in `rest`: `a::b::c`, or each
/// first item of `a::{b, c::d}`; `super::super::` climbs.
fn paths_from(mut start: Module, rest: &str) -> Vec<Module> {
    let mut segments = Vec::new();
    let mut rest = rest;
    loop {
        let ident_len = rest.bytes().take_while(|b| is_ident_byte(*b)).count();
        if ident_len == 0 {
            break;
        }
        let ident = &rest[..ident_len];
        if ident == "super" && segments.is_empty() {
            start.pop();
        } else {
            segments.push(ident.to_string());
        }
        rest = &rest[ident_len..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    let mut base = start;
    base.extend(segments.iter().cloned());
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut item = String::new();
        let mut items = Vec::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        return items
            .iter()
            .filter_map(|item| {
                let first: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                (!first.is_empty() && first != "self").then(|| {
                    let mut path = base.clone();
                    path.push(first);
                    path
                })
            })
            .collect();
    }
    if segments.is_empty() {
        Vec::new()
    } else {
        vec![base]
    }
}

fn child_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub(super) "))
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            let child = line.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(child.trim().to_string())
        })
        .collect()
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The module file a path leads into: its longest prefix that is one.
fn resolve(files: &BTreeMap<Module, (String, bool)>, path: &Module) -> Option<Module> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| files.contains_key(prefix))
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}
