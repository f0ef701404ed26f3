// Package koordtopo builds koordinator's test CPU topology layout for the recorders: sockets x
// NUMA nodes per socket x cores per NUMA node x threads per core, CPU ids sequential, a core's
// threads adjacent (koordinator's buildCPUTopologyForTest; the replays build the same with
// src/placement/cpu/accumulator.rs synthetic_topology).
package koordtopo

import "github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource"

// New returns the topology of sockets x perSocket NUMA nodes x cores x threads.
func New(sockets, perSocket, cores, threads int) *nodenumaresource.CPUTopology {
	t := &nodenumaresource.CPUTopology{
		NumSockets: sockets,
		NumNodes:   sockets * perSocket,
		NumCores:   sockets * perSocket * cores,
		NumCPUs:    sockets * perSocket * cores * threads,
		CPUDetails: nodenumaresource.CPUDetails{},
	}
	var node, core, cpu int
	for s := 0; s < sockets; s++ {
		for n := 0; n < perSocket; n++ {
			for c := 0; c < cores; c++ {
				for p := 0; p < threads; p++ {
					t.CPUDetails[cpu] = nodenumaresource.CPUInfo{SocketID: s, NodeID: node, CoreID: core, CPUID: cpu}
					cpu++
				}
				core++
			}
			node++
		}
	}
	return t
}
