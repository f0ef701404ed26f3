package mirror

// koordinator v1.7.0's unexported nodenumaresource types, mirrored field for field (same
// types, same order, so the same memory layout) for the numaamp command. A pointer to an
// unexported type koordinator never dereferences in the paths used is an unsafe.Pointer here; a
// map of an unexported value type is a map of struct{} (a map variable is one pointer, and
// these stay nil). A koordinator upgrade must re-check each struct against
// pkg/scheduler/plugins/nodenumaresource (plugin.go, resource_manager.go, reservation.go).

import (
	"sync"
	"unsafe"

	apiext "github.com/koordinator-sh/koordinator/apis/extension"
	schedulingconfig "github.com/koordinator-sh/koordinator/pkg/scheduler/apis/config"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/frameworkext/topologymanager"
	"github.com/koordinator-sh/koordinator/pkg/scheduler/plugins/nodenumaresource"
	"github.com/koordinator-sh/koordinator/pkg/util/cpuset"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// SchedulingStateData mirrors nodenumaresource.schedulingStateData (plugin.go).
type SchedulingStateData struct {
	Lock             sync.RWMutex
	PreemptibleState map[string]unsafe.Pointer
}

// PreFilterState mirrors nodenumaresource.preFilterState (plugin.go).
type PreFilterState struct {
	SchedulingStateData
	Skip                        bool
	RequestCPUBind              bool
	Requests                    corev1.ResourceList
	RequiredCPUBindPolicy       schedulingconfig.CPUBindPolicy
	PreferredCPUBindPolicy      schedulingconfig.CPUBindPolicy
	PreferredCPUExclusivePolicy schedulingconfig.CPUExclusivePolicy
	PodNUMATopologyPolicy       apiext.NUMATopologyPolicy
	PodNUMAExclusive            apiext.NumaTopologyExclusive
	NumCPUsNeeded               int
	Allocation                  *nodenumaresource.PodAllocation
	HasReservationAffinity      bool
	DesignatedAllocation        unsafe.Pointer
}

// ResourceOptions mirrors nodenumaresource.ResourceOptions (resource_manager.go).
type ResourceOptions struct {
	NumCPUsNeeded           int
	RequestCPUBind          bool
	Requests                corev1.ResourceList
	OriginalRequests        corev1.ResourceList
	RequiredCPUBindPolicy   bool
	CPUBindPolicy           schedulingconfig.CPUBindPolicy
	CPUExclusivePolicy      schedulingconfig.CPUExclusivePolicy
	PreferredCPUs           cpuset.CPUSet
	PreemptibleCPUs         cpuset.CPUSet
	ReusableResources       map[int]corev1.ResourceList
	RequiredResources       map[int]corev1.ResourceList
	RequiredFromReservation bool
	Hint                    topologymanager.NUMATopologyHint
	TopologyOptions         nodenumaresource.TopologyOptions
	NUMAScorer              unsafe.Pointer
	NodePreemptionState     unsafe.Pointer
}

// RestoreState mirrors nodenumaresource.nodeReservationRestoreStateData (reservation.go): no
// reservations, every field empty.
type RestoreState struct {
	Matched                    map[types.UID]struct{}
	Unmatched                  map[types.UID]struct{}
	MergedMatchedRemainCPUs    cpuset.CPUSet
	MergedMatchedAllocatedCPUs cpuset.CPUSet
	MergedMatchedAllocatable   map[int]corev1.ResourceList
	MergedMatchedAllocated     map[int]corev1.ResourceList
	MergedUnmatchedUsed        map[int]corev1.ResourceList
}

// Plugin mirrors nodenumaresource.Plugin (plugin.go); the interfaces the scoring paths never
// call stay nil.
type Plugin struct {
	Handle                 unsafe.Pointer // frameworkext.ExtendedHandle (an interface: two words)
	HandleData             unsafe.Pointer
	PluginArgs             *schedulingconfig.NodeNUMAResourceArgs
	NRTLister              [2]unsafe.Pointer // topologylister.NodeResourceTopologyLister
	Scorer                 unsafe.Pointer
	NUMAScorer             unsafe.Pointer
	ResourceManager        nodenumaresource.ResourceManager
	TopologyOptionsManager nodenumaresource.TopologyOptionsManager
}
