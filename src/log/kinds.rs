//! Built-in kind numbers. Numbers are never reused; a changed body is a new version.

use super::Kind;

pub const REGISTER_CONTAINER: Kind = 1;
pub const DEREGISTER_CONTAINER: Kind = 2;
pub const EXPIRE_CONTAINER: Kind = 3;
pub const LAUNCH_CONTAINER: Kind = 4;
pub const CANCEL_LAUNCH: Kind = 5;
pub const ADD_INPUTS: Kind = 10;
pub const REMOVE_INPUTS: Kind = 11;
pub const ASSIGN_TASK: Kind = 20;
pub const STOP_TASK: Kind = 21;
pub const TASK_STARTED: Kind = 22;
pub const TASK_STOPPED: Kind = 23;
pub const DESIRED_CONTAINERS: Kind = 30;
pub const SCHEMA_CHANGE: Kind = 40;
pub const CONFIG_CHANGE: Kind = 41;
pub const ACK: Kind = 50;
pub const SET_VOCABULARY_LEVEL: Kind = 60;
