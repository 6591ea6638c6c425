//! Client authentication and roles on a TLS cluster: client certificates and bearer tokens
//! map to `admin`, `operator` and `container:ID`; every refusal is typed, counted, and applies
//! nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{http_get, metric_sample, WAIT};
use ctrlog::client::tls::client_config;
use ctrlog::client::{ApiError, ClientError, ClientOptions, ControlClient, FetchRequest, Member};
use ctrlog::log::{Command, ContainerId, Filter, RegisterContainer, Target, TaskId, TaskStarted};
use ctrlog::server::AuthConfig;
use ctrlog::tools::LocalCluster;

const OPERATOR_TOKEN: &str = "operator-token-0123456789";
const ADMIN_TOKEN: &str = "admin-token-0123456789abc";
const C1_TOKEN: &str = "container-c1-token-0123456";

struct Setup {
    pki: tempfile::TempDir,
    cluster: LocalCluster,
    _data: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Setup {
        let pki = tempfile::tempdir().unwrap();
        ctrlog::tools::certs::generate(
            pki.path(),
            &[1, 2, 3],
            &["127.0.0.1".into()],
            &["operator".into(), "stranger".into()],
            30,
        )
        .unwrap();
        let tokens = pki.path().join("tokens");
        std::fs::write(
            &tokens,
            format!(
                "# token role\n{OPERATOR_TOKEN} operator\n{ADMIN_TOKEN} admin\n{C1_TOKEN} container:c1\n"
            ),
        )
        .unwrap();
        let data = tempfile::tempdir().unwrap();
        let dir = pki.path().to_path_buf();
        let cluster = LocalCluster::start(data.path(), 3, move |c| {
            c.tls = Some(ctrlog::tools::certs::replica_files(&dir, c.id));
            c.http_addr = Some("127.0.0.1:0".parse().unwrap());
            c.auth = Some(AuthConfig {
                tokens_file: Some(tokens.clone()),
                // Only the operator's certificate is known; the stranger's is the CA's too.
                certificates: BTreeMap::from([("client-operator".into(), "operator".into())]),
            });
        })
        .await
        .unwrap();
        cluster.wait_for_leader(WAIT).await.unwrap();
        Setup {
            pki,
            cluster,
            _data: data,
        }
    }

    async fn client(
        &self,
        certificate: Option<&str>,
        token: Option<&str>,
    ) -> Result<ControlClient, ClientError> {
        let identity =
            certificate.map(|name| ctrlog::tools::certs::client_identity(self.pki.path(), name));
        let tls = client_config(
            &ctrlog::tools::certs::ca_file(self.pki.path()),
            identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
        .unwrap();
        let options = ClientOptions {
            tls: Some(tls),
            token: token.map(String::from),
            retry_deadline: Duration::from_secs(2),
            ..ClientOptions::default()
        };
        ControlClient::connect_with(&self.cluster.client_addrs(), options).await
    }
}

fn api_error<T>(result: Result<T, ClientError>) -> ApiError {
    match result {
        Err(ClientError::Api(error)) => error,
        Err(other) => panic!("expected a typed refusal, got {other}"),
        Ok(_) => panic!("expected a typed refusal, it was served"),
    }
}

fn is_forbidden(error: &ApiError) -> bool {
    matches!(error, ApiError::Forbidden { .. })
}

async fn applied_offset(setup: &Setup) -> u64 {
    let leader = setup.cluster.wait_for_leader(WAIT).await.unwrap();
    setup.cluster.replica(leader).status().applied_offset
}

/// Goal: without credentials the cluster answers `Unauthorized`, to no certificate, to a
/// certificate it does not know, and to a bad token; nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_unknown_credentials_are_unauthorized() {
    let setup = Setup::start().await;
    let before = applied_offset(&setup).await;
    for (certificate, what) in [
        (None, "no certificate"),
        (Some("stranger"), "an unknown certificate"),
    ] {
        let error = api_error(setup.client(certificate, None).await);
        assert!(
            matches!(error, ApiError::Unauthorized(_)),
            "{what}: {error:?}"
        );
    }
    match setup.client(None, Some("not-a-token-at-all-0000")).await {
        Err(ClientError::GaveUp { last, .. }) => {
            assert!(last.contains("unauthorized"), "{last}");
        }
        Err(other) => panic!("a bad token: unexpected {other}"),
        Ok(_) => panic!("a bad token was accepted"),
    }
    assert_eq!(applied_offset(&setup).await, before, "nothing was applied");
    let mut counted = 0.0;
    for replica in setup.cluster.running() {
        let (_, metrics) = http_get(replica.http_addr().unwrap(), "/metrics").await;
        counted += metric_sample(
            &metrics,
            "ctrlog_auth_refusals_total{outcome=\"unauthorized\"}",
        )
        .unwrap_or(0.0);
    }
    assert!(counted >= 3.0, "the refusals were counted ({counted})");
    setup.cluster.shutdown().await;
}

/// Goal: each role does what it may and is `Forbidden` from the rest: a container token acts
/// only as its own container, an operator (by certificate) appends but changes no membership
/// and takes no snapshot, an admin (by token) does both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_allow_their_own_actions_and_forbid_the_rest() {
    let setup = Setup::start().await;
    let c1 = ContainerId::new("c1").unwrap();
    let c2 = ContainerId::new("c2").unwrap();

    let container = setup.client(None, Some(C1_TOKEN)).await.unwrap();
    let epoch = container
        .append(Command::RegisterContainer(RegisterContainer {
            container: c1.clone(),
            location: "host-a".into(),
        }))
        .await
        .expect("a container registers itself")
        .offset;
    container
        .heartbeat(&c1, epoch, &BTreeMap::new())
        .await
        .expect("and heartbeats as itself");
    let as_other = container
        .append(Command::TaskStarted(TaskStarted {
            task: TaskId::new("t1").unwrap(),
            container: c2.clone(),
            epoch,
        }))
        .await;
    assert!(
        is_forbidden(&api_error(as_other)),
        "acking as another container"
    );
    assert!(is_forbidden(&api_error(
        container.heartbeat(&c2, 1, &BTreeMap::new()).await
    )));
    let everything = FetchRequest {
        from: 1,
        entries_max: 10,
        bytes_max: 1 << 20,
        max_wait_ms: 0,
        linger_ms: 0,
        filter: Filter::Everything,
    };
    assert!(is_forbidden(&api_error(
        container.fetch(everything.clone()).await
    )));
    let own = FetchRequest {
        filter: Filter::Container(c1.clone()),
        ..everything.clone()
    };
    assert!(!container.fetch(own).await.unwrap().entries.is_empty());
    let custom = container
        .append_to(Target::All, Command::custom(1, 1, b"x".to_vec()))
        .await;
    assert!(
        is_forbidden(&api_error(custom)),
        "a container appends no user commands"
    );

    let operator = setup.client(Some("operator"), None).await.unwrap();
    operator
        .append_to(
            Target::All,
            Command::custom(1, 1, b"by the operator".to_vec()),
        )
        .await
        .expect("an operator appends");
    operator
        .fetch(everything)
        .await
        .expect("and reads everything");
    let member = Member {
        peer_addr: "127.0.0.1:1".into(),
        client_addr: "127.0.0.1:2".into(),
    };
    assert!(is_forbidden(&api_error(
        operator.add_member(9, member).await
    )));
    assert!(is_forbidden(&api_error(operator.snapshot().await)));

    let admin = setup.client(None, Some(ADMIN_TOKEN)).await.unwrap();
    admin.snapshot().await.expect("an admin takes snapshots");

    let leader = setup.cluster.wait_for_leader(WAIT).await.unwrap();
    let members = setup.cluster.replica(leader).status().members.len();
    assert_eq!(members, 3, "the forbidden membership change did nothing");
    setup.cluster.shutdown().await;
}
