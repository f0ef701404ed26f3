// Command partitions records koordinator's own GPU partition step's answers for seeded random
// cases, as JSON lines on stdout: koordinator v1.7.0's
// pkg/scheduler/plugins/deviceshare.allocateByPartition (not exported: reached with go:linkname,
// its two unexported argument types mirrored field for field in internal/mirror; build with
// -ldflags=-checklinkname=0), over tables indexed by koordinator's exported
// GetGPUPartitionIndexer, or its built-in GPUPartitionIndexOfNVIDIAHopper.
// src/placement/device/partition.rs replays every line through this project's partition step
// and requires the same answer.
//
//	go run -ldflags=-checklinkname=0 ./partitions -seed 1 -cases 3000 > ../partition-cases.jsonl
//
// The cases: 8 or 16 GPU minors, some unhealthy (absent from the total) and some used; the
// built-in Hopper table or a random table (sizes 1, 2, 4, 8; partitions of distinct minors of
// the size they are listed under; allocation scores 0-2; some with a ring bus bandwidth); a
// whole-GPU request of 1-8 GPUs; the node's Honor/Prefer policy; no pod spec, or one with
// Restricted/BestEffort and sometimes a bandwidth wish.
package main

import (
	"encoding/json"
	"flag"
	"math/rand"
	"os"
	_ "unsafe" // go:linkname

	"github.com/device-numa-extender/device-numa-extender/tests/koord-compat/accumulator/internal/mirror"
	apiext "github.com/koordinator-sh/koordinator/apis/extension"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/deviceshare"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

//go:linkname allocateByPartition github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/deviceshare.allocateByPartition
func allocateByPartition(honorGPUPartition bool, gpuRequirements *mirror.GPURequirements, gpuPartitionIndexer deviceshare.GPUPartitionIndexer, allocateContext *mirror.AllocateContext) ([]*apiext.DeviceAllocation, *framework.Status)

// One case and koordinator's answer.
type record struct {
	// The Device annotation's value (koordinator's own JSON form); empty for the built-in table.
	Table     string `json:"table,omitempty"`
	Builtin   bool   `json:"builtin,omitempty"`
	NodeHonor bool   `json:"node_honor"`
	Total     []int  `json:"total"`
	Used      []int  `json:"used"`
	Count     int    `json:"count"`
	Spec      string `json:"spec,omitempty"`
	// The partition's minors; empty with Reason when a rule failed; neither when left to the
	// general allocator.
	Minors []int  `json:"minors,omitempty"`
	Reason string `json:"reason,omitempty"`
}

func main() {
	seed := flag.Int64("seed", 1, "random seed")
	cases := flag.Int("cases", 3000, "number of cases")
	flag.Parse()
	r := rand.New(rand.NewSource(*seed))
	out := json.NewEncoder(os.Stdout)
	bandwidths := []string{"100Gi", "200Gi", "400Gi", "800Gi"}
	for written := 0; written < *cases; written++ {
		gpus := []int{8, 8, 16}[r.Intn(3)]
		rec := record{NodeHonor: r.Intn(2) == 0, Count: []int{1, 2, 2, 4, 4, 8, 3}[r.Intn(7)]}
		var indexer deviceshare.GPUPartitionIndexer
		if r.Intn(3) == 0 {
			rec.Builtin = true
			indexer = deviceshare.GPUPartitionIndexOfNVIDIAHopper
		} else if r.Intn(8) != 0 {
			table := apiext.GPUPartitionTable{}
			for _, size := range []int{1, 2, 4, 8} {
				if r.Intn(5) == 0 {
					continue
				}
				for n := r.Intn(6); n > 0; n-- {
					p := apiext.GPUPartition{
						Minors:          r.Perm(gpus)[:size],
						GPULinkType:     apiext.GPUNVLink,
						AllocationScore: r.Intn(3),
					}
					if r.Intn(3) == 0 {
						q := resource.MustParse(bandwidths[r.Intn(len(bandwidths))])
						p.RingBusBandwidth = &q
					}
					table[size] = append(table[size], p)
				}
			}
			raw, err := json.Marshal(table)
			if err != nil {
				panic(err)
			}
			rec.Table = string(raw)
			// Index a decoded copy, as koordinator does with the Device's annotation.
			decoded := apiext.GPUPartitionTable{}
			if err := json.Unmarshal(raw, &decoded); err != nil {
				panic(err)
			}
			indexer = deviceshare.GetGPUPartitionIndexer(decoded)
		}
		total := map[int]corev1.ResourceList{}
		usedHash := 0
		for minor := 0; minor < gpus; minor++ {
			if r.Intn(10) != 0 {
				total[minor] = corev1.ResourceList{apiext.ResourceGPUCore: resource.MustParse("100")}
				rec.Total = append(rec.Total, minor)
			}
			if r.Intn(4) == 0 {
				usedHash |= 1 << minor
				rec.Used = append(rec.Used, minor)
			}
		}
		req := &mirror.GPURequirements{NumberOfGPUs: rec.Count}
		honor := rec.NodeHonor
		switch r.Intn(3) {
		case 0:
		case 1, 2:
			spec := apiext.GPUPartitionSpec{AllocatePolicy: apiext.GPUPartitionAllocatePolicyBestEffort}
			if r.Intn(2) == 0 {
				spec.AllocatePolicy = apiext.GPUPartitionAllocatePolicyRestricted
			}
			if r.Intn(3) == 0 {
				q := resource.MustParse(bandwidths[r.Intn(len(bandwidths))])
				spec.RingBusBandwidth = &q
			}
			raw, err := json.Marshal(spec)
			if err != nil {
				panic(err)
			}
			rec.Spec = string(raw)
			// As koordinator's parseGPURequirements reads the pod's annotation.
			parsed, err := apiext.GetGPUPartitionSpec(map[string]string{apiext.AnnotationGPUPartitionSpec: rec.Spec})
			if err != nil {
				panic(err)
			}
			req.HonorGPUPartition = true
			req.RestrictedGPUPartition = parsed.AllocatePolicy == apiext.GPUPartitionAllocatePolicyRestricted
			req.RingBusBandwidth = parsed.RingBusBandwidth
			honor = true
		}
		ctx := &mirror.AllocateContext{DeviceUsedMinorsHash: usedHash, DeviceTotal: total}
		allocations, status := allocateByPartition(honor, req, indexer, ctx)
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
