package e2e

// What the API server served during a throughput case, per pod: requests by verb and
// resource (apiserver_request_total) and watch events by resource with their encoded bytes
// (apiserver_watch_events_total, apiserver_watch_events_sizes_sum), read from the in-process
// kube-apiserver's /metrics before and after the case. The bench prints the difference so a
// before/after shows which requests or events an extender change added or took away. Never
// asserted: a diagnostic of the throughput bench.

import (
	"fmt"
	"sort"
	"strings"
)

// apiServerMetrics is the in-process kube-apiserver's /metrics text ("" when unreadable: the
// diagnostic is then left out, the bench goes on).
func (cp *controlPlane) apiServerMetrics() string {
	raw, err := cp.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(cp.ctx)
	if err != nil {
		cp.t.Logf("apiserver /metrics: %v (API traffic not reported)", err)
		return ""
	}
	return string(raw)
}

// apiTraffic sums the three series by a short key: "<VERB> <resource>[/<subresource>]" for
// requests (every code), "watch events <resource>" and "watch bytes <resource>".
func apiTraffic(text string) map[string]float64 {
	out := map[string]float64{}
	wanted := func(name string) bool {
		return name == "apiserver_request_total" || name == "apiserver_watch_events_total" || name == "apiserver_watch_events_sizes_sum"
	}
	for _, m := range promSamples(text, wanted) {
		var key string
		switch m.name {
		case "apiserver_request_total":
			key = m.labels["verb"] + " " + m.labels["resource"]
			if s := m.labels["subresource"]; s != "" {
				key += "/" + s
			}
		case "apiserver_watch_events_total":
			key = "watch events " + m.labels["resource"]
		case "apiserver_watch_events_sizes_sum":
			key = "watch bytes " + m.labels["resource"]
		}
		out[key] += m.value
	}
	return out
}

// apiTrafficPerPod is what changed between two readings, per pod, largest first; series
// below 0.05 per pod (leases, background controllers) are left out.
func apiTrafficPerPod(before, after string, pods int) string {
	if before == "" || after == "" || pods == 0 {
		return "not measured"
	}
	b, a := apiTraffic(before), apiTraffic(after)
	type row struct {
		key string
		per float64
	}
	var rows []row
	for k, v := range a {
		per := (v - b[k]) / float64(pods)
		if per >= 0.05 {
			rows = append(rows, row{k, per})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].per != rows[j].per {
			return rows[i].per > rows[j].per
		}
		return rows[i].key < rows[j].key
	})
	var parts []string
	for _, r := range rows {
		if strings.HasPrefix(r.key, "watch bytes ") {
			parts = append(parts, fmt.Sprintf("%s %.0f", r.key, r.per))
		} else {
			parts = append(parts, fmt.Sprintf("%s %.2f", r.key, r.per))
		}
	}
	return strings.Join(parts, "; ")
}
