//! The controller `ctrlog serve` runs from the `[job]` section of its configuration
//! ([`job_config`](crate::server::config::job)). Every replica with a `[job]` runs one; only the
//! leader's acts (see [`controller`](crate::controller)). Without `[job]` a replica runs none.

use std::sync::Arc;

use crate::controller::{
    Capacity, Controller, InputSource, JobDriver, LaunchSettings, ProcessLauncher, SettingsFn,
    StaticInputs, WatchedFile,
};
use crate::jobs::plan::GroupByPartition;
use crate::log::ContainerId;
use crate::server::config::job::{parse_inputs, GrouperName, JobConfig, LauncherConfig, UserRange};
use crate::server::config::ReplicaConfig;
use crate::server::handle::ReplicaHandle;
use crate::server::ports::auth::container_token;

/// The controller `ctrlog serve` runs beside `replica`, as `config`'s `[job]` describes.
/// `config` was validated.
pub fn controller(
    config: &ReplicaConfig,
    job: &JobConfig,
    replica: ReplicaHandle,
) -> Controller<ReplicaHandle> {
    let inputs: Box<dyn InputSource> = match (&job.inputs, &job.inputs_file) {
        (_, Some(path)) => Box::new(WatchedFile::new(path)),
        (inputs, None) => Box::new(StaticInputs::new(
            parse_inputs(inputs.as_deref().unwrap_or_default()).expect("validated"),
        )),
    };
    let capacity = match &job.launcher {
        LauncherConfig::External {} => Capacity::Orchestrated,
        LauncherConfig::Process {
            command,
            log_dir,
            run_as_user,
            run_as_user_range,
            run_as_group,
            pass_env,
        } => {
            let mut launcher =
                ProcessLauncher::new(&command[0], command[1..].to_vec(), log_dir.clone())
                    .keep_running_on_drop()
                    .run_as(*run_as_user, run_as_group.or(*run_as_user))
                    .pass_env(pass_env.clone())
                    .with_settings(launch_settings(config, replica.clone()));
            if let Some(uids) = run_as_user_range.as_ref().and_then(UserRange::uids) {
                launcher = launcher.run_each_as_one_of(uids);
            }
            Capacity::Launched(Arc::new(launcher))
        }
    };
    let driver = JobDriver {
        inputs,
        grouper: Box::new(match job.grouper {
            GrouperName::Partition => GroupByPartition,
        }),
        policy: Box::new(job.scaling.policy()),
        capacity,
    };
    Controller::new(replica, driver, job.controller_config())
}

/// What a launched container connects with: the members' client addresses as they are at the
/// launch, and the gRPC ports this replica knows of, the CA of `[tls]`, and its own token
/// from the tokens file of `[auth]`.
fn launch_settings(config: &ReplicaConfig, replica: ReplicaHandle) -> SettingsFn {
    let ca = config
        .tls
        .as_ref()
        .map(|tls| tls.ca_file.display().to_string());
    let tokens_file = config.auth.as_ref().and_then(|a| a.tokens_file.clone());
    Box::new(move |container: &ContainerId| {
        let members = replica.status().members;
        let cluster = members
            .iter()
            .map(|m| m.member.client_addr.as_str())
            .collect::<Vec<_>>()
            .join(",");
        // The gRPC ports the leader knows of: its own and those the members told it.
        let grpc = (members.iter())
            .filter_map(|m| replica.grpc_addr_of(m.id))
            .collect::<Vec<_>>()
            .join(",");
        let mut settings = LaunchSettings {
            placeholders: vec![
                ("cluster", cluster.clone()),
                ("grpc", grpc.clone()),
                ("ca", ca.clone().unwrap_or_default()),
            ],
            env: vec![
                ("CTRLOG_CLUSTER".into(), cluster),
                ("CTRLOG_GRPC".into(), grpc),
            ],
        };
        if let Some(ca) = &ca {
            settings.env.push(("CTRLOG_CA".into(), ca.clone()));
        }
        if let Some(path) = &tokens_file {
            let token = container_token(path, container)?.ok_or_else(|| {
                format!(
                    "{} gives no token the role container:{container}; add one per container \
                     name the job may launch",
                    path.display()
                )
            })?;
            settings.env.push(("CTRLOG_TOKEN".into(), token));
        }
        Ok(settings)
    })
}
