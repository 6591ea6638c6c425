//! Network partitions between real replica processes on one host, for `ctrlog chaos`.
//!
//! Each replica runs under its own uid ([`ProcessCluster::for_faults`](crate::tools::bench)), so
//! nftables can tell whose connection it is: every connection a replica opens is marked with
//! its uid in conntrack, and a cut drops the packets of one replica's connections to another's
//! peer port. Loopback packets cross the output hook too, so this cuts real TCP connections on
//! 127.0.0.1 the way a broken link does: no reset, no error, just silence until the rule is
//! gone. Client ports are never matched, so a replica cut from its peers still answers its
//! clients (the partition that check-quorum is for).
//!
//! Why conntrack marks and not the packet's socket owner: a connection the replica closes
//! while the cut holds (it re-dials a silent peer) goes on resending as an orphaned socket,
//! with no owner to match, and those packets walked through the cut, renewing a follower's
//! leader lease from a leader that was supposed to be cut off.
//!
//! The rules live in a table of their own, named after this process, deleted on drop; they
//! match only the replicas' uids, so nothing else on the host is affected. Needs root (or
//! `CAP_NET_ADMIN`) and the `nft` program.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::Context;

/// One nftables table holding the current cuts.
pub struct Firewall {
    table: String,
}

impl Firewall {
    /// Creates the table, which marks every connection processes of `owners` open from now
    /// on, and an empty chain of cuts; fails with what to do if nftables cannot be used here.
    pub fn new(owners: impl IntoIterator<Item = u32>) -> anyhow::Result<Firewall> {
        let firewall = Firewall {
            table: format!("ctrlog_chaos_{}", std::process::id()),
        };
        let marks: String = owners
            .into_iter()
            .map(|uid| format!("    ct state new meta skuid {uid} ct mark set {uid}\n"))
            .collect();
        firewall
            .apply(&format!(
                "table inet {table} {{\n  \
                   chain marks {{\n    type filter hook output priority -10; policy accept;\n{marks}  }}\n  \
                   chain cuts {{ type filter hook output priority 0; policy accept; }}\n\
                 }}\n",
                table = firewall.table
            ))
            .context(
                "partitions need nftables: run as root with the `nft` program installed \
                 (Debian: apt-get install nftables), or leave partitions out with --faults",
            )?;
        Ok(firewall)
    }

    /// Drops what connections opened by processes of `from_uid` send to TCP port `to_port`:
    /// the RPCs one replica sends to another's peer port. Answers on connections the other
    /// side opened still pass, so a cut is one-way; cut both directions for a full partition.
    pub fn cut(&self, from_uid: u32, to_port: u16) -> anyhow::Result<()> {
        self.apply(&format!(
            "add rule inet {} cuts ct mark {from_uid} tcp dport {to_port} drop\n",
            self.table
        ))
    }

    /// Removes every cut.
    pub fn heal(&self) -> anyhow::Result<()> {
        self.apply(&format!("flush chain inet {} cuts\n", self.table))
    }

    fn apply(&self, rules: &str) -> anyhow::Result<()> {
        let mut nft = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting nft")?;
        nft.stdin
            .take()
            .expect("piped")
            .write_all(rules.as_bytes())?;
        let output = nft.wait_with_output()?;
        anyhow::ensure!(
            output.status.success(),
            "nft refused {rules:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(())
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        if let Err(error) = self.apply(&format!("delete table inet {}\n", self.table)) {
            eprintln!("could not remove the chaos firewall table: {error}");
        }
    }
}
