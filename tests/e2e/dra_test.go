package e2e

// Beside Kubernetes' own device allocator (issue 35): ResourceSlices of a test driver publish the
// same GPUs as the nodes' Device objects (matched by UUID); pods with ResourceClaims and
// koordinator GPU pods (whole and shared) are created together on the same nodes, with random
// deletions, an extender SIGKILL, a kube-scheduler restart and nodes handed from one allocator
// to the other. The oracle is written from the API objects alone: for every physical GPU (by
// UUID) the claims that hold it and the pods whose annotation holds it never exceed it together;
// every allocated claim names a published device; every bound GPU pod holds a device.
//
// No kubelet runs: kube-scheduler allocates claims and binds pods itself, and this test stands in
// for kube-controller-manager's ResourceClaim controller (a deleted pod's claim is deleted with
// it, its finalizer removed).
//
//   DNE_E2E_DRA_SEEDS=1,2,3,4          seeds to run (default: one)
//   DNE_E2E_DRA_ARGS=--dra-ownership=false   extra extender flags (what ownership prevents)

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	draDriver     = "gpu.e2e.example"
	draClass      = "e2e-gpu"
	vfioDriver    = "vfio.e2e.example"
	vfioClass     = "e2e-vfio"
	deviceOwner   = "device-numa-extender.io/device-owner"
	draPodsPerRun = 300
)

// publishSlice publishes node's GPUs as the test driver's pool `node`, named by the UUIDs the
// node's Device object gives them.
func (cp *controlPlane) publishSlice(node string, gpus int) {
	cp.publishSliceOf(node, gpus, draDriver, false)
}

// publishSliceOf publishes node's GPUs as driver's pool `node`; perDevice names each device's
// node on the device (`perDeviceNodeSelection`, partitionable devices) instead of the slice.
func (cp *controlPlane) publishSliceOf(node string, gpus int, driver string, perDevice bool) {
	var devices []resourceapi.Device
	for i := 0; i < gpus; i++ {
		uuid := fmt.Sprintf("GPU-%s-%d", node, i)
		index := int64(i)
		devices = append(devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":  {StringValue: &uuid},
				"index": {IntValue: &index},
			},
		})
	}
	nodeName := node
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driver},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:  driver,
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: devices,
		},
	}
	if perDevice {
		yes := true
		slice.Spec.PerDeviceNodeSelection = &yes
		for i := range slice.Spec.Devices {
			slice.Spec.Devices[i].NodeName = &nodeName
		}
	} else {
		slice.Spec.NodeName = &nodeName
	}
	if _, err := cp.admin.ResourceV1().ResourceSlices().Create(cp.ctx, slice, metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
}

// wipeSlices deletes node's slices of driver, as kubelet does at every kubelet start.
func (cp *controlPlane) wipeSlice(node, driver string) {
	err := cp.admin.ResourceV1().ResourceSlices().Delete(cp.ctx, node+"-"+driver, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		cp.t.Fatal(err)
	}
}

func (cp *controlPlane) createDeviceClass(name, extendedResource string) {
	cp.createDeviceClassOf(name, draDriver, extendedResource)
}

func (cp *controlPlane) createDeviceClassOf(name, driver, extendedResource string) {
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == %q", driver),
			}}},
		},
	}
	if extendedResource != "" {
		class.Spec.ExtendedResourceName = &extendedResource
	}
	if _, err := cp.admin.ResourceV1().DeviceClasses().Create(cp.ctx, class, metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
}

// createClaimPod creates a claim for one GPU of the test driver and a pod using it.
func (cp *controlPlane) createClaimPod(name string) {
	cp.createClaimPodOf(name, draClass)
}

// createClaimPodOf creates a claim for one device of class and a pod using it.
func (cp *controlPlane) createClaimPodOf(name, class string) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}}},
		}},
	}
	if _, err := cp.admin.ResourceV1().ResourceClaims(testNamespace).Create(cp.ctx, claim, metav1.CreateOptions{}); err != nil {
		cp.t.Errorf("claim %s: %v", name, err)
		return
	}
	pod := cp.pod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi"}})
	claimName := name
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	if _, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, pod, metav1.CreateOptions{}); err != nil {
		cp.t.Errorf("pod %s: %v", name, err)
	}
}

// deleteClaimPod deletes a pod and, as the ResourceClaim controller would, its claim.
func (cp *controlPlane) deleteClaimPod(name string) {
	cp.deletePodNow(name)
	claims := cp.admin.ResourceV1().ResourceClaims(testNamespace)
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := claims.Patch(cp.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		cp.t.Fatal(err)
	}
	if err := claims.Delete(cp.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		cp.t.Fatal(err)
	}
}

// draViolations is the oracle: from the pods, claims, slices and Device objects alone.
func (cp *controlPlane) draViolations(m machine) []string {
	ctx := context.Background()
	// Pods first: kube-scheduler allocates a pod's claims (PreBind) before it binds the pod,
	// so every pod listed bound has its claims allocated in the lists that follow, while
	// pending pods keep binding as this runs.
	generic := cp.violations()
	allPods, err := cp.admin.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	slices, err := cp.admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	// (driver, pool, device) -> UUID, and -> the node its slice is on.
	uuidOf := map[[3]string]string{}
	nodeOf := map[[3]string]string{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			k := [3]string{s.Spec.Driver, s.Spec.Pool.Name, d.Name}
			if a, ok := d.Attributes["uuid"]; ok && a.StringValue != nil {
				uuidOf[k] = *a.StringValue
			}
			if s.Spec.NodeName != nil {
				nodeOf[k] = *s.Spec.NodeName
			}
			if d.NodeName != nil {
				nodeOf[k] = *d.NodeName
			}
		}
	}
	// A pod kube-scheduler served through DRA (KEP-5004) holds its devices through the claim
	// its status names, allocated on the pod's node: it needs no annotation.
	allClaims, err := cp.admin.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		cp.t.Fatal(err)
	}
	claimNodes := map[string]map[string]bool{}
	for _, c := range allClaims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		nodes := map[string]bool{}
		for _, r := range c.Status.Allocation.Devices.Results {
			nodes[nodeOf[[3]string{r.Driver, r.Pool, r.Device}]] = true
		}
		claimNodes[c.Namespace+"/"+c.Name] = nodes
	}
	servedByDRA := map[string]bool{}
	for _, p := range allPods.Items {
		st := p.Status.ExtendedResourceClaimStatus
		if st == nil || !holds(&p) {
			continue
		}
		if nodes := claimNodes[p.Namespace+"/"+st.ResourceClaimName]; len(nodes) == 1 && nodes[p.Spec.NodeName] {
			servedByDRA[p.Name] = true
		}
	}
	var out []string
	for _, v := range generic {
		exempt := false
		for name := range servedByDRA {
			if strings.HasPrefix(v, "pod "+name+" asks for devices, is bound to ") {
				exempt = true
			}
		}
		if !exempt {
			out = append(out, v)
		}
	}
	used := map[string]int64{} // UUID -> gpu-core held
	holders := map[string][]string{}
	claims := allClaims
	allocated := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		allocated[c.Name] = true
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue // not allocated, to kube-scheduler's allocator either
			}
			uuid, ok := uuidOf[[3]string{r.Driver, r.Pool, r.Device}]
			if !ok {
				out = append(out, fmt.Sprintf("claim %s holds %s/%s/%s, which no slice publishes", c.Name, r.Driver, r.Pool, r.Device))
				continue
			}
			used[uuid] += 100
			holders[uuid] = append(holders[uuid], "claim "+c.Name)
		}
	}
	for i := range allPods.Items {
		pod := &allPods.Items[i]
		if !holds(pod) {
			continue
		}
		for _, c := range pod.Spec.ResourceClaims {
			if c.ResourceClaimName != nil && !allocated[*c.ResourceClaimName] {
				out = append(out, fmt.Sprintf("pod %s is bound to %s but its claim %s is not allocated", pod.Name, pod.Spec.NodeName, *c.ResourceClaimName))
			}
		}
		devs, err := parseDeviceAllocated(pod)
		if err != nil {
			continue // reported by violations
		}
		for _, e := range devs["gpu"] {
			// The Device objects name minor i of node n GPU-n-i (machine.device).
			uuid := fmt.Sprintf("GPU-%s-%d", pod.Spec.NodeName, e.Minor)
			// The share of the card an entry holds: its gpu-core, else its memory ratio (a
			// koordinator ratio request records only the ratio and the bytes).
			core := int64(-1)
			for _, name := range []string{"koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"} {
				if q, ok := e.Resources[name]; ok {
					parsed := resource.MustParse(q)
					if v := parsed.Value(); v > core {
						core = v
					}
				}
			}
			if core < 0 {
				core = 100
			}
			used[uuid] += core
			holders[uuid] = append(holders[uuid], "pod "+pod.Name)
		}
	}
	for uuid, u := range used {
		// Claims alone beyond a GPU are DRA's own double allocation: one GPU published by two
		// drivers' pools (a GPU driver and a VFIO driver) is two devices to kube-scheduler's
		// allocator, on a node handed to DRA. The extender promises only that no pod of its
		// holds a GPU beyond it, with claims or other pods.
		annotated := false
		for _, h := range holders[uuid] {
			annotated = annotated || strings.HasPrefix(h, "pod ")
		}
		if u > 100 && annotated {
			out = append(out, fmt.Sprintf("GPU %s: %d%% held (holders %v)", uuid, u, holders[uuid]))
		}
	}
	sort.Strings(out)
	return out
}

func draSeeds() []int64 {
	env := os.Getenv("DNE_E2E_DRA_SEEDS")
	if env == "" {
		return []int64{1}
	}
	var out []int64
	for _, s := range strings.Split(env, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			panic(fmt.Sprintf("DNE_E2E_DRA_SEEDS: %v", err))
		}
		out = append(out, n)
	}
	return out
}

func TestNoGPUIsHandedOutByBothTheExtenderAndDRA(t *testing.T) {
	for _, seed := range draSeeds() {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { draChurn(t, seed, draOptions{}) })
	}
}

// TestEveryPublishedFormKeepsAGPUFromBothAllocators is trust IV §1-§3 through kube-scheduler's
// own DRA allocator: the same churn with the GPUs published in the forms the join must read.
// nodes[0] and nodes[2] in a slice-level pool and again in a second driver's pool (a VFIO
// driver: one GPU, two pools, claims from both classes); nodes[1] and nodes[3] in slices with
// perDeviceNodeSelection; nodes[3]'s slice wiped and republished before every wave, as kubelet
// does at every start, while pods of ours hold its GPUs.
func TestEveryPublishedFormKeepsAGPUFromBothAllocators(t *testing.T) {
	for _, seed := range draSeeds() {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { draChurn(t, seed, draOptions{forms: true}) })
	}
}

// TestWithoutDeviceTaintRulesNoPublishedGPUIsTheExtenders is trust IV §4: a cluster that serves
// slices and claims at v1 but no DeviceTaintRule (1.34-1.36 by default: the rule API is alpha or
// an off-by-default beta there), and a kube-scheduler that honours none. Nothing can keep DRA
// off a published GPU, so the extender hands out none of them (it binds its pods on two nodes no
// driver publishes), and no GPU is held twice.
func TestWithoutDeviceTaintRulesNoPublishedGPUIsTheExtenders(t *testing.T) {
	for _, seed := range draSeeds() {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { draChurn(t, seed, draOptions{noTaintRules: true}) })
	}
}

// draOptions vary the churn.
type draOptions struct {
	// forms: the GPUs published in every form the join reads (see
	// TestEveryPublishedFormKeepsAGPUFromBothAllocators).
	forms bool
	// noTaintRules: DeviceTaintRule not served, kube-scheduler honouring none; two more nodes
	// that no driver publishes.
	noTaintRules bool
}

// Serves DeviceTaintRule at no version, as 1.34-1.36 do by default.
var withoutTaintRules = planOptions{
	apiserverFlags: []string{"--runtime-config=resource.k8s.io/v1/devicetaintrules=false"},
	schedulerArgs:  []string{"--feature-gates=DRADeviceTaintRules=false"},
}

func draChurn(t *testing.T, seed int64, opts draOptions) {
	rng := rand.New(rand.NewSource(seed))
	// A short hand-over grace keeps the node flips quick; 5 s is still far above what
	// kube-scheduler needs here to write a claim it allocated in memory.
	args := []string{"--dra-handover-grace=5s"}
	// DNE_E2E_DRA_ARGS adds extender flags: `--dra-ownership=false` shows what ownership prevents.
	args = append(args, strings.Fields(os.Getenv("DNE_E2E_DRA_ARGS"))...)
	plan := planOptions{}
	if opts.noTaintRules {
		plan = withoutTaintRules
	}
	cp := startControlPlane(t, plan)
	ext := cp.startExtender("", args...)
	cp.startScheduler(ext.urlPrefix())
	m := gpuMachine
	count := 4
	if opts.noTaintRules {
		count = 6
	}
	nodes := cp.addNodes("gpu", count, m)
	published := map[string]bool{}
	for i, n := range nodes[:4] {
		published[n] = true
		switch {
		case opts.forms && i%2 == 0:
			cp.publishSlice(n, m.gpus)
			cp.publishSliceOf(n, m.gpus, vfioDriver, false)
		case opts.forms:
			cp.publishSliceOf(n, m.gpus, draDriver, true)
		default:
			cp.publishSlice(n, m.gpus)
		}
	}
	cp.createDeviceClass(draClass, "")
	classes := []string{draClass}
	if opts.forms {
		cp.createDeviceClassOf(vfioClass, vfioDriver, "")
		classes = append(classes, vfioClass)
	}
	// Two nodes are DRA's, two the extender's; half-way one of each changes hands.
	cp.labelOwner(nodes[0], "dra")
	cp.labelOwner(nodes[1], "dra")
	ext.waitLeader()
	if opts.noTaintRules {
		// /readyz says why: the kind is disabled and names what that turns off.
		var body map[string]any
		if err := json.Unmarshal([]byte(ext.probeBody("/readyz?standby=ok")), &body); err != nil {
			t.Fatal(err)
		}
		kind, _ := body["kinds"].(map[string]any)["devicetaintrules"].(map[string]any)
		reason, _ := kind["reason"].(string)
		if kind["requirement"] != "disabled" || !strings.Contains(reason, "not served") || !strings.Contains(reason, "refused") {
			t.Fatalf("/readyz does not say DeviceTaintRules are off and what it costs: %v", kind)
		}
	}

	var created, claimPods []string
	live := map[string]bool{}
	isClaimPod := map[string]bool{}
	everBound := map[string]bool{}
	check := func(when string) {
		t.Helper()
		if v := cp.draViolations(m); len(v) > 0 {
			t.Fatalf("%s: a GPU held beyond itself:\n  %s", when, strings.Join(v, "\n  "))
		}
		if opts.noTaintRules {
			// No rule can keep DRA off a published GPU: none of them is the extender's.
			for _, p := range cp.boundPods() {
				if _, annotated := p.Annotations["scheduling.koordinator.sh/device-allocated"]; annotated && published[p.Spec.NodeName] {
					t.Fatalf("%s: pod %s was given a GPU of %s, which a DRA driver publishes and no DeviceTaintRule can protect", when, p.Name, p.Spec.NodeName)
				}
			}
		}
		for _, p := range cp.boundPods() {
			everBound[p.Name] = true
		}
	}
	const waves = 10
	perWave := draPodsPerRun / waves
	for wave := 0; wave < waves; wave++ {
		if opts.forms && wave > 0 {
			// kubelet restarts on nodes[3]: its slice goes, and comes back when the driver
			// registers again, while pods of ours hold its GPUs. The pause is the restart's
			// (a shape, not an assertion); the wave's claims are created right after.
			cp.wipeSlice(nodes[3], draDriver)
			time.Sleep(2 * time.Second)
			cp.publishSliceOf(nodes[3], m.gpus, draDriver, true)
		}
		var wg sync.WaitGroup
		var names []string
		for i := 0; i < perWave; i++ {
			name := fmt.Sprintf("s%d-w%d-%03d", seed, wave, i)
			names = append(names, name)
			created = append(created, name)
			live[name] = true
			kind := rng.Intn(3)
			if kind == 0 {
				isClaimPod[name] = true
				claimPods = append(claimPods, name)
			}
			class := classes[rng.Intn(len(classes))]
			wg.Add(1)
			go func(name string, kind int) {
				defer wg.Done()
				switch kind {
				case 0:
					cp.createClaimPodOf(name, class)
				case 1:
					cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}})
				default:
					cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "50"}})
				}
			}(name, kind)
		}
		wg.Wait()
		cp.waitSettled(names)
		check(fmt.Sprintf("wave %d", wave))

		switch wave {
		case 2:
			// The extender is SIGKILLed and comes back on the same address.
			ext.kill()
			ext = cp.startExtender(ext.listen, args...)
			ext.waitLeader()
		case 4:
			cp.stopScheduler()
			cp.startScheduler(ext.urlPrefix())
			ext.waitLeader()
		case 6:
			// nodes[1] (DRA's) goes to the extender, nodes[2] (the extender's) to DRA.
			cp.labelOwner(nodes[1], "extender")
			cp.labelOwner(nodes[2], "dra")
		}

		// Random deletions: about two thirds of what is bound, so capacity turns over.
		for _, p := range cp.boundPods() {
			if !live[p.Name] || rng.Intn(3) == 0 {
				continue
			}
			if isClaimPod[p.Name] {
				cp.deleteClaimPod(p.Name)
			} else {
				cp.deletePodNow(p.Name)
			}
			delete(live, p.Name)
		}
		check(fmt.Sprintf("after wave %d's deletions", wave))
	}
	// Everything on nodes[2] that is the extender's goes: its rule must go, and DRA pods land.
	for _, p := range cp.boundPods() {
		if p.Spec.NodeName == nodes[2] && !isClaimPod[p.Name] {
			cp.deletePodNow(p.Name)
		}
	}
	extra := fmt.Sprintf("s%d-late", seed)
	cp.createClaimPod(extra)
	created = append(created, extra)
	claimPods = append(claimPods, extra)
	cp.waitSettled([]string{extra})
	check("at the end")

	boundOnce, boundOnceClaims := len(everBound), 0
	for name := range everBound {
		if isClaimPod[name] {
			boundOnceClaims++
		}
	}
	bound, boundClaims := 0, 0
	onNode := map[string]int{}
	for _, p := range cp.boundPods() {
		bound++
		onNode[p.Spec.NodeName]++
		if isClaimPod[p.Name] {
			boundClaims++
		}
	}
	t.Logf("seed %d: %d pods created (%d with claims), %d seen bound (%d with claims), %d bound at the end (%d with claims), per node %v; extender metrics: %s",
		seed, len(created), len(claimPods), boundOnce, boundOnceClaims, bound, boundClaims, onNode,
		strings.Join(strings.Fields(metricLines(ext.metrics(), "dne_dra_taint_rule_writes_total")+" "+metricLines(ext.metrics(), "dne_dra_conflicts_total")), " "))
	if boundOnceClaims == 0 || boundOnce == boundOnceClaims {
		t.Fatalf("%d pods seen bound, %d with claims: the scenario did not exercise both allocators", boundOnce, boundOnceClaims)
	}
}

// labelOwner sets the node's device-owner label.
func (cp *controlPlane) labelOwner(node, owner string) {
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, deviceOwner, owner))
	if _, err := cp.admin.CoreV1().Nodes().Patch(cp.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		cp.t.Fatal(err)
	}
}

// settledReasons are FailedScheduling messages that mean "no capacity for it now": the
// extender's (no free GPU, or none it owns) and DRA's. A pod refused for anything else (the
// extender restarting, "not the leader", "catching up") is retried by kube-scheduler: in flight.
var settledReasons = []string{"insufficient gpu", "cannot allocate all claims", "Insufficient nvidia.com/gpu"}

// waitSettled waits until every pod of names is bound or has been reported unschedulable for
// want of capacity: nothing of them is in flight then.
func (cp *controlPlane) waitSettled(names []string) {
	cp.t.Helper()
	var waiting string
	err := wait.PollUntilContextTimeout(cp.ctx, 500*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		bound := map[string]bool{}
		for _, p := range cp.boundPods() {
			bound[p.Name] = true
		}
		for _, n := range names {
			if bound[n] {
				continue
			}
			settled := false
			for _, msg := range cp.schedulingEvents(n) {
				for _, r := range settledReasons {
					settled = settled || strings.Contains(msg, r)
				}
			}
			if !settled {
				waiting = n
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		cp.t.Fatalf("pods never settled: %v; %s's events: %v", err, waiting, cp.schedulingEvents(waiting))
	}
}

// TestAClassThatMapsAManagedNameIsReportedAndNeverDoubleServed is KEP-5004: a DeviceClass maps
// nvidia.com/gpu; one node does not advertise it (kube-scheduler serves it there through DRA),
// the other does (the extender's). Without --allow-dra-extended-resources /readyz names the
// class; with it, plain GPU pods land on both and no GPU is held by a claim and an annotation.
func TestAClassThatMapsAManagedNameIsReportedAndNeverDoubleServed(t *testing.T) {
	cp := startControlPlane(t, planOptions{})
	m := gpuMachine
	cp.createDeviceClass(draClass, "nvidia.com/gpu")
	ext := cp.startExtender("")
	// The DRA node: its Node does not advertise nvidia.com/gpu, its devices are DRA's.
	dra := m.node("dra-0")
	delete(dra.Status.Allocatable, "nvidia.com/gpu")
	delete(dra.Status.Capacity, "nvidia.com/gpu")
	dra.Labels[deviceOwner] = "dra"
	if _, err := cp.admin.CoreV1().Nodes().Create(cp.ctx, dra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.createNodeObjectsExceptNode("dra-0", m)
	cp.addNodes("ext", 1, m)
	cp.publishSlice("dra-0", m.gpus)
	cp.publishSlice("ext-0", m.gpus)

	// Not ready, and says why.
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		return strings.Contains(ext.probeBody("/readyz"), "DeviceClass e2e-gpu maps nvidia.com/gpu"), nil
	})
	if err != nil {
		t.Fatalf("/readyz never named the class: %q", ext.probeBody("/readyz"))
	}
	ext.kill()
	ext = cp.startExtender(ext.listen, "--allow-dra-extended-resources")
	cp.startScheduler(ext.urlPrefix())
	ext.waitLeader()

	var names []string
	for i := 0; i < 12; i++ {
		name := fmt.Sprintf("plain-%02d", i)
		names = append(names, name)
		cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}})
	}
	// 12 pods, 8 GPUs per node: both allocators must serve some, and every pod binds.
	cp.waitBound(names...)
	if v := cp.draViolations(m); len(v) > 0 {
		t.Fatalf("a GPU held beyond itself:\n  %s", strings.Join(v, "\n  "))
	}
	onNode := map[string]int{}
	for _, p := range cp.boundPods() {
		onNode[p.Spec.NodeName]++
		_, annotated := p.Annotations[annDeviceAllocated]
		viaDRA := p.Status.ExtendedResourceClaimStatus != nil
		switch p.Spec.NodeName {
		case "dra-0":
			if annotated || !viaDRA {
				t.Errorf("pod %s on the DRA node: annotated %v, served through DRA %v", p.Name, annotated, viaDRA)
			}
		case "ext-0":
			// A status from an earlier attempt on dra-0 may linger (kube-scheduler leaves it
			// when a bind fails): the annotation is what counts here.
			if !annotated {
				t.Errorf("pod %s on the extender's node has no allocation (status served through DRA: %v)", p.Name, viaDRA)
			}
		}
	}
	if onNode["dra-0"] == 0 || onNode["ext-0"] == 0 {
		t.Fatalf("pods per node %v: both allocators must have served some", onNode)
	}
	t.Logf("plain GPU pods per node: %v", onNode)
}

// probeBody is the body of GET path on the probe port ("" when the process does not answer).
func (e *extenderProc) probeBody(path string) string {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + e.probe + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// createNodeObjectsExceptNode creates a node's Device and NRT (its Node made by the caller).
func (cp *controlPlane) createNodeObjectsExceptNode(name string, m machine) {
	if _, err := cp.dyn.Resource(deviceGVR).Create(cp.ctx, m.device(name, nil), metav1.CreateOptions{}); err != nil {
		cp.t.Fatalf("device %s: %v", name, err)
	}
	if _, err := cp.dyn.Resource(nrtGVR).Create(cp.ctx, m.nrt(name), metav1.CreateOptions{}); err != nil {
		cp.t.Fatalf("nrt %s: %v", name, err)
	}
}

// waitLeader waits until the extender serves the verbs (its kube-scheduler leads, the
// caches are synced: plain /readyz answers 200) and binds too (the takeover window after a
// start or a leadership change is over).
func (e *extenderProc) waitLeader() {
	err := wait.PollUntilContextTimeout(e.cp.ctx, 100*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		return e.readyzPlain() == http.StatusOK && e.readyzField("binds_wait_for_pod_relist") == "false", nil
	})
	if err != nil {
		e.cp.t.Fatalf("extender never led: %v: %s", err, e.probeBody("/readyz"))
	}
}

// TestDeviceTaintRulesServedAtV1beta2AreWrittenThere is trust IV §4's other half: a cluster that
// serves DeviceTaintRule only at v1beta2 (1.36 with the beta API enabled). The extender finds it
// there, writes its rule at v1beta2, reads it back through its watch, and owns the pool once the
// grace has passed: a GPU pod binds. (kube-scheduler v1.37 reads rules at v1 only, so it runs
// with the gate off here and this shows the extender's half, not DRA honouring the rule.)
func TestDeviceTaintRulesServedAtV1beta2AreWrittenThere(t *testing.T) {
	cp := startControlPlane(t, planOptions{
		apiserverFlags: []string{"--runtime-config=resource.k8s.io/v1/devicetaintrules=false,resource.k8s.io/v1beta2=true"},
		schedulerArgs:  []string{"--feature-gates=DRADeviceTaintRules=false"},
	})
	ext := cp.startExtender("", "--dra-handover-grace=2s")
	cp.startScheduler(ext.urlPrefix())
	m := gpuMachine
	nodes := cp.addNodes("gpu", 1, m)
	cp.publishSlice(nodes[0], m.gpus)
	ext.waitLeader()
	v1beta2 := schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1beta2", Resource: "devicetaintrules"}
	var rules *unstructured.UnstructuredList
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		var err error
		rules, err = cp.dyn.Resource(v1beta2).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=device-numa-extender"})
		return err == nil && len(rules.Items) == 1, nil
	})
	if err != nil {
		t.Fatalf("no rule of the extender's at v1beta2: %v (%v)", err, rules)
	}
	pool, _, _ := unstructured.NestedString(rules.Items[0].Object, "spec", "deviceSelector", "pool")
	if pool != nodes[0] {
		t.Fatalf("the rule selects pool %q, want %q", pool, nodes[0])
	}
	cp.createPod(podSpec{name: "whole", limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}})
	cp.waitBound("whole")
	cp.assertNoViolations()
}

// TestAnAdminAccessClaimHoldsNoGPU is trust IV §5 through kube-scheduler's own allocator: a
// monitoring claim with adminAccess (in a namespace labelled for it, tolerating the extender's
// taint, so exempt from the chart's claim policy) is allocated the GPU of an extender-owned
// node. kube-scheduler does not count it as allocated; neither does the extender: a pod of ours
// still gets the GPU (before, "insufficient gpu devices: no whole gpu free").
func TestAnAdminAccessClaimHoldsNoGPU(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: `{"extender":{"dra":{"tolerationExemptNamespaces":["monitoring"]}}}`})
	ext := cp.startExtender("", "--dra-handover-grace=2s")
	cp.startScheduler(ext.urlPrefix())
	m := gpuMachine
	m.gpus = 2
	nodes := cp.addNodes("gpu", 1, m)
	cp.publishSlice(nodes[0], m.gpus)
	cp.createDeviceClass(draClass, "")
	ext.waitLeader()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring", Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"}}}
	if _, err := cp.admin.CoreV1().Namespaces().Create(cp.ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	yes := true
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "watch", Namespace: "monitoring"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				AdminAccess: &yes,
				Tolerations: []resourceapi.DeviceToleration{{Key: "device-numa-extender.io/owned", Operator: resourceapi.DeviceTolerationOpExists}},
			}}},
		}},
	}
	if _, err := cp.admin.ResourceV1().ResourceClaims("monitoring").Create(cp.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	watcher := cp.pod(podSpec{name: "watcher", limits: map[string]string{"cpu": "100m", "memory": "64Mi"}})
	watcher.Namespace = "monitoring"
	claimName := "watch"
	watcher.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
	watcher.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	if _, err := cp.admin.CoreV1().Pods("monitoring").Create(cp.ctx, watcher, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The admin claim is allocated one of the node's two GPUs.
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		c, err := cp.admin.ResourceV1().ResourceClaims("monitoring").Get(ctx, "watch", metav1.GetOptions{})
		return err == nil && c.Status.Allocation != nil && len(c.Status.Allocation.Devices.Results) == 1, nil
	})
	if err != nil {
		t.Fatalf("the admin claim was never allocated: %v", err)
	}
	// A pod of ours asking for both still gets them: the admin claim holds neither.
	cp.createPod(podSpec{name: "whole", limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}})
	bound := cp.waitBound("whole")
	if _, ok := bound["whole"].Annotations["scheduling.koordinator.sh/device-allocated"]; !ok {
		t.Fatalf("the pod was bound without a device allocation: %v", bound["whole"].Annotations)
	}
}
