package e2e

// Every placement kind through the stock scheduler: the chart's configuration (routeAllPods, so
// cpuset-only pods reach the extender), one pod of each kind, and assertions on what the API
// server holds: node, minors, cpusets, NUMA nodes, read with the oracle's own parsers.

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// start brings up the whole stack: control plane, extender, scheduler pointed at it.
func start(t *testing.T, opts planOptions) (*controlPlane, *extenderProc) {
	cp := startControlPlane(t, opts)
	ext := cp.startExtender("")
	cp.startScheduler(ext.urlPrefix())
	return cp, ext
}

func minorsOf(devs map[string][]deviceEntry, kind string) []int {
	var out []int
	for _, e := range devs[kind] {
		out = append(out, e.Minor)
	}
	sort.Ints(out)
	return out
}

func quantity(s string) int64 {
	q := resource.MustParse(s)
	return q.Value()
}

func TestEveryPlacementKindThroughTheStockScheduler(t *testing.T) {
	cp, ext := start(t, planOptions{chartValues: routeAllPods})
	m := gpuMachine
	cp.addNodes("gpu", 3, m)
	ext.waitReady()

	lsr := map[string]string{"koordinator.sh/qosClass": "LSR"}
	lse := map[string]string{"koordinator.sh/qosClass": "LSE"}
	single := map[string]string{"scheduling.koordinator.sh/numa-topology-spec": `{"numaTopologyPolicy":"SingleNUMANode"}`}
	pods := []podSpec{
		{name: "whole-4", limits: map[string]string{"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "4"}},
		{name: "whole-2", limits: map[string]string{"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}},
		{name: "ratio-50", limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "50"}},
		{name: "bytes-20gi", limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory": "20Gi"}},
		{name: "core-mem", limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}},
		{name: "multi-shared", limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu.shared": "2", "koordinator.sh/gpu-memory-ratio": "100"}},
		{name: "gpu-rdma", limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1", "koordinator.sh/rdma": "100"},
			annots: map[string]string{"scheduling.koordinator.sh/device-joint-allocate": `{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}`}},
		{name: "lsr-full", labels: lsr, limits: map[string]string{"cpu": "4", "memory": "4Gi"}},
		{name: "lsr-spread", labels: lsr, limits: map[string]string{"cpu": "4", "memory": "4Gi"},
			annots: map[string]string{"scheduling.koordinator.sh/resource-spec": `{"requiredCPUBindPolicy":"SpreadByPCPUs"}`}},
		{name: "lse-full", labels: lse, limits: map[string]string{"cpu": "6", "memory": "4Gi"}},
		{name: "ls-single-numa", limits: map[string]string{"cpu": "8", "memory": "8Gi"}, annots: single},
		{name: "gpu-cpuset-aligned", labels: lsr, limits: map[string]string{"cpu": "4", "memory": "4Gi", "nvidia.com/gpu": "1"}, annots: single},
	}
	// The whole-GPU pods go first, each alone: which minors they get depends on what the
	// chosen node has free, and with no NUMA policy a node without 4 free GPUs on one NUMA
	// node is still a fit (the cards then span NUMA nodes, as in koordinator). Alone on empty
	// nodes, the minors show the topology preference itself.
	var names []string
	for _, p := range pods {
		cp.createPod(p)
		names = append(names, p.name)
		if strings.HasPrefix(p.name, "whole-") {
			cp.waitBound(p.name)
		}
	}
	bound := cp.waitBound(names...)
	cp.assertNoViolations()

	devs := func(name string) map[string][]deviceEntry {
		d, err := parseDeviceAllocated(bound[name])
		if err != nil || d == nil {
			t.Fatalf("%s: device-allocated %v (annotations %v)", name, err, bound[name].Annotations)
		}
		return d
	}
	status := func(name string) *resourceStatus {
		rs, err := parseResourceStatus(bound[name])
		if err != nil || rs == nil {
			t.Fatalf("%s: resource-status %v (annotations %v)", name, err, bound[name].Annotations)
		}
		return rs
	}
	cpus := func(name string) []int {
		c, err := parseCPUList(status(name).CPUSet)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	numaOfCPU := func(c int) int { return (c % (m.numa * m.coresPerNuma)) / m.coresPerNuma }
	coreOf := func(c int) int { return c % (m.numa * m.coresPerNuma) }
	sameNuma := func(what string, cpus []int) int {
		n := numaOfCPU(cpus[0])
		for _, c := range cpus {
			if numaOfCPU(c) != n {
				t.Errorf("%s: cpus %v span NUMA nodes", what, cpus)
			}
		}
		return n
	}

	// Whole GPUs, minors by topology: 4 cards on one NUMA node, 2 cards on one PCIe switch.
	w4 := minorsOf(devs("whole-4"), "gpu")
	if len(w4) != 4 || m.gpuNuma(w4[0]) != m.gpuNuma(w4[3]) {
		t.Errorf("whole-4: minors %v, want 4 on one NUMA node", w4)
	}
	w2 := minorsOf(devs("whole-2"), "gpu")
	if len(w2) != 2 || m.gpuPCIe(w2[0]) != m.gpuPCIe(w2[1]) {
		t.Errorf("whole-2: minors %v, want 2 under one PCIe switch", w2)
	}
	for _, e := range devs("whole-4")["gpu"] {
		if quantity(e.Resources["koordinator.sh/gpu-core"]) != 100 || quantity(e.Resources["koordinator.sh/gpu-memory-ratio"]) != 100 {
			t.Errorf("whole-4: minor %d holds %v, want the whole card", e.Minor, e.Resources)
		}
	}
	// Shares.
	if g := devs("ratio-50")["gpu"]; len(g) != 1 || quantity(g[0].Resources["koordinator.sh/gpu-memory-ratio"]) != 50 {
		t.Errorf("ratio-50: %v", g)
	}
	if g := devs("bytes-20gi")["gpu"]; len(g) != 1 || quantity(g[0].Resources["koordinator.sh/gpu-memory"]) != 20<<30 {
		t.Errorf("bytes-20gi: %v", g)
	}
	if g := devs("core-mem")["gpu"]; len(g) != 1 || quantity(g[0].Resources["koordinator.sh/gpu-core"]) != 50 {
		t.Errorf("core-mem: %v", g)
	}
	if g := devs("multi-shared")["gpu"]; len(g) != 2 || g[0].Minor == g[1].Minor ||
		quantity(g[0].Resources["koordinator.sh/gpu-memory-ratio"]) != 50 || quantity(g[1].Resources["koordinator.sh/gpu-memory-ratio"]) != 50 {
		t.Errorf("multi-shared (gpu.shared 2, ratio 100): %v, want 50 on each of two cards", g)
	}
	// GPU + RDMA under the same PCIe switch.
	gr := devs("gpu-rdma")
	if len(gr["gpu"]) != 1 || len(gr["rdma"]) != 1 || m.gpuPCIe(gr["gpu"][0].Minor) != gr["rdma"][0].Minor {
		t.Errorf("gpu-rdma: %v, want the GPU and the NIC on one PCIe switch", gr)
	}
	// cpusets: FullPCPUs takes both threads of whole cores, SpreadByPCPUs one thread per core.
	full := cpus("lsr-full")
	if len(full) != 4 {
		t.Errorf("lsr-full: cpuset %v, want 4 CPUs", full)
	} else {
		cores := map[int]int{}
		for _, c := range full {
			cores[coreOf(c)]++
		}
		for core, n := range cores {
			if n != 2 {
				t.Errorf("lsr-full: cpuset %v uses core %d with %d thread(s), want whole cores", full, core, n)
			}
		}
		sameNuma("lsr-full", full)
	}
	spread := cpus("lsr-spread")
	cores := map[int]bool{}
	for _, c := range spread {
		cores[coreOf(c)] = true
	}
	if len(spread) != 4 || len(cores) != 4 {
		t.Errorf("lsr-spread: cpuset %v, want 4 CPUs on 4 distinct cores", spread)
	}
	if lse := cpus("lse-full"); len(lse) != 6 {
		t.Errorf("lse-full: cpuset %v, want 6 CPUs", lse)
	}
	// NUMA policy without a cpuset: the CPU share sits on exactly one NUMA node.
	if rs := status("ls-single-numa"); rs.CPUSet != "" || len(rs.NUMANodeResources) != 1 {
		t.Errorf("ls-single-numa: %+v, want one NUMA node and no cpuset", rs)
	}
	// GPU + cpuset, SingleNUMANode: the CPUs sit on the GPU's NUMA node.
	aligned := cpus("gpu-cpuset-aligned")
	g := devs("gpu-cpuset-aligned")["gpu"]
	if len(aligned) != 4 || len(g) != 1 {
		t.Errorf("gpu-cpuset-aligned: cpus %v gpus %v", aligned, g)
	} else if n := sameNuma("gpu-cpuset-aligned", aligned); n != m.gpuNuma(g[0].Minor) {
		t.Errorf("gpu-cpuset-aligned: cpus %v on NUMA %d, GPU %d on NUMA %d", aligned, n, g[0].Minor, m.gpuNuma(g[0].Minor))
	}
	t.Logf("placements: %s", describe(bound))
}

// describe prints each pod's node and allocation annotations, for the test log.
func describe(bound map[string]*corev1.Pod) string {
	var names []string
	for n := range bound {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		p := bound[n]
		fmt.Fprintf(&b, "\n  %s -> %s %s %s", n, p.Spec.NodeName, p.Annotations[annDeviceAllocated], p.Annotations[annResourceStatus])
	}
	return b.String()
}
