package e2e

// Trust III (issue 36) on the real control plane:
//   - a restart without leader election while a binding the previous process sent is still in
//     flight at kube-apiserver (held by a pods/binding admission webhook of the test's): the
//     restarted process must not give that binding's GPU to another pod;
//   - GPU-share pods offered CPU-only nodes while the GPU nodes are full (the chart's scheduler
//     mode ignores the share names in-tree): none is bound to a node without its device.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// bindingHold is a validating admission webhook on pods/binding that holds the binding of one
// pod until released, and admits every other binding at once.
type bindingHold struct {
	pod      string
	arrived  chan struct{}
	release  chan struct{}
	once     sync.Once
	released sync.Once
	mu       sync.Mutex
	seen     map[string]bool // pods whose bindings (dry runs too) reached the hold
}

func (h *bindingHold) saw(pod string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[pod]
}

func (h *bindingHold) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.seen[review.Request.Name] = true
	h.mu.Unlock()
	if review.Request.Name == h.pod {
		h.once.Do(func() { close(h.arrived) })
		select {
		case <-h.release:
		case <-r.Context().Done():
			return
		}
	}
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	review.Request = nil
	_ = json.NewEncoder(w).Encode(&review)
}

func (h *bindingHold) letGo() { h.released.Do(func() { close(h.release) }) }

// installBindingHold serves the hold over TLS on loopback and registers it for pods/binding.
func installBindingHold(t *testing.T, cp *controlPlane, pod string) *bindingHold {
	t.Helper()
	h := &bindingHold{pod: pod, arrived: make(chan struct{}), release: make(chan struct{}), seen: map[string]bool{}}
	t.Cleanup(h.letGo)
	caPEM, certFile, keyFile := writeServingCertificate(t, cp.dir)
	addr := freeLoopbackAddr()
	srv := &http.Server{Addr: addr, Handler: h}
	go func() { _ = srv.ListenAndServeTLS(certFile, keyFile) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "https://" + addr + "/hold"
	fail := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(30)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-binding-hold"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "binding-hold.e2e.test",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/binding"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := cp.admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(cp.ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the binding hold's ValidatingWebhookConfiguration: %v", err)
	}
	// The apiserver picks the configuration up asynchronously: dry-run bindings of a probe pod
	// until one reaches the hold (the ordering point "the hold is active").
	probe := unscheduled(t, cp, "hold-probe", map[string]string{"cpu": "1"})
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: probe.Name, Namespace: probe.Namespace}, Target: corev1.ObjectReference{Kind: "Node", Name: "nowhere"}}
		_ = cp.admin.CoreV1().Pods(probe.Namespace).Bind(ctx, b, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return h.saw(probe.Name), nil
	})
	if err != nil {
		t.Fatalf("the binding hold never became active: %v", err)
	}
	return h
}

// bindVerb calls the extender's bind verb as kube-scheduler would: "" when bound, else the
// Error it answered (or why no answer came).
func bindVerb(e *extenderProc, pod *corev1.Pod, node string) string {
	body, _ := json.Marshal(map[string]string{
		"PodName": pod.Name, "PodNamespace": pod.Namespace, "PodUID": string(pod.UID), "Node": node,
	})
	client := http.Client{Timeout: 60 * time.Second}
	resp, err := client.Post(e.urlPrefix()+"/bind", "application/json", bytes.NewReader(body))
	if err != nil {
		return "no answer: " + err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var answer struct{ Error string }
	if err := json.Unmarshal(raw, &answer); err != nil {
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return answer.Error
}

// unscheduled creates a pod no scheduler picks up: the test calls the extender's verbs itself.
func unscheduled(t *testing.T, cp *controlPlane, name string, limits map[string]string) *corev1.Pod {
	t.Helper()
	return cp.createPod(podSpec{name: name, scheduler: "e2e-nobody", limits: limits})
}

// bindUntilDecided binds, retrying while the answer says only "not now" (not ready yet, the
// pod cache catching up after a start): the final answer.
func bindUntilDecided(t *testing.T, e *extenderProc, pod *corev1.Pod, node string) string {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(e.cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		last = bindVerb(e, pod, node)
		retry := strings.Contains(last, "catching up") || strings.Contains(last, "not ready") || strings.HasPrefix(last, "no answer")
		return !retry, nil
	})
	if err != nil {
		t.Fatalf("bind of %s never decided: %s", pod.Name, last)
	}
	return last
}

// Issue 36 §1. Standalone with one replica renders no leader mode: before the fix nothing fenced
// a restart, and y got the GPU x's late binding claims (reproduced with --takeover-window=0s).
func TestARestartWithoutALeaderNeverGivesAwayABindingStillInFlight(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: `{"mode":"standalone","replicas":1}`})
	for _, a := range cp.chart.ExtenderArgs {
		if strings.HasPrefix(a, "--leader-elect") || strings.HasPrefix(a, "--follow-scheduler-lease") {
			t.Fatalf("the chart rendered a leader mode for standalone with one replica: %s", a)
		}
	}
	m := gpuMachine
	cp.addNodes("gpu", 1, m)
	// x's binding is sent with ?timeout= --request-timeout: 14 s leaves the kill, the restart
	// and y's first bind time to happen before the apiserver gives it up.
	ext := cp.startExtender("", "--request-timeout=14s")
	ext.waitReady()
	one := map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
	for i := 0; i < m.gpus-1; i++ {
		p := unscheduled(t, cp, fmt.Sprintf("fill-%d", i), one)
		if e := bindUntilDecided(t, ext, p, "gpu-0"); e != "" {
			t.Fatalf("filler %s: %s", p.Name, e)
		}
	}
	x := unscheduled(t, cp, "x", one)
	y := unscheduled(t, cp, "y", one)
	hold := installBindingHold(t, cp, "x")
	// The webhook configuration reaches the apiserver's admission asynchronously: x's binding is
	// sent (and retried, as kube-scheduler would) until the hold has it.
	cp.proxy.setDetach(true)
	go func() {
		for {
			select {
			case <-hold.arrived:
				return
			case <-cp.ctx.Done():
				return
			default:
			}
			_ = bindVerb(ext, x, "gpu-0")
		}
	}()
	select {
	case <-hold.arrived:
	case <-time.After(hangGuard):
		t.Fatal("x's binding never reached the hold")
	}
	// The process dies with x's binding in flight; the next one starts on the same address.
	ext.kill()
	ext = cp.startExtender(ext.listen, "--request-timeout=14s")
	ext.waitReady()
	first := bindVerb(ext, y, "gpu-0")
	if first == "" {
		hold.letGo()
		cp.waitBound("x")
		t.Fatalf("the restarted process bound y before x's binding could land; violations: %v", cp.violations())
	}
	if !strings.Contains(first, "catching up") {
		t.Fatalf("y's first bind after the restart: %q, want a refusal while the pod cache catches up", first)
	}
	// x's binding lands, inside its deadline.
	hold.letGo()
	cp.waitBound("x")
	cp.proxy.setDetach(false)
	last := bindUntilDecided(t, ext, y, "gpu-0")
	if last == "" {
		t.Fatalf("y was bound after x's binding landed; violations: %v", cp.violations())
	}
	t.Logf("y after the fence: %s", last)
	if p := cp.getPod("y"); p.Spec.NodeName != "" {
		t.Fatalf("y is bound to %s", p.Spec.NodeName)
	}
	cp.assertNoViolations()
	if !strings.Contains(metricLines(ext.metrics(), "dne_pod_fences_total"), `reason="started"} 1`) {
		t.Fatalf("no start fence in the restarted process's metrics:\n%s", metricLines(ext.metrics(), "dne_pod_fences_total"))
	}
}

// Issue 36 §6. The chart's scheduler mode: kube-scheduler ignores the koordinator share names
// in-tree, so when the GPU node is full it offers CPU-only nodes; before the fix the extender
// passed them (left to device plugins) and share pods were bound there, without a GPU.
func TestSharePodsAreNeverBoundToANodeThatDoesNotAdvertiseTheirDevice(t *testing.T) {
	cp, ext := start(t, planOptions{})
	m := gpuMachine
	cp.addNodes("gpu", 1, m)
	cp.addNodes("cpu", 2, cpuMachine)
	ext.waitReady()
	share := map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "100"}
	var fill []string
	for i := 0; i < m.gpus; i++ {
		name := fmt.Sprintf("share-%d", i)
		cp.createPod(podSpec{name: name, limits: share})
		fill = append(fill, name)
	}
	for _, p := range cp.waitBound(fill...) {
		if !strings.HasPrefix(p.Spec.NodeName, "gpu-") {
			t.Fatalf("%s was bound to %s, which has no GPU", p.Name, p.Spec.NodeName)
		}
	}
	// The GPU node is full: the next share pods are offered the CPU-only nodes.
	for i := 0; i < 4; i++ {
		cp.createPod(podSpec{name: fmt.Sprintf("over-%d", i), limits: share})
	}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("over-%d", i)
		ev := cp.waitEvent(name, "does not advertise")
		t.Logf("%s: %s", name, ev)
	}
	for i := 0; i < 4; i++ {
		if p := cp.getPod(fmt.Sprintf("over-%d", i)); p.Spec.NodeName != "" {
			t.Fatalf("%s was bound to %s", p.Name, p.Spec.NodeName)
		}
	}
	cp.assertNoViolations()
}

// Issue 36 §8. RBAC grants the extender `patch nodes` for the requeue signal; the chart's
// ValidatingAdmissionPolicy lets its ServiceAccount change its own annotation and nothing else.
func TestTheExtenderMayChangeOnlyItsOwnAnnotationOnNodes(t *testing.T) {
	cp := startControlPlane(t, planOptions{})
	cp.chart.wantPolicies(t, "node-writes", "dra-rule-writes", "dra-claim-tolerations")
	cp.addNodes("n", 1, cpuMachine)
	ext := cp.extenderClient()
	patch := func(body string) error {
		_, err := ext.CoreV1().Nodes().Patch(cp.ctx, "n-0", types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	taint := `{"spec":{"taints":[{"key":"evil","effect":"NoSchedule"}]}}`
	refused := cp.refusedOncePolicyIsActive("a taint patch", func() error { return patch(taint) }, func() {
		_, _ = cp.admin.CoreV1().Nodes().Patch(cp.ctx, "n-0", types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{})
	})
	if !apierrors.IsForbidden(refused) && !apierrors.IsInvalid(refused) || !strings.Contains(refused.Error(), "may change only") {
		t.Fatalf("the taint patch failed, but not by the policy: %v", refused)
	}
	for what, body := range map[string]string{
		"a label":            `{"metadata":{"labels":{"evil":"yes"}}}`,
		"another annotation": `{"metadata":{"annotations":{"evil":"yes"}}}`,
		"unschedulable":      `{"spec":{"unschedulable":true}}`,
	} {
		if err := patch(body); err == nil || !strings.Contains(err.Error(), "may change only") {
			t.Fatalf("%s: the extender's patch was not refused by the policy: %v", what, err)
		}
	}
	// Its own annotation, as the requeue signal writes it, is allowed.
	if err := patch(`{"metadata":{"annotations":{"device-numa-extender.io/capacity-returned":"2026-12-05T00:00:00.000Z gpu"}}}`); err != nil {
		t.Fatalf("the requeue annotation was refused: %v", err)
	}
	n, err := cp.admin.CoreV1().Nodes().Get(cp.ctx, "n-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) != 0 || n.Spec.Unschedulable || n.Labels["evil"] != "" || n.Annotations["evil"] != "" {
		t.Fatalf("the node was changed: taints %v unschedulable %v labels %v annotations %v", n.Spec.Taints, n.Spec.Unschedulable, n.Labels, n.Annotations)
	}
}

// Issue 38 §1. With extender.gpuShareTotals=extender RBAC grants `patch nodes/status`; the
// chart's second policy lets the extender change only the three GPU share totals there.
func TestTheExtenderMayChangeOnlyShareTotalsInNodeStatus(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: shareTotals})
	cp.chart.wantPolicies(t, "node-writes", "node-status-writes", "dra-rule-writes", "dra-claim-tolerations")
	cp.addNodes("n", 1, cpuMachine)
	ext := cp.extenderClient()
	patch := func(body string) error {
		_, err := ext.CoreV1().Nodes().Patch(cp.ctx, "n-0", types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		return err
	}
	cpu := `{"status":{"allocatable":{"cpu":"1000"},"capacity":{"cpu":"1000"}}}`
	refused := cp.refusedOncePolicyIsActive("a CPU allocatable patch", func() error { return patch(cpu) }, func() {
		_, _ = cp.admin.CoreV1().Nodes().Patch(cp.ctx, "n-0", types.MergePatchType, []byte(`{"status":{"allocatable":{"cpu":"64"},"capacity":{"cpu":"64"}}}`), metav1.PatchOptions{}, "status")
	})
	if !strings.Contains(refused.Error(), "may change only the GPU share totals") {
		t.Fatalf("the CPU patch failed, but not by the policy: %v", refused)
	}
	for what, body := range map[string]string{
		"a condition":        `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil"}]}}`,
		"another resource":   `{"status":{"allocatable":{"nvidia.com/gpu":"8"},"capacity":{"nvidia.com/gpu":"8"}}}`,
		"a removed resource": `{"status":{"allocatable":{"memory":null}}}`,
	} {
		if err := patch(body); err == nil || !strings.Contains(err.Error(), "may change only") {
			t.Fatalf("%s: the extender's status patch was not refused by the policy: %v", what, err)
		}
	}
	// The share totals, as the extender writes them, are allowed.
	if err := patch(`{"status":{"capacity":{"koordinator.sh/gpu-core":"800"},"allocatable":{"koordinator.sh/gpu-core":"800"}}}`); err != nil {
		t.Fatalf("the share totals were refused: %v", err)
	}
	n, err := cp.admin.CoreV1().Nodes().Get(cp.ctx, "n-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := n.Status.Allocatable["cpu"]; q.String() != "64" {
		t.Fatalf("the node's CPU was changed: %v", q.String())
	}
	if _, ok := n.Status.Allocatable["nvidia.com/gpu"]; ok {
		t.Fatal("the node was given nvidia.com/gpu")
	}
	if q := n.Status.Allocatable["koordinator.sh/gpu-core"]; q.String() != "800" {
		t.Fatalf("the share total was not written: %v", n.Status.Allocatable)
	}
}

// extenderClient is a client with the extender's own credentials (the chart's ServiceAccount).
func (cp *controlPlane) extenderClient() *kubernetes.Clientset {
	cp.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.extenderKubeconfig)
	if err != nil {
		cp.t.Fatal(err)
	}
	ext, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		cp.t.Fatal(err)
	}
	return ext
}

// refusedOncePolicyIsActive retries `write` until it is refused and returns the refusal. The
// apiserver loads policies asynchronously, so a write admitted before the policy is active is
// undone (as the admin) and tried again: the refusal is the ordering point "the policy is
// active"; RBAC alone admits the write.
// wantPolicies fails unless the chart rendered exactly these ValidatingAdmissionPolicies (by
// name suffix), each with its binding.
func (c *renderedChart) wantPolicies(t *testing.T, suffixes ...string) {
	t.Helper()
	var got []string
	for _, p := range c.Policies {
		got = append(got, p.Name)
	}
	if len(c.Policies) != len(suffixes) || len(c.PolicyBindings) != len(suffixes) {
		t.Fatalf("the chart rendered policies %v and %d bindings, want %v", got, len(c.PolicyBindings), suffixes)
	}
	for _, suffix := range suffixes {
		found := false
		for _, name := range got {
			found = found || strings.HasSuffix(name, "-"+suffix)
		}
		if !found {
			t.Fatalf("the chart rendered policies %v, want one named *-%s", got, suffix)
		}
	}
}

// Trust IV (found by reading): RBAC grants the extender create/delete on devicetaintrules
// cluster-wide; the chart's policy lets its ServiceAccount write only its own rules (named,
// labelled, NoSchedule with its own key, a whole pool, no owner reference) and delete only those,
// evaluated by the real API server.
func TestTheExtenderMayWriteOnlyItsOwnDeviceTaintRules(t *testing.T) {
	cp := startControlPlane(t, planOptions{})
	ext := cp.extenderClient()
	rules := ext.ResourceV1().DeviceTaintRules()
	rule := func(name, effect string, labelled bool) *resourceapi.DeviceTaintRule {
		r := &resourceapi.DeviceTaintRule{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceTaintRuleSpec{
				DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr("gpu.e2e.example"), Pool: ptr("n-0")},
				Taint:          resourceapi.DeviceTaint{Key: "device-numa-extender.io/owned", Value: "extender", Effect: resourceapi.DeviceTaintEffect(effect)},
			},
		}
		if labelled {
			r.Labels = map[string]string{"app.kubernetes.io/managed-by": "device-numa-extender"}
		}
		return r
	}
	create := func(r *resourceapi.DeviceTaintRule) error {
		_, err := rules.Create(cp.ctx, r, metav1.CreateOptions{})
		return err
	}
	refused := cp.refusedOncePolicyIsActive("a NoExecute rule", func() error { return create(rule("dne-owned-0000000000000001", "NoExecute", true)) }, func() {
		_ = cp.admin.ResourceV1().DeviceTaintRules().Delete(cp.ctx, "dne-owned-0000000000000001", metav1.DeleteOptions{})
	})
	if !strings.Contains(refused.Error(), "never NoExecute") {
		t.Fatalf("the NoExecute rule failed, but not by the policy: %v", refused)
	}
	for what, r := range map[string]*resourceapi.DeviceTaintRule{
		"another name": rule("evil", "NoSchedule", true),
		"no label":     rule("dne-owned-0000000000000002", "NoSchedule", false),
		"another key": func() *resourceapi.DeviceTaintRule {
			r := rule("dne-owned-0000000000000003", "NoSchedule", true)
			r.Spec.Taint.Key = "evil"
			return r
		}(),
		"one device": func() *resourceapi.DeviceTaintRule {
			r := rule("dne-owned-0000000000000004", "NoSchedule", true)
			r.Spec.DeviceSelector.Device = ptr("gpu-0")
			return r
		}(),
		"an owner": func() *resourceapi.DeviceTaintRule {
			r := rule("dne-owned-0000000000000005", "NoSchedule", true)
			r.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "n-0", UID: "u"}}
			return r
		}(),
	} {
		if err := create(r); err == nil || !strings.Contains(err.Error(), "may") {
			t.Fatalf("%s: the extender's rule was not refused by the policy: %v", what, err)
		}
	}
	// Another tool's rule: the extender may not delete it.
	other := rule("someone-elses", "NoExecute", false)
	other.Spec.Taint.Key = "example.com/maintenance"
	if _, err := cp.admin.ResourceV1().DeviceTaintRules().Create(cp.ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rules.Delete(cp.ctx, "someone-elses", metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "may delete only its own") {
		t.Fatalf("the extender deleted another tool's rule, or was refused for another reason: %v", err)
	}
	// Its own rule, as it writes it: created and deleted.
	if err := create(rule("dne-owned-00000000000000ff", "NoSchedule", true)); err != nil {
		t.Fatalf("the extender's own rule was refused: %v", err)
	}
	if err := rules.Delete(cp.ctx, "dne-owned-00000000000000ff", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its own rule was refused: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// Trust IV (found by reading): a ResourceClaim that tolerates the extender's taint could be
// given an owned device by kube-scheduler's DRA allocator, in memory, before anyone can object.
// The chart's policy denies such claims and claim templates at admission, evaluated by the real
// API server (requests at v1beta2 converted for the check), except in the namespaces listed.
func TestAClaimToleratingTheExtendersTaintIsDeniedOutsideTheExemptNamespaces(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: `{"extender":{"dra":{"tolerationExemptNamespaces":["monitoring"]}}}`})
	for _, ns := range []string{"monitoring"} {
		if _, err := cp.admin.CoreV1().Namespaces().Create(cp.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	claim := func(ns string, tol *resourceapi.DeviceToleration) *resourceapi.ResourceClaim {
		req := resourceapi.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
		if tol != nil {
			req.Tolerations = []resourceapi.DeviceToleration{*tol}
		}
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "c-", Namespace: ns},
			Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}},
		}
	}
	create := func(c *resourceapi.ResourceClaim) error {
		_, err := cp.admin.ResourceV1().ResourceClaims(c.Namespace).Create(cp.ctx, c, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	ours := &resourceapi.DeviceToleration{Key: "device-numa-extender.io/owned", Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	refused := cp.refusedOncePolicyIsActive("a claim tolerating the extender's taint", func() error { return create(claim(testNamespace, ours)) }, func() {})
	if !strings.Contains(refused.Error(), "tolerates the device-numa-extender.io/owned taint") {
		t.Fatalf("the tolerating claim failed, but not by the policy: %v", refused)
	}
	for what, tol := range map[string]*resourceapi.DeviceToleration{
		"any key, Exists":       {Operator: resourceapi.DeviceTolerationOpExists},
		"its key, every effect": {Key: "device-numa-extender.io/owned", Operator: resourceapi.DeviceTolerationOpEqual, Value: "extender"},
		"any key, NoSchedule":   {Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule},
	} {
		if err := create(claim(testNamespace, tol)); err == nil || !strings.Contains(err.Error(), "tolerates") {
			t.Fatalf("%s: a claim tolerating the extender's taint was admitted: %v", what, err)
		}
	}
	// Another key, no toleration, or the exempt namespace: admitted.
	for what, c := range map[string]*resourceapi.ResourceClaim{
		"another key":          claim(testNamespace, &resourceapi.DeviceToleration{Key: "example.com/maintenance", Operator: resourceapi.DeviceTolerationOpExists}),
		"NoExecute only":       claim(testNamespace, &resourceapi.DeviceToleration{Key: "device-numa-extender.io/owned", Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute}),
		"no toleration":        claim(testNamespace, nil),
		"the exempt namespace": claim("monitoring", ours),
	} {
		if err := create(c); err != nil {
			t.Fatalf("%s: refused: %v", what, err)
		}
	}
	// A claim template that tolerates it: denied too.
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "tolerating", Namespace: testNamespace},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: claim(testNamespace, ours).Spec},
	}
	if _, err := cp.admin.ResourceV1().ResourceClaimTemplates(testNamespace).Create(cp.ctx, tmpl, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "ResourceClaimTemplate tolerates") {
		t.Fatalf("a claim template tolerating the extender's taint was admitted: %v", err)
	}
}

func (cp *controlPlane) refusedOncePolicyIsActive(what string, write func() error, undo func()) error {
	cp.t.Helper()
	var refused error
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		refused = write()
		if refused == nil {
			undo()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		cp.t.Fatalf("%s by the extender was never refused: %v", what, err)
	}
	return refused
}
