"""A ctrlog container in Python, over the published gRPC contract (proto/ctrlog/v1) alone.

It joins a job, runs the tasks the coordinator assigns it through the stop -> stopped ->
assign -> started handshakes, acknowledges schema and config broadcasts, keeps its session
alive with heartbeats, stops all work when its lease lapses (its heartbeats went unanswered
for longer than --lease-ms) or it is fenced, exits once drained (its own deregistration
arrives, after its tasks were moved off), and leaves the job on SIGTERM. It survives a
replica's death: writes go to the leader, found by asking the seeds, and the subscription
resumes from the last offset it received on another replica.

Stubs come from the .proto (see README.md here):

    python -m grpc_tools.protoc -I proto --python_out=GEN --grpc_python_out=GEN \
        proto/ctrlog/v1/commands.proto proto/ctrlog/v1/errors.proto \
        proto/ctrlog/v1/control.proto
    python container.py --stubs GEN --id c1 --grpc 127.0.0.1:7003,127.0.0.1:7013

With a job's process launcher, {id} gives the name; the token, if the cluster requires one,
comes from CTRLOG_TOKEN, and the CA (for TLS) from CTRLOG_CA.
"""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", required=True, help="the container's name")
    parser.add_argument("--grpc", default=os.environ.get("CTRLOG_GRPC"),
                        help="the replicas' gRPC ports, comma-separated (or some of them: "
                             "the others are learned); default $CTRLOG_GRPC")
    parser.add_argument("--stubs", required=True, help="where grpc_tools.protoc wrote the stubs")
    parser.add_argument("--heartbeat-ms", type=int, default=200)
    parser.add_argument("--lease-ms", type=int, default=1500,
                        help="stop all work when no heartbeat was accepted for this long; "
                             "below the job's session timeout")
    parser.add_argument("--stop-delay-ms", type=int, default=0,
                        help="how long stopping a task takes (its checkpoint)")
    parser.add_argument("--lag-file", help="a file holding the lag each task reports")
    parser.add_argument("--report-file", help="where each task start and stop is appended (JSON lines)")
    return parser.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.stubs)

import grpc  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

from ctrlog.v1 import commands_pb2, control_pb2, control_pb2_grpc, errors_pb2  # noqa: E402

ERROR_TYPE = "ctrlog.v1.Error"
RPC_DEADLINE_S = 5.0


def log(message):
    print(f"[{ARGS.id}] {message}", file=sys.stderr, flush=True)


def detail(error):
    """The ctrlog.v1.Error of a refused call, or None (a transport failure, no replica)."""
    status = rpc_status.from_call(error) if hasattr(error, "trailing_metadata") else None
    if status is None:
        return None
    for any_detail in status.details:
        if any_detail.type_url.endswith(ERROR_TYPE):
            parsed = errors_pb2.Error()
            any_detail.Unpack(parsed)
            return parsed
    return None


class Fenced(Exception):
    """This session is over: the coordinator expired it, or it joined again elsewhere."""


class Replicas:
    """The seeds, the stubs of each, and which one leads, as far as this container knows."""

    def __init__(self, seeds):
        self.seeds = seeds
        self.metadata = []
        token = os.environ.get("CTRLOG_TOKEN")
        if token:
            self.metadata.append(("authorization", f"Bearer {token}"))
        ca = os.environ.get("CTRLOG_CA")
        self.credentials = grpc.ssl_channel_credentials(open(ca, "rb").read()) if ca else None
        self.stubs = {}
        self.ids = {}  # seed -> node id, learned from Status
        self.leader = seeds[0]
        self.lock = threading.Lock()
        self.learned_at = 0.0

    def learn_seeds(self):
        """Adds the gRPC ports a reachable replica's Status lists (the replicas tell each
        other theirs), at most once a second: the seeds given may be only some of them."""
        if time.monotonic() - self.learned_at < 1.0:
            return
        self.learned_at = time.monotonic()
        for seed in list(self.seeds):
            try:
                status = self.stub(seed).Status(control_pb2.StatusRequest(),
                                                metadata=self.metadata, timeout=1.0)
            except grpc.RpcError:
                continue
            self.ids[seed] = status.id
            for member in status.members:
                if member.HasField("grpc_addr") and member.grpc_addr not in self.seeds:
                    self.seeds.append(member.grpc_addr)
                    self.ids[member.grpc_addr] = member.id
            return

    def stub(self, seed):
        with self.lock:
            if seed not in self.stubs:
                if self.credentials:
                    channel = grpc.secure_channel(seed, self.credentials)
                else:
                    channel = grpc.insecure_channel(seed)
                self.stubs[seed] = control_pb2_grpc.ControlLogStub(channel)
            return self.stubs[seed]

    def seed_of(self, node_id):
        for seed in self.seeds:
            if seed not in self.ids:
                try:
                    status = self.stub(seed).Status(control_pb2.StatusRequest(),
                                                    metadata=self.metadata, timeout=1.0)
                    self.ids[seed] = status.id
                except grpc.RpcError:
                    continue
            if self.ids.get(seed) == node_id:
                return seed
        return None

    def call(self, method, request, deadline_s=30.0):
        """Calls `method` at the leader, following NotLeader and trying every seed in turn,
        until it is answered or refused for good (raised), or `deadline_s` passes."""
        give_up = time.monotonic() + deadline_s
        seed = self.leader
        while True:
            try:
                answer = getattr(self.stub(seed), method)(request, metadata=self.metadata,
                                                          timeout=RPC_DEADLINE_S)
                self.leader = seed
                return answer
            except grpc.RpcError as error:
                refusal = detail(error)
                which = refusal.WhichOneof("error") if refusal else None
                if which == "fenced":
                    raise Fenced(str(refusal.fenced)) from error
                retriable = which in (None, "not_leader", "unavailable", "overloaded", "shutting_down")
                if not retriable or time.monotonic() > give_up:
                    raise
                following = None
                if which == "not_leader" and refusal.not_leader.HasField("leader_grpc_addr"):
                    following = refusal.not_leader.leader_grpc_addr
                elif which == "not_leader" and refusal.not_leader.HasField("leader_id"):
                    following = self.seed_of(refusal.not_leader.leader_id)
                self.learn_seeds()
                if following and following != seed:
                    seed = following
                else:
                    seed = self.seeds[(self.seeds.index(seed) + 1) % len(self.seeds)]
                    time.sleep(0.05)


class Container:
    def __init__(self):
        if not ARGS.grpc:
            sys.exit("give the replicas' gRPC ports: --grpc or CTRLOG_GRPC")
        self.replicas = Replicas([seed for seed in ARGS.grpc.split(",") if seed])
        self.producer = random.getrandbits(63) or 1
        self.seq = 0
        self.epoch = None
        self.owned = set()
        self.working = True
        self.lock = threading.Lock()
        self.last_accepted = time.monotonic()
        self.stopping = threading.Event()
        self.fenced = threading.Event()
        self.drained = threading.Event()

    def next_pair(self):
        with self.lock:
            self.seq += 1
            return control_pb2.ProducerSeq(producer=self.producer, seq=self.seq)

    def append(self, **command):
        """Appends one typed command idempotently (a retry keeps its pair)."""
        request = control_pb2.AppendRequest(producer=self.next_pair(),
                                            typed=commands_pb2.Command(**command))
        return self.replicas.call("Append", request)

    def report(self, task, running):
        if not ARGS.report_file:
            return
        line = json.dumps({"container": ARGS.id, "epoch": self.epoch, "task": task,
                           "running": running, "at_us": time.time_ns() // 1000})
        # One short O_APPEND write per event, so that containers do not interleave.
        fd = os.open(ARGS.report_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def start(self, task):
        with self.lock:
            if self.working:
                self.report(task, True)
            self.owned.add(task)

    def stop(self, task):
        with self.lock:
            if task in self.owned:
                self.owned.discard(task)
                if self.working:
                    self.report(task, False)

    def set_working(self, working):
        with self.lock:
            if working != self.working:
                self.working = working
                for task in sorted(self.owned):
                    self.report(task, working)
                log("lease renewed; working" if working else "lease lapsed; stopped all work")

    def stop_all(self):
        self.set_working(False)
        with self.lock:
            self.owned.clear()

    def lag(self):
        per_task = 0
        if ARGS.lag_file:
            try:
                per_task = int(open(ARGS.lag_file).read().strip() or 0)
            except (OSError, ValueError):
                pass
        with self.lock:
            return {task: per_task for task in self.owned}

    def heartbeats(self):
        """Beats every --heartbeat-ms; the lease is checked on every beat, answered or not."""
        while not self.stopping.is_set():
            sent = time.monotonic()
            request = control_pb2.HeartbeatRequest(container=ARGS.id, epoch=self.epoch,
                                                   lag=self.lag())
            try:
                self.replicas.call("Heartbeat", request, deadline_s=ARGS.lease_ms / 1000)
                self.last_accepted = sent
            except Fenced as fenced:
                log(f"fenced: {fenced}")
                self.fenced.set()
                self.stop_all()
                return
            except grpc.RpcError as error:
                log(f"heartbeat failed: {error.code()}")
            self.set_working(time.monotonic() - self.last_accepted < ARGS.lease_ms / 1000)
            self.stopping.wait(max(0.0, ARGS.heartbeat_ms / 1000 - (time.monotonic() - sent)))

    def obey(self, entry):
        which = entry.command.WhichOneof("command") if entry.HasField("command") else None
        if which == "assign_task" and entry.command.assign_task.epoch == self.epoch:
            task = entry.command.assign_task.task
            log(f"runs {task}")
            self.start(task)
            self.append(task_started=commands_pb2.TaskStarted(
                task=task, container=ARGS.id, epoch=self.epoch))
        elif which == "stop_task" and entry.command.stop_task.epoch == self.epoch:
            task = entry.command.stop_task.task
            time.sleep(ARGS.stop_delay_ms / 1000)
            log(f"stops {task}")
            self.stop(task)
            self.append(task_stopped=commands_pb2.TaskStopped(
                task=task, container=ARGS.id, epoch=self.epoch, checkpoint=b"python"))
        elif which in ("schema_change", "config_change"):
            log(f"acks the {which.replace('_', ' ')} at offset {entry.offset}")
            self.append(ack=commands_pb2.Ack(container=ARGS.id, epoch=self.epoch,
                                             offset=entry.offset))
        elif which == "expire_container" and entry.command.expire_container.epoch == self.epoch:
            raise Fenced("expired by the coordinator")
        elif (which == "deregister_container"
              and entry.command.deregister_container.epoch == self.epoch):
            # Drained (scaled in): its tasks were moved off first; the session is over.
            log("drained by the coordinator")
            self.drained.set()
            self.stopping.set()

    def resume_from_state(self):
        """Far behind the retained log: take up what the state says this session owns."""
        owned = set()
        offset = 0
        for part in self.replicas.stub(self.replicas.leader).State(
                control_pb2.StateRequest(min_offset=0), metadata=self.replicas.metadata,
                timeout=RPC_DEADLINE_S):
            offset = part.offset
            for task in part.tasks:
                if task.owner_container == ARGS.id and task.owner_epoch == self.epoch:
                    owned.add(task.task)
        for task in owned - self.owned:
            self.start(task)
        return offset + 1

    def subscribe(self):
        """Follows this container's commands from after its registration, on any replica,
        resuming from the last offset received whenever a stream breaks."""
        offset = self.epoch + 1
        seeds = self.replicas.seeds
        at = 0
        while not self.stopping.is_set() and not self.fenced.is_set():
            seed = seeds[at % len(seeds)]
            request = control_pb2.SubscribeRequest(**{"from": offset}, container=ARGS.id)
            try:
                stream = self.replicas.stub(seed).Subscribe(request, metadata=self.replicas.metadata)
                for reply in stream:
                    for entry in reply.entries:
                        self.obey(entry)
                    offset = reply.next_offset
                    if self.stopping.is_set() or self.fenced.is_set():
                        stream.cancel()
                        break
            except Fenced as fenced:
                log(f"fenced: {fenced}")
                self.fenced.set()
            except grpc.RpcError as error:
                refusal = detail(error)
                if refusal is not None and refusal.WhichOneof("error") == "compacted":
                    offset = self.resume_from_state()
                    continue
                if error.code() != grpc.StatusCode.CANCELLED:
                    log(f"subscription at {seed} broke ({error.code()}); resuming at {offset}")
                at += 1
                time.sleep(0.1)

    def run(self):
        joined = self.replicas.call("Join", control_pb2.JoinRequest(
            container=ARGS.id, location=f"python pid {os.getpid()}", producer=self.next_pair()))
        self.epoch = joined.epoch
        self.replicas.learn_seeds()
        log(f"joined at epoch {self.epoch}; replicas {','.join(self.replicas.seeds)}")
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        beating = threading.Thread(target=self.heartbeats, daemon=True)
        beating.start()
        following = threading.Thread(target=self.subscribe, daemon=True)
        following.start()
        while not self.stopping.is_set() and not self.fenced.is_set():
            self.stopping.wait(0.1)
        self.stop_all()
        if self.fenced.is_set():
            return 3
        if self.drained.is_set():
            return 0
        try:
            self.replicas.call("Leave", control_pb2.LeaveRequest(
                container=ARGS.id, epoch=self.epoch, producer=self.next_pair()), deadline_s=5.0)
            log("left the job")
        except (grpc.RpcError, Fenced) as error:
            log(f"could not leave: {error}")
        return 0


if __name__ == "__main__":
    sys.exit(Container().run())
