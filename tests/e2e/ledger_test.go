package e2e

// The independent oracle: what koordlet would enforce, computed from the API server's objects
// alone. It parses koordinator's annotation formats itself (never the crate's parsers) and
// checks that no GPU, RDMA NIC or CPU is promised beyond its capacity by the pods that hold it.

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	annDeviceAllocated = "scheduling.koordinator.sh/device-allocated"
	annResourceStatus  = "scheduling.koordinator.sh/resource-status"
)

// deviceEntry is one entry of koordinator's device-allocated annotation
// (apis/extension/device_share.go: DeviceAllocation).
type deviceEntry struct {
	Minor     int               `json:"minor"`
	Resources map[string]string `json:"resources"`
	ID        string            `json:"id,omitempty"`
}

// resourceStatus is koordinator's resource-status annotation (apis/extension/numa_aware.go).
type resourceStatus struct {
	CPUSet            string `json:"cpuset,omitempty"`
	NUMANodeResources []struct {
		Node      int               `json:"node"`
		Resources map[string]string `json:"resources"`
	} `json:"numaNodeResources,omitempty"`
}

func parseDeviceAllocated(pod *corev1.Pod) (map[string][]deviceEntry, error) {
	raw, ok := pod.Annotations[annDeviceAllocated]
	if !ok {
		return nil, nil
	}
	out := map[string][]deviceEntry{}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return nil, fmt.Errorf("pod %s: %s: %w", pod.Name, annDeviceAllocated, err)
	}
	return out, nil
}

func parseResourceStatus(pod *corev1.Pod) (*resourceStatus, error) {
	raw, ok := pod.Annotations[annResourceStatus]
	if !ok {
		return nil, nil
	}
	out := &resourceStatus{}
	if err := json.Unmarshal([]byte(raw), out); err != nil {
		return nil, fmt.Errorf("pod %s: %s: %w", pod.Name, annResourceStatus, err)
	}
	return out, nil
}

// parseCPUList parses a Linux cpu list ("0-3,8,10-11").
func parseCPUList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// holds says whether a pod holds what its annotations say: bound and not finished. A pod being
// deleted still holds until it is gone (its containers may still run).
func holds(pod *corev1.Pod) bool {
	return pod.Spec.NodeName != "" && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// violations lists every over-allocation among the API server's pods against the nodes' Device
// objects and the machine m every node of the test runs. Empty means koordlet could enforce
// every allocation at once.
func (cp *controlPlane) violations(m machine) []string {
	ctx := context.Background()
	pods, err := cp.admin.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	type key struct {
		node, kind string
		minor      int
	}
	used := map[key]map[string]int64{}
	holders := map[key][]string{}
	cpuOwner := map[string]map[int]string{}
	var out []string
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !holds(pod) {
			continue
		}
		devs, err := parseDeviceAllocated(pod)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		for kind, entries := range devs {
			for _, e := range entries {
				k := key{pod.Spec.NodeName, kind, e.Minor}
				if used[k] == nil {
					used[k] = map[string]int64{}
				}
				for name, q := range e.Resources {
					v, err := resource.ParseQuantity(q)
					if err != nil {
						out = append(out, fmt.Sprintf("pod %s: %s %q: %v", pod.Name, name, q, err))
						continue
					}
					used[k][name] += v.Value()
				}
				holders[k] = append(holders[k], pod.Name)
			}
		}
		// A pod that asked for GPUs and is bound must say which (koordlet needs the minors).
		if wantsDevices(pod) && len(devs) == 0 {
			out = append(out, fmt.Sprintf("pod %s asks for devices, is bound to %s, and has no %s", pod.Name, pod.Spec.NodeName, annDeviceAllocated))
		}
		rs, err := parseResourceStatus(pod)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		if rs != nil && rs.CPUSet != "" {
			cpus, err := parseCPUList(rs.CPUSet)
			if err != nil {
				out = append(out, fmt.Sprintf("pod %s: %v", pod.Name, err))
				continue
			}
			owners := cpuOwner[pod.Spec.NodeName]
			if owners == nil {
				owners = map[int]string{}
				cpuOwner[pod.Spec.NodeName] = owners
			}
			for _, c := range cpus {
				if c < 0 || c >= m.cpus() {
					out = append(out, fmt.Sprintf("pod %s: cpu %d is not on node %s", pod.Name, c, pod.Spec.NodeName))
				}
				if other, taken := owners[c]; taken {
					out = append(out, fmt.Sprintf("cpu %d of %s is in the cpusets of %s and %s", c, pod.Spec.NodeName, other, pod.Name))
				}
				owners[c] = pod.Name
			}
		}
	}
	capacity := map[string]int64{
		"koordinator.sh/gpu-core":         100,
		"koordinator.sh/gpu-memory-ratio": 100,
		"koordinator.sh/gpu-memory":       int64(m.gpuMemoryGi) << 30,
		"koordinator.sh/rdma":             100,
	}
	for k, u := range used {
		max := m.gpus
		if k.kind == "rdma" {
			max = m.gpus / 2
		}
		if k.minor < 0 || k.minor >= max {
			out = append(out, fmt.Sprintf("%s %s minor %d does not exist (holders %v)", k.node, k.kind, k.minor, holders[k]))
		}
		for name, v := range u {
			if c, ok := capacity[name]; ok && v > c {
				out = append(out, fmt.Sprintf("%s %s %d: %s %d > %d (holders %v)", k.node, k.kind, k.minor, name, v, c, holders[k]))
			}
		}
	}
	sort.Strings(out)
	return out
}

var deviceResources = []string{
	"nvidia.com/gpu", "koordinator.sh/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory",
	"koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu.shared", "koordinator.sh/rdma",
}

func wantsDevices(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		for _, r := range deviceResources {
			if q, ok := c.Resources.Limits[corev1.ResourceName(r)]; ok && !q.IsZero() {
				return true
			}
		}
	}
	return false
}

func (cp *controlPlane) assertNoViolations(m machine) {
	cp.t.Helper()
	if v := cp.violations(m); len(v) > 0 {
		cp.t.Fatalf("over-allocation on the API server:\n  %s", strings.Join(v, "\n  "))
	}
}
