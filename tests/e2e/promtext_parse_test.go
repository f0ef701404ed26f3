package e2e

import "testing"

// The bench's diagnostics read real /metrics text; this pins their parsing on a sample of it.
func TestBenchDiagnosticsParseMetricsText(t *testing.T) {
	api0 := `# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 10
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 4
apiserver_watch_events_total{component="apiserver",group="",resource="pods",version="v1"} 100
apiserver_watch_events_sizes_sum{component="apiserver",group="",resource="pods",version="v1"} 50000
`
	api1 := `apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 30
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 24
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 1
apiserver_watch_events_total{component="apiserver",group="",resource="pods",version="v1"} 240
apiserver_watch_events_sizes_sum{component="apiserver",group="",resource="pods",version="v1"} 150000
`
	got := apiTrafficPerPod(api0, api1, 20)
	want := "watch bytes pods 5000; watch events pods 7.00; POST pods/binding 1.10; POST pods 1.00; PUT leases 0.05"
	if got != want {
		t.Errorf("apiTrafficPerPod:\n got %q\nwant %q", got, want)
	}
	if got := apiTrafficPerPod("", api1, 20); got != "not measured" {
		t.Errorf("without a first reading: %q", got)
	}

	sched0 := `scheduler_scheduling_algorithm_duration_seconds_sum 1
scheduler_scheduling_algorithm_duration_seconds_count 100
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="scheduled"} 2
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="scheduled"} 100
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="unschedulable"} 9
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="unschedulable"} 3
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="p",status="Success"} 0.5
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="p",status="Success"} 100
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="p",status="Success",le="0.001"} 7
`
	sched1 := `scheduler_scheduling_algorithm_duration_seconds_sum 1.5
scheduler_scheduling_algorithm_duration_seconds_count 200
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="scheduled"} 3
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="scheduled"} 200
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="unschedulable"} 99
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="unschedulable"} 4
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="p",status="Success"} 0.7
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="p",status="Success"} 200
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="p",status="Error"} 5
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="p",status="Error"} 1
`
	got = schedulerCycle(sched0, sched1)
	want = "attempt 10.000 ms, algorithm 5.000 ms, Filter 2.000 ms"
	if got != want {
		t.Errorf("schedulerCycle:\n got %q\nwant %q", got, want)
	}

	ext0 := `dne_http_request_duration_seconds_bucket{outcome="ok",verb="filter",le="0.001"} 10
dne_http_request_duration_seconds_bucket{outcome="ok",verb="filter",le="0.0025"} 10
dne_http_request_duration_seconds_bucket{outcome="ok",verb="filter",le="+Inf"} 10
dne_http_request_duration_seconds_sum{outcome="ok",verb="filter"} 0.005
dne_http_request_duration_seconds_count{outcome="ok",verb="filter"} 10
`
	ext1 := `dne_http_request_duration_seconds_bucket{outcome="ok",verb="filter",le="0.001"} 100
dne_http_request_duration_seconds_bucket{outcome="ok",verb="filter",le="0.0025"} 110
dne_http_request_duration_seconds_bucket{outcome="ok",verb="filter",le="+Inf"} 110
dne_http_request_duration_seconds_sum{outcome="ok",verb="filter"} 0.105
dne_http_request_duration_seconds_count{outcome="ok",verb="filter"} 110
dne_http_request_duration_seconds_sum{outcome="error",verb="bind"} 9
dne_http_request_duration_seconds_count{outcome="error",verb="bind"} 3
`
	got = verbLatencies(ext0, ext1)
	want = "filter n=100 mean=1.00ms p99<=2.5ms"
	if got != want {
		t.Errorf("verbLatencies:\n got %q\nwant %q", got, want)
	}
}
