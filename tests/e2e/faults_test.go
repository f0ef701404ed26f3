package e2e

// Faults of the real control plane, one after another on one cluster: the extender SIGKILLed
// while binds are in flight, etcd compacted and kube-apiserver restarted on the same etcd (every
// watch resumes from a compacted revision and relists), kube-scheduler restarted. After each:
// no over-allocation on the API server and every pod bound. At the end a capacity probe: as
// many more pods as the GPUs have room for, and three times that. Exactly the room binds, which
// holds only if the restarted extender's ledger equals the pods on the API server (a forgotten
// holder over-allocates, a leaked one strands capacity).

import (
	"fmt"
	"testing"
)

func TestFaultsLeaveTheLedgerEqualToThePods(t *testing.T) {
	cp, ext := start(t, planOptions{})
	m := gpuMachine
	cp.addNodes("gpu", 2, m)
	ext.waitReady()
	quarter := map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "25"}
	wave := func(prefix string, n int) []string {
		var names []string
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("%s-%02d", prefix, i)
			cp.createPod(podSpec{name: name, limits: quarter})
			names = append(names, name)
		}
		return names
	}
	all := wave("a", 8)
	cp.waitBound(all...)
	cp.assertNoViolations()

	// 1. SIGKILL with binds in flight, then a restart on the same address.
	b := wave("b", 8)
	all = append(all, b...)
	ext.kill()
	ext = cp.startExtender(ext.listen)
	ext.waitReady()
	cp.waitBound(all...)
	cp.assertNoViolations()

	// 2. etcd compacted, kube-apiserver restarted on it: watches resume from compacted
	// revisions and must relist.
	c := wave("c", 8)
	all = append(all, c...)
	cp.compactEtcd()
	cp.stopAPIServer()
	cp.startAPIServer()
	cp.waitBound(all...)
	cp.assertNoViolations()

	// 3. kube-scheduler restarted: pods created while it is down wait for the new one.
	cp.stopScheduler()
	d := wave("d", 8)
	all = append(all, d...)
	cp.startScheduler(ext.urlPrefix())
	cp.waitBound(all...)
	cp.assertNoViolations()

	// Capacity probe: 2 nodes x 8 GPUs x 4 quarters = 64, 32 held.
	room := 2*m.gpus*4 - len(all)
	probe := wave("z", 3*room)
	bound := cp.waitQuiet(append(all, probe...), len(all)+room)
	if len(bound) != len(all)+room {
		t.Fatalf("%d pods bound after the faults, want %d (the %d held + %d of room)", len(bound), len(all)+room, len(all), room)
	}
	cp.assertNoViolations()
	t.Logf("relists seen by the extender: %s", metricLines(ext.metrics(), "relist"))
}
