// Command numaamp records koordinator's own NUMA-level amplification for seeded random cases, as
// JSON lines on stdout: koordinator v1.7.0's pkg/scheduler/plugins/nodenumaresource with a
// Node CPU (and sometimes memory) amplification ratio
// (node.koordinator.sh/resource-amplification-ratio). Each case is a node (koordinator's test
// topology layout, NUMA resources of CPUs x 1000 millicores and some memory), pods already on it
// (cpuset pods whose NUMA shares are their CPUs, and NUMA-bound pods without a cpuset), and a pod
// to place (a cpuset of some CPUs, required or preferred policy, or millicores without a cpuset)
// under a node NUMA policy. Recorded, all by koordinator's code:
//
//   - available: each NUMA node's available cpu and memory (getAvailableNUMANodeResources after
//     the plugin's getResourceOptions has amplified the NUMA resources, amplifyNUMANodeResources);
//   - hints: every NUMA mask GetTopologyHints offers for cpu, with its NUMA score
//     (numaScoringStrategy, the pod's request amplified when it gets a cpuset), and those it
//     offers for memory;
//   - the allocation on one mask (Allocate: its NUMA shares and cpuset, or its refusal);
//   - under no NUMA policy, a cpuset pod's node score (scoreWithAmplifiedCPUs).
//
// The unexported functions are reached with go:linkname, their unexported argument types
// mirrored in internal/mirror; build with -ldflags=-checklinkname=0.
// src/placement/cpu/amplified_cases.rs replays every line.
//
//	go run -ldflags=-checklinkname=0 ./numaamp -seed 1 -cases 2000 > ../numaamp-cases.jsonl 2>/dev/null
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"unsafe" // go:linkname; pointers to unexported types

	"github.com/device-numa-extender/device-numa-extender/tests/koord-compat/accumulator/internal/koordtopo"
	"github.com/device-numa-extender/device-numa-extender/tests/koord-compat/accumulator/internal/mirror"
	apiext "github.com/koordinator-sh/koordinator/apis/extension"
	schedulingconfig "github.com/koordinator-sh/koordinator/pkg/scheduler/apis/config"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/frameworkext/topologymanager"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource"
	"github.com/koordinator-sh/koordinator/pkg/util/bitmask"
	"github.com/koordinator-sh/koordinator/pkg/util/cpuset"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

//go:linkname getResourceOptions github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource.(*Plugin).getResourceOptions
func getResourceOptions(p *nodenumaresource.Plugin, state *mirror.PreFilterState, node *corev1.Node, pod *corev1.Pod, requestCPUBind bool, affinity topologymanager.NUMATopologyHint, topologyOptions nodenumaresource.TopologyOptions) (*mirror.ResourceOptions, error)

//go:linkname getAvailableNUMANodeResources github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource.(*NodeAllocation).getAvailableNUMANodeResources
func getAvailableNUMANodeResources(n *nodenumaresource.NodeAllocation, topologyOptions nodenumaresource.TopologyOptions, reusableResources map[int]corev1.ResourceList) (totalAvailable, totalAllocated map[int]corev1.ResourceList)

//go:linkname getTopologyHints github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource.(*resourceManager).GetTopologyHints
func getTopologyHints(c unsafe.Pointer, node *corev1.Node, pod *corev1.Pod, options *mirror.ResourceOptions, policy apiext.NUMATopologyPolicy, restoreState *mirror.RestoreState) (map[string][]topologymanager.NUMATopologyHint, error)

//go:linkname scoreWithAmplifiedCPUs github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource.(*Plugin).scoreWithAmplifiedCPUs
func scoreWithAmplifiedCPUs(p *nodenumaresource.Plugin, state *mirror.PreFilterState, nodeInfo *framework.NodeInfo, resourceOptions *mirror.ResourceOptions) (int64, *framework.Status)

// The scorer constructors, keyed by strategy (the plugin's own map).
//
//go:linkname resourceStrategyTypeMap github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource.resourceStrategyTypeMap
var resourceStrategyTypeMap map[schedulingconfig.ScoringStrategyType]func(args *schedulingconfig.NodeNUMAResourceArgs) unsafe.Pointer

// handle is the one part of a framework handle NewResourceManager reads.
type handle struct {
	framework.Handle
	informers informers.SharedInformerFactory
}

func (h handle) SharedInformerFactory() informers.SharedInformerFactory { return h.informers }

type share struct {
	Node   int   `json:"node"`
	Milli  int64 `json:"cpu_milli"`
	Memory int64 `json:"memory"`
}

type heldPod struct {
	CPUSet string  `json:"cpuset,omitempty"`
	Shares []share `json:"numa"`
}

type amounts struct {
	Milli  int64 `json:"cpu_milli"`
	Memory int64 `json:"memory"`
}

type hint struct {
	Mask  []int `json:"mask"`
	Score int64 `json:"score"`
}

type record struct {
	Topology [4]int    `json:"topology"` // sockets, NUMA per socket, cores per NUMA, threads
	Memory   []int64   `json:"numa_memory"`
	Ratio    string    `json:"ratio"` // the Node annotation
	Policy   string    `json:"numa_policy"`
	Strategy string    `json:"strategy"` // node, NUMA and NUMA-allocate strategy alike
	Pods     []heldPod `json:"pods"`
	// The pod: CPUs of a cpuset (Bind set) or millicores.
	Bind     string `json:"bind,omitempty"`
	Required bool   `json:"required,omitempty"`
	CPUs     int    `json:"cpus,omitempty"`
	Milli    int64  `json:"cpu_milli,omitempty"`
	PodMem   int64  `json:"memory"`
	Mask     []int  `json:"mask"`
	// koordinator's answers.
	Available []amounts `json:"available"`
	Hints     []hint    `json:"hints"`
	MemHints  [][]int   `json:"memory_hints"`
	Shares    []share   `json:"shares,omitempty"`
	CPUSet    string    `json:"cpuset,omitempty"`
	Refused   string    `json:"refused,omitempty"`
	NodeScore *int64    `json:"node_score,omitempty"`
}

const gi = int64(1) << 30

func main() {
	seed := flag.Int64("seed", 1, "random seed")
	cases := flag.Int("cases", 2000, "number of cases")
	flag.Parse()
	r := rand.New(rand.NewSource(*seed))
	out := json.NewEncoder(os.Stdout)
	ratios := []string{`{"cpu":1.5}`, `{"cpu":2}`, `{"cpu":1.25}`, `{"cpu":1.33}`, `{"cpu":3}`,
		`{"cpu":1.5,"memory":1.2}`, `{"cpu":2.5,"memory":1.5}`, `{"cpu":1.1}`}
	policies := []apiext.NUMATopologyPolicy{apiext.NUMATopologyPolicyNone, apiext.NUMATopologyPolicyBestEffort,
		apiext.NUMATopologyPolicyRestricted, apiext.NUMATopologyPolicySingleNUMANode}
	for written := 0; written < *cases; {
		dims := [4]int{1 + r.Intn(2), 1 + r.Intn(2), []int{2, 3, 4, 6}[r.Intn(4)], 1 + r.Intn(2)}
		topo := koordtopo.New(dims[0], dims[1], dims[2], dims[3])
		numa := topo.NumNodes
		rec := record{
			Topology: dims,
			Ratio:    ratios[r.Intn(len(ratios))],
			Policy:   string(policies[r.Intn(len(policies))]),
			Strategy: []string{"LeastAllocated", "MostAllocated"}[r.Intn(2)],
		}
		for i := 0; i < numa; i++ {
			rec.Memory = append(rec.Memory, []int64{8, 16, 32}[r.Intn(3)]*gi)
		}
		// Pods already on the node: each a cpuset pod (its CPUs on one or two NUMA nodes, shared
		// as CPUs x 1000) or a NUMA-bound pod without one (millicores on one or two NUMA nodes).
		free := topo.CPUDetails.CPUs()
		memUsed := make([]int64, numa)
		for p, n := 0, r.Intn(5); p < n; p++ {
			nodes := []int{r.Intn(numa)}
			if numa > 1 && r.Intn(3) == 0 {
				other := r.Intn(numa)
				if other != nodes[0] {
					nodes = append(nodes, other)
				}
			}
			sort.Ints(nodes)
			var pod heldPod
			var cpus []int
			withCPUSet := r.Intn(2) == 0
			for _, node := range nodes {
				mem := int64(1+r.Intn(4)) * gi
				if memUsed[node]+mem > rec.Memory[node] {
					mem = 0
				}
				memUsed[node] += mem
				if withCPUSet {
					there := free.Intersection(topo.CPUDetails.CPUsInNUMANodes(node)).ToSlice()
					if len(there) == 0 {
						continue
					}
					take := 1 + r.Intn(len(there))
					cpus = append(cpus, there[:take]...)
					free = free.Difference(cpuset.NewCPUSet(there[:take]...))
					pod.Shares = append(pod.Shares, share{Node: node, Milli: int64(take) * 1000, Memory: mem})
				} else {
					pod.Shares = append(pod.Shares, share{Node: node, Milli: int64(250 * (1 + r.Intn(16))), Memory: mem})
				}
			}
			if len(pod.Shares) == 0 {
				continue
			}
			if withCPUSet {
				pod.CPUSet = cpuset.NewCPUSet(cpus...).String()
			}
			rec.Pods = append(rec.Pods, pod)
		}
		// The pod to place.
		if r.Intn(3) > 0 {
			rec.Bind = []string{schedulingconfig.CPUBindPolicyFullPCPUs, schedulingconfig.CPUBindPolicySpreadByPCPUs}[r.Intn(2)]
			rec.Required = r.Intn(2) == 0
			rec.CPUs = 1 + r.Intn(topo.NumCPUs)
			if rec.Bind == schedulingconfig.CPUBindPolicyFullPCPUs && dims[3] > 1 {
				rec.CPUs += rec.CPUs % dims[3] // whole cores, as a FullPCPUs pod asks
			}
		} else {
			rec.Milli = int64(250 * (1 + r.Intn(4*topo.NumCPUs)))
		}
		rec.PodMem = int64(1+r.Intn(8)) * gi
		for i := 0; i < numa; i++ {
			if r.Intn(2) == 0 {
				rec.Mask = append(rec.Mask, i)
			}
		}
		if len(rec.Mask) == 0 {
			rec.Mask = []int{r.Intn(numa)}
		}
		if rec.Policy == string(apiext.NUMATopologyPolicyNone) && rec.Bind == "" {
			continue // no NUMA policy, no cpuset: nothing of NUMA placement applies
		}
		answer(&rec, topo)
		if err := out.Encode(rec); err != nil {
			panic(err)
		}
		written++
	}
}

func milli(m int64) resource.Quantity { return *resource.NewMilliQuantity(m, resource.DecimalSI) }
func bytes(b int64) resource.Quantity { return *resource.NewQuantity(b, resource.BinarySI) }

// answer fills rec's koordinator answers.
func answer(rec *record, topo *nodenumaresource.CPUTopology) {
	const nodeName = "amp"
	numa := topo.NumNodes
	var numaResources []nodenumaresource.NUMANodeResource
	var totalMilli, totalMemory int64
	for i := 0; i < numa; i++ {
		cpus := int64(topo.CPUDetails.CPUsInNUMANodes(i).Size()) * 1000
		numaResources = append(numaResources, nodenumaresource.NUMANodeResource{Node: i, Resources: corev1.ResourceList{
			corev1.ResourceCPU: milli(cpus), corev1.ResourceMemory: bytes(rec.Memory[i]),
		}})
		totalMilli += cpus
		totalMemory += rec.Memory[i]
	}
	// koord-manager's Node: allocatable amplified as a whole.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: map[string]string{
		apiext.AnnotationNodeResourceAmplificationRatio: rec.Ratio,
	}}}
	ratios, err := apiext.GetNodeResourceAmplificationRatios(node.Annotations)
	if err != nil {
		panic(err)
	}
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: milli(totalMilli), corev1.ResourceMemory: bytes(totalMemory)}
	apiext.AmplifyResourceList(node.Status.Allocatable, ratios)

	topologyOptions := nodenumaresource.TopologyOptions{
		CPUTopology:        topo,
		MaxRefCount:        1,
		NUMATopologyPolicy: apiext.NUMATopologyPolicy(rec.Policy),
		NUMANodeResources:  numaResources,
	}
	tom := nodenumaresource.NewTopologyOptionsManager()
	tom.UpdateTopologyOptions(nodeName, func(o *nodenumaresource.TopologyOptions) { *o = topologyOptions })
	strategy := schedulingconfig.NUMALeastAllocated
	scoring := schedulingconfig.LeastAllocated
	if rec.Strategy == "MostAllocated" {
		strategy, scoring = schedulingconfig.NUMAMostAllocated, schedulingconfig.MostAllocated
	}
	manager := nodenumaresource.NewResourceManager(handle{informers: informers.NewSharedInformerFactory(kubefake.NewSimpleClientset(), 0)}, strategy, tom)

	var pods []*corev1.Pod
	for i, held := range rec.Pods {
		alloc := &nodenumaresource.PodAllocation{UID: types.UID(fmt.Sprintf("held-%d", i)), Namespace: "default", Name: fmt.Sprintf("held-%d", i)}
		if held.CPUSet != "" {
			alloc.CPUSet = cpuset.MustParse(held.CPUSet)
		}
		var podMilli, podMemory int64
		for _, s := range held.Shares {
			alloc.NUMANodeResources = append(alloc.NUMANodeResources, nodenumaresource.NUMANodeResource{Node: s.Node, Resources: corev1.ResourceList{
				corev1.ResourceCPU: milli(s.Milli), corev1.ResourceMemory: bytes(s.Memory),
			}})
			podMilli += s.Milli
			podMemory += s.Memory
		}
		manager.Update(nodeName, alloc)
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{UID: alloc.UID, Namespace: alloc.Namespace, Name: alloc.Name},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: milli(podMilli), corev1.ResourceMemory: bytes(podMemory)},
			}}}},
		})
	}

	bind := rec.Bind != ""
	podMilli := rec.Milli
	if bind {
		podMilli = int64(rec.CPUs) * 1000
	}
	requests := corev1.ResourceList{corev1.ResourceCPU: milli(podMilli), corev1.ResourceMemory: bytes(rec.PodMem)}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "incoming", Namespace: "default", Name: "incoming"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: requests}}}},
	}
	state := &mirror.PreFilterState{RequestCPUBind: bind, Requests: requests, NumCPUsNeeded: int(podMilli / 1000)}
	if rec.Required {
		state.RequiredCPUBindPolicy = rec.Bind
	} else {
		state.PreferredCPUBindPolicy = rec.Bind
	}
	mask, err := bitmask.NewBitMask(rec.Mask...)
	if err != nil {
		panic(err)
	}
	options, err := getResourceOptions(nil, state, node, pod, bind, topologymanager.NUMATopologyHint{NUMANodeAffinity: mask}, topologyOptions)
	if err != nil {
		panic(err)
	}
	args := &schedulingconfig.NodeNUMAResourceArgs{ScoringStrategy: &schedulingconfig.ScoringStrategy{
		Type:      scoring,
		Resources: []schedconfig.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}},
	}}
	scorer := resourceStrategyTypeMap[scoring](args)
	options.NUMAScorer = scorer

	available, _ := getAvailableNUMANodeResources(manager.GetNodeAllocation(nodeName), options.TopologyOptions, nil)
	for i := 0; i < numa; i++ {
		cpu, memory := available[i][corev1.ResourceCPU], available[i][corev1.ResourceMemory]
		rec.Available = append(rec.Available, amounts{Milli: cpu.MilliValue(), Memory: memory.Value()})
	}

	if rec.Policy != string(apiext.NUMATopologyPolicyNone) {
		hintOptions := *options
		receiver := (*[2]unsafe.Pointer)(unsafe.Pointer(&manager))[1]
		hints, err := getTopologyHints(receiver, node, pod, &hintOptions, apiext.NUMATopologyPolicy(rec.Policy), &mirror.RestoreState{})
		if err != nil {
			panic(err)
		}
		rec.Hints = []hint{}
		for _, h := range hints[string(corev1.ResourceCPU)] {
			rec.Hints = append(rec.Hints, hint{Mask: h.NUMANodeAffinity.GetBits(), Score: h.Score})
		}
		rec.MemHints = [][]int{}
		for _, h := range hints[string(corev1.ResourceMemory)] {
			rec.MemHints = append(rec.MemHints, h.NUMANodeAffinity.GetBits())
		}

		allocOptions := *options
		allocOptions.Hint = topologymanager.NUMATopologyHint{NUMANodeAffinity: mask}
		allocOptions.ReusableResources = map[int]corev1.ResourceList{}
		allocation, status := manager.Allocate(node, pod, (*nodenumaresource.ResourceOptions)(unsafe.Pointer(&allocOptions)))
		if !status.IsSuccess() {
			// Its reasons come from a map: sorted, so the file is the same every run.
			reasons := append([]string(nil), status.Reasons()...)
			sort.Strings(reasons)
			rec.Refused = strings.Join(reasons, ", ")
		} else {
			for _, s := range allocation.NUMANodeResources {
				cpu, memory := s.Resources[corev1.ResourceCPU], s.Resources[corev1.ResourceMemory]
				rec.Shares = append(rec.Shares, share{Node: s.Node, Milli: cpu.MilliValue(), Memory: memory.Value()})
			}
			rec.CPUSet = allocation.CPUSet.String()
		}
	} else {
		plugin := &mirror.Plugin{PluginArgs: args, Scorer: scorer, NUMAScorer: scorer, ResourceManager: manager, TopologyOptionsManager: tom}
		nodeInfo := framework.NewNodeInfo(pods...)
		nodeInfo.SetNode(node)
		score, status := scoreWithAmplifiedCPUs((*nodenumaresource.Plugin)(unsafe.Pointer(plugin)), state, nodeInfo, options)
		if !status.IsSuccess() {
			panic(status.AsError())
		}
		rec.NodeScore = &score
	}
}
