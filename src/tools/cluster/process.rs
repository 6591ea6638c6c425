//! `ProcessCluster`: `ctrlog serve` processes on loopback, each replica a child process with
//! its folder, its ports and its log file, as `ctrlog bench`, `ctrlog chaos`, the demo and the
//! process tests run them; plainly, with the observability port, or as deployed (TLS and
//! authentication with a CA of its own), with a hook on each spawn (the power-loss shim).

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::client::{ClientOptions, ControlClient};
use crate::tools::certs;

/// `ctrlog serve` processes on loopback with their data in a temporary folder; killed and
/// removed when dropped. The first `initial` replicas form the cluster; replicas added later
/// ([`add_replica`](Self::add_replica)) wait to be made members.
pub struct ProcessCluster {
    exe: PathBuf,
    /// The replicas that run another binary than `exe`: from the start
    /// ([`start_mixed`](Self::start_mixed)), or since [`replace`](Self::replace).
    replaced: std::collections::HashMap<usize, PathBuf>,
    dir: tempfile::TempDir,
    members: String,
    initial: usize,
    /// Replica `i` runs as uid and gid `base + i + 1` (see [`for_faults`](Self::for_faults)).
    uid_base: Option<u32>,
    addrs: Vec<(String, String)>,
    /// Each replica's observability port, when the cluster serves them.
    http_addrs: Vec<Option<std::net::SocketAddr>>,
    /// Each replica's gRPC port, when the cluster serves them.
    grpc_addrs: Vec<Option<std::net::SocketAddr>>,
    extra: Vec<String>,
    /// Runs before every start of a replica process (see [`for_faults`](Self::for_faults)).
    on_spawn: Option<SpawnHook>,
    /// Tokio worker threads per replica (`TOKIO_WORKER_THREADS`), see [`worker_threads_each`].
    worker_threads: usize,
    /// TLS on both ports and authentication, when started [`secure`](Self::start_secure).
    secure: Option<Secured>,
    children: Vec<Option<Child>>,
}

/// What a cluster started with [`ProcessCluster::start_secure`] was given: its certificates,
/// tokens and the configuration file every replica reads.
struct Secured {
    /// The CA and every certificate (`certs::generate`'s layout).
    pki: PathBuf,
    /// The file each replica gets as `--config`: the caller's settings and `[auth]`.
    config: PathBuf,
    /// Each principal's bearer token, as the tokens file gives it.
    tokens: std::collections::BTreeMap<String, String>,
    /// The admin's certificate: what the cluster's own client dials with.
    client: ClientOptions,
}

/// Replica ids that [`ProcessCluster::start_secure`] issues certificates for: the founding
/// members, and room for replicas added later or for a test posing as one that never was.
pub const SECURE_NODE_IDS_MAX: crate::NodeId = 9;

/// The client certificates (and principals) [`ProcessCluster::start_secure`] issues: each
/// name's certificate is `certs::client_identity(pki, name)`, and the tokens file gives each
/// principal a token too ([`token`](ProcessCluster::token)).
pub const SECURE_CLIENTS: [(&str, &str); 5] = [
    ("admin", "admin"),
    ("operator", "operator"),
    ("c1", "container:c1"),
    ("c2", "container:c2"),
    ("workers", "containers:worker-"),
];

/// How [`ProcessCluster::launch`] starts the replicas, beyond their number and flags.
#[derive(Default)]
struct Launch {
    uid_base: Option<u32>,
    http: bool,
    on_spawn: Option<SpawnHook>,
    /// The settings every replica reads (TOML), for a secure cluster; `None` for plain TCP.
    secure_config: Option<String>,
    /// Replicas (0-based) that run another executable than the cluster's.
    executables: std::collections::HashMap<usize, PathBuf>,
    /// The founder (replica 1) is not started: the others wait for it, unfounded, until
    /// [`restart`](ProcessCluster::restart)`(0)`.
    founder_held: bool,
    /// Each replica serves a gRPC port too.
    grpc: bool,
}

/// A replica process about to start, as a [`SpawnHook`] sees it.
pub struct Spawning<'a> {
    /// 0-based.
    pub index: usize,
    pub data_dir: &'a Path,
    /// The uid it will run as, if not this process's.
    pub uid: Option<u32>,
}

/// Prepares each start of a replica process (its files, its environment): a fault injector's
/// hook into every start, restarts and added replicas included.
pub type SpawnHook = Box<dyn Fn(&Spawning<'_>, &mut Process) -> anyhow::Result<()> + Send + Sync>;

/// Tokio worker threads for each process of a cluster run on this machine (`ctrlog bench`
/// and `ctrlog chaos`): the `replicas` replicas and the process driving them share its cores
/// equally, at least one thread each. tokio's default of one thread per core would give three
/// replicas and a client on two cores eight threads competing for them, and make every
/// hand-off between tasks a wake-up on another thread; one thread each was faster at every
/// client count (BENCHMARKS.md). An explicit `TOKIO_WORKER_THREADS` wins.
pub fn worker_threads_each(replicas: usize) -> usize {
    if let Some(threads) = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&threads: &usize| threads > 0)
    {
        return threads;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / (replicas + 1)).max(1)
}

/// A port free on 127.0.0.1 now, for a replica started later. It is drawn below the kernel's
/// ephemeral range where that leaves room: a port from inside it may be taken in the meantime
/// as the local port of any outgoing connection (a client, another test's replicas), and the
/// replica would then fail to start with "address in use". Nor is a port handed out twice in
/// one process: clusters started side by side (the tests of one file run at once) would
/// otherwise draw the same free port now and then, before either replica bound it.
fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = unclaimed_port()?;
        if HANDED_OUT.lock().expect("never poisoned").insert(port) {
            return Ok(port);
        }
    }
}

/// A port free on 127.0.0.1 now (see [`free_port`]).
fn unclaimed_port() -> std::io::Result<u16> {
    use rand::Rng;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10_000;
    if ephemeral_low > LOWEST + 1_000 {
        let mut rng = rand::thread_rng();
        for _ in 0..100 {
            let port = rng.gen_range(LOWEST..ephemeral_low);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl ProcessCluster {
    /// Starts `size` replicas of this executable with `extra` flags for `serve`, and waits for
    /// a leader.
    pub async fn start(size: u64, extra: &[String]) -> anyhow::Result<ProcessCluster> {
        let exe = std::env::current_exe().context("finding this executable")?;
        ProcessCluster::start_with(exe, size, extra).await
    }

    /// Starts `size` replicas of the `ctrlog` binary at `exe` (tests pass the one cargo built).
    pub async fn start_with(
        exe: PathBuf,
        size: u64,
        extra: &[String],
    ) -> anyhow::Result<ProcessCluster> {
        ProcessCluster::launch(exe, size, extra, Launch::default()).await
    }

    /// Starts `size` replicas of the `ctrlog` binary at `exe`, each serving its observability
    /// port too (see [`http_addr`](Self::http_addr)).
    pub async fn start_with_http(
        exe: PathBuf,
        size: u64,
        extra: &[String],
    ) -> anyhow::Result<ProcessCluster> {
        let http = Launch {
            http: true,
            ..Launch::default()
        };
        ProcessCluster::launch(exe, size, extra, http).await
    }

    /// Starts `size` replicas of the `ctrlog` binary at `exe`, each serving its observability
    /// and gRPC ports (see [`grpc_addr`](Self::grpc_addr)).
    pub async fn start_with_grpc(
        exe: PathBuf,
        size: u64,
        extra: &[String],
    ) -> anyhow::Result<ProcessCluster> {
        let grpc = Launch {
            http: true,
            grpc: true,
            ..Launch::default()
        };
        ProcessCluster::launch(exe, size, extra, grpc).await
    }

    /// Starts `size` replicas of the `ctrlog` binary at `exe`, but replica `i` (0-based) of
    /// each `(i, other)` runs `other`: a cluster founded by members on different builds.
    pub async fn start_mixed(
        exe: PathBuf,
        size: u64,
        extra: &[String],
        others: impl IntoIterator<Item = (usize, PathBuf)>,
    ) -> anyhow::Result<ProcessCluster> {
        let mixed = Launch {
            executables: others.into_iter().collect(),
            ..Launch::default()
        };
        ProcessCluster::launch(exe, size, extra, mixed).await
    }

    /// Starts `size` replicas of the `ctrlog` binary at `exe` as a deployment runs them: TLS
    /// on both ports with certificates of a CA made here (`node-1` to
    /// `node-`[`SECURE_NODE_IDS_MAX`]), authentication by certificate or token for each of
    /// [`SECURE_CLIENTS`], and each replica's observability port on (`http`). `config` is
    /// TOML every replica reads besides (limits, a `[job]`), as from a shared `--config` file;
    /// `extra` must not name `--config` again. The cluster's client is the admin
    /// ([`client_options`](Self::client_options)).
    pub async fn start_secure(
        exe: PathBuf,
        size: u64,
        config: &str,
        http: bool,
        extra: &[String],
    ) -> anyhow::Result<ProcessCluster> {
        let secure = Launch {
            http,
            secure_config: Some(config.to_string()),
            ..Launch::default()
        };
        ProcessCluster::launch(exe, size, extra, secure).await
    }

    /// Starts the founding members of a secure cluster ([`start_secure`](Self::start_secure))
    /// but its founder: they wait, their logs empty, for replica 1, which
    /// [`restart`](Self::restart)`(0)` starts. Returns once they listen.
    pub async fn start_secure_without_founder(
        exe: PathBuf,
        size: u64,
    ) -> anyhow::Result<ProcessCluster> {
        let held = Launch {
            secure_config: Some(String::new()),
            founder_held: true,
            ..Launch::default()
        };
        ProcessCluster::launch(exe, size, &[], held).await
    }

    /// Starts `size` replicas of the `ctrlog` binary at `exe`, for a fault injector: with a
    /// `uid_base`, each under a uid of its own (`uid_base + id`), so that a
    /// [`Firewall`](crate::tools::chaos::firewall::Firewall) can cut the links between them (needs root);
    /// `on_spawn` runs before every start of a replica.
    pub async fn for_faults(
        exe: PathBuf,
        size: u64,
        extra: &[String],
        uid_base: Option<u32>,
        on_spawn: Option<SpawnHook>,
    ) -> anyhow::Result<ProcessCluster> {
        let faults = Launch {
            uid_base,
            on_spawn,
            ..Launch::default()
        };
        ProcessCluster::launch(exe, size, extra, faults).await
    }

    async fn launch(
        exe: PathBuf,
        size: u64,
        extra: &[String],
        how: Launch,
    ) -> anyhow::Result<ProcessCluster> {
        let Launch {
            uid_base,
            http,
            on_spawn,
            secure_config,
            executables,
            founder_held,
            grpc,
        } = how;
        let mut addrs = Vec::new();
        let mut http_addrs = Vec::new();
        let mut grpc_addrs = Vec::new();
        for _ in 0..size {
            addrs.push((
                format!("127.0.0.1:{}", free_port()?),
                format!("127.0.0.1:{}", free_port()?),
            ));
            http_addrs.push(match http {
                true => Some(std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?))),
                false => None,
            });
            grpc_addrs.push(match grpc {
                true => Some(std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?))),
                false => None,
            });
        }
        let members = addrs
            .iter()
            .enumerate()
            .map(|(i, (peer, client))| format!("{}={peer}/{client}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let dir = tempfile::Builder::new().prefix("ctrlog-bench-").tempdir()?;
        if uid_base.is_some() {
            // The replicas must reach their own directories in the root-only temporary folder.
            std::fs::set_permissions(
                dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o711),
            )?;
        }
        let secure = secure_config
            .map(|config| Secured::write(dir.path(), &config))
            .transpose()?;
        let mut cluster = ProcessCluster {
            exe,
            replaced: executables,
            dir,
            members,
            initial: size as usize,
            uid_base,
            addrs,
            http_addrs,
            grpc_addrs,
            extra: extra.to_vec(),
            on_spawn,
            worker_threads: worker_threads_each(size as usize),
            secure,
            children: Vec::new(),
        };
        for i in 0..size as usize {
            let child = match (i, founder_held) {
                (0, true) => None,
                _ => Some(cluster.spawn(i)?),
            };
            cluster.children.push(child);
        }
        if founder_held {
            for i in 1..size as usize {
                let peer = &cluster.addrs[i].0;
                crate::tools::poll_until(
                    "a founding member listening",
                    Duration::from_secs(30),
                    crate::tools::POLL_INTERVAL,
                    || async { tokio::net::TcpStream::connect(peer).await.map(drop) },
                )
                .await?;
            }
            return Ok(cluster);
        }
        let led = async {
            let client =
                ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
                    .await?;
            client.leader_status().await
        };
        let led = led.await;
        // A leader needs only two: a third that failed to start would go unnoticed until a
        // fault the cluster could have survived takes it down.
        for i in 0..size as usize {
            if let Some(status) = cluster.exited(i) {
                anyhow::bail!(
                    "replica {} exited at start ({status}): {}",
                    i + 1,
                    cluster.log_tail(i, 5)
                );
            }
        }
        led?;
        Ok(cluster)
    }

    /// Starts one more replica, not a member: it waits until a member adds it
    /// (`ControlClient::add_member` with [`member`](Self::member)). Returns its index.
    pub fn add_replica(&mut self) -> anyhow::Result<usize> {
        self.addrs.push((
            format!("127.0.0.1:{}", free_port()?),
            format!("127.0.0.1:{}", free_port()?),
        ));
        self.http_addrs.push(None);
        self.grpc_addrs.push(None);
        let i = self.addrs.len() - 1;
        self.children.push(Some(self.spawn(i)?));
        Ok(i)
    }

    /// How a client reaches this cluster as its admin: with the admin's certificate on a
    /// secure cluster, plainly otherwise.
    pub fn client_options(&self) -> ClientOptions {
        self.secure
            .as_ref()
            .map_or_else(ClientOptions::default, |secure| secure.client.clone())
    }

    /// The index (0-based) of the replica that leads now.
    pub async fn leader_index(&self) -> anyhow::Result<usize> {
        let client =
            ControlClient::connect_with(&self.client_addrs(), self.client_options()).await?;
        let leader = client.leader_status().await?.id;
        Ok(leader as usize - 1)
    }

    /// The CA and certificates of a secure cluster (`certs::generate`'s layout).
    pub fn pki(&self) -> Option<&Path> {
        self.secure.as_ref().map(|secure| secure.pki.as_path())
    }

    /// The bearer token the tokens file of a secure cluster gives `principal` (one of
    /// [`SECURE_CLIENTS`]' roles).
    pub fn token(&self, principal: &str) -> Option<&str> {
        let secure = self.secure.as_ref()?;
        secure.tokens.get(principal).map(String::as_str)
    }

    /// Replica `i`'s addresses, as a member.
    pub fn member(&self, i: usize) -> crate::client::Member {
        let (peer, client) = &self.addrs[i];
        crate::client::Member {
            peer_addr: peer.clone(),
            client_addr: client.clone(),
        }
    }

    /// Replica `i`'s peer port.
    pub fn peer_port(&self, i: usize) -> u16 {
        port_of(&self.addrs[i].0)
    }

    /// Replica `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        port_of(&self.addrs[i].1)
    }

    /// Replica `i`'s observability port, if the cluster was started with them.
    pub fn http_addr(&self, i: usize) -> Option<std::net::SocketAddr> {
        self.http_addrs.get(i).copied().flatten()
    }

    /// Replica `i`'s gRPC port (0-based), if the cluster serves them.
    pub fn grpc_addr(&self, i: usize) -> Option<std::net::SocketAddr> {
        self.grpc_addrs.get(i).copied().flatten()
    }

    /// The uid replica `i` runs under, if each has its own.
    pub fn uid(&self, i: usize) -> Option<u32> {
        self.uid_base.map(|base| base + i as u32 + 1)
    }

    fn spawn(&self, i: usize) -> anyhow::Result<Child> {
        let (peer, client) = &self.addrs[i];
        let data = self.replica_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("replica-{}.log", i + 1)))?;
        let mut process = Process::new(self.replaced.get(&i).unwrap_or(&self.exe));
        process
            .args(["serve", "--id", &(i + 1).to_string(), "--peer-addr", peer])
            .args(["--client-addr", client]);
        if i < self.initial {
            process.args(["--initial-members", &self.members]);
        } else {
            // Any replica started before it may be the member that adds it.
            let before: Vec<String> = (1..=i).map(|id| id.to_string()).collect();
            process.args(["--join-from", &before.join(",")]);
        }
        if let Some(http) = self.http_addr(i) {
            process.args(["--http-addr", &http.to_string()]);
        }
        if let Some(grpc) = self.grpc_addr(i) {
            process.args(["--grpc-addr", &grpc.to_string()]);
        }
        if let Some(secure) = &self.secure {
            let tls = certs::replica_files(&secure.pki, i as crate::NodeId + 1);
            process.arg("--config").arg(&secure.config);
            process.arg("--tls-ca").arg(&tls.ca_file);
            process.arg("--tls-cert").arg(&tls.cert_file);
            process.arg("--tls-key").arg(&tls.key_file);
        }
        if let Some(uid) = self.uid(i) {
            std::fs::create_dir_all(&data)?;
            std::os::unix::fs::chown(&data, Some(uid), Some(uid))?;
            std::os::unix::process::CommandExt::uid(&mut process, uid);
            std::os::unix::process::CommandExt::gid(&mut process, uid);
        }
        if let Some(hook) = &self.on_spawn {
            let spawning = Spawning {
                index: i,
                data_dir: &data,
                uid: self.uid(i),
            };
            hook(&spawning, &mut process)?;
        }
        let child = process
            .arg("--data")
            .arg(&data)
            .args(&self.extra)
            // `CTRLOG_REPLICA_LOG` sets the replicas' filter (e.g. `info` to follow elections);
            // by default warnings, the controller, and a replica's start, stop and handover.
            .env(
                "RUST_LOG",
                std::env::var("CTRLOG_REPLICA_LOG").unwrap_or_else(|_| {
                    "warn,ctrlog::controller=info,ctrlog::server::replica=info,ctrlog::server::ports::peer=info,\
                     ctrlog::raft::elector=info,ctrlog::raft::network=info"
                        .into()
                }),
            )
            .env("TOKIO_WORKER_THREADS", self.worker_threads.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting ctrlog serve")?;
        Ok(child)
    }

    pub fn client_addrs(&self) -> Vec<String> {
        self.addrs
            .iter()
            .map(|(_, client)| client.clone())
            .collect()
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Leaves the folder (the replicas' data and `replica-N.log` files) in place when the
    /// cluster is dropped, for a failure to be looked into; returns its path.
    pub fn keep_files(&mut self) -> &Path {
        self.dir.disable_cleanup(true);
        self.dir.path()
    }

    /// Replicas this cluster has started, the replaced ones included.
    pub fn replica_count(&self) -> usize {
        self.children.len()
    }

    /// Replica `i`'s (0-based) data directory.
    pub fn replica_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("replica-{}", i + 1))
    }

    /// Whether replica `i` (0-based) has exited since it was started, and how.
    pub fn exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.children[i].as_mut()?.try_wait().ok().flatten()
    }

    /// The last `lines` lines replica `i` (0-based) logged, for failure reports.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(format!("replica-{}.log", i + 1)))
            .unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The resident memory of replica `i` (0-based), from `/proc`.
    pub fn rss_bytes(&self, i: usize) -> Option<u64> {
        let pid = self.children.get(i)?.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    }

    /// The process id of replica `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        Some(self.children.get(i)?.as_ref()?.id())
    }

    /// Sends a signal to replica `i` (SIGSTOP and SIGCONT pause and resume it).
    pub fn signal(&self, i: usize, signal: libc::c_int) -> std::io::Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| std::io::Error::other("not running"))?;
        // SAFETY: kill(2) on a child process id this struct owns; no memory is involved.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// SIGKILLs replica `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts replica `i` again on its directory (killing it first if it runs).
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        self.children[i] = Some(self.spawn(i)?);
        Ok(())
    }

    /// One step of a rolling upgrade (or of a rollback): stops replica `i` as a service
    /// manager would (SIGTERM, then SIGKILL after `grace`) and starts the binary at `exe` on
    /// its directory, with its addresses and flags.
    pub async fn replace(&mut self, i: usize, exe: PathBuf, grace: Duration) -> anyhow::Result<()> {
        if let Some(mut child) = self.children[i].take() {
            // SAFETY: kill(2) on a child process this struct owns; no memory is involved.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + grace;
            while child.try_wait()?.is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = child.kill();
            child.wait()?;
        }
        self.replaced.insert(i, exe);
        self.children[i] = Some(self.spawn(i)?);
        Ok(())
    }
}

impl Secured {
    /// Issues the certificates and tokens of a secure cluster under `dir`, and writes the
    /// configuration every replica reads: `settings`, then `[auth]`.
    fn write(dir: &Path, settings: &str) -> anyhow::Result<Secured> {
        use rand::Rng;
        let pki = dir.join("pki");
        let nodes: Vec<crate::NodeId> = (1..=SECURE_NODE_IDS_MAX).collect();
        let clients: Vec<String> = SECURE_CLIENTS.iter().map(|(n, _)| n.to_string()).collect();
        certs::generate(&pki, &nodes, &["127.0.0.1".into()], &clients, 30, false)?;
        let mut rng = rand::thread_rng();
        let tokens: std::collections::BTreeMap<String, String> = SECURE_CLIENTS
            .iter()
            .map(|(_, principal)| {
                let secret: u128 = rng.gen();
                (principal.to_string(), format!("{secret:032x}"))
            })
            .collect();
        let tokens_file = pki.join("tokens");
        let lines: String = tokens
            .iter()
            .map(|(principal, token)| format!("{token} {principal}\n"))
            .collect();
        std::fs::write(&tokens_file, lines)?;
        std::fs::set_permissions(
            &tokens_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )?;
        let certificates: String = SECURE_CLIENTS
            .iter()
            .map(|(name, principal)| format!("\"client-{name}\" = \"{principal}\"\n"))
            .collect();
        let config = dir.join("secure.toml");
        std::fs::write(
            &config,
            format!(
                "{settings}\n[auth]\ntokens_file = {}\n\n[auth.certificates]\n{certificates}",
                toml::Value::from(tokens_file.display().to_string())
            ),
        )?;
        let (cert, key) = certs::client_identity(&pki, "admin");
        let tls = crate::wire::tls::client_config(&certs::ca_file(&pki), Some((&cert, &key)))?;
        Ok(Secured {
            pki,
            config,
            tokens,
            client: ClientOptions::default().tls(tls),
        })
    }
}

/// The port of an address this module built (`127.0.0.1:{port}`).
fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("addresses are built from a port")
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// The live processes whose command line names `path`: the containers a job under `path`
/// started (they outlive the replicas that launched them), for a test or the demo to end.
pub fn processes_mentioning(path: &Path) -> Vec<libc::pid_t> {
    let needle = path.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| *pid != std::process::id() as libc::pid_t)
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            // A zombie (state Z) has ended; only its parent's wait is missing.
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |stat| {
                    stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z'))
                });
            !zombie && String::from_utf8_lossy(&cmdline).contains(&needle)
        })
        .collect()
}
