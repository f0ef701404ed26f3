package e2e

// The oracle judged: a sound cluster passes, and each planted violation is caught by name.
// No control plane: ledgerViolations reads plain objects.

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// heldPod is a bound pod asking limits and holding the given annotations.
func heldPod(name string, limits map[string]string, devices, status string) corev1.Pod {
	p := newPod(podSpec{name: name, scheduler: "x", limits: limits})
	p.UID = types.UID("uid-" + p.Name)
	p.Spec.NodeName = "n"
	p.Annotations = map[string]string{}
	if devices != "" {
		p.Annotations[annDeviceAllocated] = devices
	}
	if status != "" {
		p.Annotations[annResourceStatus] = status
	}
	return *p
}

func gpuEntry(minor int, core, ratio, mem string) string {
	b, _ := json.Marshal(map[string]any{"minor": minor, "resources": map[string]string{
		"koordinator.sh/gpu-core": core, "koordinator.sh/gpu-memory-ratio": ratio, "koordinator.sh/gpu-memory": mem,
	}})
	return string(b)
}

func TestTheLedgerOracleCatchesEachPlantedViolation(t *testing.T) {
	m := gpuMachine
	sick := func(minor int) bool { return minor != 7 }
	base := func() clusterObjects {
		return clusterObjects{
			devices: []unstructured.Unstructured{*m.device("n", sick)},
			nrts:    []unstructured.Unstructured{*m.nrt("n")},
			pods: []corev1.Pod{
				heldPod("whole", map[string]string{"nvidia.com/gpu": "1"},
					`{"gpu":[`+gpuEntry(0, "100", "100", "80Gi")+`]}`, ""),
				heldPod("half", map[string]string{"koordinator.sh/gpu-memory-ratio": "50"},
					`{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-memory-ratio":"50","koordinator.sh/gpu-memory":"40Gi"}}]}`, ""),
				heldPod("old-name", map[string]string{"kubernetes.io/gpu": "100"},
					`{"gpu":[`+gpuEntry(2, "100", "100", "80Gi")+`]}`, ""),
				heldPod("lsr", map[string]string{"cpu": "4", "memory": "1Gi"}, "",
					`{"cpuset":"0-3","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"1Gi"}}]}`),
			},
		}
	}
	if v := ledgerViolations(base()); len(v) != 0 {
		t.Fatalf("a sound cluster: %v", v)
	}
	// koordinator's amplification: NUMA node 0 (32 CPUs) × 1.5 = 48, and lsr's 4-CPU cpuset
	// counts 6 of them: 42 more CPUs of NUMA shares fit (4 + 42 − 4 + 6 = 48).
	amplified := func(o *clusterObjects, cpus string) {
		node := corev1.Node{}
		node.Name = "n"
		node.Annotations = map[string]string{"node.koordinator.sh/resource-amplification-ratio": `{"cpu":1.5}`}
		o.nodes = append(o.nodes, node)
		o.pods = append(o.pods, heldPod("shared", map[string]string{"cpu": cpus, "memory": "1Gi"}, "",
			`{"numaNodeResources":[{"node":0,"resources":{"cpu":"`+cpus+`","memory":"1Gi"}}]}`))
	}
	sound := base()
	amplified(&sound, "42")
	if v := ledgerViolations(sound); len(v) != 0 {
		t.Fatalf("a sound amplified cluster: %v", v)
	}
	plants := []struct {
		name  string
		plant func(o *clusterObjects)
		want  string
	}{
		{"a share over a card's capacity", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("more", map[string]string{"koordinator.sh/gpu-memory-ratio": "60"},
				`{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-memory-ratio":"60","koordinator.sh/gpu-memory":"48Gi"}}]}`, ""))
		}, "n gpu/1: koordinator.sh/gpu-memory-ratio 110000 > 100000"},
		{"a minor the Device does not list", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("ghost", map[string]string{"nvidia.com/gpu": "1"},
				`{"gpu":[`+gpuEntry(9, "100", "100", "80Gi")+`]}`, ""))
		}, "n gpu/9 is not in the node's Device object"},
		{"an unhealthy minor", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("sick", map[string]string{"nvidia.com/gpu": "1"},
				`{"gpu":[`+gpuEntry(7, "100", "100", "80Gi")+`]}`, ""))
		}, "n gpu/7 is unhealthy and held"},
		{"no Device object", func(o *clusterObjects) { o.devices = nil }, "n has no Device object"},
		{"memory bytes beyond the card (a smaller Device)", func(o *clusterObjects) {
			small := m
			small.gpuMemoryGi = 40
			o.devices = []unstructured.Unstructured{*small.device("n", sick)}
		}, "n gpu/0: koordinator.sh/gpu-memory"},
		{"under-recorded: two GPUs asked, one held", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("two", map[string]string{"nvidia.com/gpu": "2"},
				`{"gpu":[`+gpuEntry(3, "100", "100", "80Gi")+`]}`, ""))
		}, "cards: asked 2000, recorded 1000"},
		{"under-recorded: a ratio short", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("short", map[string]string{"koordinator.sh/gpu-memory-ratio": "60"},
				`{"gpu":[{"minor":4,"resources":{"koordinator.sh/gpu-memory-ratio":"50","koordinator.sh/gpu-memory":"40Gi"}}]}`, ""))
		}, "koordinator.sh/gpu-memory-ratio: asked 60000, recorded 50000"},
		{"a cpuset smaller than the request", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("small-set", map[string]string{"cpu": "4", "memory": "1Gi"}, "",
				`{"cpuset":"8-10"}`))
		}, "pod small-set asked for 4000m CPU and holds cpuset \"8-10\" (3 CPUs)"},
		{"a CPU off the topology", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("off", map[string]string{"cpu": "1", "memory": "1Gi"}, "",
				`{"cpuset":"64"}`))
		}, "cpu 64 is not in node n's CPU topology"},
		{"a CPU in two cpusets", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("overlap", map[string]string{"cpu": "1", "memory": "1Gi"}, "",
				`{"cpuset":"3"}`))
		}, "cpu 3 of n is in the cpusets of"},
		{"a NUMA node's CPUs over its zone", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("numa", map[string]string{"cpu": "30", "memory": "1Gi"}, "",
				`{"numaNodeResources":[{"node":0,"resources":{"cpu":"30","memory":"1Gi"}}]}`))
		}, "n NUMA node 0: cpu 34000 > 32000 milli"},
		{"an amplified NUMA node's CPUs over its amplified zone", func(o *clusterObjects) {
			amplified(o, "43")
		}, "n NUMA node 0: cpu 49000 > 48000 milli"},
		{"a NUMA node the NRT does not have", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("numa2", map[string]string{"cpu": "1", "memory": "1Gi"}, "",
				`{"numaNodeResources":[{"node":5,"resources":{"cpu":"1"}}]}`))
		}, "n NUMA node 5 is held but its NRT has no zone node-5"},
		{"a device pod bound without an allocation", func(o *clusterObjects) {
			o.pods = append(o.pods, heldPod("bare", map[string]string{"nvidia.com/gpu": "1"}, "", ""))
		}, "pod bare asks for devices, is bound to n, and has no"},
	}
	for _, p := range plants {
		o := base()
		p.plant(&o)
		v := ledgerViolations(o)
		found := false
		for _, line := range v {
			if strings.Contains(line, p.want) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: not caught (want %q); the oracle said %v", p.name, p.want, v)
		}
	}
}
