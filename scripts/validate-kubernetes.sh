#!/usr/bin/env bash
# Validates the manifests under deploy/kubernetes offline, without a cluster:
#
# 1. kubernetes-validate (PyPI, pinned) checks every document against the Kubernetes OpenAPI
#    schemas of one pinned Kubernetes version, strictly: unknown fields are refused, and a
#    kind it has no schema for is an error, except KEDA's (a custom resource: no schema).
# 2. A Python check covers what that cannot: KEDA's ScaledObject (known fields and types, and
#    its HPA behavior block schema-checked as part of an HPA), duplicate YAML keys (which the
#    YAML loader would silently merge), and that the files agree with each other: the replica
#    TOML parses, is in external launcher mode, and its [job.scaling] min/max equal the
#    scalers'; the scalers target the Deployment; CTRLOG_CLUSTER names the replicas.
# 3. scripts/kubernetes-policy.py checks the security policy the files must meet as shipped
#    (its docstring lists the rules), over the manifests and over the Secrets that
#    deploy/kubernetes/secrets.sh writes with this build's `ctrlog` (CTRLOG, built if absent).
#
# Installs kubernetes-validate into a venv at target/kubernetes-validate-venv on first use.
# Exits non-zero on any invalid manifest.
#
#   scripts/validate-kubernetes.sh
#   KUBERNETES_VERSION=1.30.0 scripts/validate-kubernetes.sh     (another schema version)
#   MANIFESTS=/elsewhere/deploy/kubernetes scripts/validate-kubernetes.sh   (other files)
set -euo pipefail
cd "$(dirname "$0")/.."

KV_VERSION=1.37.0                            # kubernetes-validate, ships schemas 1.25–1.37
K8S_VERSION=${KUBERNETES_VERSION:-1.34.0}    # the Kubernetes version validated against
MANIFESTS=${MANIFESTS:-deploy/kubernetes}
VENV=target/kubernetes-validate-venv
CTRLOG=${CTRLOG:-target/debug/ctrlog}

shopt -s nullglob
files=("$MANIFESTS"/*.yaml "$MANIFESTS"/*.yml)
if [ ${#files[@]} -eq 0 ]; then
    echo "no YAML files under $MANIFESTS" >&2
    exit 1
fi

# --- install -----------------------------------------------------------------------------
py="$VENV/bin/python"
installed=$("$py" -m kubernetes_validate --version 2>/dev/null || true)
if [ "$installed" != "$KV_VERSION" ]; then
    echo "installing kubernetes-validate $KV_VERSION into $VENV"
    rm -rf "$VENV"
    mkdir -p target
    python3 -m venv "$VENV" || {
        echo "python3 -m venv failed (on Debian's python3: apt-get install python3-venv)" >&2
        exit 1
    }
    "$py" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
    # The consistency check reads TOML: tomllib is in Python 3.11+, tomli before that.
    "$py" -c 'import tomllib' 2>/dev/null ||
        "$py" -m pip install --quiet --disable-pip-version-check "tomli==2.0.1"
fi

# --- the Secrets secrets.sh writes, checked with the manifests -----------------------------
[ -x "$CTRLOG" ] || cargo build --quiet --bin ctrlog
out=$(mktemp)
secrets=$(mktemp -d)
trap 'rm -rf "$out" "$secrets"' EXIT
CTRLOG=$CTRLOG deploy/kubernetes/secrets.sh "$secrets" >/dev/null

# --- 1. kubernetes-validate, strict ------------------------------------------------------
echo "== kubernetes-validate $KV_VERSION --strict -k $K8S_VERSION"
status=0
"$py" -m kubernetes_validate --strict -k "$K8S_VERSION" "${files[@]}" "$secrets/secrets.yaml" \
    >"$out" 2>&1 || status=$?
cat "$out"
if [ "$status" -ne 0 ]; then
    echo "FAIL: kubernetes-validate refused a manifest (exit $status)" >&2
    exit 1
fi
# It only warns (and exits 0) for a kind it has no schema for: a misspelt kind or apiVersion
# would pass unchecked. Only KEDA's custom resources may, and step 2 checks those.
unchecked=$(grep -v '^INFO ' "$out" |
    grep -Ev "^WARN .* with api version keda\.sh/v1alpha1 for kubernetes version" || true)
if [ -n "$unchecked" ]; then
    echo "FAIL: kubernetes-validate could not schema-check these documents:" >&2
    echo "$unchecked" >&2
    exit 1
fi
if ! grep -q '^INFO ' "$out"; then
    echo "FAIL: kubernetes-validate checked nothing" >&2
    exit 1
fi

# --- 2. KEDA, duplicate keys, cross-file consistency -------------------------------------
echo "== custom resources, duplicate keys and consistency between the files"
"$py" - "$K8S_VERSION" "${files[@]}" <<'PY'
import copy
import sys

import yaml
import kubernetes_validate.utils as kv

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

version, paths = sys.argv[1], sys.argv[2:]
errors = []


def fail(where, message):
    errors.append(f"{where}: {message}")


class NoDuplicates(yaml.SafeLoader):
    pass


def construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


NoDuplicates.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)

docs = []  # (path, document)
for path in paths:
    try:
        with open(path) as f:
            loaded = [d for d in yaml.load_all(f, Loader=NoDuplicates) if d is not None]
    except yaml.YAMLError as e:
        fail(path, f"not valid YAML: {e}")
        continue
    for d in loaded:
        if not isinstance(d, dict) or "apiVersion" not in d or "kind" not in d:
            fail(path, "a document without apiVersion and kind")
            continue
        docs.append((path, d))


def find(kind, api=None):
    return [(p, d) for p, d in docs
            if d["kind"] == kind and (api is None or d["apiVersion"] == api)]


def unknown(where, obj, allowed):
    if not isinstance(obj, dict):
        fail(where, f"must be a mapping, not {type(obj).__name__}")
        return
    for key in set(obj) - set(allowed):
        fail(where, f"unknown field {key!r} (known: {', '.join(sorted(allowed))})")


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


# KEDA ScaledObject (keda.sh/v1alpha1, KEDA 2.x). No schema ships with kubernetes-validate,
# so the fields are checked here; the embedded HPA behavior goes through the HPA schema.
keda = find("ScaledObject")
for path, so in keda:
    errors_before = len(errors)
    w = f"{path}: ScaledObject/{so.get('metadata', {}).get('name')}"
    if so["apiVersion"] != "keda.sh/v1alpha1":
        fail(w, f"apiVersion {so['apiVersion']!r}, expected keda.sh/v1alpha1")
    unknown(w, so, {"apiVersion", "kind", "metadata", "spec"})
    meta = so.get("metadata") or {}
    if not meta.get("name"):
        fail(w, "metadata.name is missing")
    spec = so.get("spec") or {}
    unknown(f"{w}: spec", spec, {
        "scaleTargetRef", "pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
        "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "advanced", "fallback",
        "triggers"})
    for field in ("pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
                  "idleReplicaCount", "minReplicaCount", "maxReplicaCount"):
        if field in spec and not (is_int(spec[field]) and spec[field] >= 0):
            fail(f"{w}: spec.{field}", f"must be a non-negative integer, not {spec[field]!r}")
    ref = spec.get("scaleTargetRef")
    if not isinstance(ref, dict) or not ref.get("name"):
        fail(f"{w}: spec.scaleTargetRef", "must name the target")
    else:
        unknown(f"{w}: spec.scaleTargetRef", ref,
                {"apiVersion", "kind", "name", "envSourceContainerName"})
    advanced = spec.get("advanced") or {}
    unknown(f"{w}: spec.advanced", advanced,
            {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount",
             "scalingModifiers"})
    hpa_config = advanced.get("horizontalPodAutoscalerConfig") or {}
    unknown(f"{w}: spec.advanced.horizontalPodAutoscalerConfig", hpa_config,
            {"name", "behavior"})
    # What KEDA turns it into: an autoscaling/v2 HPA. Validate that with the real schema.
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": meta.get("name", "x")},
        "spec": {
            "scaleTargetRef": {"apiVersion": (ref or {}).get("apiVersion", "apps/v1"),
                               "kind": (ref or {}).get("kind", "Deployment"),
                               "name": (ref or {}).get("name", "x")},
            "minReplicas": spec.get("minReplicaCount", 1),
            "maxReplicas": spec.get("maxReplicaCount", 100),
            "metrics": [{"type": "External", "external": {
                "metric": {"name": "keda"},
                "target": {"type": "AverageValue", "averageValue": "1"}}}],
        },
    }
    if "behavior" in hpa_config:
        hpa["spec"]["behavior"] = hpa_config["behavior"]
    try:
        kv.validate(hpa, version, strict=True)
    except kv.ValidationError as e:
        fail(f"{w}: as an HPA", f"{'.'.join(map(str, e.path))}: {e.message}")
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        fail(f"{w}: spec.triggers", "must be a non-empty list")
        triggers = []
    for i, t in enumerate(triggers):
        tw = f"{w}: spec.triggers[{i}]"
        unknown(tw, t, {"type", "name", "metadata", "authenticationRef", "metricType",
                        "useCachedMetrics"})
        if not isinstance(t, dict):
            continue
        if t.get("metricType", "AverageValue") not in ("AverageValue", "Value", "Utilization"):
            fail(tw, f"metricType {t['metricType']!r}")
        md = t.get("metadata")
        if not isinstance(md, dict):
            fail(tw, "metadata must be a mapping")
            continue
        for k, v in md.items():
            if not isinstance(v, str):  # the CRD: map of string to string
                fail(f"{tw}.metadata.{k}", f"must be a string (quote it), not {v!r}")
        if t.get("type") == "prometheus":
            for k in ("serverAddress", "query", "threshold"):
                if not md.get(k):
                    fail(f"{tw}.metadata", f"prometheus needs {k}")
            try:
                float(md.get("threshold", ""))
            except ValueError:
                fail(f"{tw}.metadata.threshold", f"not a number: {md.get('threshold')!r}")
        else:
            fail(tw, f"type {t.get('type')!r}, expected prometheus")
    if len(errors) == errors_before:
        print(f"OK   {path}: ScaledObject/{meta.get('name')} (fields and types checked here, "
              f"not against KEDA's CRD schema; its HPA behavior against the HPA schema)")

# Consistency between the files.
deployments = {d["metadata"]["name"]: (p, d) for p, d in find("Deployment")}
for p, d in find("HorizontalPodAutoscaler") + keda:
    target = d["spec"]["scaleTargetRef"].get("name")
    if target not in deployments:
        fail(p, f"{d['kind']} scales {target!r}, which no file here defines as a Deployment")

scaling_limits = []  # (where, min, max)
for p, d in find("HorizontalPodAutoscaler"):
    s = d["spec"]
    scaling_limits.append((f"{p} HPA", s.get("minReplicas", 1), s["maxReplicas"]))
    names = [m.get("external", {}).get("metric", {}).get("name") for m in s.get("metrics", [])]
    if "ctrlog_desired_containers" not in names:
        fail(p, "the HPA does not use the metric ctrlog_desired_containers")
for p, d in keda:
    s = d["spec"]
    scaling_limits.append((f"{p} ScaledObject", s.get("minReplicaCount", 0),
                           s.get("maxReplicaCount", 100)))

statefulsets = find("StatefulSet")
config_maps = {d["metadata"]["name"]: (p, d) for p, d in find("ConfigMap")}
client_addrs = None
for p, sts in statefulsets:
    ns = sts["metadata"].get("namespace", "default")
    pod = sts["spec"]["template"]["spec"]
    services = {d["metadata"]["name"]: d for _, d in find("Service")}
    service = services.get(sts["spec"]["serviceName"])
    if service is None or service["spec"].get("clusterIP") != "None":
        fail(p, f"serviceName {sts['spec']['serviceName']!r} is not a headless Service here")
    for v in pod.get("volumes", []):
        if "configMap" not in v:
            continue
        cm_name = v["configMap"]["name"]
        if cm_name not in config_maps:
            fail(p, f"mounts ConfigMap {cm_name!r}, which no file here defines")
            continue
        cp, cm = config_maps[cm_name]
        mounts = [m["mountPath"] for c in pod["containers"]
                  for m in c.get("volumeMounts", []) if m["name"] == v["name"]]
        for key, text in cm.get("data", {}).items():
            if not key.endswith(".toml"):
                continue
            try:
                conf = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                fail(f"{cp}: {key}", f"not valid TOML: {e}")
                continue
            job = conf.get("job", {})
            if job.get("launcher", {}).get("kind") != "external":
                fail(f"{cp}: {key}", "[job.launcher] kind is not \"external\"")
            sc = job.get("scaling", {})
            limits = (f"{cp}: {key} [job.scaling]", sc.get("min"), sc.get("max"))
            if limits not in scaling_limits:
                scaling_limits.insert(0, limits)
            inputs = job.get("inputs_file")
            if inputs:
                directory, _, name = inputs.rpartition("/")
                if directory not in mounts or name not in cm.get("data", {}):
                    fail(f"{cp}: {key}", f"inputs_file {inputs} is not this ConfigMap's "
                         f"key {name!r} mounted at {directory}")
            members = conf.get("initial_members", {})
            replica_ids = []
            for _, one in statefulsets:
                args = one["spec"]["template"]["spec"]["containers"][0].get("args") or []
                replica_ids.append(args[args.index("--id") + 1] if "--id" in args else None)
            if sorted(members) != sorted(map(str, replica_ids)):
                fail(f"{cp}: {key}", f"initial_members {sorted(members)} are not the "
                     f"StatefulSets' --id values {replica_ids}")
            replica_id = replica_ids[statefulsets.index((p, sts))]
            host = f"{sts['metadata']['name']}-0.{sts['spec']['serviceName']}.{ns}.svc"
            member = members.get(str(replica_id), {})
            for field in ("peer_addr", "client_addr"):
                if not str(member.get(field, "")).startswith(host):
                    fail(f"{cp}: {key}", f"initial_members.{replica_id}.{field} "
                         f"{member.get(field)!r} is not the pod {host}...")
            client_addrs = [members[k]["client_addr"] for k in sorted(members, key=int)]

# The StatefulSets, one per replica, differ in nothing but the replica's number, where it
# is written: the name, the `replica` label (and selector), --id and the Secret's name.
def without_number(sts):
    sts = copy.deepcopy(sts)
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    args = pod["containers"][0].get("args") or []
    if "--id" in args:
        args[args.index("--id") + 1] = "N"
    sts["metadata"]["name"] = "N"
    for labels in (sts["metadata"].get("labels"), spec["selector"].get("matchLabels"),
                   spec["template"]["metadata"].get("labels")):
        if labels and "replica" in labels:
            labels["replica"] = "N"
    for v in pod.get("volumes", []):
        if "secret" in v:
            v["secret"]["secretName"] = "N"
    return yaml.safe_dump(sts)


if len({without_number(one) for _, one in statefulsets}) > 1:
    fail("StatefulSets", "differ in more than the replica's number: keep them identical")

if len({(lo, hi) for _, lo, hi in scaling_limits}) > 1:
    fail("scaling limits", "min/max differ: " + "; ".join(
        f"{w}: {lo}..{hi}" for w, lo, hi in scaling_limits))

for p, dep in deployments.values():
    for c in dep["spec"]["template"]["spec"]["containers"]:
        env = {e["name"]: e for e in c.get("env", [])}
        cluster = env.get("CTRLOG_CLUSTER", {}).get("value")
        if cluster is None:
            continue
        if client_addrs is not None and cluster.split(",") != client_addrs:
            fail(p, f"CTRLOG_CLUSTER {cluster!r} is not the replicas' client addresses "
                 f"{','.join(client_addrs)}")
        pod_name = env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
        if pod_name.get("fieldPath") != "metadata.name" or "$(POD_NAME)" not in c.get("args", []):
            fail(p, "the container's --id is not the pod name ($(POD_NAME) from metadata.name)")

if errors:
    for e in errors:
        print("ERROR " + e)
    sys.exit(1)
print(f"OK   no duplicate keys in {len(paths)} files; min/max agree ("
      + "; ".join(f"{w}: {lo}..{hi}" for w, lo, hi in scaling_limits)
      + "); scalers target a Deployment defined here; CTRLOG_CLUSTER and initial_members "
      "name the StatefulSet's pods")
PY

# --- 3. the security policy ---------------------------------------------------------------
echo "== the security policy (scripts/kubernetes-policy.py)"
"$py" scripts/kubernetes-policy.py "$secrets" "${files[@]}"
# The rules must bite: each of a list of single breaches of the shipped files fails them.
"$py" scripts/kubernetes-policy.py --self-test "$secrets" "${files[@]}"

schema_checked=$(grep -c '^INFO ' "$out")
echo "== passed: $schema_checked documents schema-checked strictly against Kubernetes $K8S_VERSION" \
     "(kubernetes-validate $KV_VERSION); KEDA ScaledObjects checked by field list only" \
     "(no CRD schema): $(grep -c '^WARN ' "$out" || true)"
