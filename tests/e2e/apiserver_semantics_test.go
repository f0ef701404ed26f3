package e2e

// What the bind path relies on from kube-apiserver, checked on the real one. tests/support's fake
// API server implements each of these (Binding resourceVersion precondition, Binding annotations
// merged with the node, 409 for a bound pod, merge-patch resourceVersion precondition, the
// binding's `timeout` parameter); if the real server disagreed, the fake would be wrong and so
// would every test built on it.

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestTheRealAPIServerHasTheSemanticsTheFakeAssumes(t *testing.T) {
	cp := startControlPlane(t, planOptions{})
	ctx := context.Background()
	cp.addNodes("gpu", 1, gpuMachine)
	pods := cp.admin.CoreV1().Pods(testNamespace)
	// An unmanaged scheduler name: nothing but this test binds these pods.
	p := cp.createPod(podSpec{name: "semantics", scheduler: "nobody", limits: map[string]string{"cpu": "1"}})
	staleRV := p.ResourceVersion

	// A write moves the pod's resourceVersion on.
	patched, err := pods.Patch(ctx, p.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// 1. A merge patch carrying a stale metadata.resourceVersion is refused with 409.
	_, err = pods.Patch(ctx, p.Name, types.MergePatchType,
		[]byte(`{"metadata":{"resourceVersion":"`+staleRV+`","labels":{"again":"yes"}}}`), metav1.PatchOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("merge patch with a stale resourceVersion: %v, want 409 Conflict", err)
	}

	binding := func(rv string) *corev1.Binding {
		return &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{
				Name: p.Name, Namespace: testNamespace, UID: p.UID, ResourceVersion: rv,
				Annotations: map[string]string{annDeviceAllocated: `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"}}]}`},
			},
			Target: corev1.ObjectReference{Kind: "Node", Name: "gpu-0"},
		}
	}
	// 2. A Binding stamped with a stale resourceVersion is refused with 409 and lands nothing.
	err = cp.admin.CoreV1().RESTClient().Post().Namespace(testNamespace).Resource("pods").Name(p.Name).
		SubResource("binding").Param("timeout", "5s").Body(binding(staleRV)).Do(ctx).Error()
	if !apierrors.IsConflict(err) {
		t.Fatalf("Binding with a stale resourceVersion: %v, want 409 Conflict", err)
	}
	if got := cp.getPod(p.Name); got.Spec.NodeName != "" || got.Annotations[annDeviceAllocated] != "" {
		t.Fatalf("a refused Binding changed the pod: node %q annotations %v", got.Spec.NodeName, got.Annotations)
	}

	// 3. A Binding at the current resourceVersion (with the binding's `timeout` parameter, as
	// the extender sends it) sets the node and merges its annotations, in one write.
	start := time.Now()
	err = cp.admin.CoreV1().RESTClient().Post().Namespace(testNamespace).Resource("pods").Name(p.Name).
		SubResource("binding").Param("timeout", "5s").Body(binding(patched.ResourceVersion)).Do(ctx).Error()
	if err != nil {
		t.Fatalf("Binding at the current resourceVersion: %v", err)
	}
	got := cp.getPod(p.Name)
	if got.Spec.NodeName != "gpu-0" || got.Annotations[annDeviceAllocated] == "" || got.Labels["touched"] != "yes" {
		t.Fatalf("after the Binding: node %q annotations %v labels %v", got.Spec.NodeName, got.Annotations, got.Labels)
	}
	t.Logf("binding accepted in %v", time.Since(start))

	// 4. A second Binding of a bound pod is refused with 409, whatever its resourceVersion.
	err = cp.admin.CoreV1().RESTClient().Post().Namespace(testNamespace).Resource("pods").Name(p.Name).
		SubResource("binding").Body(binding("")).Do(ctx).Error()
	if !apierrors.IsConflict(err) {
		t.Fatalf("Binding of a bound pod: %v, want 409 Conflict", err)
	}
}
