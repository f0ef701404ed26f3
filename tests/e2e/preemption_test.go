package e2e

// Preemption through the extender's `preempt` verb: a node full of low-priority holders, then a
// high-priority pod. kube-scheduler's default preemption proposes victims, the extender keeps
// the nodes where those victims free what the pod needs (whole GPUs, a cpuset on one NUMA
// node), the scheduler deletes them, and the test plays the kubelet that finishes the
// deletions. No share is ever held twice: the oracle counts a terminating victim as a holder
// until it is gone, and is run while the victims terminate.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

func (cp *controlPlane) priorityClass(name string, value int32) {
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
	if _, err := cp.admin.SchedulingV1().PriorityClasses().Create(cp.ctx, pc, metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
	// The Priority admission plugin resolves the class from an informer: a pod created right
	// after the class can be refused ("no PriorityClass with name ... was found"; seen once in
	// CI). Wait, as an ordering, until a dry-run pod naming the class is admitted.
	probe := newPod(podSpec{name: "priority-probe-" + name, scheduler: "none", priority: name})
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	err := wait.PollUntilContextTimeout(cp.ctx, 50*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		_, err := cp.admin.CoreV1().Pods(testNamespace).Create(ctx, probe, dryRun)
		return err == nil, nil
	})
	if err != nil {
		cp.t.Fatalf("PriorityClass %s never admitted a pod: %v", name, err)
	}
}

// playKubelet finishes the deletion of every terminating pod (grace 0), checking the oracle
// before each, until done() holds.
func (cp *controlPlane) playKubeletUntil(m machine, done func() bool) (victims []string) {
	cp.t.Helper()
	err := wait.PollUntilContextTimeout(cp.ctx, 100*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		cp.assertNoViolations()
		pods, err := cp.admin.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				victims = append(victims, p.Name)
				cp.deletePodNow(p.Name)
			}
		}
		return done(), nil
	})
	if err != nil {
		cp.t.Fatalf("preemption never completed; victims so far %v", victims)
	}
	return victims
}

func TestPreemptionThroughTheExtender(t *testing.T) {
	cp, ext := start(t, planOptions{chartValues: routeAllPods})
	m := gpuMachine
	cp.addNodes("gpu", 1, m)
	ext.waitReady()
	cp.priorityClass("low", 100)
	cp.priorityClass("high", 1000)

	// Whole GPUs: eight 1-GPU holders fill the node.
	var low []string
	for i := 0; i < m.gpus; i++ {
		name := fmt.Sprintf("low-gpu-%d", i)
		low = append(low, name)
		cp.createPod(podSpec{name: name, priority: "low", limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}})
	}
	held := cp.waitBound(low...)
	minorOf := map[string]int{}
	for name, p := range held {
		d, err := parseDeviceAllocated(p)
		if err != nil || len(d["gpu"]) != 1 {
			t.Fatalf("%s: %v %v", name, d, err)
		}
		minorOf[name] = d["gpu"][0].Minor
	}
	cp.createPod(podSpec{name: "high-gpu", priority: "high", limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}})
	victims := cp.playKubeletUntil(m, func() bool { return cp.getPod("high-gpu").Spec.NodeName != "" })
	if len(victims) != 1 {
		t.Fatalf("victims %v, want exactly one 1-GPU holder", victims)
	}
	hp := cp.getPod("high-gpu")
	d, err := parseDeviceAllocated(hp)
	if err != nil || len(d["gpu"]) != 1 || d["gpu"][0].Minor != minorOf[victims[0]] {
		t.Fatalf("high-gpu holds %v, want the victim %s's GPU %d", d, victims[0], minorOf[victims[0]])
	}
	cp.assertNoViolations()

	// cpusets: LSR holders of 8 CPUs (4 whole cores) fill the 64 CPUs; a high-priority LSR pod
	// needs one victim's whole cores.
	for _, name := range append(low, "high-gpu") {
		cp.deletePodNow(name)
	}
	lsr := map[string]string{"koordinator.sh/qosClass": "LSR"}
	var holders []string
	for i := 0; i < m.cpus()/8; i++ {
		name := fmt.Sprintf("low-cpuset-%d", i)
		holders = append(holders, name)
		cp.createPod(podSpec{name: name, priority: "low", labels: lsr, limits: map[string]string{"cpu": "8", "memory": "1Gi"}})
	}
	cp.waitBound(holders...)
	cp.createPod(podSpec{name: "high-cpuset", priority: "high", labels: lsr, limits: map[string]string{"cpu": "8", "memory": "1Gi"}})
	victims = cp.playKubeletUntil(m, func() bool { return cp.getPod("high-cpuset").Spec.NodeName != "" })
	if len(victims) != 1 {
		t.Fatalf("victims %v, want exactly one 8-CPU holder", victims)
	}
	rs, err := parseResourceStatus(cp.getPod("high-cpuset"))
	if err != nil || rs == nil {
		t.Fatalf("high-cpuset: resource-status %v %v", rs, err)
	}
	cpus, _ := parseCPUList(rs.CPUSet)
	if len(cpus) != 8 {
		t.Fatalf("high-cpuset: cpuset %q, want 8 CPUs", rs.CPUSet)
	}
	cp.assertNoViolations()
}

// shareTotals is the chart with extender.gpuShareTotals=extender: the extender's leader writes
// each node's GPU share totals, and the scheduler counts them.
const shareTotals = `{"extender":{"gpuShareTotals":"extender"}}`

// waitAllocatable waits until the node advertises `value` of `name` in status.allocatable and
// status.capacity.
func (cp *controlPlane) waitAllocatable(node, name, value string) {
	cp.t.Helper()
	want := resource.MustParse(value)
	err := wait.PollUntilContextTimeout(cp.ctx, 100*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		n, err := cp.admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		a, okA := n.Status.Allocatable[corev1.ResourceName(name)]
		c, okC := n.Status.Capacity[corev1.ResourceName(name)]
		return okA && okC && a.Cmp(want) == 0 && c.Cmp(want) == 0, nil
	})
	if err != nil {
		cp.t.Fatalf("node %s never advertised %s=%s", node, name, value)
	}
}

// Issue 38 §1: a pod asking for half a GPU preempts through the stock scheduler once the node
// advertises its GPU share totals. Every card is held by two low-priority half-card pods; the
// scheduler counts the totals (all used), proposes the fewest lowest-priority victims that make
// room by totals (one half-card pod), the extender's preempt keeps the node because that victim
// frees half of one card, and the pod binds to that card.
func TestSharePodsPreemptThroughTheExtender(t *testing.T) {
	cp, ext := start(t, planOptions{chartValues: shareTotals})
	m := gpuMachine
	cp.addNodes("gpu", 1, m)
	ext.waitReady()
	cp.waitAllocatable("gpu-0", "koordinator.sh/gpu-core", fmt.Sprint(100*m.gpus))
	cp.waitAllocatable("gpu-0", "koordinator.sh/gpu-memory-ratio", fmt.Sprint(100*m.gpus))
	cp.waitAllocatable("gpu-0", "koordinator.sh/gpu-memory", fmt.Sprintf("%dGi", m.gpuMemoryGi*m.gpus))
	cp.priorityClass("low", 100)
	cp.priorityClass("high", 1000)
	half := map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
	var low []string
	for i := 0; i < 2*m.gpus; i++ {
		name := fmt.Sprintf("low-half-%d", i)
		low = append(low, name)
		cp.createPod(podSpec{name: name, priority: "low", limits: half})
	}
	held := cp.waitBound(low...)
	minorOf := map[string]int{}
	perCard := map[int]int{}
	for name, p := range held {
		d, err := parseDeviceAllocated(p)
		if err != nil || len(d["gpu"]) != 1 {
			t.Fatalf("%s: %v %v", name, d, err)
		}
		minorOf[name] = d["gpu"][0].Minor
		perCard[d["gpu"][0].Minor]++
	}
	for minor := 0; minor < m.gpus; minor++ {
		if perCard[minor] != 2 {
			t.Fatalf("card %d holds %d half-card pods, want every card full: %v", minor, perCard[minor], perCard)
		}
	}
	cp.assertNoViolations()

	cp.createPod(podSpec{name: "high-half", priority: "high", limits: half})
	victims := cp.playKubeletUntil(m, func() bool { return cp.getPod("high-half").Spec.NodeName != "" })
	if len(victims) != 1 {
		t.Fatalf("victims %v, want exactly one half-card holder", victims)
	}
	d, err := parseDeviceAllocated(cp.getPod("high-half"))
	if err != nil || len(d["gpu"]) != 1 || d["gpu"][0].Minor != minorOf[victims[0]] {
		t.Fatalf("high-half holds %v, want the victim %s's GPU %d", d, victims[0], minorOf[victims[0]])
	}
	cp.assertNoViolations()
}

// holdShare creates a pod already bound to `node` that holds `share` hundredths of GPU `minor`
// (the annotation koordinator's scheduler would have written), at `priority`.
func (cp *controlPlane) holdShare(name, node, priority string, minor, share int) {
	cp.t.Helper()
	s := fmt.Sprint(share)
	p := cp.pod(podSpec{name: name, priority: priority, limits: map[string]string{
		"cpu": "100m", "memory": "128Mi", "koordinator.sh/gpu-core": s, "koordinator.sh/gpu-memory-ratio": s}})
	p.Spec.NodeName = node
	p.Annotations = map[string]string{"scheduling.koordinator.sh/device-allocated": fmt.Sprintf(
		`{"gpu":[{"minor":%d,"resources":{"koordinator.sh/gpu-core":"%s","koordinator.sh/gpu-memory-ratio":"%s"}}]}`, minor, s, s)}
	if _, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, p, metav1.CreateOptions{}); err != nil {
		cp.t.Fatalf("pod %s: %v", name, err)
	}
}

// Issue 38 §2: kube-scheduler picks victims by node totals, here two pods on two cards whose
// removal frees 40 on each and 50 on neither. The extender's preempt answers the fewest pods
// that free half a card instead (one 60 holder), which kube-scheduler evicts as they are; the
// pod binds to that card.
func TestSharePreemptionVictimsFreeOneCard(t *testing.T) {
	cp, ext := start(t, planOptions{chartValues: shareTotals})
	m := machine{numa: 1, coresPerNuma: 16, gpus: 2, gpuMemoryGi: 80}
	cp.addNodes("gpu", 1, m)
	ext.waitReady()
	cp.waitAllocatable("gpu-0", "koordinator.sh/gpu-core", "200")
	cp.priorityClass("low", 100)
	cp.priorityClass("mid", 200)
	cp.priorityClass("high", 1000)
	// Card 0: 30 + 30 (mid) + 40 (low); card 1: 60 (mid) + 40 (low). kube-scheduler reprieves
	// the mid pods first, so its victims are the two low 40s, one per card.
	cp.holdShare("a30", "gpu-0", "mid", 0, 30)
	cp.holdShare("b30", "gpu-0", "mid", 0, 30)
	cp.holdShare("c40", "gpu-0", "low", 0, 40)
	cp.holdShare("d60", "gpu-0", "mid", 1, 60)
	cp.holdShare("e40", "gpu-0", "low", 1, 40)
	// Every holder is in the extender's cache (an ordering point: a half-card pod fits nowhere).
	ext.waitCachedPods(5)
	cp.assertNoViolations()

	half := map[string]string{"cpu": "100m", "memory": "128Mi", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
	cp.createPod(podSpec{name: "high-half", priority: "high", limits: half})
	victims := cp.playKubeletUntil(m, func() bool { return cp.getPod("high-half").Spec.NodeName != "" })
	if len(victims) != 1 || victims[0] != "d60" {
		t.Fatalf("victims %v, want exactly d60 (the one pod whose removal frees half of one card)", victims)
	}
	d, err := parseDeviceAllocated(cp.getPod("high-half"))
	if err != nil || len(d["gpu"]) != 1 || d["gpu"][0].Minor != 1 {
		t.Fatalf("high-half holds %v, want GPU 1 (the victim's)", d)
	}
	for _, name := range []string{"a30", "b30", "c40", "e40"} {
		if p := cp.getPod(name); p.DeletionTimestamp != nil {
			t.Fatalf("%s is being deleted; only d60 should be", name)
		}
	}
	cp.assertNoViolations()
}

// waitCachedPods waits until the extender's pod cache holds n pods.
func (e *extenderProc) waitCachedPods(n int) {
	want := fmt.Sprintf(`dne_cached_objects{kind="pods"} %d`, n)
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		return strings.Contains(e.metrics(), want), nil
	})
	if err != nil {
		e.cp.t.Fatalf("the extender never cached %d pods: %s", n, metricLines(e.metrics(), "dne_cached_objects"))
	}
}
