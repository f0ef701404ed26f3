package e2e

// The independent oracle: what koordlet would enforce, computed from the API server's objects
// alone (pods, Device objects, NodeResourceTopologies). It parses koordinator's annotation
// formats itself (never the crate's parsers) and checks that no GPU, RDMA NIC, CPU or NUMA
// node is promised beyond what its node publishes, and that every pod holds what it asked.
// ledger_oracle_test.go feeds it planted violations: each must be caught.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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

// clusterObjects is what the oracle reads: the API server's pods, Device objects and
// NodeResourceTopologies, nothing else (not the machine a test meant to build, not the crate).
type clusterObjects struct {
	pods    []corev1.Pod
	devices []unstructured.Unstructured
	nrts    []unstructured.Unstructured
	// nodes: only their node.koordinator.sh/resource-amplification-ratio is read.
	nodes []corev1.Node
}

// violations lists everything koordlet could not enforce at once among the API server's
// objects (see ledgerViolations). Empty means every allocation is sound.
func (cp *controlPlane) violations() []string {
	ctx := context.Background()
	pods, err := cp.admin.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	devices, err := cp.dyn.Resource(deviceGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	nrts, err := cp.dyn.Resource(nrtGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	nodes, err := cp.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	return ledgerViolations(clusterObjects{pods: pods.Items, devices: devices.Items, nrts: nrts.Items, nodes: nodes.Items})
}

// deviceSlot is one Device entry as koordlet publishes it.
type deviceSlot struct {
	healthy  bool
	capacity map[string]int64 // milli-units
}

// deviceSlots reads every node's Device entries: node -> "type/minor" -> slot.
func deviceSlots(devices []unstructured.Unstructured) (map[string]map[string]deviceSlot, []string) {
	out := map[string]map[string]deviceSlot{}
	var problems []string
	for _, d := range devices {
		list, _, _ := unstructured.NestedSlice(d.Object, "spec", "devices")
		slots := map[string]deviceSlot{}
		for _, raw := range list {
			e, _ := raw.(map[string]any)
			kind, _ := e["type"].(string)
			minor, ok := e["minor"].(int64)
			if !ok {
				problems = append(problems, fmt.Sprintf("Device %s: an entry without an integer minor: %v", d.GetName(), e))
				continue
			}
			healthy, _ := e["health"].(bool)
			slot := deviceSlot{healthy: healthy, capacity: map[string]int64{}}
			res, _ := e["resources"].(map[string]any)
			for name, q := range res {
				qs, _ := q.(string)
				v, err := resource.ParseQuantity(qs)
				if err != nil {
					problems = append(problems, fmt.Sprintf("Device %s %s/%d: %s %v: %v", d.GetName(), kind, minor, name, q, err))
					continue
				}
				slot.capacity[name] = v.MilliValue()
			}
			key := fmt.Sprintf("%s/%d", kind, minor)
			if _, dup := slots[key]; !dup {
				slots[key] = slot
			}
		}
		out[d.GetName()] = slots
	}
	return out, problems
}

// cpuNumas reads every NRT's CPU → NUMA node map (koordlet's cpu-topology annotation).
func cpuNumas(nrts []unstructured.Unstructured) map[string]map[int]int {
	out := map[string]map[int]int{}
	for _, n := range nrts {
		var topo struct {
			Detail []struct {
				ID   int `json:"id"`
				Node int `json:"node"`
			} `json:"detail"`
		}
		if raw, ok := n.GetAnnotations()["node.koordinator.sh/cpu-topology"]; ok && json.Unmarshal([]byte(raw), &topo) == nil {
			m := map[int]int{}
			for _, c := range topo.Detail {
				m[c.ID] = c.Node
			}
			out[n.GetName()] = m
		}
	}
	return out
}

// numaZones reads every NRT's CPU ids (koordlet's cpu-topology annotation) and its NUMA zones'
// allocatable (zone "node-N"): node -> CPU ids, node -> NUMA node -> resource -> milli-units.
func numaZones(nrts []unstructured.Unstructured) (map[string]map[int]bool, map[string]map[int]map[string]int64) {
	cpus := map[string]map[int]bool{}
	zones := map[string]map[int]map[string]int64{}
	for _, n := range nrts {
		var topo struct {
			Detail []struct {
				ID int `json:"id"`
			} `json:"detail"`
		}
		if raw, ok := n.GetAnnotations()["node.koordinator.sh/cpu-topology"]; ok && json.Unmarshal([]byte(raw), &topo) == nil {
			ids := map[int]bool{}
			for _, c := range topo.Detail {
				ids[c.ID] = true
			}
			cpus[n.GetName()] = ids
		}
		list, _, _ := unstructured.NestedSlice(n.Object, "zones")
		byNuma := map[int]map[string]int64{}
		for _, raw := range list {
			z, _ := raw.(map[string]any)
			name, _ := z["name"].(string)
			var numa int
			if _, err := fmt.Sscanf(name, "node-%d", &numa); err != nil {
				continue
			}
			res := map[string]int64{}
			rl, _ := z["resources"].([]any)
			for _, r := range rl {
				rm, _ := r.(map[string]any)
				rn, _ := rm["name"].(string)
				qs, _ := rm["allocatable"].(string)
				if v, err := resource.ParseQuantity(qs); err == nil {
					res[rn] = v.MilliValue()
				}
			}
			byNuma[numa] = res
		}
		zones[n.GetName()] = byNuma
	}
	return cpus, zones
}

// deviceAsks is what a pod asks of managed devices, summed over its containers (an init
// container's where larger), in milli-units, keyed by the name koordinator records it under
// (reference/koord-deviceshare.md §2.2): whole-GPU names become gpu-core and gpu-memory-ratio
// of N×100 and N "cards"; koordinator.sh/gpu both of v; deprecated kubernetes.io/* names their
// koordinator.sh/* twins. Names kube-scheduler served through DRA (the pod status's request
// mappings) are left out: their devices are in a claim, not the annotation.
func deviceAsks(pod *corev1.Pod) map[string]int64 {
	served := map[string]bool{}
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		for _, m := range st.RequestMappings {
			served[m.ResourceName] = true
		}
	}
	of := func(c corev1.Container) map[string]int64 {
		out := map[string]int64{}
		names := map[corev1.ResourceName]resource.Quantity{}
		for n, q := range c.Resources.Limits {
			names[n] = q
		}
		for n, q := range c.Resources.Requests {
			names[n] = q
		}
		for n, q := range names {
			if served[string(n)] {
				continue
			}
			name := string(n)
			if rest, ok := strings.CutPrefix(name, "kubernetes.io/"); ok {
				name = "koordinator.sh/" + rest
			}
			v := q.MilliValue()
			switch name {
			case "nvidia.com/gpu", "amd.com/gpu", "dcu.com/gpu":
				out["koordinator.sh/gpu-core"] += 100 * v
				out["koordinator.sh/gpu-memory-ratio"] += 100 * v
				out["cards"] += v
			case "koordinator.sh/gpu":
				out["koordinator.sh/gpu-core"] += v
				out["koordinator.sh/gpu-memory-ratio"] += v
			case "koordinator.sh/gpu.shared":
				out["cards"] += v
			case "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio",
				"koordinator.sh/rdma", "koordinator.sh/fpga":
				out[name] += v
			}
		}
		return out
	}
	total := map[string]int64{}
	for _, c := range pod.Spec.Containers {
		for k, v := range of(c) {
			total[k] += v
		}
	}
	for _, c := range pod.Spec.InitContainers {
		for k, v := range of(c) {
			if v > total[k] {
				total[k] = v
			}
		}
	}
	for k, v := range total {
		if v <= 0 {
			delete(total, k)
		}
	}
	return total
}

// carriesWhatWasAsked says how an allocation differs from its pod's ask ("" if it does not):
// every asked dimension summed over the entries equals the ask, "cards" as distinct GPUs. Only
// dimensions the pod names: koordinator fills the others (a ratio's bytes).
func carriesWhatWasAsked(asks map[string]int64, devs map[string][]deviceEntry) string {
	var problems []string
	for dim, want := range asks {
		var got int64
		if dim == "cards" {
			minors := map[int]bool{}
			for _, e := range devs["gpu"] {
				minors[e.Minor] = true
			}
			got = 1000 * int64(len(minors))
		} else {
			for _, entries := range devs {
				for _, e := range entries {
					if q, ok := e.Resources[dim]; ok {
						if v, err := resource.ParseQuantity(q); err == nil {
							got += v.MilliValue()
						}
					}
				}
			}
		}
		if got != want {
			problems = append(problems, fmt.Sprintf("%s: asked %d, recorded %d (milli)", dim, want, got))
		}
	}
	sort.Strings(problems)
	return strings.Join(problems, "; ")
}

// podCPUMilli is the pod's CPU request summed over its containers (requests, else limits).
func podCPUMilli(pod *corev1.Pod) int64 {
	var milli int64
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Requests[corev1.ResourceCPU]
		if !ok {
			q = c.Resources.Limits[corev1.ResourceCPU]
		}
		milli += q.MilliValue()
	}
	return milli
}

// ledgerViolations is the oracle, from the API objects alone. Per node:
//  1. device shares: per type and minor, the sum of every resource over holding pods is within
//     what the node's Device object lists for that minor; a minor the Device does not list, an
//     unhealthy minor, or a node with no Device object holds nothing;
//  2. every allocation carries exactly what its pod asked (capacity sums pass an allocator that
//     records less than it hands out), and a pod asking for devices has an allocation;
//  3. exclusive cpusets: disjoint, on CPUs the NRT's topology lists, as large as the pod's
//     (whole) CPU request;
//  4. NUMA: per NUMA node, the cpu and memory of every holder's numaNodeResources within the
//     NRT zone's allocatable; on a Node carrying koordinator's amplification ratio, within the
//     zone × the ratio, the CPUs cpusets hold there counted × the ratio (koordinator v1.7.0
//     amplifyNUMANodeResources, getAvailableNUMANodeResources: shares − cpuset CPUs + their
//     amplified size). The cpusets themselves stay physical: 3. holds them disjoint.
func ledgerViolations(o clusterObjects) []string {
	slots, out := deviceSlots(o.devices)
	cpuIDs, zones := numaZones(o.nrts)
	cpuNuma := cpuNumas(o.nrts)
	ratios := map[string]map[string]float64{}
	for _, n := range o.nodes {
		raw, ok := n.Annotations["node.koordinator.sh/resource-amplification-ratio"]
		if !ok {
			continue
		}
		var r map[string]float64
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			continue // koordinator refuses every pod there: nothing is amplified
		}
		ratios[n.Name] = r
	}
	// amplify is koordinator's extension.Amplify on milli-units: ceil(units × ratio) for a ratio
	// above 1 (cpu in millicores; memory in bytes, so the milli-units are divided first).
	amplify := func(node, name string, milli int64) int64 {
		r := ratios[node][name]
		if r <= 1 || milli == 0 {
			return milli
		}
		if name == "cpu" {
			return int64(math.Ceil(float64(milli) * r))
		}
		return int64(math.Ceil(float64(milli/1000)*r)) * 1000
	}
	type key struct {
		node, slot string
	}
	used := map[key]map[string]int64{}
	holders := map[key][]string{}
	numaUsed := map[string]map[int]map[string]int64{}
	cpuOwner := map[string]map[int]string{}
	for i := range o.pods {
		pod := &o.pods[i]
		if !holds(pod) {
			continue
		}
		node := pod.Spec.NodeName
		devs, err := parseDeviceAllocated(pod)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		for kind, entries := range devs {
			for _, e := range entries {
				k := key{node, fmt.Sprintf("%s/%d", kind, e.Minor)}
				if used[k] == nil {
					used[k] = map[string]int64{}
				}
				for name, q := range e.Resources {
					v, err := resource.ParseQuantity(q)
					if err != nil {
						out = append(out, fmt.Sprintf("pod %s: %s %q: %v", pod.Name, name, q, err))
						continue
					}
					used[k][name] += v.MilliValue()
				}
				holders[k] = append(holders[k], pod.Name)
			}
		}
		asks := deviceAsks(pod)
		switch {
		// A pod that asked for devices and is bound must say which (koordlet needs the minors).
		case wantsDevices(pod) && len(devs) == 0 && len(asks) > 0:
			out = append(out, fmt.Sprintf("pod %s asks for devices, is bound to %s, and has no %s", pod.Name, node, annDeviceAllocated))
		case len(devs) > 0 && len(asks) > 0:
			if why := carriesWhatWasAsked(asks, devs); why != "" {
				out = append(out, fmt.Sprintf("pod %s on %s holds other than it asked: %s: %s", pod.Name, node, why, pod.Annotations[annDeviceAllocated]))
			}
		}
		rs, err := parseResourceStatus(pod)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		if rs == nil {
			continue
		}
		for _, n := range rs.NUMANodeResources {
			if numaUsed[node] == nil {
				numaUsed[node] = map[int]map[string]int64{}
			}
			if numaUsed[node][n.Node] == nil {
				numaUsed[node][n.Node] = map[string]int64{}
			}
			for name, q := range n.Resources {
				v, err := resource.ParseQuantity(q)
				if err != nil {
					out = append(out, fmt.Sprintf("pod %s: numaNodeResources %s %q: %v", pod.Name, name, q, err))
					continue
				}
				numaUsed[node][n.Node][name] += v.MilliValue()
			}
		}
		if rs.CPUSet == "" {
			continue
		}
		cpus, err := parseCPUList(rs.CPUSet)
		if err != nil {
			out = append(out, fmt.Sprintf("pod %s: %v", pod.Name, err))
			continue
		}
		if want := podCPUMilli(pod); want%1000 != 0 || int64(len(cpus)) != want/1000 {
			out = append(out, fmt.Sprintf("pod %s asked for %dm CPU and holds cpuset %q (%d CPUs)", pod.Name, want, rs.CPUSet, len(cpus)))
		}
		owners := cpuOwner[node]
		if owners == nil {
			owners = map[int]string{}
			cpuOwner[node] = owners
		}
		for _, c := range cpus {
			if !cpuIDs[node][c] {
				out = append(out, fmt.Sprintf("pod %s: cpu %d is not in node %s's CPU topology", pod.Name, c, node))
			}
			if other, taken := owners[c]; taken {
				out = append(out, fmt.Sprintf("cpu %d of %s is in the cpusets of %s and %s", c, node, other, pod.Name))
			}
			owners[c] = pod.Name
		}
	}
	for k, u := range used {
		nodeSlots, hasDevice := slots[k.node]
		slot, listed := nodeSlots[k.slot]
		switch {
		case !hasDevice:
			out = append(out, fmt.Sprintf("%s has no Device object and %s is held (holders %v)", k.node, k.slot, holders[k]))
			continue
		case !listed:
			out = append(out, fmt.Sprintf("%s %s is not in the node's Device object (holders %v)", k.node, k.slot, holders[k]))
			continue
		case !slot.healthy:
			out = append(out, fmt.Sprintf("%s %s is unhealthy and held (holders %v)", k.node, k.slot, holders[k]))
		}
		for name, v := range u {
			if c := slot.capacity[name]; v > c {
				out = append(out, fmt.Sprintf("%s %s: %s %d > %d milli (holders %v)", k.node, k.slot, name, v, c, holders[k]))
			}
		}
	}
	for node, byNuma := range numaUsed {
		// The CPUs cpusets hold on each NUMA node of this node.
		held := map[int]int64{}
		for c := range cpuOwner[node] {
			if numa, ok := cpuNuma[node][c]; ok {
				held[numa] += 1000
			}
		}
		for numa, u := range byNuma {
			zone, ok := zones[node][numa]
			if !ok {
				out = append(out, fmt.Sprintf("%s NUMA node %d is held but its NRT has no zone node-%d", node, numa, numa))
				continue
			}
			for name, v := range u {
				if name == "cpu" && held[numa] > 0 && v >= held[numa] {
					v = v - held[numa] + amplify(node, name, held[numa])
				}
				if c, ok := zone[name]; ok && v > amplify(node, name, c) {
					out = append(out, fmt.Sprintf("%s NUMA node %d: %s %d > %d milli", node, numa, name, v, amplify(node, name, c)))
				}
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

func (cp *controlPlane) assertNoViolations() {
	cp.t.Helper()
	if v := cp.violations(); len(v) > 0 {
		cp.t.Fatalf("over-allocation on the API server:\n  %s", strings.Join(v, "\n  "))
	}
}
