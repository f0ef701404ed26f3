package e2e

// API objects as the real producers publish them: Nodes as a kubelet reports them (allocatable
// and a Ready condition, no kubelet behind them), Device as koordlet writes it, and
// NodeResourceTopology with koordlet's CPU topology annotations.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	deviceGVR = schema.GroupVersionResource{Group: "scheduling.koordinator.sh", Version: "v1alpha1", Resource: "devices"}
	nrtGVR    = schema.GroupVersionResource{Group: "topology.node.k8s.io", Version: "v1alpha1", Resource: "noderesourcetopologies"}
)

// machine is one node's hardware: NUMA nodes (one socket each), physical cores per NUMA node
// with two hyperthreads each, GPUs spread evenly over the NUMA nodes two per PCIe switch, and
// optionally one RDMA NIC per PCIe switch.
type machine struct {
	numa         int
	coresPerNuma int
	gpus         int
	gpuMemoryGi  int
	rdma         bool
}

var gpuMachine = machine{numa: 2, coresPerNuma: 16, gpus: 8, gpuMemoryGi: 80, rdma: true}
var cpuMachine = machine{numa: 2, coresPerNuma: 16}

func (m machine) cpus() int { return m.numa * m.coresPerNuma * 2 }

// cpuID is the logical CPU of thread `thread` (0/1) of global core `core`: Linux numbers the
// first threads of all cores first.
func (m machine) cpuID(core, thread int) int { return thread*m.numa*m.coresPerNuma + core }

// gpuNuma / gpuPCIe say where GPU minor i sits.
func (m machine) gpuNuma(i int) int { return i / (m.gpus / m.numa) }
func (m machine) gpuPCIe(i int) int { return i / 2 }

func (m machine) node(name string) *corev1.Node {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(fmt.Sprint(m.cpus())),
		corev1.ResourceMemory: resource.MustParse(fmt.Sprintf("%dGi", 256*m.numa)),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if m.gpus > 0 {
		// What the NVIDIA device plugin and koord-manager advertise.
		res["nvidia.com/gpu"] = resource.MustParse(fmt.Sprint(m.gpus))
		res["koordinator.sh/gpu-core"] = resource.MustParse(fmt.Sprint(100 * m.gpus))
		res["koordinator.sh/gpu-memory-ratio"] = resource.MustParse(fmt.Sprint(100 * m.gpus))
		res["koordinator.sh/gpu-memory"] = resource.MustParse(fmt.Sprintf("%dGi", m.gpuMemoryGi*m.gpus))
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{
			Capacity:    res,
			Allocatable: res,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
			}},
			Phase: corev1.NodeRunning,
		},
	}
}

// device is the koordinator Device koordlet publishes for the node.
func (m machine) device(name string, healthy func(minor int) bool) *unstructured.Unstructured {
	var devices []any
	for i := 0; i < m.gpus; i++ {
		devices = append(devices, map[string]any{
			"type": "gpu", "id": fmt.Sprintf("GPU-%s-%d", name, i), "minor": int64(i),
			"health": healthy == nil || healthy(i),
			"resources": map[string]any{
				"koordinator.sh/gpu-core":         "100",
				"koordinator.sh/gpu-memory":       fmt.Sprintf("%dGi", m.gpuMemoryGi),
				"koordinator.sh/gpu-memory-ratio": "100",
			},
			"topology": map[string]any{
				"socketID": int64(m.gpuNuma(i)), "nodeID": int64(m.gpuNuma(i)),
				"pcieID": fmt.Sprintf("pci0000:%02d", m.gpuPCIe(i)),
				"busID":  fmt.Sprintf("0000:%02x:00.0", 0x10+i),
			},
		})
	}
	if m.rdma {
		for p := 0; p < m.gpus/2; p++ {
			devices = append(devices, map[string]any{
				"type": "rdma", "id": fmt.Sprintf("RDMA-%s-%d", name, p), "minor": int64(p), "health": true,
				"resources": map[string]any{"koordinator.sh/rdma": "100"},
				"topology": map[string]any{
					"socketID": int64(p * 2 / (m.gpus / m.numa)), "nodeID": int64(p * 2 / (m.gpus / m.numa)),
					"pcieID": fmt.Sprintf("pci0000:%02d", p),
					"busID":  fmt.Sprintf("0000:%02x:00.0", 0x80+p),
				},
			})
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"devices": devices},
	}}
}

// nrt is the NodeResourceTopology koordlet publishes: CPU topology and NUMA zones.
func (m machine) nrt(name string) *unstructured.Unstructured {
	type cpu struct {
		ID     int `json:"id"`
		Core   int `json:"core"`
		Socket int `json:"socket"`
		Node   int `json:"node"`
	}
	var detail []cpu
	for thread := 0; thread < 2; thread++ {
		for core := 0; core < m.numa*m.coresPerNuma; core++ {
			numa := core / m.coresPerNuma
			detail = append(detail, cpu{ID: m.cpuID(core, thread), Core: core, Socket: numa, Node: numa})
		}
	}
	topo, _ := json.Marshal(map[string]any{"detail": detail})
	var zones []any
	for n := 0; n < m.numa; n++ {
		cpus := fmt.Sprint(2 * m.coresPerNuma)
		zones = append(zones, map[string]any{
			"name": fmt.Sprintf("node-%d", n), "type": "Node",
			"resources": []any{
				map[string]any{"name": "cpu", "capacity": cpus, "allocatable": cpus, "available": cpus},
				map[string]any{"name": "memory", "capacity": "256Gi", "allocatable": "256Gi", "available": "256Gi"},
			},
		})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
		"metadata": map[string]any{
			"name": name,
			"annotations": map[string]any{
				"node.koordinator.sh/cpu-topology":          string(topo),
				"kubelet.koordinator.sh/cpu-manager-policy": `{"policy":"none"}`,
			},
		},
		"topologyPolicies": []any{"None"},
		"zones":            zones,
	}}
}

// addNodes creates n nodes of machine m named prefix-0..n-1, each with its Device (when it has
// devices) and its NRT.
func (cp *controlPlane) addNodes(prefix string, n int, m machine) []string {
	var names []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		names = append(names, name)
		cp.createNodeObjects(name, m)
	}
	return names
}

func (cp *controlPlane) createNodeObjects(name string, m machine) {
	ctx := context.Background()
	if _, err := cp.admin.CoreV1().Nodes().Create(ctx, m.node(name), metav1.CreateOptions{}); err != nil {
		cp.t.Fatalf("node %s: %v", name, err)
	}
	if m.gpus > 0 {
		if _, err := cp.dyn.Resource(deviceGVR).Create(ctx, m.device(name, nil), metav1.CreateOptions{}); err != nil {
			cp.t.Fatalf("device %s: %v", name, err)
		}
	}
	if _, err := cp.dyn.Resource(nrtGVR).Create(ctx, m.nrt(name), metav1.CreateOptions{}); err != nil {
		cp.t.Fatalf("nrt %s: %v", name, err)
	}
}

// podSpec describes a test pod.
type podSpec struct {
	name      string
	scheduler string            // "" = the chart's scheduler
	limits    map[string]string // container limits (= requests)
	labels    map[string]string
	annots    map[string]string
	priority  string // PriorityClass name
}

const testNamespace = "default"

var metav1CreateOptions = metav1.CreateOptions{}

// pod builds the pod; with no scheduler named, the chart's.
func (cp *controlPlane) pod(p podSpec) *corev1.Pod {
	if p.scheduler == "" {
		p.scheduler = schedulerName(cp.chart)
	}
	return newPod(p)
}

func newPod(p podSpec) *corev1.Pod {
	limits := corev1.ResourceList{}
	for k, v := range p.limits {
		limits[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: testNamespace, Labels: p.labels, Annotations: p.annots},
		Spec: corev1.PodSpec{
			SchedulerName:     p.scheduler,
			PriorityClassName: p.priority,
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.example/app:1",
				Resources: corev1.ResourceRequirements{Limits: limits, Requests: limits},
			}},
		},
	}
	return pod
}

func (cp *controlPlane) createPod(p podSpec) *corev1.Pod {
	created, err := cp.admin.CoreV1().Pods(testNamespace).Create(context.Background(), cp.pod(p), metav1.CreateOptions{})
	if err != nil {
		cp.t.Fatalf("pod %s: %v", p.name, err)
	}
	return created
}

// schedulerName is the chart's profile name, read from its scheduler config.
func schedulerName(c *renderedChart) string {
	for _, line := range strings.Split(c.SchedulerConfig, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "- schedulerName:") {
			return strings.Trim(strings.TrimSpace(strings.TrimPrefix(line, "- schedulerName:")), `"`)
		}
	}
	panic("the chart's scheduler config has no schedulerName")
}
