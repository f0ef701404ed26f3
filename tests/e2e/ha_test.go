package e2e

// The chart's HA shape, standalone mode: two extender replicas with --leader-elect (the chart's
// args for mode=standalone, replicas=2) behind one address that routes by readiness, as the
// chart's Service does (a standby answers /readyz 503 in standalone mode). Only the leader
// binds; SIGKILLing it mid-run hands over to the standby with no double allocation, and the
// capacity probe afterwards shows the new leader's ledger equals the pods.

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// readinessService forwards each request to a replica that answers /readyz 200, like a
// Service whose endpoints are the ready pods; with none ready it answers 503 like a Service
// without endpoints would refuse.
type readinessService struct {
	mu       sync.Mutex
	replicas []*extenderProc
	server   *http.Server
	addr     string
}

func newReadinessService(t *testing.T, replicas ...*extenderProc) *readinessService {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &readinessService{replicas: replicas, addr: ln.Addr().String()}
	s.server = &http.Server{Handler: http.HandlerFunc(s.serve)}
	go func() { _ = s.server.Serve(ln) }()
	t.Cleanup(func() { s.server.Close() })
	return s
}

func (s *readinessService) setReplicas(replicas ...*extenderProc) {
	s.mu.Lock()
	s.replicas = replicas
	s.mu.Unlock()
}

func (s *readinessService) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	replicas := append([]*extenderProc(nil), s.replicas...)
	s.mu.Unlock()
	for _, e := range replicas {
		if e.readyzPlain() == http.StatusOK {
			target, _ := url.Parse(e.urlPrefix())
			httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, r)
			return
		}
	}
	http.Error(w, "no ready endpoints", http.StatusServiceUnavailable)
}

// binds is the extender's count of successful binds from its own metrics.
func (e *extenderProc) binds() string {
	return metricLines(e.metrics(), `dne_binds_total{outcome="bound"}`)
}

func TestStandaloneLeaderElectionHandsOverWithoutDoubleAllocation(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: `{"mode":"standalone","replicas":2}`})
	if !strings.Contains(strings.Join(cp.chart.ExtenderArgs, " "), "--leader-elect") {
		t.Fatalf("the standalone chart with 2 replicas does not elect a leader: %v", cp.chart.ExtenderArgs)
	}
	schedulerChart, err := loadRenderedChart("")
	if err != nil {
		t.Fatal(err)
	}
	m := gpuMachine
	cp.addNodes("gpu", 2, m)
	a := cp.startExtenderAs("replica-a", "")
	b := cp.startExtenderAs("replica-b", "")
	svc := newReadinessService(t, a, b)
	cp.startSchedulerWithConfig(schedulerChart, "http://"+svc.addr, nil)

	quarter := map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "25"}
	wave := func(prefix string, n int) []string {
		var names []string
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("%s-%02d", prefix, i)
			cp.createPod(podSpec{name: name, limits: quarter, scheduler: schedulerName(schedulerChart)})
			names = append(names, name)
		}
		return names
	}
	all := wave("a", 16)
	cp.waitBound(all...)
	cp.assertNoViolations()
	leader, standby := a, b
	if a.readyzPlain() != http.StatusOK {
		leader, standby = b, a
	}
	if standby.readyzPlain() == http.StatusOK {
		t.Fatal("both replicas answer /readyz 200 in standalone mode")
	}
	if got := standby.binds(); got != "" && !strings.HasSuffix(got, " 0") {
		t.Fatalf("the standby bound pods: %s", got)
	}
	t.Logf("leader binds: %s", leader.binds())

	// Kill the leader with binds in flight; the standby takes the Lease after it expires.
	more := wave("b", 16)
	all = append(all, more...)
	leader.kill()
	svc.setReplicas(standby)
	cp.waitBound(all...)
	cp.assertNoViolations()
	t.Logf("after the handover, new leader binds: %s", standby.binds())

	// Capacity probe: 2 nodes x 8 GPUs x 4 quarters = 64, 32 held.
	room := 2*m.gpus*4 - len(all)
	probe := wave("z", 3*room)
	bound := cp.waitQuiet(append(all, probe...), len(all)+room)
	if len(bound) != len(all)+room {
		t.Fatalf("%d pods bound after the handover, want %d", len(bound), len(all)+room)
	}
	cp.assertNoViolations()
}
