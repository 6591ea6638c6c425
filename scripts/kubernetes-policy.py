"""The security policy that deploy/kubernetes must meet as shipped, checked offline.

    python kubernetes-policy.py SECRETS_DIR MANIFEST...
    python kubernetes-policy.py --self-test SECRETS_DIR MANIFEST...

SECRETS_DIR is what deploy/kubernetes/secrets.sh wrote (secrets.yaml, tokens, pki/). Each
rule below is one line of the policy; a manifest that breaks one is named with the rule, and
the exit status is 1. scripts/validate-kubernetes.sh runs it after the schema check.

* The namespace enforces the "restricted" Pod Security Standard.
* Every pod mounts no service-account token, runs as a non-root user with the runtime's
  seccomp profile, on a read-only root file system, without privilege escalation or
  capabilities, and runs the image this repository builds (scripts/build-image.sh).
* Secrets are mounted with mode 0400 or 0600; each replica mounts its own Secret alone.
* The replica configuration turns TLS and tokens on, with the files from that Secret.
* The NetworkPolicies let only replicas reach the peer port, and only pods or namespaces named
  by label the HTTP port. Every policy that selects a replica counts (they are additive), its
  selector evaluated as Kubernetes does (matchLabels and matchExpressions), its ports as
  Kubernetes reads them (none or an empty list is every port; endPort makes a range).
* No pod of any kind but a replica's own can read a replica's Secret (volumes, projected
  volumes, env, envFrom).
* The Secrets secrets.sh writes hold no CA key and no other holder's key: a replica's holds the
  CA's certificate, its own certificate and key, and hashed tokens; the containers' holds the
  CA's certificate and a token whose role is the containers' prefix role, not an admin's.
"""

import base64
import os
import re
import sys

import yaml

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

def load(secrets_dir, paths):
    """The manifests' documents, and what secrets.sh wrote: the Secrets by name (key to
    decoded text), the roles by plaintext token, and the PKI's files by name."""
    docs = []  # (path, document)
    for path in paths:
        with open(path) as f:
            docs += [(path, d) for d in yaml.safe_load_all(f) if d]
    with open(os.path.join(secrets_dir, "secrets.yaml")) as f:
        written = {d["metadata"]["name"]: {k: base64.b64decode(v).decode()
                                          for k, v in d["data"].items()}
                   for d in yaml.safe_load_all(f) if d}
    with open(os.path.join(secrets_dir, "tokens")) as f:
        roles = dict(line.split(maxsplit=1) for line in f.read().splitlines() if line.strip())
    pki = os.path.join(secrets_dir, "pki")
    files = {}
    for file in os.listdir(pki):
        with open(os.path.join(pki, file)) as f:
            files[file] = f.read()
    return docs, written, roles, files


def name(doc):
    return doc["metadata"]["name"]


with open(os.path.join(os.path.dirname(__file__), "..", "Cargo.toml")) as f:
    version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
IMAGE = f"ctrlog:{version.removesuffix('-dev')}"


def violations(docs, written, roles, pki_files):
    """Every rule the files break, one line each."""
    errors = []

    def fail(where, message):
        errors.append(f"{where}: {message}")

    def of_kind(kind):
        return [(p, d) for p, d in docs if d.get("kind") == kind]

    image = IMAGE

    # --- the namespace ------------------------------------------------------------------------
    namespaces = of_kind("Namespace")
    if not namespaces:
        fail("manifests", "no Namespace: nothing enforces the Pod Security Standard")
    for p, ns in namespaces:
        labels = ns["metadata"].get("labels") or {}
        if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
            fail(f"{p}: Namespace/{name(ns)}",
                 "does not enforce the restricted Pod Security Standard "
                 "(label pod-security.kubernetes.io/enforce: restricted)")

    # --- every pod ----------------------------------------------------------------------------
    accounts = {name(d): d for _, d in of_kind("ServiceAccount")}
    workloads = of_kind("StatefulSet") + of_kind("Deployment")
    if not workloads:
        fail("manifests", "no StatefulSet or Deployment to check")
    for p, w in workloads:
        where = f"{p}: {w['kind']}/{name(w)}"
        pod = w["spec"]["template"]["spec"]
        if pod.get("automountServiceAccountToken") is not False:
            fail(where, "mounts a service-account token (set automountServiceAccountToken: false)")
        account = pod.get("serviceAccountName", "default")
        if account not in accounts:
            fail(where, f"runs as the service account {account!r}, which no manifest here defines")
        elif accounts[account].get("automountServiceAccountToken") is not False:
            fail(where, f"its service account {account} mounts a token by default")
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(field):
                fail(where, f"{field} is on")
        pod_security = pod.get("securityContext") or {}
        for c in pod["containers"] + pod.get("initContainers", []):
            cw = f"{where}: container {c['name']}"
            security = c.get("securityContext") or {}

            def effective(field):
                return security.get(field, pod_security.get(field))

            if effective("runAsNonRoot") is not True:
                fail(cw, "may run as root (runAsNonRoot is not true)")
            if effective("runAsUser") in (None, 0):
                fail(cw, "names no non-zero runAsUser")
            if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
                fail(cw, "runs without the RuntimeDefault seccomp profile")
            if security.get("readOnlyRootFilesystem") is not True:
                fail(cw, "its root file system is writable")
            if security.get("allowPrivilegeEscalation") is not False:
                fail(cw, "may escalate privileges")
            if security.get("privileged"):
                fail(cw, "is privileged")
            if "ALL" not in ((security.get("capabilities") or {}).get("drop") or []):
                fail(cw, "keeps its capabilities (drop ALL)")
            if c.get("image") != image:
                fail(cw, f"runs {c.get('image')!r}, not {image}, the image scripts/build-image.sh "
                         "builds")
            for env in c.get("env", []):
                if re.search(r"TOKEN$|PASSWORD|SECRET", env["name"]) and "value" in env:
                    fail(cw, f"the environment variable {env['name']} holds a literal secret")
        for v in pod.get("volumes", []):
            if "hostPath" in v:
                fail(f"{where}: volume {v['name']}", "is a hostPath")
            secret = v.get("secret")
            if secret is None:
                continue
            modes = [secret.get("defaultMode", 0o644)] + [
                i["mode"] for i in secret.get("items", []) if "mode" in i]
            for mode in modes:
                if mode not in (0o400, 0o600):
                    fail(f"{where}: volume {v['name']}",
                         f"mode {mode:o}: a Secret is mounted 0400 or 0600")

    # --- the replicas: their own Secret, TLS and tokens on ------------------------------------
    replica_sets = [(p, w) for p, w in of_kind("StatefulSet")]
    config_maps = {name(d): d for _, d in of_kind("ConfigMap")}
    replica_secrets = {}  # replica id -> Secret name
    secret_owners = {}  # Secret name -> the StatefulSet of the replica it is for
    for p, sts in replica_sets:
        where = f"{p}: StatefulSet/{name(sts)}"
        pod = sts["spec"]["template"]["spec"]
        if sts["spec"].get("replicas", 1) != 1:
            fail(where, f"runs {sts['spec'].get('replicas')} pods from one template, so they share "
                        "one Secret (every replica's key): one StatefulSet per replica")
        args = pod["containers"][0].get("args") or []
        replica_id = args[args.index("--id") + 1] if "--id" in args else None
        secret_volumes = [v for v in pod.get("volumes", []) if "secret" in v]
        if len(secret_volumes) != 1:
            fail(where, f"mounts {len(secret_volumes)} Secrets; a replica mounts its own alone")
            continue
        secret_name = secret_volumes[0]["secret"]["secretName"]
        if replica_id is None or secret_name != f"ctrlog-replica-{replica_id}":
            fail(where, f"replica {replica_id} mounts the Secret {secret_name!r}, not "
                        f"ctrlog-replica-{replica_id}")
        if secret_name in replica_secrets.values():
            fail(where, f"shares the Secret {secret_name} with another replica")
        replica_secrets[replica_id] = secret_name
        secret_owners[secret_name] = sts
        mount = next((m["mountPath"] for m in pod["containers"][0].get("volumeMounts", [])
                      if m["name"] == secret_volumes[0]["name"]), None)
        for v in pod.get("volumes", []):
            if "configMap" not in v or v["configMap"]["name"] not in config_maps:
                continue
            for key, text in config_maps[v["configMap"]["name"]].get("data", {}).items():
                if not key.endswith(".toml"):
                    continue
                conf = tomllib.loads(text)
                cw = f"{where}: ConfigMap key {key}"
                tls, auth = conf.get("tls"), conf.get("auth")
                if not tls:
                    fail(cw, "TLS is off ([tls] is missing)")
                if not auth:
                    fail(cw, "credentials are off ([auth] is missing)")
                if conf.get("insecure_plaintext"):
                    fail(cw, "insecure_plaintext is on")
                files = [(f"tls.{f}", (tls or {}).get(f))
                         for f in ("ca_file", "cert_file", "key_file")]
                files.append(("auth.tokens_file", (auth or {}).get("tokens_file")))
                for field, file in files:
                    if file and (mount is None or not file.startswith(mount + "/")):
                        fail(cw, f"{field} {file} is not in the replica's Secret "
                                 f"(mounted at {mount})")

    # --- the network: only replicas reach the peer port, scrapers alone the HTTP port --------
    replica_labels = [w["spec"]["template"]["metadata"].get("labels") or {}
                      for _, w in replica_sets]
    replica_namespaces = {w["metadata"].get("namespace", "default") for _, w in replica_sets}

    def selects(selector, labels):
        """Whether a label selector selects `labels`, as Kubernetes evaluates it: matchLabels
        and every matchExpressions requirement (an empty selector selects everything)."""
        selector = selector or {}
        if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
            return False
        for requirement in selector.get("matchExpressions") or []:
            key, op = requirement["key"], requirement["operator"]
            values = requirement.get("values") or []
            if op == "In" and labels.get(key) not in values:
                return False
            if op == "NotIn" and key in labels and labels[key] in values:
                return False
            if op == "Exists" and key not in labels:
                return False
            if op == "DoesNotExist" and key in labels:
                return False
        return True

    def opens(rule, named, number):
        """Whether an ingress rule's ports include the port `named` (or numbered `number`):
        no ports, or an empty list, is every port; a range runs from port to endPort."""
        ports = rule.get("ports")
        if not ports:
            return True
        for port in ports:
            at = port.get("port")
            if at is None or at == named:
                return True
            if isinstance(at, int) and at <= number <= port.get("endPort", at):
                return True
        return False

    # Policies are additive: any one that selects a replica and opens a port opens it to its
    # sources, whatever the others say.
    guarding = [(p, np) for p, np in of_kind("NetworkPolicy")
                if "Ingress" in np["spec"].get("policyTypes", ["Ingress"])
                and np["metadata"].get("namespace", "default") in replica_namespaces
                and any(selects(np["spec"].get("podSelector"), l) for l in replica_labels)]
    if not any(all(selects(np["spec"].get("podSelector"), l) for l in replica_labels)
               for _, np in guarding):
        fail("manifests", "no NetworkPolicy guards every replica's ingress")
    for p, np in guarding:
        for i, rule in enumerate(np["spec"].get("ingress") or []):
            where = f"{p}: NetworkPolicy/{name(np)} ingress[{i}]"
            sources = rule.get("from")
            if opens(rule, "peer", 7001):
                if not sources:
                    fail(where, "opens the peer port to every source")
                for source in sources or []:
                    if set(source) != {"podSelector"} or not (
                            source["podSelector"].get("matchLabels")) or not all(
                            selects(source["podSelector"], l) for l in replica_labels) or any(
                            r.get("operator") in ("NotIn", "DoesNotExist") for r in
                            source["podSelector"].get("matchExpressions") or []):
                        fail(where, f"opens the peer port to {source}, which is not the replicas")
            if opens(rule, "http", 7080):
                if not sources:
                    fail(where, "opens the HTTP port to every source (let only the namespaces "
                                "that scrape it in)")
                for source in sources or []:
                    if "ipBlock" in source or not (source.get("namespaceSelector") or {}).get(
                            "matchLabels") and not (source.get("podSelector") or {}).get(
                            "matchLabels"):
                        fail(where, f"opens the HTTP port to {source}: name the namespaces or "
                                    "pods that scrape it by label")

    # --- a replica's Secret: mounted by that replica alone --------------------------------------
    pod_kinds = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job",
                 "CronJob", "ReplicationController")

    def pod_spec(doc):
        if doc.get("kind") == "Pod":
            return doc.get("spec") or {}
        if doc.get("kind") == "CronJob":
            return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return doc["spec"]["template"]["spec"]

    def secrets_used(pod):
        """Every Secret a pod can read: volumes (projected ones too), env and envFrom."""
        used = set()
        for v in pod.get("volumes") or []:
            if "secret" in v:
                used.add(v["secret"].get("secretName"))
            for source in (v.get("projected") or {}).get("sources") or []:
                if "secret" in source:
                    used.add(source["secret"].get("name"))
        for c in (pod.get("containers") or []) + (pod.get("initContainers") or []) + (
                pod.get("ephemeralContainers") or []):
            for env in c.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    used.add(ref.get("name"))
            for source in c.get("envFrom") or []:
                if "secretRef" in source:
                    used.add(source["secretRef"].get("name"))
        return used

    for p, doc in docs:
        if doc.get("kind") not in pod_kinds:
            continue
        for secret in secrets_used(pod_spec(doc)):
            if not (secret or "").startswith("ctrlog-replica-"):
                continue
            if secret_owners.get(secret) is not doc:
                fail(f"{p}: {doc['kind']}/{name(doc)}",
                     f"can read the Secret {secret}, a replica's own (its key and tokens)")

    # --- the Secrets secrets.sh writes --------------------------------------------------------
    private_keys = {f: text for f, text in pki_files.items() if f.endswith("-key.pem")}
    for replica_id, secret_name in replica_secrets.items():
        where = f"secrets.sh: Secret/{secret_name}"
        held = written.get(secret_name)
        if held is None:
            fail(where, "is mounted by a replica but secrets.sh does not write it")
            continue
        if set(held) != {"ca.pem", "node.pem", "node-key.pem", "tokens"}:
            fail(where, f"holds {sorted(held)}, not ca.pem, node.pem, node-key.pem and tokens")
        own_key = f"node-{replica_id}-key.pem"
        for key, value in held.items():
            for file, private in private_keys.items():
                its_own = key == "node-key.pem" and file == own_key
                if value.strip() == private.strip() and not its_own:
                    fail(where, f"{key} is {file}: a replica holds no key but its own")
        if held.get("node-key.pem", "").strip() != private_keys.get(own_key, "").strip():
            fail(where, f"node-key.pem is not replica {replica_id}'s key")
        if "PRIVATE KEY" in held.get("ca.pem", "") or held.get("ca.pem") != pki_files.get("ca.pem"):
            fail(where, "ca.pem is not the CA's certificate alone")
        for line in held.get("tokens", "").splitlines():
            if line.strip() and not line.startswith("sha256:"):
                fail(where, "its tokens file holds a plaintext token (use ctrlog tokens hash)")

    for p, dep in of_kind("Deployment"):
        where = f"{p}: Deployment/{name(dep)}"
        pod = dep["spec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            if "secret" not in v:
                continue
            held = written.get(v["secret"]["secretName"])
            if held is None:
                fail(where, f"mounts the Secret {v['secret']['secretName']}, which secrets.sh "
                            "does not write")
                continue
            if any("PRIVATE KEY" in value for value in held.values()):
                fail(where, "its Secret holds a private key")
            token = held.get("token", "").strip()
            role = roles.get(token, "").strip()
            if role != f"containers:{name(dep)}-":
                fail(where, f"its token's role is {role!r}, not containers:{name(dep)}- (the "
                            "prefix its pods are named with)")

    return errors


MUTATIONS = {
    # Each breaks one rule; --self-test checks that the policy then fails.
    "a service-account token mounted": lambda docs, w: [
        d["spec"]["template"]["spec"].update(automountServiceAccountToken=True)
        for _, d in docs if d.get("kind") == "Deployment"],
    "a writable root file system": lambda docs, w: [
        d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
            readOnlyRootFilesystem=False) for _, d in docs if d.get("kind") == "StatefulSet"],
    "a container run as root": lambda docs, w: [
        d["spec"]["template"]["spec"]["securityContext"].update(runAsUser=0, runAsNonRoot=False)
        for _, d in docs if d.get("kind") == "Deployment"],
    "a Secret mounted 0440": lambda docs, w: [
        v["secret"].update(defaultMode=0o440) for _, d in docs if d.get("kind") == "StatefulSet"
        for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v],
    "two replicas sharing a Secret": lambda docs, w: [
        v["secret"].update(secretName="ctrlog-replica-1") for _, d in docs
        if d.get("kind") == "StatefulSet" for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v],
    "TLS off": lambda docs, w: [
        d["data"].update({k: re.sub(r"(?s)\[tls\].*?(?=\n\[)", "", t)
                          for k, t in d["data"].items() if k.endswith(".toml")})
        for _, d in docs if d.get("kind") == "ConfigMap"],
    "no NetworkPolicy": lambda docs, w: [
        docs.remove(x) for x in [x for x in docs if x[1].get("kind") == "NetworkPolicy"]],
    "the peer port open to every pod": lambda docs, w: [
        d["spec"]["ingress"].append({"ports": [{"port": "peer"}]})
        for _, d in docs if d.get("kind") == "NetworkPolicy" and d["spec"].get("ingress")],
    "the CA key in a replica's Secret": lambda docs, w: w["ctrlog-replica-2"].update(
        {"ca-key.pem": w["__pki"]["ca-key.pem"]}),
    "another replica's key in a replica's Secret": lambda docs, w: w["ctrlog-replica-2"].update(
        {"node-key.pem": w["__pki"]["node-1-key.pem"]}),
    "a plaintext token in a replica's Secret": lambda docs, w: w["ctrlog-replica-3"].update(
        {"tokens": "a-plaintext-token-of-some-length operator\n"}),
    "the containers holding the operator's token": lambda docs, w: w["ctrlog-container"].update(
        {"token": w["__operator"]}),
    # The review's bypasses of issue 59, each of which the policy once let through.
    "the peer port opened by a second policy selecting by matchExpressions": lambda docs, w:
        docs.append(("extra.yaml", {
            "kind": "NetworkPolicy", "metadata": {"name": "x", "namespace": "ctrlog-job"},
            "spec": {"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "In", "values": ["ctrlog"]}]},
                "ingress": [{"ports": [{"port": "peer"}]}]}})),
    "the peer port opened by a policy selecting one replica": lambda docs, w:
        docs.append(("extra.yaml", {
            "kind": "NetworkPolicy", "metadata": {"name": "x", "namespace": "ctrlog-job"},
            "spec": {"podSelector": {"matchLabels": {"app": "ctrlog", "replica": "1"}},
                     "ingress": [{"ports": [{"port": 7001}]}]}})),
    "every port opened by an empty port list": lambda docs, w: [
        d["spec"]["ingress"].append({"ports": [], "from": [{"podSelector": {
            "matchLabels": {"app": "ctrlog-container"}}}]})
        for _, d in docs if d.get("kind") == "NetworkPolicy" and d["spec"].get("ingress")],
    "the peer port inside a port range": lambda docs, w: [
        d["spec"]["ingress"].append({"ports": [{"port": 7000, "endPort": 7010}], "from": [
            {"podSelector": {"matchLabels": {"app": "ctrlog-container"}}}]})
        for _, d in docs if d.get("kind") == "NetworkPolicy" and d["spec"].get("ingress")],
    "a Pod mounting a replica's Secret": lambda docs, w: docs.append(("extra.yaml", {
        "kind": "Pod", "metadata": {"name": "x", "namespace": "ctrlog-job"},
        "spec": {"containers": [{"name": "x", "image": "busybox"}],
                 "volumes": [{"name": "s", "secret": {"secretName": "ctrlog-replica-1"}}]}})),
    "a Job reading a replica's Secret through its environment": lambda docs, w: docs.append((
        "extra.yaml", {"kind": "Job", "metadata": {"name": "x", "namespace": "ctrlog-job"},
                       "spec": {"template": {"spec": {"containers": [{
                           "name": "x", "image": "busybox", "envFrom": [
                               {"secretRef": {"name": "ctrlog-replica-2"}}]}]}}}})),
    "the HTTP port open to every source": lambda docs, w: [
        d["spec"]["ingress"].append({"ports": [{"port": "http"}]})
        for _, d in docs if d.get("kind") == "NetworkPolicy" and d["spec"].get("ingress")],
}


def self_test(docs, written, roles, pki_files):
    """Each mutation of the shipped files must break the policy, and the files must not."""
    import copy
    assert not violations(docs, written, roles, pki_files), "the shipped files break it"
    operator = next(token for token, role in roles.items() if role.strip() == "operator")
    for what, mutate in MUTATIONS.items():
        d, w = copy.deepcopy(docs), copy.deepcopy(written)
        w["__pki"], w["__operator"] = pki_files, operator
        mutate(d, w)
        del w["__pki"], w["__operator"]
        assert violations(d, w, roles, pki_files), f"the policy misses {what}"
    print(f"OK   policy self-test: each of {len(MUTATIONS)} mutations breaks it")


if __name__ == "__main__":
    self_testing = sys.argv[1:2] == ["--self-test"]
    args = sys.argv[2:] if self_testing else sys.argv[1:]
    loaded = load(args[0], args[1:])
    if self_testing:
        self_test(*loaded)
        sys.exit(0)
    errors = violations(*loaded)
    if errors:
        for e in errors:
            print("POLICY " + e)
        sys.exit(1)
    print(f"OK   policy: the manifests and {len(loaded[1])} Secrets meet it (restricted pods, "
          "no service-account token, one Secret per replica with no CA or other key, TLS and "
          "tokens on, the peer port for replicas alone)")
