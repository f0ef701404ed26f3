#!/usr/bin/env python3
"""Generates examples/cluster.yaml: a small, realistic GPU cluster for offline runs.

3 GPU nodes (8 GPUs each over 2 NUMA nodes, 2 PCIe switches per NUMA node, one unhealthy GPU
on gpu-node-2), NRTs with koordinator CPU-topology annotations, running pods holding GPU
shares and cpusets, one CPU-only node without a Device, and pending pods to bind.
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


def pod(ns, name, node, requests, allocated=None, resource_status=None, uid=None):
    ann = {}
    if allocated is not None:
        ann["scheduling.koordinator.sh/device-allocated"] = json.dumps(allocated, separators=(",", ":"))
    if resource_status is not None:
        ann["scheduling.koordinator.sh/resource-status"] = json.dumps(resource_status, separators=(",", ":"))
    meta = {"name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}", "annotations": ann}
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

print("# Generated by examples/gen_cluster.py; edit that script, not this file.")
print(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=120), end="")
