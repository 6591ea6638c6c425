//! A loopback TCP proxy the tests put between a client and a replica, to break connections
//! for real: cut every connection, or swallow the replica's answers so that a request's fate
//! is unknown to its sender.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Shared {
    target: Mutex<SocketAddr>,
    swallow_answers: AtomicBool,
    /// Connections accepted so far.
    accepted: AtomicU64,
    /// Bumped to close every open connection.
    cuts: watch::Sender<u64>,
}

/// One proxy in front of one address. Dropping it stops accepting.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            swallow_answers: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            cuts: watch::Sender::new(0),
        });
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(forward(client, shared.clone()));
                }
            }
        });
        Proxy {
            addr,
            shared,
            accept,
        }
    }

    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// How many connections the proxy has accepted.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Closes every connection open through the proxy now; new ones are accepted.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Sends new connections to another address, like a virtual IP that moves to the new
    /// leader.
    pub fn retarget(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = target;
    }

    /// While on, bytes from the replica are dropped: requests arrive, answers never do.
    pub fn swallow_answers(&self, on: bool) {
        self.shared.swallow_answers.store(on, Ordering::SeqCst);
    }
}

async fn forward(mut client: TcpStream, shared: Arc<Shared>) {
    let mut cuts = shared.cuts.subscribe();
    cuts.mark_unchanged();
    let target = *shared.target.lock().unwrap();
    let Ok(mut server) = TcpStream::connect(target).await else {
        return; // the replica is down: the client sees its connection closed
    };
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let requests = tokio::io::copy(&mut client_read, &mut server_write);
    let answers = async {
        let mut buffer = vec![0u8; 64 << 10];
        loop {
            let n = server_read.read(&mut buffer).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if !shared.swallow_answers.load(Ordering::SeqCst) {
                client_write.write_all(&buffer[..n]).await?;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = answers => {}
        _ = cuts.changed() => {}
    }
}
