// Package mirror holds koordinator v1.7.0's unexported deviceshare argument types, mirrored field
// for field (same types, same order, so the same memory layout), for the commands that reach
// its unexported functions with go:linkname. Field names differ only in being exported; a
// koordinator upgrade must re-check both structs against pkg/scheduler/plugins/deviceshare.
package mirror

import (
	"unsafe"

	apiext "github.com/koordinator-sh/koordinator/apis/extension"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// GPURequirements mirrors deviceshare.GPURequirements (plugin.go).
type GPURequirements struct {
	NumberOfGPUs                        int
	RequestsPerGPU                      corev1.ResourceList
	GPUShared                           bool
	HonorGPUPartition                   bool
	RestrictedGPUPartition              bool
	RingBusBandwidth                    *resource.Quantity
	RequiredTopologyScopeLevel          int
	RequiredTopologyScope               apiext.DeviceTopologyScope
	EnforceGPUSharedResourceTemplate    bool
	CandidateGPUSharedResourceTemplates map[string]apiext.GPUSharedResourceTemplates
}

// AllocateContext mirrors deviceshare.AllocateContext (allocator_gpu.go); the scorer is the
// pointer koordinator's own scorer constructors return, or nil.
type AllocateContext struct {
	DeviceUsedMinorsHash int
	DeviceFree           map[int]corev1.ResourceList
	DeviceTotal          map[int]corev1.ResourceList
	AllocationScorer     unsafe.Pointer
}
