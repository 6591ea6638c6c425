//! Where the job's inputs come from.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::log::Input;

/// The set of inputs the job should consume now. Polled every controller tick, so a source
/// hands out the same shared set while it does not change: the controller then knows at a
/// glance that the inputs did not move, and copies nothing.
pub trait InputSource: Send {
    fn inputs(&mut self) -> Result<Arc<BTreeSet<Input>>, String>;
}

/// A fixed list.
pub struct StaticInputs(Arc<BTreeSet<Input>>);

impl StaticInputs {
    pub fn new(inputs: BTreeSet<Input>) -> StaticInputs {
        StaticInputs(Arc::new(inputs))
    }
}

impl InputSource for StaticInputs {
    fn inputs(&mut self) -> Result<Arc<BTreeSet<Input>>, String> {
        Ok(self.0.clone())
    }
}

/// A file with one `system/stream/partition` per line (`#` starts a comment), re-read when it
/// changes: partitions appear and disappear by editing it. A file that does not parse keeps
/// the last good set (and says why), so a half-written edit never revokes the job's inputs.
/// A file that lists no input does not parse either unless it says [`NO_INPUTS`] alone: an
/// empty set stops every task, and an empty file is more often a truncated one (an editor's
/// save, a configuration tool's first write) than an intent.
pub struct WatchedFile {
    path: PathBuf,
    seen: Option<(std::time::SystemTime, u64)>,
    last: Option<Arc<BTreeSet<Input>>>,
}

/// What an inputs file says, alone, to mean that the job has no inputs (every task stops).
pub const NO_INPUTS: &str = "none";

impl WatchedFile {
    pub fn new(path: impl Into<PathBuf>) -> WatchedFile {
        WatchedFile {
            path: path.into(),
            seen: None,
            last: None,
        }
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<BTreeSet<Input>, String> {
        let lines: Vec<(usize, &str)> = (text.lines().enumerate())
            .map(|(n, line)| (n, line.split('#').next().unwrap_or("").trim()))
            .filter(|(_, line)| !line.is_empty())
            .collect();
        match lines.as_slice() {
            [] => {
                return Err(format!(
                    "it lists no input; an empty file is taken for a truncated one, since \
                     no inputs stops every task: write `{NO_INPUTS}` on a line of its own to \
                     mean that"
                ))
            }
            [(_, only)] if *only == NO_INPUTS => return Ok(BTreeSet::new()),
            _ => {}
        }
        (lines.into_iter())
            .map(|(n, line)| match line {
                NO_INPUTS => Err(format!("line {}: `{NO_INPUTS}` beside inputs", n + 1)),
                line => line.parse().map_err(|e| format!("line {}: {e}", n + 1)),
            })
            .collect()
    }
}

impl InputSource for WatchedFile {
    fn inputs(&mut self) -> Result<Arc<BTreeSet<Input>>, String> {
        let where_ = || self.path.display().to_string();
        let meta = std::fs::metadata(&self.path).map_err(|e| format!("{}: {e}", where_()))?;
        let stamp = (meta.modified().map_err(|e| e.to_string())?, meta.len());
        if let (Some(seen), Some(last)) = (self.seen, &self.last) {
            if seen == stamp {
                return Ok(last.clone());
            }
        }
        let text = std::fs::read_to_string(&self.path).map_err(|e| format!("{}: {e}", where_()))?;
        match WatchedFile::parse(&text) {
            Ok(inputs) => {
                // An edit that leaves the set as it was keeps handing out the same set.
                let inputs = match self.last.take() {
                    Some(last) if *last == inputs => last,
                    _ => Arc::new(inputs),
                };
                self.seen = Some(stamp);
                self.last = Some(inputs.clone());
                Ok(inputs)
            }
            Err(error) => match &self.last {
                Some(last) => {
                    tracing::warn!(file = %where_(), %error, "inputs file does not parse; keeping the last good set");
                    Ok(last.clone())
                }
                None => Err(format!("{}: {error}", where_())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_inputs_with_comments() {
        let inputs =
            WatchedFile::parse("# job inputs\nkafka/events/0\n\nkafka/events/1  # new\n").unwrap();
        assert_eq!(inputs.len(), 2);
        assert!(WatchedFile::parse("kafka/events/x")
            .unwrap_err()
            .contains("line 1"));
    }

    #[test]
    fn a_bad_edit_keeps_the_last_good_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inputs");
        std::fs::write(&path, "kafka/events/0\n").unwrap();
        let mut source = WatchedFile::new(&path);
        assert_eq!(source.inputs().unwrap().len(), 1);
        std::fs::write(&path, "kafka/events/0\nkafka/events/1\n").unwrap();
        assert_eq!(source.inputs().unwrap().len(), 2);
        std::fs::write(&path, "kafka/events/0\nkafka/ev").unwrap();
        assert_eq!(source.inputs().unwrap().len(), 2);
    }

    /// Goal: an inputs file emptied (truncated by a save, a first write) keeps the job's
    /// inputs; only `none` alone revokes them all. 3d7237e read an empty file as "no inputs"
    /// and stopped every task.
    #[test]
    fn an_empty_file_keeps_the_inputs_and_none_revokes_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inputs");
        std::fs::write(&path, "kafka/events/0\nkafka/events/1\n").unwrap();
        let mut source = WatchedFile::new(&path);
        assert_eq!(source.inputs().unwrap().len(), 2);
        for emptied in ["", "\n\n", "# all gone\n"] {
            std::fs::write(&path, emptied).unwrap();
            assert_eq!(
                source.inputs().unwrap().len(),
                2,
                "{emptied:?} keeps the inputs"
            );
        }
        std::fs::write(&path, "none\n").unwrap();
        assert!(source.inputs().unwrap().is_empty(), "`none` says so");
        let refused = WatchedFile::parse("none\nkafka/events/0").unwrap_err();
        assert!(refused.contains("beside inputs"), "{refused}");
        let refused = WatchedFile::parse("").unwrap_err();
        assert!(refused.contains("`none`"), "{refused}");
    }
}
