//! Real network cuts of one loopback connection, with nftables.

use std::process::{Command, Stdio};

const NFT_PREFIX: &str = "fl_client_rust_";

/// A real network cut of one loopback TCP connection: every packet from or
/// to `port` is dropped (in an nftables table of this suite's own), until
/// dropped. Nothing is sent back: to both ends the connection just goes
/// silent, as in a partition.
pub struct NetCut {
    table: String,
}

impl NetCut {
    pub fn port(port: u16) -> Result<NetCut, String> {
        use std::io::Write;
        let table = format!("{NFT_PREFIX}{}_{port}", std::process::id());
        let rules = format!(
            "table inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    \
             tcp sport {port} drop\n    tcp dport {port} drop\n  }}\n}}\n"
        );
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot cut the network: nft: {e}"))?;
        child.stdin.take().unwrap().write_all(rules.as_bytes()).map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "cannot cut the network: nft: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(NetCut { table })
    }
}

impl Drop for NetCut {
    fn drop(&mut self) {
        let _ = Command::new("nft").args(["delete", "table", "inet", &self.table]).status();
    }
}

/// Removes the tables of cuts a killed run left behind.
pub fn heal_all_cuts() {
    let Ok(out) = Command::new("nft").args(["list", "tables"]).stderr(Stdio::null()).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(table) = line.strip_prefix("table inet ").filter(|t| t.starts_with(NFT_PREFIX)) {
            let _ = Command::new("nft").args(["delete", "table", "inet", table]).status();
        }
    }
}
