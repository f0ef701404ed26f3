package e2e

// The readiness gate against a real scheduler: the extender starts before one of its CRDs
// exists (NodeResourceTopology; the chart's requireKinds names both kinds), kube-scheduler calls
// it meanwhile with pods already waiting, and no pod binds while /readyz says 503. Then the CRD
// and the NRTs appear, the extender finds them by rediscovery, and the pods that fit bind, each
// with its GPUs, with no over-allocation. (The Devices exist from the start: a node without a
// Device object is left to the kubelet's device plugins by design, so a Device arriving after
// readiness would race the binds.)

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

const requireBothKinds = `{"extender":{"requireKinds":["devices","noderesourcetopologies"]}}`

func TestReadinessGateHoldsARealSchedulerUntilTheCRDsAreSynced(t *testing.T) {
	nrtCRD := "topology.node.k8s.io_"
	cp := startControlPlane(t, planOptions{lateCRDs: []string{nrtCRD}, chartValues: requireBothKinds})
	m := gpuMachine
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("gpu-%d", i)
		if _, err := cp.admin.CoreV1().Nodes().Create(cp.ctx, m.node(name), metav1CreateOptions); err != nil {
			t.Fatal(err)
		}
		if _, err := cp.dyn.Resource(deviceGVR).Create(cp.ctx, m.device(name, nil), metav1CreateOptions); err != nil {
			t.Fatal(err)
		}
	}
	// Fast rediscovery so the test does not wait out the 30 s default for the late CRD.
	ext := cp.startExtender("", "--rediscover-interval=2s")
	cp.startScheduler(ext.urlPrefix())
	var names []string
	for i := 0; i < 24; i++ {
		name := fmt.Sprintf("early-%02d", i)
		names = append(names, name)
		cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}})
	}

	// Watch the gate: a pod seen bound, then /readyz seen not 200, means the extender bound
	// while it said it was not ready (readiness never goes back once the caches are synced).
	stop := make(chan struct{})
	violations := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				close(violations)
				return
			default:
			}
			// Not boundPods: t.Fatal belongs to the test's goroutine, so errors come back
			// through the channel.
			pods, err := cp.listBoundPods()
			if err != nil {
				violations <- fmt.Sprintf("cannot list pods: %v", err)
				close(violations)
				return
			}
			bound := len(pods)
			if code := ext.readyz(); bound > 0 && code != http.StatusOK {
				violations <- fmt.Sprintf("%d pods bound while /readyz answered %d", bound, code)
				close(violations)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	// Until the CRDs exist the scheduler's attempts fail with the extender's not-ready error.
	cp.waitEvent(names[0], "not ready")
	if code := ext.readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz answered %d with the CRDs missing, want 503", code)
	}
	if n := len(cp.boundPods()); n != 0 {
		t.Fatalf("%d pods bound before the extender was ready", n)
	}

	cp.installCRDs(func(file string) bool { return strings.Contains(file, nrtCRD) })
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("gpu-%d", i)
		if _, err := cp.dyn.Resource(nrtGVR).Create(cp.ctx, m.nrt(name), metav1CreateOptions); err != nil {
			t.Fatal(err)
		}
	}
	ext.waitReady()
	// 16 GPUs for 24 one-GPU pods: 16 bind, 8 stay pending (in-tree Insufficient nvidia.com/gpu).
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		return len(cp.boundPods()) == 16, nil
	})
	if err != nil {
		t.Fatalf("%d pods bound after the extender became ready, want 16", len(cp.boundPods()))
	}
	close(stop)
	for v := range violations {
		t.Fatal(v)
	}
	cp.assertNoViolations()
}
