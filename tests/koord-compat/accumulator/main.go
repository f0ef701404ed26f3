// Command accumulator records koordinator's own cpuset accumulator's answers for seeded random
// cases, as JSON lines on stdout: koordinator v1.7.0's
// pkg/scheduler/plugins/nodenumaresource.takeCPUs, reached with go:linkname (it is not
// exported; build with -ldflags=-checklinkname=0). src/placement/cpu/koord_cases.rs replays
// every line through this project's accumulator and requires the same cpuset.
//
//	go run -ldflags=-checklinkname=0 . -seed 1 -cases 3000 > ../accumulator-cases.jsonl
//
// The cases: koordinator's test topology layout (sockets x NUMA nodes per socket x cores per NUMA
// node x threads per core, CPU ids sequential, a core's threads adjacent); a random share of
// CPUs held, each holder CPU with a random exclusive policy; a request of any size up to the
// free CPUs (whole cores for FullPCPUs with SMT, as the scheduler only asks for those), any bind
// policy, exclusive policy and NUMA strategy. Reference counts > 1 and reservation-preferred CPUs
// are left out (never used by this project). After them, -refusals cases (from their own seeded
// stream, so the cases above never change) ask for more than is free: more CPUs than are free,
// or for FullPCPUs one whole core more than are entirely free; koordinator's refusals are
// recorded as "error" and must be this project's refusals too.
package main

import (
	"encoding/json"
	"flag"
	"math/rand"
	"os"
	_ "unsafe" // go:linkname

	"github.com/device-numa-extender/device-numa-extender/tests/koord-compat/accumulator/internal/koordtopo"
	schedulingconfig "github.com/koordinator-sh/koordinator/pkg/scheduler/apis/config"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource"
	"github.com/koordinator-sh/koordinator/pkg/util/cpuset"
)

//go:linkname takeCPUs github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource.takeCPUs
func takeCPUs(
	topology *nodenumaresource.CPUTopology,
	maxRefCount int,
	availableCPUs cpuset.CPUSet,
	allocatedCPUs nodenumaresource.CPUDetails,
	numCPUsNeeded int,
	cpuBindPolicy schedulingconfig.CPUBindPolicy,
	cpuExclusivePolicy schedulingconfig.CPUExclusivePolicy,
	numaAllocatedStrategy schedulingconfig.NUMAAllocateStrategy,
) (cpuset.CPUSet, error)

// One case and koordinator's answer ("" with Error set when it refused).
type record struct {
	Topology  [4]int `json:"topology"` // sockets, NUMA per socket, cores per NUMA, threads
	Allocated string `json:"allocated"`
	HeldPCPU  string `json:"held_pcpu_level"`
	HeldNUMA  string `json:"held_numa_node_level"`
	Need      int    `json:"need"`
	Policy    string `json:"policy"`
	Exclusive string `json:"exclusive"`
	Strategy  string `json:"strategy"`
	Answer    string `json:"answer"`
	Error     string `json:"error,omitempty"`
}

func main() {
	seed := flag.Int64("seed", 1, "random seed")
	cases := flag.Int("cases", 5000, "number of cases")
	refusals := flag.Int("refusals", 300, "cases after them that ask for more than is free")
	flag.Parse()
	r := rand.New(rand.NewSource(*seed))
	pick := func(xs ...int) int { return xs[r.Intn(len(xs))] }
	out := json.NewEncoder(os.Stdout)
	policies := []schedulingconfig.CPUBindPolicy{schedulingconfig.CPUBindPolicyFullPCPUs, schedulingconfig.CPUBindPolicySpreadByPCPUs}
	exclusives := []schedulingconfig.CPUExclusivePolicy{schedulingconfig.CPUExclusivePolicyNone, schedulingconfig.CPUExclusivePolicyPCPULevel, schedulingconfig.CPUExclusivePolicyNUMANodeLevel}
	strategies := []schedulingconfig.NUMAAllocateStrategy{schedulingconfig.NUMAMostAllocated, schedulingconfig.NUMALeastAllocated}
	for written := 0; written < *cases; {
		dims := [4]int{pick(1, 2), pick(1, 2), pick(1, 2, 3, 4, 8), pick(1, 2)}
		topo := koordtopo.New(dims[0], dims[1], dims[2], dims[3])
		share := []float64{0, 0.1, 0.25, 0.5, 0.75}[r.Intn(5)]
		allocated := nodenumaresource.CPUDetails{}
		var held, pcpu, numa []int
		for cpu := 0; cpu < topo.NumCPUs; cpu++ {
			if r.Float64() >= share {
				continue
			}
			info := topo.CPUDetails[cpu]
			switch r.Intn(6) {
			case 0:
				info.ExclusivePolicy = schedulingconfig.CPUExclusivePolicyPCPULevel
				pcpu = append(pcpu, cpu)
			case 1:
				info.ExclusivePolicy = schedulingconfig.CPUExclusivePolicyNUMANodeLevel
				numa = append(numa, cpu)
			}
			allocated[cpu] = info
			held = append(held, cpu)
		}
		heldSet := cpuset.NewCPUSet(held...)
		available := topo.CPUDetails.CPUs().Difference(heldSet)
		if available.Size() == 0 {
			continue
		}
		policy := policies[r.Intn(2)]
		need := 1 + r.Intn(available.Size())
		if policy == schedulingconfig.CPUBindPolicyFullPCPUs && dims[3] > 1 {
			need -= need % dims[3]
			if need == 0 {
				continue
			}
		}
		exclusive := exclusives[r.Intn(3)]
		strategy := strategies[r.Intn(2)]
		rec := record{
			Topology:  dims,
			Allocated: heldSet.String(),
			HeldPCPU:  cpuset.NewCPUSet(pcpu...).String(),
			HeldNUMA:  cpuset.NewCPUSet(numa...).String(),
			Need:      need,
			Policy:    string(policy),
			Exclusive: string(exclusive),
			Strategy:  string(strategy),
		}
		answer(out, rec, topo, available, allocated)
		written++
	}
	// Then cases meant to be refused, from their own stream (the cases above stay as they
	// were recorded): more CPUs than are free, or for FullPCPUs more whole cores than are
	// entirely free. koordinator decides; both its refusals and any answer are recorded.
	rr := rand.New(rand.NewSource(*seed + 1_000_003))
	for n := 0; n < *refusals; {
		dims := [4]int{1 + rr.Intn(2), 1 + rr.Intn(2), []int{1, 2, 3, 4, 8}[rr.Intn(5)], 1 + rr.Intn(2)}
		topo := koordtopo.New(dims[0], dims[1], dims[2], dims[3])
		allocated := nodenumaresource.CPUDetails{}
		var held []int
		for cpu := 0; cpu < topo.NumCPUs; cpu++ {
			if rr.Intn(3) == 0 {
				allocated[cpu] = topo.CPUDetails[cpu]
				held = append(held, cpu)
			}
		}
		heldSet := cpuset.NewCPUSet(held...)
		available := topo.CPUDetails.CPUs().Difference(heldSet)
		policy := policies[rr.Intn(2)]
		need := available.Size() + 1 + rr.Intn(dims[3]+1)
		if policy == schedulingconfig.CPUBindPolicyFullPCPUs && dims[3] > 1 {
			// Whole cores (two threads each here): one more than are entirely free.
			fullyFree := 0
			for core := 0; core < topo.NumCores; core++ {
				if available.Contains(core*dims[3]) && available.Contains(core*dims[3]+1) {
					fullyFree++
				}
			}
			need = (fullyFree + 1) * dims[3]
		}
		if need > topo.NumCPUs {
			continue
		}
		exclusive := exclusives[rr.Intn(3)]
		strategy := strategies[rr.Intn(2)]
		rec := record{
			Topology:  dims,
			Allocated: heldSet.String(),
			HeldPCPU:  "",
			HeldNUMA:  "",
			Need:      need,
			Policy:    string(policy),
			Exclusive: string(exclusive),
			Strategy:  string(strategy),
		}
		answer(out, rec, topo, available, allocated)
		n++
	}
}

// answer records koordinator's answer to rec (its refusal as Error) on out.
func answer(out *json.Encoder, rec record, topo *nodenumaresource.CPUTopology, available cpuset.CPUSet, allocated nodenumaresource.CPUDetails) {
	got, err := takeCPUs(topo, 1, available, allocated, rec.Need,
		schedulingconfig.CPUBindPolicy(rec.Policy), schedulingconfig.CPUExclusivePolicy(rec.Exclusive),
		schedulingconfig.NUMAAllocateStrategy(rec.Strategy))
	if err != nil {
		rec.Error = err.Error()
	} else {
		rec.Answer = got.String()
	}
	if err := out.Encode(rec); err != nil {
		panic(err)
	}
}
