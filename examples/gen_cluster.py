#!/usr/bin/env python3
"""Generates examples/cluster.yaml: a small, realistic GPU cluster for offline runs.

3 GPU nodes (8 GPUs each over 2 NUMA nodes, 2 PCIe switches per NUMA node, one unhealthy GPU
on gpu-node-2), NRTs with koordinator CPU-topology annotations, running pods holding GPU
shares and cpusets, one CPU-only node without a Device, CPU-only nodes with each NUMA policy
(none, BestEffort, Restricted, SingleNUMANode; one with 4 NUMA nodes) and reserved CPUs, and
pending pods to bind (GPU pods, an LSR cpuset pod, a GPU + cpuset pod).
Run: python3 examples/gen_cluster.py > examples/cluster.yaml
"""
import json

import yaml  # PyYAML; only needed to regenerate the example

GiB = 1 << 30
docs = []


def node(name, gpus):
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus:
        alloc.update({"nvidia.com/gpu": str(gpus), "koordinator.sh/gpu-core": str(100 * gpus),
                      "koordinator.sh/gpu-memory": f"{80 * gpus}Gi",
                      "koordinator.sh/gpu-memory-ratio": str(100 * gpus)})
    labels = {"kubernetes.io/hostname": name}
    if gpus:
        labels.update({"node.koordinator.sh/gpu-vendor": "nvidia", "node.koordinator.sh/gpu-model": "A100-SXM4-80GB"})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def device(name, unhealthy=()):
    devs = []
    for minor in range(8):
        numa = minor // 4
        pcie = minor // 2
        devs.append({
            "type": "gpu", "id": f"GPU-{name}-{minor:04d}", "minor": minor, "health": minor not in unhealthy,
            "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "80Gi",
                          "koordinator.sh/gpu-memory-ratio": "100"},
            "topology": {"socketID": numa, "nodeID": numa, "pcieID": f"pci0000:{pcie:02x}",
                         "busID": f"0000:{0x10 + minor:02x}:00.0"}})
    for nic in range(2):
        devs.append({"type": "rdma", "id": f"0000:{0x40 + nic:02x}:00.0", "minor": nic, "health": True,
                     "resources": {"koordinator.sh/rdma": "100"},
                     "topology": {"socketID": nic, "nodeID": nic, "pcieID": f"pci0000:{nic * 2:02x}",
                                  "busID": f"0000:{0x40 + nic:02x}:00.0"}})
    return {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": {"name": name, "labels": {"node.koordinator.sh/gpu-vendor": "nvidia",
                                                  "node.koordinator.sh/gpu-model": "A100-SXM4-80GB"}},
            "spec": {"devices": devs}}


def nrt(name):
    # 64 logical CPUs: 2 sockets = 2 NUMA nodes, 16 cores each, 2 threads per core.
    detail = []
    for cpu in range(64):
        thread = cpu // 32
        core = cpu % 32
        detail.append({"id": cpu, "core": core, "socket": core // 16, "node": core // 16})
    detail.sort(key=lambda d: d["id"])
    zones = [{"name": f"node-{n}", "type": "Node",
              "resources": [{"name": "cpu", "capacity": "32", "allocatable": "32", "available": "32"},
                            {"name": "memory", "capacity": "256Gi", "allocatable": "256Gi", "available": "256Gi"}]}
             for n in range(2)]
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name, "annotations": {
                "node.koordinator.sh/cpu-topology": json.dumps({"detail": detail}, separators=(",", ":")),
                "kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": "none"}),
                "node.koordinator.sh/cpu-shared-pools": json.dumps(
                    [{"socket": 0, "node": 0, "cpuset": "8-15,40-47"}, {"socket": 1, "node": 1, "cpuset": "16-31,48-63"}])}},
            "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                           {"name": "topologyManagerScope", "value": "pod"}],
            "zones": zones}


def numa_nrt(name, numas, sockets, cores_per_numa, policies=None, attributes=None, annotations=None):
    """An NRT as koordlet writes it for CPU-only nodes: `numas` NUMA nodes over `sockets`
    sockets, `cores_per_numa` cores per NUMA node, 2 threads per core (Linux numbering: the
    second threads of all cores follow the first threads)."""
    cores = numas * cores_per_numa
    detail = []
    for cpu in range(cores * 2):
        core = cpu % cores
        numa = core // cores_per_numa
        detail.append({"id": cpu, "core": core % (cores // sockets), "socket": numa * sockets // numas, "node": numa})
    per_numa = str(cores_per_numa * 2)
    zones = [{"name": f"node-{n}", "type": "Node",
              "resources": [{"name": "cpu", "capacity": per_numa, "allocatable": per_numa, "available": per_numa},
                            {"name": "memory", "capacity": "128Gi", "allocatable": "128Gi", "available": "128Gi"}]}
             for n in range(numas)]
    ann = {"node.koordinator.sh/cpu-topology": json.dumps({"detail": detail}, separators=(",", ":")),
           "kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": "none"})}
    ann.update(annotations or {})
    obj = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
           "metadata": {"name": name, "annotations": ann}, "zones": zones}
    if policies:
        obj["topologyPolicies"] = policies
    if attributes:
        obj["attributes"] = [{"name": k, "value": v} for k, v in attributes.items()]
    return obj


def cpu_node(name, labels=None):
    n = node(name, 0)
    n["metadata"]["labels"].update(labels or {})
    return n


def pod(ns, name, node, requests, allocated=None, resource_status=None, uid=None, labels=None):
    ann = {}
    if allocated is not None:
        ann["scheduling.koordinator.sh/device-allocated"] = json.dumps(allocated, separators=(",", ":"))
    if resource_status is not None:
        ann["scheduling.koordinator.sh/resource-status"] = json.dumps(resource_status, separators=(",", ":"))
    meta = {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}", "annotations": ann}
    if labels:
        meta["labels"] = labels
    spec = {"schedulerName": "device-numa-scheduler",
            "containers": [{"name": "main", "image": "registry.example/ml/app:1.0",
                            "resources": {"requests": requests, "limits": requests}}]}
    status = {"phase": "Pending"}
    if node:
        spec["nodeName"] = node
        status = {"phase": "Running"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def gpu_alloc(name, minor, core=None, ratio=100):
    res = {"koordinator.sh/gpu-memory": f"{80 * ratio // 100}Gi", "koordinator.sh/gpu-memory-ratio": str(ratio)}
    if core is not None:
        res["koordinator.sh/gpu-core"] = str(core)
    return {"minor": minor, "resources": dict(sorted(res.items())), "id": f"GPU-{name}-{minor:04d}"}


for i in range(3):
    n = f"gpu-node-{i}"
    docs += [node(n, 8), device(n, unhealthy=(5,) if i == 2 else ()), nrt(n)]
docs += [node("cpu-node-0", 0), nrt("cpu-node-0")]

# CPU-only nodes, one per NUMA policy (koordlet's NRT annotations; reserved CPUs from every
# source koordinator reads). All are SMT-2.
docs += [
    # No NUMA policy (v1alpha1 "None"); CPUs 0,32 reserved by the node reservation and 1,33 by
    # the exclusive system-QoS cpuset.
    cpu_node("numa-none-0"),
    numa_nrt("numa-none-0", 2, 2, 16, policies=["None"], annotations={
        "node.koordinator.sh/reservation": json.dumps({"resources": {"cpu": "2"}, "reservedCPUs": "0,32"}),
        "node.koordinator.sh/system-qos-resource": json.dumps({"cpuset": "1,33", "cpusetExclusive": True})}),
    # BestEffort from kubelet's best-effort policy with pod scope (v1alpha1 string).
    cpu_node("numa-besteffort-0"),
    numa_nrt("numa-besteffort-0", 2, 2, 16, policies=["BestEffortPodLevel"]),
    # Restricted from the node label (overrides the NRT), and every pod gets whole cores.
    cpu_node("numa-restricted-0", {"node.koordinator.sh/numa-topology-policy": "Restricted",
                                   "node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"}),
    numa_nrt("numa-restricted-0", 2, 2, 16, policies=["None"]),
    # SingleNUMANode from v1alpha2 attributes, 4 NUMA nodes over 2 sockets, packing strategy;
    # kubelet-reserved CPUs 0,32 and a kubelet-static pod on 2-3,34-35.
    cpu_node("numa-single-0", {"node.koordinator.sh/numa-allocate-strategy": "MostAllocated"}),
    numa_nrt("numa-single-0", 4, 2, 8,
             attributes={"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod"},
             annotations={
                 "kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": "static", "reservedCPUs": "0,32"}),
                 "node.koordinator.sh/pod-cpu-allocs": json.dumps([{"namespace": "kube-system", "name": "static-pod",
                                                                     "uid": "uid-static", "cpuset": "2-3,34-35",
                                                                     "managedByKubelet": True}])}),
]

# Running pods holding GPU shares and cpusets.
docs.append(pod("ml", "train-a-0", "gpu-node-0", {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"},
                {"gpu": [gpu_alloc("gpu-node-0", 0, 100), gpu_alloc("gpu-node-0", 1, 100)]},
                {"cpuset": "0-7,32-39", "numaNodeResources": [{"node": 0, "resources": {"cpu": "16"}}]}))
docs.append(pod("ml", "infer-b-0", "gpu-node-0", {"cpu": "4", "memory": "16Gi", "koordinator.sh/gpu-memory-ratio": "50"},
                {"gpu": [gpu_alloc("gpu-node-0", 2, None, 50)]}))
docs.append(pod("ml", "infer-b-1", "gpu-node-1", {"cpu": "4", "memory": "16Gi",
                                                    "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"},
                {"gpu": [gpu_alloc("gpu-node-1", 4, 50, 50)]}))
docs.append(pod("ml", "train-c-0", "gpu-node-1", {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"},
                {"gpu": [gpu_alloc("gpu-node-1", m, 100) for m in range(4)]},
                {"cpuset": "0-15,32-47", "numaNodeResources": [{"node": 0, "resources": {"cpu": "32"}}]}))
docs.append(pod("default", "web-0", "cpu-node-0", {"cpu": "2", "memory": "4Gi"}))
# Pending pods that the example requests filter, prioritize and bind.
docs.append(pod("ml", "infer-new", None, {"cpu": "4", "memory": "16Gi", "koordinator.sh/gpu-memory-ratio": "50"},
                uid="3f0c6a58-6a5e-4f0b-9d1c-2a7e1f0b9c11"))
docs.append(pod("ml", "train-new", None, {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"},
                uid="7b1d2e44-0c1a-4d7e-9a55-5e0f2c8d7a01"))

docs.append(pod("ml", "db-0", "numa-single-0", {"cpu": "8", "memory": "32Gi"},
                resource_status={"cpuset": "4-7,36-39",
                                 "numaNodeResources": [{"node": 0, "resources": {"cpu": "8", "memory": "32Gi"}}]},
                labels={"koordinator.sh/qosClass": "LSR"}))
# Pending cpuset pods: an LSR pod asking for 8 whole CPUs, and an LSR pod with 2 GPUs + 8 CPUs
# (on gpu-node-0 the 2 free whole GPUs are on NUMA 1, so its cpuset goes there too).
docs.append(pod("ml", "lsr-new", None, {"cpu": "8", "memory": "16Gi"},
                uid="5a2b9c10-3d4e-4f5a-8b6c-7d8e9f0a1b2c", labels={"koordinator.sh/qosClass": "LSR"}))
docs.append(pod("ml", "gpu-lsr-new", None, {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
                uid="9c8b7a6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d", labels={"koordinator.sh/qosClass": "LSR"}))

print("# Generated by examples/gen_cluster.py; edit that script, not this file.")
print(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=120), end="")
