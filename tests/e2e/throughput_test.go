package e2e

// The throughput benchmark, in the manner of scheduler_perf: the same pods on the same nodes,
// scheduled (a) by the stock scheduler alone (GPU requests as plain extended resources the
// nodes advertise; NodeResourcesFit alone), (b) with the chart's configuration (GPU pods, whole
// and shared) and (c) with every pod routed to the extender (LSR cpuset pods, GPU + cpuset
// pods), at the scheduler's default percentageOfNodesToScore and at 100. Pods/s from creation to
// bound, sampled once a second from a pod informer; CPU seconds of the extender, of
// kube-scheduler (a separate process here, built from the same module) and of the control plane
// (etcd and kube-apiserver, in this test process) per 1,000 pods, and what the extender adds to
// their sum; the machine's load average when each case starts; the extender's bootstrap time
// and resident memory, and kube-scheduler's; the extender's verb latencies from its own metrics.
//
// Not part of CI: DNE_E2E_BENCH=1 scripts/e2e.sh -run TestThroughput -v
// (DNE_E2E_BENCH_NODES=1000,5000 and DNE_E2E_BENCH_PODS=1000 by default;
// DNE_E2E_BENCH_QPS=<qps> replaces the chart's clientConnection qps (burst twice that), whose
// 100 caps every configuration near 100 pods/s; DNE_E2E_BENCH_CASES=<regexp> runs only the cases
// whose "<name> <percentage>" matches; DNE_E2E_BENCH_PERF=<dir> records `perf` profiles of the
// extender, kube-scheduler and this process (etcd, kube-apiserver and the TCP forwarder every
// client goes through) for each case; DNE_E2E_BINARY=<path> runs another extender binary, for
// a before/after in one session; DNE_E2E_BENCH_RANKING=filter|prioritize sets the chart's
// extenderConfig.ranking for (b) and (c), prioritize for a binary from before the flag;
// DNE_E2E_BENCH_NULL=1 adds the "(n) null extender" cases beside (b) and (c): the same stanza
// pointed at a server that passes every candidate and binds with a bare Binding, the
// protocol's own cost).
// Each case also logs the API server's requests and watch events per pod (apitraffic_test.go)
// and kube-scheduler's cycle means from its own metrics (schedmetrics_test.go).
// Never asserts a speed.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

type benchCase struct {
	name      string
	podSet    string // "gpu" or "cpuset"
	extender  bool
	routeAll  bool
	null      bool   // the null extender (nullextender_test.go) instead of the extender
	pctOfNode string // "default" or "100"
}

type benchResult struct {
	benchCase
	nodes                 int
	pods                  int
	wall                  time.Duration
	avg, p50              float64
	extenderCPU, schedCPU float64 // seconds per 1,000 pods
	// This test process's CPU per 1,000 pods: etcd and kube-apiserver run in it, with the
	// bench's own pod creators and informer (the same work in every case), so its difference
	// between cases is the API server's.
	controlPlaneCPU float64
	loadBefore      string // /proc/loadavg's 1-minute figure when the case started
	latencies       string
}

func TestThroughput(t *testing.T) {
	if os.Getenv("DNE_E2E_BENCH") == "" {
		t.Skip("the throughput benchmark runs with DNE_E2E_BENCH=1 (see BENCHMARKS.md)")
	}
	nodeCounts := intsFromEnv("DNE_E2E_BENCH_NODES", []int{1000, 5000})
	pods := intsFromEnv("DNE_E2E_BENCH_PODS", []int{1000})[0]
	var results []benchResult
	for _, n := range nodeCounts {
		results = append(results, runThroughputAt(t, n, pods)...)
	}
	t.Log("\n" + throughputTable(results))
}

func intsFromEnv(key string, def []int) []int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			panic(fmt.Sprintf("%s: %v", key, err))
		}
		out = append(out, n)
	}
	return out
}

// benchValues are the chart values of the (b) and (c) cases: the defaults, or with
// DNE_E2E_BENCH_RANKING=prioritize|filter the chart's extenderConfig.ranking (prioritize runs a
// binary from before the flag: the chart then passes no --ranking).
func benchValues(routeAll bool) string {
	cfg := map[string]any{}
	if r := os.Getenv("DNE_E2E_BENCH_RANKING"); r != "" {
		cfg["ranking"] = r
	}
	if routeAll {
		cfg["routeAllPods"] = true
	}
	if len(cfg) == 0 {
		return ""
	}
	raw, err := json.Marshal(map[string]any{"extenderConfig": cfg})
	if err != nil {
		panic(err)
	}
	return string(raw)
}

func runThroughputAt(t *testing.T, nodes, pods int) []benchResult {
	cp := startControlPlane(t, planOptions{chartValues: benchValues(false)})
	routeAll, err := loadRenderedChart(benchValues(true))
	if err != nil {
		t.Fatal(err)
	}
	m := gpuMachine
	createNodesConcurrently(cp, nodes, m)
	started := time.Now()
	ext := cp.startExtender("")
	ext.waitReady()
	t.Logf("%d nodes: the extender was ready %v after its start (bootstrap: list and replay every kind); resident %s",
		nodes, time.Since(started).Round(10*time.Millisecond), residentMiB(ext.pid()))

	var results []benchResult
	for _, pct := range []string{"default", "100"} {
		for _, c := range []benchCase{
			{name: "(a) stock, GPU pods", podSet: "gpu"},
			{name: "(b) chart, GPU pods", podSet: "gpu", extender: true},
			{name: "(n) null extender, GPU pods", podSet: "gpu", extender: true, null: true},
			{name: "(a) stock, cpuset pods", podSet: "cpuset"},
			{name: "(c) chart routeAllPods, cpuset pods", podSet: "cpuset", extender: true, routeAll: true},
			{name: "(n) null extender routeAllPods, cpuset pods", podSet: "cpuset", extender: true, routeAll: true, null: true},
		} {
			c.pctOfNode = pct
			if c.null && os.Getenv("DNE_E2E_BENCH_NULL") != "1" {
				continue
			}
			if only := os.Getenv("DNE_E2E_BENCH_CASES"); only != "" && !regexp.MustCompile(only).MatchString(c.name+" "+pct) {
				continue
			}
			chart := cp.chart
			if c.routeAll {
				chart = routeAll
			}
			r := runThroughputCase(cp, ext, chart, c, pods)
			r.nodes = nodes
			t.Logf("%d nodes, %s, percentageOfNodesToScore %s: %.1f pods/s (p50 %.1f), %v; CPU/1000 pods: extender %.2fs, scheduler %.2fs, control plane %.2fs; load %s; %s",
				nodes, c.name, pct, r.avg, r.p50, r.wall.Round(time.Millisecond), r.extenderCPU, r.schedCPU, r.controlPlaneCPU, r.loadBefore, r.latencies)
			results = append(results, r)
		}
	}
	return results
}

func createNodesConcurrently(cp *controlPlane, n int, m machine) {
	parallelFor(n, 16, func(i int) { cp.createNodeObjects(fmt.Sprintf("node-%05d", i), m) })
}

// editConfigForCase edits the chart's configuration: for (a) no extender, and for "default"
// no percentageOfNodesToScore in the profile.
func editConfigForCase(cfg string, c benchCase) (string, error) {
	if qps := os.Getenv("DNE_E2E_BENCH_QPS"); qps != "" {
		n, err := strconv.Atoi(qps)
		if err != nil {
			return "", fmt.Errorf("DNE_E2E_BENCH_QPS: %w", err)
		}
		cfg = regexp.MustCompile(`(?m)^(\s*)qps: \d+$`).ReplaceAllString(cfg, fmt.Sprintf("${1}qps: %d", n))
		cfg = regexp.MustCompile(`(?m)^(\s*)burst: \d+$`).ReplaceAllString(cfg, fmt.Sprintf("${1}burst: %d", 2*n))
	}
	if c.pctOfNode == "default" {
		cfg = regexp.MustCompile(`(?m)^\s*percentageOfNodesToScore:.*\n`).ReplaceAllString(cfg, "")
	} else if !strings.Contains(cfg, "percentageOfNodesToScore: 100") {
		return "", fmt.Errorf("the chart's profile no longer sets percentageOfNodesToScore: 100")
	}
	if !c.extender {
		i := strings.Index(cfg, "extenders:")
		if i < 0 {
			return "", fmt.Errorf("no extenders: in the chart's scheduler config")
		}
		cfg = cfg[:strings.LastIndex(cfg[:i], "\n")+1]
	}
	return cfg, nil
}

func benchPod(c benchCase, i int, schedulerName string) *corev1.Pod {
	p := podSpec{name: fmt.Sprintf("bench-%05d", i), scheduler: schedulerName}
	switch {
	case c.podSet == "gpu" && i%2 == 0:
		p.limits = map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
	case c.podSet == "gpu":
		p.limits = map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "50"}
	case i%2 == 0:
		p.labels = map[string]string{"koordinator.sh/qosClass": "LSR"}
		p.limits = map[string]string{"cpu": "4", "memory": "4Gi"}
	default:
		p.labels = map[string]string{"koordinator.sh/qosClass": "LSR"}
		p.limits = map[string]string{"cpu": "4", "memory": "4Gi", "nvidia.com/gpu": "1"}
	}
	return newPod(p)
}

func runThroughputCase(cp *controlPlane, ext *extenderProc, chart *renderedChart, c benchCase, n int) benchResult {
	t := cp.t
	metricsArgs, metricsAddr, err := schedulerMetricsArgs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	urlPrefix, extPid := ext.urlPrefix(), ext.pid()
	if c.null {
		null := cp.startNullExtender()
		defer null.stop()
		urlPrefix, extPid = null.url, null.proc.pid()
	}
	sched := cp.startSchedulerWithConfig(chart, urlPrefix, func(cfg string) (string, error) {
		return editConfigForCase(cfg, c)
	}, metricsArgs...)
	defer func() {
		cp.stopScheduler()
		cp.deleteAllPods()
	}()

	// Count bound pods from an informer, as scheduler_perf's throughputCollector does.
	var bound, lastBoundAt int64
	seen := sync.Map{}
	factory := informers.NewSharedInformerFactoryWithOptions(cp.admin, 0, informers.WithNamespace(testNamespace))
	inf := factory.Core().V1().Pods().Informer()
	onPod := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			if _, dup := seen.LoadOrStore(p.Name, true); !dup {
				atomic.AddInt64(&bound, 1)
				atomic.StoreInt64(&lastBoundAt, time.Now().UnixNano())
			}
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onPod, UpdateFunc: func(_, o any) { onPod(o) }})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	cache.WaitForCacheSync(stop, inf.HasSynced)

	// Wait for the scheduler to hold its Lease (first pod bound) with one warm-up pod, not
	// counted, so leader election is not measured.
	warm := benchPod(c, n, schedulerName(chart))
	warm.Name = "bench-warmup"
	if _, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, warm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(cp.ctx, 100*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		return atomic.LoadInt64(&bound) >= 1, nil
	}); err != nil {
		t.Fatalf("%s: warm-up pod never bound: %v", c.name, cp.schedulingEvents("bench-warmup"))
	}
	base := atomic.LoadInt64(&bound)

	stopProfiles := startProfiles(cp, c, map[string]int{"extender": extPid, "kube-scheduler": sched.pid(), "control-plane": os.Getpid()})
	defer stopProfiles()
	load := loadAverage()
	extCPU0, schedCPU0, cpCPU0 := procCPUSeconds(extPid), procCPUSeconds(sched.pid()), procCPUSeconds(os.Getpid())
	metrics0 := ext.metrics()
	api0 := cp.apiServerMetrics()
	sched0 := schedulerMetrics(metricsAddr)
	start := time.Now()
	go createPodsConcurrently(cp, c, n, schedulerName(chart))
	var samples []float64
	last := base
	for {
		time.Sleep(time.Second)
		now := atomic.LoadInt64(&bound)
		samples = append(samples, float64(now-last))
		last = now
		if now-base >= int64(n) {
			break
		}
		if time.Since(start) > 30*time.Minute {
			t.Fatalf("%s: %d of %d pods bound after 30m", c.name, now-base, n)
		}
	}
	// From the first creation to the informer seeing the last pod bound.
	wall := time.Unix(0, atomic.LoadInt64(&lastBoundAt)).Sub(start)
	stopProfiles()
	extCPU, schedCPU := procCPUSeconds(extPid)-extCPU0, procCPUSeconds(sched.pid())-schedCPU0
	cpCPU := procCPUSeconds(os.Getpid()) - cpCPU0
	t.Logf("%s: resident at the end: extender %s, kube-scheduler %s", c.name, residentMiB(ext.pid()), residentMiB(sched.pid()))
	lat := verbLatencies(metrics0, ext.metrics())
	traffic := apiTrafficPerPod(api0, cp.apiServerMetrics(), n)
	t.Logf("%s: API server traffic per pod: %s", c.name, traffic)
	t.Logf("%s: kube-scheduler's cycle (means): %s", c.name, schedulerCycle(sched0, schedulerMetrics(metricsAddr)))
	if !c.extender {
		lat = "extender not called"
	} else if c.null {
		lat = "null extender"
	}
	return benchResult{
		benchCase: c, pods: n, wall: wall,
		avg: float64(n) / wall.Seconds(), p50: median(samples),
		extenderCPU: extCPU * 1000 / float64(n), schedCPU: schedCPU * 1000 / float64(n),
		controlPlaneCPU: cpCPU * 1000 / float64(n), loadBefore: load,
		latencies: lat,
	}
}

// startProfiles runs `perf record` on each process for the measured part of a case when
// DNE_E2E_BENCH_PERF names a directory (files <case>-<process>.data); the returned func stops
// them (idempotent). Read with `perf report -i <file> --no-children`.
func startProfiles(cp *controlPlane, c benchCase, pids map[string]int) func() {
	dir := os.Getenv("DNE_E2E_BENCH_PERF")
	if dir == "" {
		return func() {}
	}
	_ = os.MkdirAll(dir, 0o755)
	slug := regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(c.name+"-"+c.pctOfNode), "-")
	var cmds []*exec.Cmd
	for name, pid := range pids {
		out := filepath.Join(dir, slug+"-"+name+".data")
		cmd := exec.Command("perf", "record", "-F", "499", "-g", "-p", strconv.Itoa(pid), "-o", out)
		if err := cmd.Start(); err != nil {
			cp.t.Logf("perf record: %v", err)
			continue
		}
		cmds = append(cmds, cmd)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, cmd := range cmds {
				_ = cmd.Process.Signal(os.Interrupt)
				_ = cmd.Wait()
			}
		})
	}
}

func createPodsConcurrently(cp *controlPlane, c benchCase, n int, sched string) {
	parallelFor(n, 8, func(i int) {
		_, _ = cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, benchPod(c, i, sched), metav1.CreateOptions{})
	})
}

func (cp *controlPlane) deleteAllPods() {
	zero := int64(0)
	_ = cp.admin.CoreV1().Pods(testNamespace).DeleteCollection(cp.ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	_ = wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.admin.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(pods.Items) == 0, nil
	})
}

// loadAverage is /proc/loadavg's 1-minute figure ("?" where it cannot be read).
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(raw)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// residentMiB is a process's resident set (VmRSS) in MiB, or "?".
func residentMiB(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				return fmt.Sprintf("%.0f MiB", kb/1024)
			}
		}
	}
	return "?"
}

// procCPUSeconds is utime+stime of a process from /proc (clock ticks of 1/100 s).
func procCPUSeconds(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return math.NaN()
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// verbLatencies summarises the extender's own request-duration histogram over the run: per verb,
// count, mean and the bucket bound under which 99% fell.
func verbLatencies(before, after string) string {
	type hist struct {
		sum, count float64
		buckets    map[float64]float64
	}
	const family = "dne_http_request_duration_seconds"
	parse := func(text string) map[string]*hist {
		out := map[string]*hist{}
		samples := promSamples(text, func(name string) bool { return strings.HasPrefix(name, family+"_") })
		for _, m := range samples {
			if m.labels["outcome"] != "ok" {
				continue
			}
			h := out[m.labels["verb"]]
			if h == nil {
				h = &hist{buckets: map[float64]float64{}}
				out[m.labels["verb"]] = h
			}
			switch strings.TrimPrefix(m.name, family+"_") {
			case "sum":
				h.sum += m.value
			case "count":
				h.count += m.value
			case "bucket":
				bound, _ := strconv.ParseFloat(m.labels["le"], 64)
				h.buckets[bound] += m.value
			}
		}
		return out
	}
	b, a := parse(before), parse(after)
	var parts []string
	for _, verb := range []string{"filter", "prioritize", "bind", "preempt"} {
		ha := a[verb]
		if ha == nil {
			continue
		}
		hb := b[verb]
		if hb == nil {
			hb = &hist{buckets: map[float64]float64{}}
		}
		count := ha.count - hb.count
		if count == 0 {
			continue
		}
		var bounds []float64
		for le := range ha.buckets {
			bounds = append(bounds, le)
		}
		sort.Float64s(bounds)
		p99 := math.Inf(1)
		for _, le := range bounds {
			if ha.buckets[le]-hb.buckets[le] >= 0.99*count {
				p99 = le
				break
			}
		}
		parts = append(parts, fmt.Sprintf("%s n=%.0f mean=%.2fms p99<=%gms", verb, count, (ha.sum-hb.sum)/count*1000, p99*1000))
	}
	return strings.Join(parts, ", ")
}

func throughputTable(rs []benchResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| nodes | pctOfNodesToScore | case | load | pods | wall | pods/s avg | pods/s p50 | ratio to (a) | CPU s/1000 pods: extender | kube-scheduler | control plane | added by the extender | extender verbs |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	baseline := map[string]benchResult{}
	for _, r := range rs {
		key := fmt.Sprintf("%d/%s/%s", r.nodes, r.pctOfNode, r.podSet)
		ratio, added := "1", "-"
		if !r.extender {
			baseline[key] = r
		} else if base, ok := baseline[key]; ok && base.avg > 0 {
			ratio = fmt.Sprintf("%.2f", r.avg/base.avg)
			// Everything (b) or (c) spent that (a) did not: the extender's own CPU, and
			// kube-scheduler's and the control plane's extra.
			added = fmt.Sprintf("%.2f", r.extenderCPU+(r.schedCPU-base.schedCPU)+(r.controlPlaneCPU-base.controlPlaneCPU))
		}
		extCPU := "-"
		if r.extender {
			extCPU = fmt.Sprintf("%.2f", r.extenderCPU)
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %d | %v | %.1f | %.1f | %s | %s | %.2f | %.2f | %s | %s |\n",
			r.nodes, r.pctOfNode, r.name, r.loadBefore, r.pods, r.wall.Round(100*time.Millisecond), r.avg, r.p50, ratio, extCPU, r.schedCPU, r.controlPlaneCPU, added, r.latencies)
	}
	return b.String()
}
