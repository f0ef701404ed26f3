package e2e

// Prompt requeue against the real kube-scheduler (issue 25): pods the extender rejected because
// every GPU was sick wait in kube-scheduler's unschedulable pool; the GPUs turn healthy (a Device
// update, which kube-scheduler does not watch); the extender's one Node annotation makes
// kube-scheduler retry them all.
//
// What makes this test fail without the signal: kube-scheduler's own retry of those pods comes
// only after podMaxInUnschedulablePodsDuration (5 minutes), past the 3-minute hang guard of
// waitBound; and the extender's metrics must show the write. DNE_E2E_REQUEUE_PODS sets the number
// of waiting pods (default 40; BENCHMARKS.md's figure uses 1000); DNE_E2E_REQUEUE_BEFORE=1 also
// runs the same scenario with --requeue=false, waiting up to 8 minutes, for the "before" figure.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

const requeueAnnotation = "device-numa-extender.io/capacity-returned"

func TestPodsRejectedForSickGPUsBindPromptlyWhenTheGPUsHeal(t *testing.T) {
	pods := 40
	if v := os.Getenv("DNE_E2E_REQUEUE_PODS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("DNE_E2E_REQUEUE_PODS=%q: want a positive number", v)
		}
		pods = n
	}
	took, writes := healScenario(t, pods, true, hangGuard)
	t.Logf("GPU healthy -> %d pending pods bound: %v (last pod); requeue signals written: %d (%.2f per 1,000 pending pods)",
		pods, took, writes, float64(writes)*1000/float64(pods))
	if writes < 1 {
		t.Fatalf("the pods bound, but no requeue signal was written: something else retried them")
	}
	if os.Getenv("DNE_E2E_REQUEUE_BEFORE") == "1" {
		took, writes := healScenario(t, pods, false, 8*time.Minute)
		t.Logf("before (--requeue=false): GPU healthy -> %d pending pods bound: %v; signals written: %d", pods, took, writes)
	}
}

// healScenario: `pods` GPU-share pods on nodes whose GPUs are all sick, every pod rejected
// (FailedScheduling) and remembered; then every GPU heals. Returns the time from the heal to the
// last pod bound, and the requeue signals the extender wrote.
func healScenario(t *testing.T, pods int, requeue bool, guard time.Duration) (time.Duration, int) {
	cp := startControlPlane(t, planOptions{})
	ext := cp.startExtender("", fmt.Sprintf("--requeue=%t", requeue))
	cp.startScheduler(ext.urlPrefix())
	m := gpuMachine
	// Ten pods per GPU (gpu-memory-ratio 10), eight GPUs per node.
	perNode := 10 * m.gpus
	nodes := (pods + perNode - 1) / perNode
	sick := func(int) bool { return false }
	var names []string
	for i := 0; i < nodes; i++ {
		cp.createNode(fmt.Sprintf("sick-%d", i), m, sick, m.gpus)
	}
	ext.waitReady()
	for i := 0; i < pods; i++ {
		name := fmt.Sprintf("waits-%04d", i)
		names = append(names, name)
		cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "100m", "memory": "64Mi", "koordinator.sh/gpu-memory-ratio": "10"}})
	}
	// Every pod rejected by the extender, and (with --requeue) remembered as waiting.
	for _, name := range names {
		cp.waitEvent(name, "")
	}
	if requeue {
		err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
			return ext.waitingPods() >= pods, nil
		})
		if err != nil {
			t.Fatalf("the extender never remembered %d waiting pods (has %d)", pods, ext.waitingPods())
		}
	}
	if n := len(cp.boundPods()); n != 0 {
		t.Fatalf("%d pods bound on sick GPUs", n)
	}
	// Past the takeover window (binds wait for a fresh pod relist after the extender becomes
	// leader): the figure is the requeue's, not the start's.
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		return ext.readyzField("binds_wait_for_pod_relist") == "false", nil
	})
	if err != nil {
		t.Fatalf("binds still wait for a pod relist: %v", err)
	}

	before := time.Now()
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("sick-%d", i)
		cp.updateDevice(name, m.device(name, nil))
	}
	var first time.Duration
	err = wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, guard, true, func(context.Context) (bool, error) {
		n := len(cp.boundPods())
		if n > 0 && first == 0 {
			first = time.Since(before)
		}
		return n == pods, nil
	})
	took := time.Since(before)
	t.Logf("requeue=%t: GPUs healed -> first of %d pods bound: %v, last: %v", requeue, pods, first, took)
	writes := -1
	if v := metricValue(ext.metrics(), `dne_requeue_signals_total{result="written"}`); !math.IsNaN(v) {
		writes = int(v)
	}
	if err != nil {
		t.Fatalf("requeue=%t: %d of %d pods bound %v after the GPUs healed (signals written: %d; %s)",
			requeue, len(cp.boundPods()), pods, took, writes, metricLines(ext.metrics(), "dne_requeue"))
	}
	cp.assertNoViolations()
	if requeue {
		// The signal is where kube-scheduler saw it: on a healed node.
		annotated := 0
		for i := 0; i < nodes; i++ {
			node, err := cp.admin.CoreV1().Nodes().Get(context.Background(), fmt.Sprintf("sick-%d", i), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := node.Annotations[requeueAnnotation]; ok {
				annotated++
			}
		}
		if annotated == 0 {
			t.Fatalf("no healed node carries %s", requeueAnnotation)
		}
	} else if writes != 0 {
		t.Fatalf("--requeue=false wrote %d signals", writes)
	}
	return took, writes
}

// readyzField is a top-level field of GET /readyz's body, as JSON text ("" when unreadable).
func (e *extenderProc) readyzField(name string) string {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + e.probe + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r map[string]json.RawMessage
	if json.Unmarshal(body, &r) != nil {
		return ""
	}
	return string(r[name])
}

// waitingPods is /readyz's requeue.waiting_pods (-1 when unreadable).
func (e *extenderProc) waitingPods() int {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + e.probe + "/readyz")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Requeue struct {
			WaitingPods int `json:"waiting_pods"`
		} `json:"requeue"`
	}
	if json.Unmarshal(body, &r) != nil {
		return -1
	}
	return r.Requeue.WaitingPods
}

// metricValue is the value of the sample line that starts with `series` (NaN when absent).
func metricValue(text, series string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}
