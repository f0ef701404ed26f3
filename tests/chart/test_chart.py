"""Chart tests: every render goes through the real Helm SDK (helm-python-sdk, Helm v4 Go code)."""

from __future__ import annotations

import base64
import posixpath
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

import render as R

K8S_VERSION = "1.33.0"

# --- the binary's contract ------------------------------------------------------------------------

CLI_RS = R.ROOT / "src" / "cli.rs"
# Where the clap structs `serve` flattens in (`#[command(flatten)]`) are defined.
ARGS_RS = [CLI_RS, R.ROOT / "src" / "ops" / "args.rs"]


def clap_struct(name: str) -> str:
    """The body of `pub struct <name>` in one of ARGS_RS."""
    for path in ARGS_RS:
        src = path.read_text()
        start = src.find(f"pub struct {name} ")
        if start >= 0:
            body = src[start:]
            return body[: body.index("\n}\n")]
    raise AssertionError(f"pub struct {name} is in none of {[str(p) for p in ARGS_RS]}")


def parse_serve_contract() -> tuple[set[str], set[str]]:
    """(flags, env vars) of `device-numa-extender serve`, read from the clap definitions of
    ServeArgs in src/cli.rs and of every struct it flattens in, so the chart is checked against
    what the binary really accepts. Each `#[arg(long, env = "X", ...)]` names the flag after the
    field below it."""
    flags, envs = set(), set()
    pending, seen = ["ServeArgs"], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        body = clap_struct(name)
        for m in re.finditer(r"#\[command\(flatten\)\]\s*pub \w+:\s*(?:[\w:]+::)?(\w+)\s*,", body):
            pending.append(m.group(1))
        for m in re.finditer(r"#\[arg\((.*?)\)\]\s*pub (\w+):", body, re.S):
            attrs, field = m.group(1), m.group(2)
            if re.search(r"\blong\b", attrs):
                flags.add("--" + field.replace("_", "-"))
            env = re.search(r'env\s*=\s*"([A-Z0-9_]+)"', attrs)
            if env:
                envs.add(env.group(1))
    assert {"ScoringArgs", "ServeOpsArgs"} <= seen, f"flattened structs not followed: {seen}"
    assert len(flags) >= 20, f"parsed only {sorted(flags)} from {ARGS_RS}"
    return flags, envs


# Flags and env vars of `device-numa-extender serve` (the contract the binary implements).
SERVE_FLAGS, SERVE_ENV = parse_serve_contract()
# kube-scheduler's Extender config (kubescheduler.config.k8s.io/v1), all of its JSON fields.
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
KSC_TOP_FIELDS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "healthzBindAddress",
    "metricsBindAddress", "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive",
}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}

API_CALLS_RS = R.ROOT / "src" / "api_calls.rs"


def parse_api_calls() -> dict[str, set[tuple[str, str, str]]]:
    """{const name: {(group, resource, verb)}} from src/api_calls.rs. Tolerates rustfmt's
    multi-line layout; fails loudly when an entry does not parse rather than skipping it."""
    src = API_CALLS_RS.read_text()
    tables: dict[str, set[tuple[str, str, str]]] = {}
    for m in re.finditer(r"pub const (\w+)\s*:\s*&\[ApiCall\]\s*=\s*&\[(.*?)\]\s*;", src, re.S):
        name, body = m.group(1), m.group(2)
        entries = re.findall(
            r'ApiCall\s*\{\s*group:\s*"([^"]*)"\s*,\s*resource:\s*"([^"]*)"\s*,\s*'
            r'verbs:\s*&\[([^\]]*)\]\s*,?\s*\}', body)
        assert len(entries) == body.count("ApiCall {") + body.count("ApiCall{"), \
            f"unparsed ApiCall entry in {name}"
        rows = set()
        for group, resource, verbs in entries:
            for verb in re.findall(r'"([^"]+)"', verbs):
                rows.add((group, resource, verb))
        tables[name] = rows
    assert {"API_CALLS", "LEADER_ELECTION_API_CALLS", "REQUEUE_API_CALLS",
            "DRA_OWNERSHIP_API_CALLS", "SHARE_TOTALS_API_CALLS"} <= tables.keys(), tables.keys()
    assert tables["API_CALLS"] and tables["LEADER_ELECTION_API_CALLS"]
    return tables


# --- helpers --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def chart():
    c = R.load_chart()
    yield c
    c.close()


def objs(chart, values=None, **kw) -> list[dict[str, Any]]:
    return [o for _, _, o in R.documents(R.render(values, chart=chart, **kw))]


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def containers(objects) -> dict[str, dict]:
    dep = one(objects, "Deployment")
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def scheduler_config(objects) -> dict:
    cm = one(objects, "ConfigMap", f"{R.RELEASE}-scheduler-config")
    return yaml.safe_load(cm["data"]["config.yaml"])


def notes_extenders(chart, values) -> list[dict]:
    text = R.notes(R.render(values, chart=chart))
    block = text[text.index("extenders:"):]
    block = block[: block.index("\n\n")]
    return yaml.safe_load(block)["extenders"]


def duration_seconds(d: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"([0-9.]+)(ms|s|m|h)", d)
    assert parts and "".join(a + b for a, b in parts) == d, d
    return sum(float(a) * units[b] for a, b in parts)


def rbac_rows(rules) -> set[tuple[str, str, str]]:
    """(group, resource, verb) rows; resourceNames (only ever on Leases) narrow a row, they are
    checked by test_lease_roles_name_their_lease."""
    rows = set()
    for r in rules:
        assert "nonResourceURLs" not in r
        assert "resourceNames" not in r or r["resources"] == ["leases"], r
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    assert "*" not in (g, res, v), "no wildcards"
                    rows.add((g, res, v))
    return rows


def bound_rules(objects, sa: str) -> tuple[set, set]:
    """(rows from ClusterRoles, rows from Roles) that the chart itself defines and binds to sa,
    excluding the kube-scheduler container's stock roles."""
    cluster, ns = set(), set()
    for b in objects:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        defined = [o for o in objects if o["kind"] == ref["kind"] and o["metadata"]["name"] == ref["name"]]
        if not defined or ref["name"].endswith("-scheduler-leases"):
            continue  # stock system:* roles, and the kube-scheduler container's lease Role
        rows = rbac_rows(defined[0]["rules"])
        (cluster if ref["kind"] == "ClusterRole" else ns).update(rows)
    return cluster, ns


# --- the value sets every structural test runs on -------------------------------------------------

CASES = {
    "default": None,
    "grafana-dashboard": {"grafanaDashboard": {"enabled": True, "labels": {"team": "gpu"},
                                               "annotations": {"grafana_folder": "GPU"}}},
    "scheduler-no-follow": {"replicas": 1, "extender": {"followSchedulerLease": False}},
    "scheduler-ha": {"replicas": 2},
    "scheduler-route-all-pods": {"extenderConfig": {"routeAllPods": True}},
    "scheduler-servicemonitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "path-prefix": {"extender": {"pathPrefix": "/device-numa", "port": 9000}},
    "options": {
        "extender": {
            "requireKinds": ["devices", "noderesourcetopologies"], "maxStaleness": "5m",
            "scoreStrategy": "most-allocated",
            "scoreWeights": {"koordinator.sh/gpu-core": 2, "cpu": 1},
            "extraArgs": ["--max-concurrency=64"],
            "extraEnv": [{"name": "DNE_LOG_LEVEL", "value": "debug"}],
            "logFormat": "text",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        "image": {"repository": "registry.example/dne", "tag": "1.2.3", "pullPolicy": "Always"},
        "podAnnotations": {"a": "b"},
        "prometheusScrapeAnnotations": False,
    },
    "standalone": {"mode": "standalone"},
    "standalone-ha": {"mode": "standalone", "replicas": 2},
    "standalone-no-le": {"mode": "standalone", "replicas": 1,
                         "extender": {"leaderElection": {"enabled": False}}},
    "standalone-le-forced": {"mode": "standalone", "extender": {"leaderElection": {"enabled": True, "leaseName": "dne"}}},
    "standalone-servicemonitor": {"mode": "standalone", "serviceMonitor": {"enabled": True}},
    "standalone-prefix": {"mode": "standalone", "extender": {"pathPrefix": "/gpu/v1"}},
    "no-pdb": {"podDisruptionBudget": {"enabled": False}},
    "no-requeue": {"extender": {"requeue": {"enabled": False}}},
    "share-totals-extender": {"extender": {"gpuShareTotals": "extender"}},
    "share-totals-koord-manager-route-all": {"extender": {"gpuShareTotals": "koord-manager"},
                                             "extenderConfig": {"routeAllPods": True}},
    "standalone-share-totals": {"mode": "standalone", "extender": {"gpuShareTotals": "extender"}},
    "share-totals-no-policy": {"extender": {"gpuShareTotals": "extender"}, "rbac": {"nodeWritePolicy": False}},
    "no-dra-ownership": {"extender": {"dra": {"ownership": False, "handoverGrace": "30s",
                                              "allowExtendedResources": True,
                                              "cpuDrivers": ["dra.cpu", "cpu.example.com"]}}},
    "scheduler-tls-secrets": {"tls": {"secretName": "dne-serving", "clientSecretName": "dne-client"},
                              "extender": {"port": 9443, "probePort": 9090, "pathPrefix": "/dne"}},
    "scheduler-tls-cert-manager": {"tls": {"certManager": {"enabled": True, "issuerRef": {
        "name": "cluster-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "standalone-tls": {"mode": "standalone", "tls": {"secretName": "dne-serving"}},
    "standalone-tls-cert-manager": {"mode": "standalone", "replicas": 2, "tls": {"certManager": {
        "enabled": True, "issuerRef": {"name": "ca", "kind": "Issuer", "group": "cert-manager.io"},
        "extraDnsNames": ["dne.example.internal"]}}},
    "standalone-tls-no-client-verify": {"mode": "standalone", "tls": {"secretName": "dne-serving",
                                                                      "verifyClients": False}},
    "standalone-tls-off": {"mode": "standalone", "tls": {"enabled": False, "secretName": "dne-serving"}},
    "standalone-netpol-custom": {"mode": "standalone", "networkPolicy": {
        "verbsFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}},
                      {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sched"}},
                       "podSelector": {"matchLabels": {"app": "my-scheduler"}}}],
        "probesFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}},
    "standalone-no-netpol": {"mode": "standalone", "networkPolicy": {"enabled": False}},
    "webhook": {"webhook": {"enabled": True},
                "networkPolicy": {"webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]}},
    "webhook-no-netpol": {"webhook": {"enabled": True}, "networkPolicy": {"enabled": False}},
    "webhook-cpuset-qos-cert-manager": {"webhook": {"enabled": True, "routeCpusetQos": True,
                                                    "certificate": {"source": "certManager"}},
                                        "tls": {"certManager": {"issuerRef": {"name": "ca"}}},
                                        "networkPolicy": {"webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]}},
    "webhook-standalone-secret": {"mode": "standalone", "webhook": {
        "enabled": True, "schedulerName": "my-scheduler", "failurePolicy": "Ignore",
        "certificate": {"source": "secret", "secretName": "wh-tls", "caBundle": "Q0E="}},
        "networkPolicy": {"webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]}},
}


def expects_tls(values) -> bool:
    t = (values or {}).get("tls", {})
    source = bool(t.get("secretName")) or t.get("certManager", {}).get("enabled", False)
    return source if t.get("enabled") is None else t["enabled"]


def is_standalone(values) -> bool:
    return (values or {}).get("mode", "scheduler") == "standalone"


# CRD-typed kinds: no schema in kubernetes-validate's built-in set; checked structurally.
CRD_KINDS = {"monitoring.coreos.com/": "ServiceMonitor", "cert-manager.io/": "Certificate"}


def expects_own_le(values) -> bool:
    v = values or {}
    if v.get("mode", "scheduler") != "standalone":
        return False
    enabled = v.get("extender", {}).get("leaderElection", {}).get("enabled")
    return enabled if enabled is not None else v.get("replicas", 2) > 1


def expects_follow(values) -> bool:
    v = values or {}
    return v.get("mode", "scheduler") == "scheduler" and v.get("extender", {}).get("followSchedulerLease", True)


@pytest.mark.parametrize("case", CASES)
def test_renders_and_validates_against_k8s_1_33(chart, case):
    objects = objs(chart, CASES[case])
    assert objects
    skipped = []
    for o in objects:
        if any(o["apiVersion"].startswith(g) and o["kind"] == k for g, k in CRD_KINDS.items()):
            skipped.append(o["kind"])
            continue
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        assert o["metadata"]["name"]
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            assert o["metadata"].get("namespace"), f"{o['kind']} without namespace"
    values = CASES[case] or {}
    sm_enabled = values.get("serviceMonitor", {}).get("enabled", False)
    cm_enabled = expects_tls(values) and values.get("tls", {}).get("certManager", {}).get("enabled", False)
    webhook_cm = (values.get("webhook", {}).get("enabled", False)
                  and values["webhook"].get("certificate", {}).get("source") == "certManager")
    assert sorted(skipped) == sorted(["ServiceMonitor"] * sm_enabled
                                     + ["Certificate"] * (2 * cm_enabled + webhook_cm))


@pytest.mark.parametrize("case", CASES)
def test_lint_strict_clean(case):
    report = helm.lint(R.CHART_DIR, CASES[case], strict=True, namespace=R.NAMESPACE,
                       kube_version="v" + K8S_VERSION)
    assert report["errors"] == []
    # severity: 1 info, 2 warning, 3 error. The only info is "icon is recommended".
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("case", CASES)
def test_extender_args_use_only_contract_flags(chart, case):
    values = CASES[case]
    c = containers(objs(chart, values))["extender"]
    assert "command" not in c, "the image's ENTRYPOINT is the binary"
    args = c["args"]
    assert args[0] == "serve"
    seen = []
    for a in args[1:]:
        flag = a.split("=", 1)[0]
        assert flag in SERVE_FLAGS, f"{a!r} is not a flag of `device-numa-extender serve`"
        seen.append(flag)
    for e in c.get("env", []):
        assert e["name"] in SERVE_ENV, f"env {e['name']} is not read by the binary"
    assert ("--leader-elect" in seen) == expects_own_le(values)
    assert ("--follow-scheduler-lease" in seen) == expects_follow(values)
    assert not ("--leader-elect" in seen and "--follow-scheduler-lease" in seen)
    if expects_follow(values):
        lease = scheduler_config(objs(chart, values))["leaderElection"]["resourceName"]
        assert f"--follow-scheduler-lease={lease}" in args
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


@pytest.mark.parametrize("case", CASES)
def test_extender_rbac_is_exactly_api_calls(chart, case):
    values = CASES[case]
    tables = parse_api_calls()
    objects = objs(chart, values)
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    cr = one(objects, "ClusterRole", f"{R.RELEASE}-extender")
    requeue = ((values or {}).get("extender") or {}).get("requeue", {}).get("enabled", True)
    ownership = ((values or {}).get("extender") or {}).get("dra", {}).get("ownership", True)
    share_totals = ((values or {}).get("extender") or {}).get("gpuShareTotals", "ignored")
    expected = (tables["API_CALLS"] | (tables["REQUEUE_API_CALLS"] if requeue else set())
                | (tables["DRA_OWNERSHIP_API_CALLS"] if ownership else set())
                | (tables["SHARE_TOTALS_API_CALLS"] if share_totals == "extender" else set()))
    assert rbac_rows(cr["rules"]) == expected
    cluster, ns = bound_rules(objects, sa)
    assert cluster == expected
    needs_leases = expects_own_le(values) or expects_follow(values)
    assert ns == (tables["LEADER_ELECTION_API_CALLS"] if needs_leases else set())
    for o in objects:
        if o["kind"] == "Role" and o["metadata"]["name"].endswith("-extender-leases"):
            assert o["metadata"]["namespace"] == R.NAMESPACE


def test_scheduler_mode_rbac_is_the_stock_kube_scheduler_set(chart):
    objects = objs(chart)
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    refs = {(b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
            for b in objects if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
            and any(s["name"] == sa and s["namespace"] == R.NAMESPACE for s in b["subjects"])}
    assert ("ClusterRoleBinding", "ClusterRole", "system:kube-scheduler", None) in refs
    assert ("ClusterRoleBinding", "ClusterRole", "system:volume-scheduler", None) in refs
    assert ("RoleBinding", "Role", "extension-apiserver-authentication-reader", "kube-system") in refs
    lease_role = one(objects, "Role", f"{R.RELEASE}-scheduler-leases")
    assert lease_role["metadata"]["namespace"] == R.NAMESPACE
    assert {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")} <= rbac_rows(lease_role["rules"])
    # standalone mode carries none of it
    standalone = objs(chart, {"mode": "standalone"})
    assert not [o for o in standalone if o["kind"] in ("ClusterRoleBinding", "RoleBinding") and o["roleRef"]["name"].startswith("system:")]
    assert not [o for o in standalone if o["kind"] == "ConfigMap"]


def test_rbac_create_false_and_existing_service_account(chart):
    objects = objs(chart, {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}})
    assert not [o for o in objects if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


TLS_CONFIG_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}


def check_extenders_stanza(extenders: list[dict], *, port: int, prefix: str, host: str,
                           tls: bool = False, ranking: str = "filter") -> dict:
    assert isinstance(extenders, list) and len(extenders) == 1
    ext = extenders[0]
    assert set(ext) <= EXTENDER_FIELDS, f"unknown extender fields {set(ext) - EXTENDER_FIELDS}"
    scheme = "https" if tls else "http"
    assert ext["urlPrefix"] == f"{scheme}://{host}:{port}{prefix}"
    assert "?" not in ext["urlPrefix"] and not ext["urlPrefix"].endswith("/")
    assert (ext["filterVerb"], ext["bindVerb"], ext["preemptVerb"]) == ("filter", "bind", "preempt")
    if ranking == "filter":
        # Filter's answer carries the ranking: kube-scheduler must not ask for scores (and a
        # weight without prioritizeVerb would only mislead).
        assert "prioritizeVerb" not in ext and "weight" not in ext
    else:
        assert ext["prioritizeVerb"] == "prioritize"
        assert isinstance(ext["weight"], int) and not isinstance(ext["weight"], bool)
        # One point of our 0..10 score (x weight x 10) outweighs the v1.37 default in-tree
        # maximum (15 x 100: DynamicResources and VolumeBinding count too).
        assert ext["weight"] * 10 > 1500
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["enableHTTPS"] is tls
    if tls:
        tc = ext["tlsConfig"]
        assert set(tc) <= TLS_CONFIG_FIELDS, set(tc) - TLS_CONFIG_FIELDS
        assert tc.get("insecure", False) is False, "the scheduler must verify the extender"
        assert {"certFile", "keyFile", "caFile"} <= set(tc), "client cert + CA for the server"
    else:
        assert "tlsConfig" not in ext
    assert duration_seconds(ext["httpTimeout"]) > 0
    names = []
    for mr in ext.get("managedResources", []):
        assert set(mr) <= {"name", "ignoredByScheduler"}
        assert isinstance(mr["ignoredByScheduler"], bool)
        n = mr["name"]
        # IsExtendedResourceName: domain-prefixed, not native (kubernetes.io/), not "requests.";
        # "requests.<name>" must be a qualified name.
        assert "/" in n and "kubernetes.io/" not in n and not n.startswith("requests."), n
        domain, _, short = n.partition("/")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", domain), n
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", short) and len(short) <= 63, n
        names.append(n)
    assert len(names) == len(set(names)), "managed resource names must be unique"
    return ext


# koordinator's deprecated names: in the chart's list (the webhook routes and renames them), never
# in the extender stanza.
DEPRECATED_NAMES = {"kubernetes.io/gpu", "kubernetes.io/gpu-core", "kubernetes.io/gpu-memory",
                    "kubernetes.io/gpu-memory-ratio", "kubernetes.io/rdma", "kubernetes.io/fpga"}
SHARE_NAMES = {"koordinator.sh/gpu-core", "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio"}
KOORD_NAMES = {
    "nvidia.com/gpu", "amd.com/gpu", "dcu.com/gpu", "koordinator.sh/gpu", "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu.shared",
    "huawei.com/npu-core", "huawei.com/npu-cpu", "huawei.com/npu-dvpp", "koordinator.sh/rdma",
    "koordinator.sh/fpga",
}


@pytest.mark.parametrize("case", [c for c in CASES if (CASES[c] or {}).get("mode") != "standalone"])
def test_scheduler_config(chart, case):
    values = CASES[case] or {}
    objects = objs(chart, values)
    cfg = scheduler_config(objects)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert set(cfg) <= KSC_TOP_FIELDS
    le = cfg["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases"
    assert le["resourceNamespace"] == R.NAMESPACE and le["resourceName"] == "device-numa-scheduler"
    (profile,) = cfg["profiles"]
    assert set(profile) <= PROFILE_FIELDS
    assert profile["schedulerName"] == "device-numa-scheduler"
    assert profile["percentageOfNodesToScore"] == 100
    ext_values = values.get("extender", {})
    ext = check_extenders_stanza(cfg["extenders"], port=ext_values.get("port", 8888),
                                 prefix=ext_values.get("pathPrefix", ""), host="127.0.0.1",
                                 tls=expects_tls(values), ranking=ranking_of(values))
    # Server gives up before the client, so the scheduler gets a readable Error, not a timeout.
    req_timeout = next(a for a in containers(objects)["extender"]["args"] if a.startswith("--request-timeout="))
    assert duration_seconds(ext["httpTimeout"]) > duration_seconds(req_timeout.split("=", 1)[1])
    ignored = {m["name"] for m in values.get("extenderConfig", {}).get("managedResources", [])} or \
        {n for n in KOORD_NAMES | DEPRECATED_NAMES if not n.endswith("/gpu") or not n.startswith(("nvidia", "amd", "dcu"))}
    # Advertised share totals are counted: kube-scheduler's preemption then proposes victims.
    if values.get("extender", {}).get("gpuShareTotals", "ignored") != "ignored":
        ignored -= SHARE_NAMES
    if values.get("extenderConfig", {}).get("routeAllPods"):
        assert "managedResources" not in ext
        (pc,) = profile["pluginConfig"]
        assert pc["name"] == "NodeResourcesFit"
        # Deprecated names are valid here (label names) and every pod reaches the extender.
        assert set(pc["args"]["ignoredResources"]) == ignored
    else:
        assert "pluginConfig" not in profile
        mrs = {m["name"]: m["ignoredByScheduler"] for m in ext["managedResources"]}
        # kube-scheduler refuses kubernetes.io/ names in managedResources (validateExtendedResourceName).
        assert set(mrs) == KOORD_NAMES
        assert not any(n.startswith("kubernetes.io/") for n in mrs)
        assert {n for n, ign in mrs.items() if ign} == ignored - DEPRECATED_NAMES
        # vendor whole-GPU counts stay visible to NodeResourcesFit
        assert not mrs["nvidia.com/gpu"] and not mrs["amd.com/gpu"] and not mrs["dcu.com/gpu"]
    # kube-scheduler container: stock image, reads this config.
    ks = containers(objects)["kube-scheduler"]
    assert ks["image"] == "registry.k8s.io/kube-scheduler:v1.33.0"
    assert "--config=/etc/kubernetes/device-numa-scheduler/config.yaml" in ks["command"]
    dep = one(objects, "Deployment")
    assert dep["spec"]["template"]["metadata"]["annotations"]["checksum/scheduler-config"]


@pytest.mark.parametrize("case", [c for c in CASES if (CASES[c] or {}).get("mode") == "standalone"])
def test_standalone_notes_print_matching_extenders_stanza(chart, case):
    values = CASES[case]
    objects = objs(chart, values)
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    assert set(containers(objects)) == {"extender"}
    svc = one(objects, "Service", R.RELEASE)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"verbs": 8888, "metrics": 8889}
    ext_values = values.get("extender", {})
    check_extenders_stanza(notes_extenders(chart, values), port=8888,
                           prefix=ext_values.get("pathPrefix", ""),
                           host=f"{R.RELEASE}.{R.NAMESPACE}.svc", tls=expects_tls(values),
                           ranking=ranking_of(values))


def test_fragmentation_strategy_reaches_the_binary_and_asks_for_every_pod(chart):
    warning = "WARNING: extender.scoreStrategy=fragmentation"
    for values, warned in [
        ({"extender": {"scoreStrategy": "fragmentation"}}, True),
        ({"extender": {"scoreStrategy": "fragmentation"}, "extenderConfig": {"routeAllPods": True}}, False),
        ({"mode": "standalone", "extender": {"scoreStrategy": "fragmentation"}}, True),
        ({"extender": {"scoreStrategy": "most-allocated"}}, False),
        (None, False),
    ]:
        rendered = R.render(values, chart=chart)
        assert (warning in R.notes(rendered)) == warned, values
        args = containers(objs(chart, values))["extender"]["args"]
        strategy = (values or {}).get("extender", {}).get("scoreStrategy")
        assert (f"--score-strategy={strategy}" in args) == bool(strategy), args
    mix = "60:cpu=4,gpu=0.5;40:cpu=8,gpu=1"
    args = containers(objs(chart, {"extender": {"scoreStrategy": "fragmentation",
                                                 "fragmentationMix": mix}}))["extender"]["args"]
    assert f"--fragmentation-mix={mix}" in args, args
    assert not any(a.startswith("--fragmentation-mix") for a in containers(objs(chart, None))["extender"]["args"])


def test_pod_security_and_probes(chart):
    for values in (None, {"mode": "standalone"}):
        objects = objs(chart, values)
        spec = one(objects, "Deployment")["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["runAsNonRoot"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["seccompProfile"]["type"] == "RuntimeDefault"
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        ext = {c["name"]: c for c in spec["containers"]}["extender"]
        # scheduler mode: a synced standby is ready (PDBs count it); standalone: the leader only
        # (the Service routes by readiness).
        standalone = (values or {}).get("mode") == "standalone"
        want = "/readyz" if standalone else "/readyz?standby=ok"
        assert ext["readinessProbe"]["httpGet"]["path"] == want
        assert ext["livenessProbe"]["httpGet"]["path"] == "/healthz"
        # Startup holds liveness off for >= 5 minutes of bootstrap; it never probes readiness,
        # which a standby fails forever by design.
        sp = ext["startupProbe"]
        assert sp["httpGet"]["path"] == "/healthz"
        assert sp["periodSeconds"] * sp["failureThreshold"] >= 300
        assert one(objects, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
        if not standalone:
            pdb = one(objects, "PodDisruptionBudget")
            assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        ann = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        # Metrics are on the probe port, never on the verb port.
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8889"


def test_ha_defaults_protect_something_and_never_block_a_drain(chart):
    """Issue 27: two replicas on different nodes; in scheduler mode a PodDisruptionBudget with
    minAvailable 1 that counts the synced standby (so it allows one eviction and never both);
    in standalone mode, where only the leader is ready, no budget by default (any budget would
    forbid evicting the leader and hang every drain of its node)."""
    objects = objs(chart)
    dep = one(objects, "Deployment")
    assert dep["spec"]["replicas"] == 2
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    # 1 replica: a budget would protect nothing; no spreading either.
    single = objs(chart, {"replicas": 1})
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in one(single, "Deployment")["spec"]["template"]["spec"]
    # hard anti-affinity, none, and a user's own affinity winning.
    hard = one(objs(chart, {"podAntiAffinity": "hard"}), "Deployment")
    required = hard["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert required[0]["topologyKey"] == "kubernetes.io/hostname"
    none = one(objs(chart, {"podAntiAffinity": "none"}), "Deployment")
    assert "affinity" not in none["spec"]["template"]["spec"]
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]}}}
    assert one(objs(chart, {"affinity": own}), "Deployment")["spec"]["template"]["spec"]["affinity"] == own
    # standalone: no budget unless asked for.
    standalone = objs(chart, {"mode": "standalone"})
    assert not [o for o in standalone if o["kind"] == "PodDisruptionBudget"]
    forced = objs(chart, {"mode": "standalone", "podDisruptionBudget": {"enabled": True}})
    assert one(forced, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert not [o for o in objs(chart, {"podDisruptionBudget": {"enabled": False}})
                if o["kind"] == "PodDisruptionBudget"]


@pytest.mark.parametrize("case", CASES)
def test_lease_roles_name_their_lease(chart, case):
    """Issue 27: the Lease Roles may get/update only the Lease they elect on or follow; only
    create (which RBAC cannot restrict by name) and kube-scheduler's own list/watch are
    unnamed."""
    values = CASES[case]
    objects = objs(chart, values)
    v = values or {}
    sched_lease = v.get("scheduler", {}).get("leaderElection", {}).get("resourceName", "device-numa-scheduler")
    own_lease = v.get("extender", {}).get("leaderElection", {}).get("leaseName", "device-numa-extender")
    expected = {f"{R.RELEASE}-extender-leases": sched_lease if expects_follow(values) else own_lease,
                f"{R.RELEASE}-scheduler-leases": sched_lease}
    seen = 0
    for o in objects:
        if o["kind"] != "Role" or o["metadata"]["name"] not in expected:
            continue
        seen += 1
        for rule in o["rules"]:
            assert rule["resources"] == ["leases"]
            if rule.get("resourceNames"):
                assert rule["resourceNames"] == [expected[o["metadata"]["name"]]], rule
                assert set(rule["verbs"]) == {"get", "update"}, rule
            else:
                assert set(rule["verbs"]) <= {"create", "list", "watch"}, rule
    assert seen == (expects_follow(values) or expects_own_le(values)) + (v.get("mode", "scheduler") == "scheduler" and v.get("rbac", {}).get("create", True))


def test_listener_limits_reach_the_flags(chart):
    """Issue 27: every connection and body limit is a value, passed as its flag."""
    args = containers(objs(chart))["extender"]["args"]
    for flag in ("--max-connections=512", "--probe-max-connections=64", "--header-read-timeout=5s",
                 "--idle-timeout=120s", "--max-connection-age=10m", "--max-header-bytes=16384",
                 "--body-budget-bytes=67108864", "--body-read-timeout=5s"):
        assert flag in args, (flag, args)
    custom = {"extender": {"bodyBudgetBytes": 33554432, "bodyReadTimeout": "2s", "connections": {
        "maxConnections": 100, "probeMaxConnections": 10, "headerReadTimeout": "3s",
        "idleTimeout": "95s", "maxConnectionAge": "1h", "maxHeaderBytes": 8192}}}
    args = containers(objs(chart, custom))["extender"]["args"]
    for flag in ("--max-connections=100", "--probe-max-connections=10", "--header-read-timeout=3s",
                 "--idle-timeout=95s", "--max-connection-age=1h", "--max-header-bytes=8192",
                 "--body-budget-bytes=33554432", "--body-read-timeout=2s"):
        assert flag in args, (flag, args)


def test_service_monitor(chart):
    for mode, svc_name in (("scheduler", f"{R.RELEASE}-metrics"), ("standalone", R.RELEASE)):
        objects = objs(chart, {"mode": mode, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}})
        sm = one(objects, "ServiceMonitor")
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        assert sm["metadata"]["labels"]["release"] == "prom"
        svc = one(objects, "Service", svc_name)
        assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        ports = {p["name"]: p for p in svc["spec"]["ports"]}
        assert sm["spec"]["endpoints"][0]["port"] == "metrics" and ports["metrics"]["port"] == 8889
        assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert not [o for o in objs(chart) if o["kind"] in ("ServiceMonitor", "Service")]


GRAFANA_JSON = R.ROOT / "deploy" / "grafana" / "device-numa-extender.json"
CHART_GRAFANA_JSON = R.CHART_DIR / "dashboards" / "device-numa-extender.json"


def test_grafana_dashboard_configmap(chart):
    import json

    assert not [o for o in objs(chart) if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]], \
        "the dashboard ConfigMap is off by default"
    # Helm can only read files inside the chart: the chart keeps a copy, which must not drift.
    assert CHART_GRAFANA_JSON.read_bytes() == GRAFANA_JSON.read_bytes()
    objects = objs(chart, {"grafanaDashboard": {"enabled": True, "labels": {"team": "gpu"},
                                                "annotations": {"grafana_folder": "GPU"},
                                                "namespace": "monitoring"}})
    cms = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(cms) == 1
    cm = cms[0]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["team"] == "gpu"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "GPU"
    assert json.loads(cm["data"]["device-numa-extender.json"]) == json.loads(GRAFANA_JSON.read_text())


def test_options_reach_the_pod(chart):
    objects = objs(chart, CASES["options"])
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    ext = containers(objects)["extender"]
    assert ext["image"] == "registry.example/dne:1.2.3" and ext["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["nodeSelector"] and spec["tolerations"] and spec["affinity"]
    args = ext["args"]
    for a in ("--require-kinds=devices,noderesourcetopologies", "--max-staleness=5m",
              "--score-strategy=most-allocated", "--score-weights=cpu=1,koordinator.sh/gpu-core=2",
              "--log-format=text"):
        assert a in args
    assert args[-1] == "--max-concurrency=64", "extraArgs come last so they win"
    assert {"name": "DNE_LOG_LEVEL", "value": "debug"} in ext["env"]
    ann = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert ann.get("a") == "b" and "prometheus.io/scrape" not in ann


BAD_VALUES = [
    {"mode": "sidecar"},
    {"podAntiAffinity": "sometimes"},
    {"podDisruptionBudget": {"maxUnavailable": 1}},
    {"extender": {"connections": {"maxConnections": 0}}},
    {"extender": {"connections": {"idleTimeout": "forever"}}},
    {"extender": {"connections": {"maxHeaderBytes": 100}}},
    {"extender": {"bodyBudgetBytes": 10}},
    {"replicas": 0},
    {"replicas": "2"},
    {"unknownKey": 1},
    {"extender": {"pathPrefix": "gpu"}},
    {"extender": {"pathPrefix": "/gpu/"}},
    {"extender": {"pathPrefix": "/gpu?x=1"}},
    {"extender": {"port": 70000}},
    {"extender": {"logFormat": "yaml"}},
    {"extender": {"requestTimeout": "10"}},
    {"extender": {"assumeTtl": "five minutes"}},
    {"extender": {"requireKinds": ["pods"]}},
    {"extender": {"scoreStrategy": "balanced"}},
    {"extender": {"fragmentationMix": 5}},
    {"extender": {"scoreWeights": {"gpu": -1}}},
    {"extender": {"leaderElection": {"enabled": "yes"}}},
    {"extender": {"extraArgs": ["serve"]}},
    {"extender": {"typo": True}},
    {"extenderConfig": {"weight": 0}},
    {"extenderConfig": {"ranking": "score"}},
    {"extenderConfig": {"httpTimeout": 30}},
    {"extenderConfig": {"managedResources": [{"name": "gpu", "ignoredByScheduler": True}]}},
    {"extenderConfig": {"managedResources": [{"name": "kubernetes.io/tpu", "ignoredByScheduler": True}]}},
    {"extenderConfig": {"managedResources": [{"name": "requests.example.com/gpu", "ignoredByScheduler": True}]}},
    {"extenderConfig": {"managedResources": [{"name": "example.com/gpu"}]}},
    {"extenderConfig": {"managedResources": [{"name": "example.com/gpu", "ignoredByScheduler": True}] * 2}},
    {"scheduler": {"schedulerName": "Device_Scheduler"}},
    {"scheduler": {"image": {"repository": "x", "tag": "v1", "pullPolicy": "Sometimes"}}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "Never"}},
    {"serviceMonitor": {"enabled": "true"}},
    {"extender": {"probePort": 0}},
    {"tls": {"enabled": "yes"}},
    {"tls": {"verifyClients": "true"}},
    {"tls": {"secretName": "Bad_Name"}},
    {"tls": {"reloadInterval": "10"}},
    {"tls": {"certManager": {"issuerRef": {"kind": ""}}}},
    {"extenderConfig": {"tlsConfig": {"certFile": "tls.crt", "keyFile": "/k", "caFile": "/c"}}},
    {"networkPolicy": {"verbsFrom": []}},
    {"networkPolicy": {"probesFrom": []}},
    {"networkPolicy": {"verbsFrom": [{}]}},
    {"networkPolicy": {"enabled": "true"}},
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[str(b) for b in BAD_VALUES])
def test_schema_rejects_bad_values(chart, bad):
    with pytest.raises(helm.HelmValuesError):
        R.render(bad, chart=chart)


def test_schema_accepts_defaults(chart):
    chart.validate_schema(chart.values)


def test_api_calls_table_parses():
    t = parse_api_calls()
    assert ("", "pods/binding", "create") in t["API_CALLS"]
    assert ("coordination.k8s.io", "leases", "get") in t["LEADER_ELECTION_API_CALLS"]


def test_deploy_manifest_is_a_fresh_default_render():
    committed = R.DEPLOY_FILE.read_text()
    assert committed == R.deploy_manifest(), \
        "deploy/device-numa-extender.yaml is stale: run tests/chart/run.sh --regenerate"


def test_deploy_crds_validate():
    crds = sorted((R.ROOT / "deploy" / "crds").glob("*.yaml"))
    names = set()
    for p in crds:
        for o in yaml.safe_load_all(p.read_text()):
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
            names.add(o["metadata"]["name"])
            vers = {v["name"]: v for v in o["spec"]["versions"]}
            assert o["spec"]["scope"] == "Cluster"
            assert sum(v["storage"] for v in vers.values()) == 1
            # kube-apiserver refuses a CRD of a protected group (*.k8s.io, *.kubernetes.io)
            # without an approval annotation; the schema validation above cannot see that rule
            # (tests/e2e installs these files into a real apiserver).
            group = o["spec"]["group"]
            if group.endswith((".k8s.io", ".kubernetes.io")) or group in ("k8s.io", "kubernetes.io"):
                assert o["metadata"].get("annotations", {}).get("api-approved.kubernetes.io"), p.name
    assert names == {"devices.scheduling.koordinator.sh", "noderesourcetopologies.topology.node.k8s.io"}


def test_existing_scheduler_example_matches_the_standalone_stanza(chart):
    doc = yaml.safe_load((R.ROOT / "deploy" / "scheduler-config-existing.yaml").read_text())
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert set(doc) <= KSC_TOP_FIELDS
    for p in doc["profiles"]:
        assert set(p) <= PROFILE_FIELDS
        assert p["percentageOfNodesToScore"] == 100
    check_extenders_stanza(doc["extenders"], port=8888, prefix="", host=f"{R.RELEASE}.{R.NAMESPACE}.svc")
    assert doc["extenders"] == notes_extenders(chart, {"mode": "standalone"})


# --- who may call bind: the stanza and the server agree ---------------------------------------------

def flag_values(args: list[str]) -> dict[str, str]:
    out = {}
    for a in args[1:]:
        flag, _, value = a.partition("=")
        out[flag] = value
    return out


def container_port(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container.get("ports", []) if p["name"] == name]
    return port


def secret_mount(spec: dict, container: dict, path: str) -> str:
    """The Secret whose volume is mounted at the directory of `path` in `container`."""
    directory = posixpath.dirname(path)
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == directory]
    assert len(mounts) == 1, f"{path}: no volume mounted at {directory} in {container['name']}"
    assert mounts[0]["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mounts[0]["name"]]
    assert "secret" in volume, f"{directory} is not a Secret volume: {volume}"
    # kubernetes.io/tls Secret keys (plus ca.crt, as cert-manager writes it).
    assert posixpath.basename(path) in ("tls.crt", "tls.key", "ca.crt"), path
    return volume["secret"]["secretName"]


@pytest.mark.parametrize("case", CASES)
def test_stanza_and_server_flags_agree(chart, case):
    """What kube-scheduler is told (urlPrefix, enableHTTPS, tlsConfig) is what the extender
    serves (--listen, --path-prefix, --tls-*), and the files on both sides are mounted Secrets."""
    values = CASES[case] or {}
    objects = objs(chart, values)
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    cs = containers(objects)
    flags = flag_values(cs["extender"]["args"])
    if is_standalone(values):
        ext = notes_extenders(chart, values)[0]
    else:
        ext = scheduler_config(objects)["extenders"][0]
    url = urlsplit(ext["urlPrefix"])
    listen_host, _, listen_port = flags["--listen"].rpartition(":")
    assert int(listen_port) == url.port
    assert flags.get("--path-prefix", "") == url.path
    probe_host, _, probe_port = flags["--probe-address"].rpartition(":")
    assert probe_port != listen_port, "probes and metrics on their own port"
    if is_standalone(values):
        assert listen_host == "0.0.0.0"
        assert url.hostname == f"{R.RELEASE}.{R.NAMESPACE}.svc"
        svc_ports = {p["name"]: p for p in one(objects, "Service", R.RELEASE)["spec"]["ports"]}
        assert svc_ports["verbs"]["port"] == url.port
        assert container_port(cs["extender"], svc_ports["verbs"]["targetPort"]) == int(listen_port)
    else:
        # Sidecar: the verbs (and bind) are reachable from inside the pod only.
        assert listen_host == "127.0.0.1" == url.hostname
        assert "verbs" not in {p["name"] for p in cs["extender"].get("ports", [])}
    # kubelet probes and Prometheus use the probe port.
    metrics_port = container_port(cs["extender"], "metrics")
    assert metrics_port == int(probe_port)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert cs["extender"][probe]["httpGet"]["port"] == "metrics"
        assert "scheme" not in cs["extender"][probe]["httpGet"], "probes are plain HTTP"

    tls = expects_tls(values)
    assert ext["enableHTTPS"] is tls and (url.scheme == "https") is tls
    assert ("--tls-cert-file" in flags) is tls and ("--tls-key-file" in flags) is tls
    if not tls:
        assert not [f for f in flags if f.startswith("--tls-")]
        return
    verify = values.get("tls", {}).get("verifyClients", True)
    assert ("--tls-client-ca-file" in flags) is verify
    server_secrets = {secret_mount(spec, cs["extender"], flags[f])
                      for f in ("--tls-cert-file", "--tls-key-file", "--tls-client-ca-file") if f in flags}
    assert len(server_secrets) == 1
    tls_values = values.get("tls", {})
    assert server_secrets == {tls_values.get("secretName") or f"{R.RELEASE}-tls"}
    tc = ext["tlsConfig"]
    if is_standalone(values):
        assert tc == {"certFile": "/etc/kubernetes/device-numa-extender/client/tls.crt",
                      "keyFile": "/etc/kubernetes/device-numa-extender/client/tls.key",
                      "caFile": "/etc/kubernetes/device-numa-extender/client/ca.crt"}
    else:
        # The kube-scheduler container has the client certificate exactly where tlsConfig says.
        client_secrets = {secret_mount(spec, cs["kube-scheduler"], tc[k]) for k in ("certFile", "keyFile", "caFile")}
        assert client_secrets == {tls_values.get("clientSecretName") or f"{R.RELEASE}-client-tls"}
        assert posixpath.basename(tc["certFile"]) == "tls.crt" and posixpath.basename(tc["keyFile"]) == "tls.key"
    if tls_values.get("certManager", {}).get("enabled"):
        certs = {c["metadata"]["name"]: c for c in objects if c["kind"] == "Certificate"}
        serving, client = certs[f"{R.RELEASE}-tls"], certs[f"{R.RELEASE}-client-tls"]
        assert serving["spec"]["secretName"] == next(iter(server_secrets))
        assert "server auth" in serving["spec"]["usages"] and "client auth" in client["spec"]["usages"]
        # The urlPrefix host is in the serving certificate.
        if url.hostname == "127.0.0.1":
            assert "127.0.0.1" in serving["spec"]["ipAddresses"]
        else:
            assert url.hostname in serving["spec"]["dnsNames"]
        # One issuer signs both: each side's ca.crt verifies the other.
        assert serving["spec"]["issuerRef"] == client["spec"]["issuerRef"] == tls_values["certManager"]["issuerRef"]
        for c in certs.values():
            assert c["apiVersion"] == "cert-manager.io/v1" and c["spec"]["privateKey"]["rotationPolicy"] == "Always"


@pytest.mark.parametrize("case", CASES)
def test_network_policy_admits_verbs_only_from_the_scheduler(chart, case):
    values = CASES[case] or {}
    objects = objs(chart, values)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    webhook = values.get("webhook", {}).get("enabled", False)
    if (not is_standalone(values) and not webhook) or values.get("networkPolicy", {}).get("enabled") is False:
        assert policies == []
        return
    (np,) = policies
    kubernetes_validate.validate(np, K8S_VERSION, strict=True)
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = np["spec"]["podSelector"]["matchLabels"]
    assert selector and all(pod_labels.get(k) == v for k, v in selector.items())
    assert np["spec"]["policyTypes"] == ["Ingress"]
    flags = flag_values(containers(objects)["extender"]["args"])
    verb_port = int(flags["--listen"].rpartition(":")[2])
    probe_port = int(flags["--probe-address"].rpartition(":")[2])
    rules = np["spec"]["ingress"]
    # Every rule names its ports and its peers: a rule without either admits everything.
    for r in rules:
        assert r.get("ports") and r.get("from"), f"open rule {r}"
    by_port = {}
    for r in rules:
        for p in r["ports"]:
            by_port.setdefault(p["port"], []).extend(r["from"])
    # Scheduler mode: the verbs are on loopback (no rule), kube-scheduler's secure port is
    # open as the probe port is.
    sched_port = values.get("scheduler", {}).get("securePort", 10259)
    ports = {verb_port, probe_port} if is_standalone(values) else {probe_port, sched_port}
    if webhook:
        ports.add(int(flags["--webhook-listen"].rpartition(":")[2]))
    assert set(by_port) == ports
    defaults = yaml.safe_load((R.CHART_DIR / "values.yaml").read_text())["networkPolicy"]
    want_verbs = values.get("networkPolicy", {}).get("verbsFrom", defaults["verbsFrom"])
    want_probes = values.get("networkPolicy", {}).get("probesFrom", defaults["probesFrom"])
    if is_standalone(values):
        assert by_port[verb_port] == want_verbs
    else:
        assert flags["--listen"].startswith("127.0.0.1:")
        assert by_port[sched_port] == want_probes
    assert by_port[probe_port] == want_probes
    if webhook:
        webhook_port = int(flags["--webhook-listen"].rpartition(":")[2])
        assert by_port[webhook_port] == values["networkPolicy"]["webhookFrom"]
        assert all(p.get("ipBlock", {}).get("cidr") not in ("0.0.0.0/0", "::/0") for p in by_port[webhook_port])
    if is_standalone(values) and "verbsFrom" not in values.get("networkPolicy", {}):
        # Default: kube-scheduler pods in kube-system, not "any pod" and not "any namespace".
        (peer,) = by_port[verb_port]
        assert peer["podSelector"]["matchLabels"] == {"component": "kube-scheduler"}
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}


TEMPLATE_ERRORS = [
    # Two active binders without a Lease between them (issue 36 §1).
    ({"mode": "standalone", "replicas": 2, "extender": {"leaderElection": {"enabled": False}}},
     "mode=standalone with replicas > 1 needs extender.leaderElection.enabled"),
    ({"replicas": 3, "extender": {"followSchedulerLease": False}},
     "mode=scheduler with replicas > 1 needs extender.followSchedulerLease=true"),
    ({"extender": {"fragmentationMix": "1:cpu=4"}}, "extender.fragmentationMix needs extender.scoreStrategy=fragmentation"),
    ({"tls": {"enabled": True}}, "tls.enabled=true needs"),
    ({"tls": {"secretName": "dne-serving"}}, "needs tls.clientSecretName"),
    ({"tls": {"certManager": {"enabled": True}}}, "issuerRef.name is required"),
]


@pytest.mark.parametrize("bad,message", TEMPLATE_ERRORS, ids=[m for _, m in TEMPLATE_ERRORS])
def test_inconsistent_values_fail_the_render(chart, bad, message):
    with pytest.raises(Exception) as err:
        R.render(bad, chart=chart)
    assert message in str(err.value)


# --- Node writes (issue 36 §8) ---------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_the_extender_may_change_only_its_own_annotation_on_nodes(chart, case):
    values = CASES[case] or {}
    objects = objs(chart, values)
    requeue = values.get("extender", {}).get("requeue", {}).get("enabled", True)
    # The status policy (GPU share totals) is checked on its own, below this section.
    # The status policy (GPU share totals) and the DeviceTaintRule policy are checked on their
    # own, below this section.
    others = ("-node-status-writes", "-dra-rule-writes", "-dra-claim-tolerations")
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                and not o["metadata"]["name"].endswith(others)]
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                and not o["metadata"]["name"].endswith(others)]
    patches_nodes = any("patch" in r["verbs"] and "nodes" in r["resources"]
                        for o in objects if o["kind"] == "ClusterRole"
                        and o["metadata"]["name"].endswith("-extender") for r in o["rules"])
    # Wherever RBAC lets the extender patch Nodes, the policy narrows it (unless switched off),
    # and only then.
    policy_on = values.get("rbac", {}).get("nodeWritePolicy", True)
    assert patches_nodes == requeue
    assert bool(policies) == (patches_nodes and policy_on)
    if not policies:
        return
    (policy,), (binding,) = policies, bindings
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes"] and rule["operations"] == ["UPDATE"]
    sa = one(objects, "ServiceAccount")
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{user}'"
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for field in ("object.spec", "object.metadata.labels", "object.metadata.finalizers",
                  "object.metadata.ownerReferences",
                  "object.metadata.annotations", "'device-numa-extender.io/capacity-returned'"):
        assert field in text, field


@pytest.mark.parametrize("values,exempt", [
    ({}, None),
    ({"extender": {"dra": {"tolerationExemptNamespaces": ["monitoring", "ops"]}}}, ["monitoring", "ops"]),
    ({"extender": {"dra": {"denyTolerations": False}}}, "off"),
    ({"extender": {"dra": {"ownership": False}}}, "off"),
])
def test_claims_tolerating_the_extenders_taint_are_denied_outside_the_exempt_namespaces(chart, values, exempt):
    """Trust IV: a claim tolerating the extender's NoSchedule taint could be given an owned device
    by DRA in memory; a ValidatingAdmissionPolicy denies such claims and claim templates (the real
    API server evaluates it in tests/e2e)."""
    objects = objs(chart, values)
    name = f"{R.RELEASE}-dra-claim-tolerations"
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name]
    if exempt == "off":
        assert not policies
        return
    (policy,) = policies
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"resourceclaims", "resourceclaimtemplates"}
    assert policy["spec"]["matchConstraints"]["matchPolicy"] == "Equivalent"
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for needle in ("'device-numa-extender.io/owned'", "'Exists'", "'NoSchedule'", "firstAvailable",
                   "object.spec.spec.devices"):
        assert needle in text, needle
    binding = one(objects, "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"]["validationActions"] == ["Deny"]
    selector = binding["spec"].get("matchResources", {}).get("namespaceSelector")
    if exempt is None:
        assert selector is None
    else:
        (expr,) = selector["matchExpressions"]
        assert expr == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": exempt}


@pytest.mark.parametrize("ownership", [True, False])
def test_the_extender_may_write_only_its_own_device_taint_rules(chart, ownership):
    """Trust IV: RBAC grants create/delete on devicetaintrules cluster-wide with DRA ownership;
    the policy narrows them to the extender's own rules (named, labelled, NoSchedule with its key,
    a whole pool, no owner reference). The real API server evaluates it in tests/e2e."""
    values = {"extender": {"dra": {"ownership": ownership}}}
    objects = objs(chart, values)
    name = f"{R.RELEASE}-dra-rule-writes"
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name]
    writes = any("create" in r["verbs"] and "devicetaintrules" in r["resources"]
                 for o in objects if o["kind"] == "ClusterRole"
                 and o["metadata"]["name"].endswith("-extender") for r in o["rules"])
    assert writes == ownership
    assert bool(policies) == ownership
    if not policies:
        return
    (policy,) = policies
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["devicetaintrules"] and rule["apiGroups"] == ["resource.k8s.io"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"} and rule["apiVersions"] == ["*"]
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == 'system:serviceaccount:{R.NAMESPACE}:{sa}'"
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for needle in ("'NoSchedule'", "'device-numa-extender.io/owned'", "startsWith('dne-owned-')",
                   "'device-numa-extender'", "ownerReferences", "deviceSelector.device"):
        assert needle in text, needle
    binding = one(objects, "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"]["validationActions"] == ["Deny"]
    off = objs(chart, {**values, "rbac": {"draRulePolicy": False}})
    assert not [o for o in off if o["metadata"]["name"] == name]


# --- the admission webhook (issue 25) -------------------------------------------------------------

WEBHOOK_CASES = [c for c in CASES if (CASES[c] or {}).get("webhook", {}).get("enabled")]


def test_webhook_is_off_by_default(chart):
    objects = objs(chart)
    assert not [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    assert not any(a.startswith("--webhook") for a in containers(objects)["extender"]["args"])


@pytest.mark.parametrize("case", WEBHOOK_CASES)
def test_webhook_configuration_reaches_the_listener_and_routes_only_device_pods(chart, case):
    values = CASES[case]
    w = values["webhook"]
    objects = objs(chart, values)
    mwc = one(objects, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    # The shape kube-apiserver needs, and the defaults the README promises.
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == w.get("failurePolicy", "Fail")
    assert 1 <= hook["timeoutSeconds"] <= 30
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    excluded = [e for e in hook["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    assert excluded and "kube-system" in excluded[0]["values"], "the control plane's namespaces are never blocked"
    # clientConfig → Service → container port → --webhook-listen: one chain.
    svc_ref = hook["clientConfig"]["service"]
    assert svc_ref["path"] == "/mutate-pods"
    svc = one(objects, "Service", svc_ref["name"])
    assert svc["metadata"]["namespace"] == svc_ref["namespace"] == R.NAMESPACE
    assert svc["spec"]["publishNotReadyAddresses"] is True, "standbys and syncing replicas answer too"
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == svc_ref["port"]]
    ext = containers(objects)["extender"]
    (cport,) = [p for p in ext["ports"] if p["name"] == port["targetPort"]]
    flags = flag_values(ext["args"])
    assert int(flags["--webhook-listen"].rpartition(":")[2]) == cport["containerPort"]
    # The serving certificate is mounted where the flags point.
    cert_dir = flags["--webhook-tls-cert-file"].rpartition("/")[0]
    assert flags["--webhook-tls-key-file"].rpartition("/")[0] == cert_dir
    (mount,) = [m for m in ext["volumeMounts"] if m["mountPath"] == cert_dir]
    pod_volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    secret_name = pod_volumes[mount["name"]]["secret"]["secretName"]
    source = w.get("certificate", {}).get("source", "generate")
    if source == "generate":
        secret = one(objects, "Secret", secret_name)
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        assert base64.b64decode(secret["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
    elif source == "certManager":
        cert = one(objects, "Certificate", f"{R.RELEASE}-webhook-tls")
        assert cert["spec"]["secretName"] == secret_name
        host = f"{svc['metadata']['name']}.{R.NAMESPACE}.svc"
        assert host in cert["spec"]["dnsNames"]
        assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{R.NAMESPACE}/{cert['metadata']['name']}"
        assert "caBundle" not in hook["clientConfig"]
    else:
        assert secret_name == w["certificate"]["secretName"]
        assert hook["clientConfig"]["caBundle"] == w["certificate"]["caBundle"]
    # The scheduler the pods are routed to is the one that calls the extender.
    if is_standalone(values):
        assert flags["--webhook-scheduler-name"] == w["schedulerName"]
    else:
        assert flags["--webhook-scheduler-name"] == scheduler_config(objects)["profiles"][0]["schedulerName"]
    # The API server's filter and the binary's rule name the same resources.
    managed = [r["name"] for r in yaml.safe_load((R.CHART_DIR / "values.yaml").read_text())
               ["extenderConfig"]["managedResources"]]
    assert flags["--webhook-managed-resources"].split(",") == managed
    (cond,) = hook["matchConditions"]
    for name in managed:
        assert f"'{name}'" in cond["expression"]
    assert DEPRECATED_NAMES <= set(managed), "koordinator's deprecated names are routed too"
    assert "default-scheduler" in cond["expression"]
    # The extender's own pods reach the webhook too (renames, preset nodeName refused).
    assert f"object.spec.schedulerName == '{flags['--webhook-scheduler-name']}'" in cond["expression"]
    assert ("koordinator.sh/qosClass" in cond["expression"]) == bool(w.get("routeCpusetQos"))
    assert ("--webhook-route-cpuset-qos" in ext["args"]) == bool(w.get("routeCpusetQos"))


WEBHOOK_ERRORS = [
    ({"mode": "standalone", "webhook": {"enabled": True}}, "needs webhook.schedulerName"),
    # Issue 36 §2: the webhook port is not opened to every pod by default, in either mode.
    ({"mode": "standalone", "webhook": {"enabled": True, "schedulerName": "s"}},
     "networkPolicy.webhookFrom must name the addresses kube-apiserver calls the webhook from"),
    ({"webhook": {"enabled": True}},
     "networkPolicy.webhookFrom must name the addresses kube-apiserver calls the webhook from"),
    ({"webhook": {"enabled": True, "certificate": {"source": "secret"}}}, "needs webhook.certificate.secretName"),
    ({"webhook": {"enabled": True, "certificate": {"source": "secret", "secretName": "s"}}},
     "needs webhook.certificate.caBundle"),
    ({"webhook": {"enabled": True, "certificate": {"source": "certManager"}}}, "needs tls.certManager.issuerRef.name"),
]


@pytest.mark.parametrize("bad,message", WEBHOOK_ERRORS, ids=[m for _, m in WEBHOOK_ERRORS])
def test_inconsistent_webhook_values_fail_the_render(chart, bad, message):
    with pytest.raises(Exception) as err:
        R.render(bad, chart=chart)
    assert message in str(err.value)


def ranking_of(values: dict | None) -> str:
    return ((values or {}).get("extenderConfig") or {}).get("ranking", "filter")


@pytest.mark.parametrize("ranking", ["filter", "prioritize"])
@pytest.mark.parametrize("mode", ["scheduler", "standalone"])
def test_ranking_sets_the_binary_and_the_stanza_together(chart, ranking, mode):
    values = {"mode": mode, "extenderConfig": {"ranking": ranking}}
    objects = objs(chart, values)
    args = containers(objects)["extender"]["args"]
    # The binary's default is prioritize: the chart names filter only (so a binary from before
    # the flag runs the prioritize stanza).
    assert [a for a in args if a.startswith("--ranking")] == (["--ranking=filter"] if ranking == "filter" else [])
    stanza = scheduler_config(objects)["extenders"] if mode == "scheduler" else notes_extenders(chart, values)
    host = "127.0.0.1" if mode == "scheduler" else f"{R.RELEASE}.{R.NAMESPACE}.svc"
    check_extenders_stanza(stanza, port=8888, prefix="", host=host, ranking=ranking)


@pytest.mark.parametrize("mode", ["ignored", "koord-manager", "extender"])
def test_gpu_share_totals_reach_the_binary_and_the_status_policy_only_with_the_extender(chart, mode):
    values = {"extender": {"gpuShareTotals": mode}}
    objects = objs(chart, values)
    assert f"--gpu-share-totals={mode}" in containers(objects)["extender"]["args"]
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    status_policy = policies.get(f"{R.RELEASE}-node-status-writes")
    assert (status_policy is not None) == (mode == "extender")
    if status_policy:
        (rule,) = status_policy["spec"]["matchConstraints"]["resourceRules"]
        assert rule["resources"] == ["nodes/status"] and rule["operations"] == ["UPDATE"]
        sa = one(objects, "ServiceAccount")["metadata"]["name"]
        (cond,) = status_policy["spec"]["matchConditions"]
        assert f"system:serviceaccount:{R.NAMESPACE}:{sa}" in cond["expression"]
        text = " ".join(v["expression"] for v in status_policy["spec"]["validations"])
        for name in SHARE_NAMES:
            assert name in text
        for field in ("capacity", "allocatable", "conditions", "addresses"):
            assert f"object.status.{field}" in text
        binding = one(objects, "ValidatingAdmissionPolicyBinding", f"{R.RELEASE}-node-status-writes")
        assert binding["spec"]["validationActions"] == ["Deny"]
    # Without the policy switch, no policy, whatever the mode.
    off = objs(chart, {**values, "rbac": {"nodeWritePolicy": False}})
    assert not [o for o in off if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"].endswith("-node-status-writes")]


def test_kube_version_covers_every_api_the_default_render_uses(chart):
    """The chart's default render carries ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1,
    served from Kubernetes 1.30): Chart.yaml's kubeVersion must not promise older releases, where
    the install fails (found in trust IV; the chart said >=1.27)."""
    text = (Path(__file__).resolve().parents[2] / "charts/device-numa-extender/Chart.yaml").read_text()
    (floor,) = re.findall(r'^kubeVersion:\s*">=(\d+)\.(\d+)\.', text, re.M)
    policies = [o for o in objs(chart) if o["kind"] == "ValidatingAdmissionPolicy"]
    assert policies and all(o["apiVersion"] == "admissionregistration.k8s.io/v1" for o in policies)
    assert (int(floor[0]), int(floor[1])) >= (1, 30), floor
