package e2e

// Saturation and liveness: three times more GPU pods than GPUs; exactly capacity binds, the rest
// stay Pending with the extender's reason in their FailedScheduling events, and each way capacity
// returns (a holder deleted, a GPU turning healthy, a Device growing) lets a pending pod bind.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
)

// extenderGPUReason is the extender's filter reason for a node without a fitting GPU, as the
// scheduler copies it into the FailedScheduling event.
const extenderGPUReason = "insufficient gpu"

func TestSaturationAndLiveness(t *testing.T) {
	// Most of this test waits for the scheduler's unschedulable-pod flush (a Device change is
	// no event kube-scheduler watches): let the other scenarios run meanwhile.
	t.Parallel()
	cp, ext := start(t, planOptions{})
	m := gpuMachine
	// gpu-0: 8 healthy GPUs. gpu-1: minor 7 unhealthy. gpu-2: a Device listing only 4 GPUs.
	cp.addNodes("gpu", 1, m)
	cp.createNode("gpu-1", m, func(minor int) bool { return minor != 7 }, m.gpus)
	cp.createNode("gpu-2", m, nil, 4)
	ext.waitReady()
	capacity := 8 + 7 + 4

	var names []string
	for i := 0; i < 3*capacity; i++ {
		name := fmt.Sprintf("sat-%02d", i)
		names = append(names, name)
		cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "100"}})
	}
	bound := cp.waitQuiet(names, capacity)
	if len(bound) != capacity {
		t.Fatalf("%d pods bound, capacity %d", len(bound), capacity)
	}
	cp.assertNoViolations()

	// A holder deleted: the deletion is a cluster event, so a pending pod is retried at once.
	victim := bound[0]
	before := time.Now()
	cp.deletePodNow(victim.Name)
	took := cp.waitBoundCount(capacity, victim.Name)
	t.Logf("capacity returns -> pending pod bound: pod deleted: %v", took.Sub(before))
	cp.assertNoViolations()

	// A GPU turns healthy (gpu-1 minor 7) and a Device grows (gpu-2 to 8 GPUs), at once: each
	// adds capacity only on its node, so the node a pod lands on says which return it was.
	before = time.Now()
	cp.updateDevice("gpu-1", m.device("gpu-1", nil))
	cp.updateDevice("gpu-2", m.device("gpu-2", nil))
	landed := map[string]time.Duration{}
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, 8*time.Minute, true, func(context.Context) (bool, error) {
		counts := map[string]int{}
		for _, p := range cp.boundPods() {
			counts[p.Spec.NodeName]++
		}
		if _, seen := landed["gpu-1"]; !seen && counts["gpu-1"] == 8 {
			landed["gpu-1"] = time.Since(before)
		}
		if _, seen := landed["gpu-2"]; !seen && counts["gpu-2"] > 4 {
			landed["gpu-2"] = time.Since(before)
		}
		return counts["gpu-1"] == 8 && counts["gpu-2"] == 8, nil
	})
	if err != nil {
		t.Fatalf("capacity from a healthy GPU / a grown Device never used: %v (landed %v)", err, landed)
	}
	t.Logf("capacity returns -> pending pod bound: GPU turned healthy: %v; Device grown: %v (first pod); "+
		"kube-scheduler retries an extender-rejected pod only on a cluster event it watches or after "+
		"podMaxInUnschedulablePodsDuration (5m), and a Device change is neither", landed["gpu-1"], landed["gpu-2"])
	cp.assertNoViolations()
	if got := len(cp.boundPods()); got != 8+8+8 {
		t.Fatalf("%d pods bound after capacity returned, want 24", got)
	}
}

// createNode creates a node of machine m whose Device lists only the first `gpus` GPUs, with
// health per minor.
func (cp *controlPlane) createNode(name string, m machine, healthy func(int) bool, gpus int) {
	ctx := context.Background()
	if _, err := cp.admin.CoreV1().Nodes().Create(ctx, m.node(name), metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
	dev := m.device(name, healthy)
	devices, _, _ := unstructured.NestedSlice(dev.Object, "spec", "devices")
	var kept []any
	for _, d := range devices {
		dm := d.(map[string]any)
		if dm["type"] == "gpu" && dm["minor"].(int64) >= int64(gpus) {
			continue
		}
		kept = append(kept, d)
	}
	_ = unstructured.SetNestedSlice(dev.Object, kept, "spec", "devices")
	if _, err := cp.dyn.Resource(deviceGVR).Create(ctx, dev, metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
	if _, err := cp.dyn.Resource(nrtGVR).Create(ctx, m.nrt(name), metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
}

// updateDevice replaces a Device's spec, as koordlet does when health or inventory changes.
func (cp *controlPlane) updateDevice(name string, want *unstructured.Unstructured) {
	ctx := context.Background()
	cur, err := cp.dyn.Resource(deviceGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	cur.Object["spec"] = want.Object["spec"]
	if _, err := cp.dyn.Resource(deviceGVR).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
}

// waitQuiet waits until `want` pods are bound and every other pod has a FailedScheduling event
// carrying the extender's reason: from then on nothing is in flight.
func (cp *controlPlane) waitQuiet(names []string, want int) []podRef {
	cp.t.Helper()
	var bound []podRef
	err := wait.PollUntilContextTimeout(cp.ctx, 500*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		bound = nil
		pending := map[string]bool{}
		for _, n := range names {
			pending[n] = true
		}
		for _, p := range cp.boundPods() {
			bound = append(bound, podRef{Name: p.Name, Node: p.Spec.NodeName})
			delete(pending, p.Name)
		}
		if len(bound) < want {
			return false, nil
		}
		for n := range pending {
			rejected := false
			for _, msg := range cp.schedulingEvents(n) {
				if strings.Contains(msg, extenderGPUReason) {
					rejected = true
				}
			}
			if !rejected {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		cp.t.Fatalf("never quiet: %d bound (want %d); events of %s: %v", len(bound), want, names[len(names)-1], cp.schedulingEvents(names[len(names)-1]))
	}
	return bound
}

type podRef struct{ Name, Node string }

// waitBoundCount waits until `want` pods other than `except` are bound; returns when.
func (cp *controlPlane) waitBoundCount(want int, except string) time.Time {
	var at time.Time
	err := wait.PollUntilContextTimeout(cp.ctx, 50*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		n := 0
		for _, p := range cp.boundPods() {
			if p.Name != except {
				n++
			}
		}
		at = time.Now()
		return n >= want, nil
	})
	if err != nil {
		cp.t.Fatalf("never %d pods bound again", want)
	}
	return at
}
