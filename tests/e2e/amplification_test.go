package e2e

// Issue 38 §3: koordinator's CPU amplification ratio reaches NUMA placement through the real
// watches. koord-manager amplifies a Node's allocatable CPU by
// node.koordinator.sh/resource-amplification-ratio; koordinator amplifies each NUMA node by the
// same ratio and counts the CPUs cpusets hold there at their amplified size. The oracle
// (assertNoViolations) reads the ratio from the Node and holds every NUMA node to its amplified
// zone, the cpusets to their physical CPUs.

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Two NUMA nodes of 32 CPUs, amplified 1.5×: 48 each. A 16-CPU cpuset on one of them counts
// 24 there; a NUMA-bound pod without a cpuset asking 40 CPUs, more than any NUMA node has
// physically, fits only on the other one as amplified; a third asking 30 then fits nowhere
// (24 and 8 left).
func TestAnAmplifiedNUMANodeHoldsWhatItsRatioSays(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: routeAllPods})
	m := cpuMachine
	node := m.node("amp-0")
	node.Annotations = map[string]string{"node.koordinator.sh/resource-amplification-ratio": `{"cpu":1.5}`}
	amplified := resource.MustParse(fmt.Sprint(m.cpus() * 3 / 2))
	node.Status.Capacity[corev1.ResourceCPU] = amplified
	node.Status.Allocatable[corev1.ResourceCPU] = amplified
	ctx := context.Background()
	if _, err := cp.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.dyn.Resource(nrtGVR).Create(ctx, m.nrt("amp-0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Started after the Node exists: its first list carries the ratio.
	ext := cp.startExtender("")
	cp.startScheduler(ext.urlPrefix())
	ext.waitReady()

	single := map[string]string{"scheduling.koordinator.sh/numa-topology-spec": `{"numaTopologyPolicy":"SingleNUMANode"}`}
	cp.createPod(podSpec{name: "lsr-16", labels: map[string]string{"koordinator.sh/qosClass": "LSR"},
		limits: map[string]string{"cpu": "16", "memory": "4Gi"}, annots: single})
	held := cp.waitBound("lsr-16")["lsr-16"]
	cp.createPod(podSpec{name: "ls-40", limits: map[string]string{"cpu": "40", "memory": "4Gi"}, annots: single})
	shared := cp.waitBound("ls-40")["ls-40"]

	status := func(p *corev1.Pod) *resourceStatus {
		rs, err := parseResourceStatus(p)
		if err != nil || rs == nil {
			t.Fatalf("%s: resource-status %v (annotations %v)", p.Name, err, p.Annotations)
		}
		return rs
	}
	h, s := status(held), status(shared)
	if len(h.NUMANodeResources) != 1 || len(s.NUMANodeResources) != 1 || s.CPUSet != "" {
		t.Fatalf("lsr-16 %+v, ls-40 %+v: want one NUMA node each, and no cpuset for ls-40", h, s)
	}
	if h.NUMANodeResources[0].Node == s.NUMANodeResources[0].Node {
		t.Errorf("ls-40 shares NUMA node %d with lsr-16's cpuset: 24 + 40 > 48", h.NUMANodeResources[0].Node)
	}
	if q := quantity(s.NUMANodeResources[0].Resources["cpu"]); q != 40 {
		t.Errorf("ls-40's NUMA share: %d CPUs, want 40 (more than the NUMA node's 32: amplified)", q)
	}
	cpus, err := parseCPUList(h.CPUSet)
	if err != nil || len(cpus) != 16 {
		t.Fatalf("lsr-16's cpuset %q: %v", h.CPUSet, err)
	}

	// 24 left beside the cpuset, 8 beside ls-40: 30 fits nowhere, for NUMA placement's reason.
	cp.createPod(podSpec{name: "ls-30", limits: map[string]string{"cpu": "30", "memory": "4Gi"}, annots: single})
	t.Logf("ls-30: %s", cp.waitEvent("ls-30", "cpu"))
	cp.assertNoViolations()
}
