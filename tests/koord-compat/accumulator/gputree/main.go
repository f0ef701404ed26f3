// Command gputree records koordinator's own GPU topology allocator's answers for seeded random
// cases, as JSON lines on stdout: koordinator v1.7.0's
// pkg/scheduler/plugins/deviceshare.allocateByDeviceTopology (not exported: reached with
// go:linkname, its unexported argument types mirrored field for field in internal/mirror; build with
// -ldflags=-checklinkname=0) over the tree its exported GetGPUTopologyScope builds, scored by its
// own LeastAllocated/MostAllocated scorer with its default weights. This is the step that places
// a GPU request on a node whose GPUs all report a topology (the general case; the default
// allocator only runs without one). src/placement/device/allocate.rs replays every line.
//
//	go run -ldflags=-checklinkname=0 ./gputree -seed 1 -cases 3000 > ../gputree-cases.jsonl
//
// The cases: 2, 4 or 8 GPUs on 1 or 2 NUMA nodes with 1 or 2 PCIe switches each (minors in
// order); each GPU untouched, held whole, or partly held (25, 50 or 75 % of core, memory and
// ratio); a request of 1-4 whole GPUs or a 25/50/75 % share of one; LeastAllocated or
// MostAllocated.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"unsafe" // go:linkname; the scorer constructors return a pointer to an unexported type

	"github.com/device-numa-extender/device-numa-extender/tests/koord-compat/accumulator/internal/mirror"
	apiext "github.com/koordinator-sh/koordinator/apis/extension"
	schedulingv1alpha1 "github.com/koordinator-sh/koordinator/apis/scheduling/v1alpha1"
	schedulerconfig "github.com/koordinator-sh/koordinator/pkg/scheduler/apis/config"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/deviceshare"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

//go:linkname allocateByDeviceTopology github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/deviceshare.allocateByDeviceTopology
func allocateByDeviceTopology(gpuRequirements *mirror.GPURequirements, gpuTopologyScope *deviceshare.GPUTopologyScope, allocateContext *mirror.AllocateContext) ([]*apiext.DeviceAllocation, *framework.Status)

// The scorer constructors, keyed by strategy (deviceshare's own map).
//
//go:linkname deviceResourceStrategyTypeMap github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/deviceshare.deviceResourceStrategyTypeMap
var deviceResourceStrategyTypeMap map[schedulerconfig.ScoringStrategyType]func(args *schedulerconfig.DeviceShareArgs) unsafe.Pointer

type gpu struct {
	Minor int    `json:"minor"`
	NUMA  int    `json:"numa"`
	PCIe  string `json:"pcie"`
	// Percent held (0-100) of core, memory and ratio alike.
	Used int `json:"used"`
}

type record struct {
	GPUs     []gpu  `json:"gpus"`
	Count    int    `json:"count"`
	Share    int    `json:"share,omitempty"` // percent of one GPU; 0 for whole GPUs
	Strategy string `json:"strategy"`
	Minors   []int  `json:"minors,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

const memory = 80 << 30

func resources(percent int) corev1.ResourceList {
	return corev1.ResourceList{
		apiext.ResourceGPUCore:        *resource.NewQuantity(int64(percent), resource.DecimalSI),
		apiext.ResourceGPUMemoryRatio: *resource.NewQuantity(int64(percent), resource.DecimalSI),
		apiext.ResourceGPUMemory:      *resource.NewQuantity(int64(memory/100*percent), resource.BinarySI),
	}
}

func main() {
	seed := flag.Int64("seed", 1, "random seed")
	cases := flag.Int("cases", 3000, "number of cases")
	flag.Parse()
	r := rand.New(rand.NewSource(*seed))
	out := json.NewEncoder(os.Stdout)
	weights := []schedconfig.ResourceSpec{
		{Name: string(apiext.ResourceGPUMemoryRatio), Weight: 1},
		{Name: string(apiext.ResourceGPUMemory), Weight: 1},
		{Name: string(apiext.ResourceRDMA), Weight: 1},
		{Name: string(apiext.ResourceFPGA), Weight: 1},
	}
	for written := 0; written < *cases; written++ {
		n := []int{2, 4, 8}[r.Intn(3)]
		numas := 1 + r.Intn(2)
		pcies := 1 + r.Intn(2)
		perNUMA := (n + numas - 1) / numas
		perPCIe := (perNUMA + pcies - 1) / pcies
		rec := record{Strategy: []string{"LeastAllocated", "MostAllocated"}[r.Intn(2)]}
		var infos []*schedulingv1alpha1.DeviceInfo
		total := map[int]corev1.ResourceList{}
		free := map[int]corev1.ResourceList{}
		usedHash := 0
		for m := 0; m < n; m++ {
			numa := m / perNUMA
			g := gpu{Minor: m, NUMA: numa, PCIe: fmt.Sprintf("pci%d-%d", numa, (m%perNUMA)/perPCIe)}
			switch r.Intn(4) {
			case 1:
				g.Used = 100
			case 2:
				g.Used = []int{25, 50, 75}[r.Intn(3)]
			}
			rec.GPUs = append(rec.GPUs, g)
			minor := int32(m)
			infos = append(infos, &schedulingv1alpha1.DeviceInfo{
				Type:      schedulingv1alpha1.GPU,
				Minor:     &minor,
				Health:    true,
				Resources: resources(100),
				Topology: &schedulingv1alpha1.DeviceTopology{
					SocketID: int32(numa), NodeID: int32(numa), PCIEID: g.PCIe,
				},
			})
			total[m] = resources(100)
			if g.Used < 100 {
				free[m] = resources(100 - g.Used)
			} else {
				free[m] = resources(0)
			}
			if g.Used > 0 {
				usedHash |= 1 << m
			}
		}
		req := &mirror.GPURequirements{}
		if r.Intn(3) == 0 {
			rec.Share = []int{25, 50, 75}[r.Intn(3)]
			rec.Count = 1
			req.GPUShared = true
			req.NumberOfGPUs = 1
			req.RequestsPerGPU = resources(rec.Share)
		} else {
			rec.Count = 1 + r.Intn(4)
			req.NumberOfGPUs = rec.Count
			req.RequestsPerGPU = resources(100)
		}
		args := &schedulerconfig.DeviceShareArgs{ScoringStrategy: &schedulerconfig.ScoringStrategy{
			Type: schedulerconfig.ScoringStrategyType(rec.Strategy), Resources: weights,
		}}
		ctx := &mirror.AllocateContext{
			DeviceUsedMinorsHash: usedHash,
			DeviceFree:           free,
			DeviceTotal:          total,
			AllocationScorer:     deviceResourceStrategyTypeMap[args.ScoringStrategy.Type](args),
		}
		scope := deviceshare.GetGPUTopologyScope(infos, total)
		allocations, status := allocateByDeviceTopology(req, scope, ctx)
		if !status.IsSuccess() {
			rec.Reason = status.Message()
		}
		for _, a := range allocations {
			rec.Minors = append(rec.Minors, int(a.Minor))
		}
		if err := out.Encode(rec); err != nil {
			panic(err)
		}
	}
}
