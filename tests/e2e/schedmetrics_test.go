package e2e

// kube-scheduler's own view of a throughput case: the mean of its scheduling-cycle histograms
// (scheduling_attempt_duration_seconds for scheduled pods, scheduling_algorithm_duration_seconds,
// and framework_extension_point_duration_seconds per extension point) over the case, read from
// its /metrics before and after. The algorithm's mean minus its plugins' is what the extenders
// and host selection took in the serial part of each cycle. A diagnostic, never asserted.

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// schedulerMetricsArgs serve kube-scheduler's /metrics on a free loopback address without
// authorization (anonymous is allowed by its delegated authentication); the address to scrape.
func schedulerMetricsArgs(dir string) ([]string, string, error) {
	addr := freeLoopbackAddr()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", err
	}
	return []string{
		"--secure-port=" + port,
		"--bind-address=127.0.0.1",
		"--cert-dir=" + dir,
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
	}, addr, nil
}

// schedulerMetrics is kube-scheduler's /metrics text, "" when it cannot be read (the
// diagnostic is then left out). Retries while the port comes up.
func schedulerMetrics(addr string) string {
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // self-signed, loopback
	}
	defer client.CloseIdleConnections()
	for attempt := 0; attempt < 50; attempt++ {
		resp, err := client.Get("https://" + addr + "/metrics")
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(body)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ""
}

// schedulerHistograms sums each histogram's _sum and _count by a short key: "attempt" (scheduled
// pods only), "algorithm", and each extension point's name (successful runs only).
func schedulerHistograms(text string) map[string][2]float64 {
	const prefix = "scheduler_"
	histograms := []string{"scheduling_attempt_duration_seconds", "scheduling_algorithm_duration_seconds", "framework_extension_point_duration_seconds"}
	split := func(name string) (histogram, part string) {
		for _, h := range histograms {
			for _, p := range []string{"_sum", "_count"} {
				if name == prefix+h+p {
					return h, p
				}
			}
		}
		return "", ""
	}
	out := map[string][2]float64{}
	for _, m := range promSamples(text, func(name string) bool { h, _ := split(name); return h != "" }) {
		histogram, part := split(m.name)
		var key string
		switch histogram {
		case "scheduling_attempt_duration_seconds":
			if m.labels["result"] != "scheduled" {
				continue
			}
			key = "attempt"
		case "scheduling_algorithm_duration_seconds":
			key = "algorithm"
		default:
			if m.labels["status"] != "Success" {
				continue
			}
			key = m.labels["extension_point"]
		}
		cur := out[key]
		if part == "_sum" {
			cur[0] += m.value
		} else {
			cur[1] += m.value
		}
		out[key] = cur
	}
	return out
}

// schedulerCycle is the mean of each histogram over the case, in ms: "attempt 4.1 ms, algorithm
// 3.2 ms, PreFilter 0.05 ms, Filter 2.1 ms, ...". Filter is the whole phase of a cycle (every
// node's plugins, in parallel), as kube-scheduler records it.
func schedulerCycle(before, after string) string {
	if before == "" || after == "" {
		return "not measured"
	}
	b, a := schedulerHistograms(before), schedulerHistograms(after)
	mean := func(key string) (float64, bool) {
		n := a[key][1] - b[key][1]
		if n <= 0 {
			return 0, false
		}
		return (a[key][0] - b[key][0]) / n * 1000, true
	}
	var parts []string
	for _, key := range []string{"attempt", "algorithm", "PreFilter", "Filter", "PreScore", "Score", "Reserve", "Permit", "PreBind", "Bind"} {
		if ms, ok := mean(key); ok {
			parts = append(parts, fmt.Sprintf("%s %.3f ms", key, ms))
		}
	}
	return strings.Join(parts, ", ")
}
