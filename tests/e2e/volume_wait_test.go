package e2e

// How long can kube-scheduler hold a DRA allocation in memory only (decided at Reserve, written
// at the DynamicResources PreBind) while the extender may take the pool over (trust IV, the
// hand-over grace)? Reading the v1.37.2 sources suggested VolumeBinding's PreBind, which waits
// up to bindTimeoutSeconds (600 s) for a WaitForFirstConsumer volume, would delay the claim's
// write by that long. On the real control plane it does not: v1.37 runs PreBind plugins that
// allow it in parallel (both plugins' PreBindPreFlight answer AllowParallel), so the claim is
// written while the volume still waits. This test pins that ordering.

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

func TestALateVolumeDoesNotHoldAClaimInMemory(t *testing.T) {
	cp := startControlPlane(t, planOptions{})
	ext := cp.startExtender("")
	cp.startScheduler(ext.urlPrefix())
	m := gpuMachine
	m.gpus = 2
	nodes := cp.addNodes("gpu", 1, m)
	node := nodes[0]
	cp.labelOwner(node, "dra")
	cp.publishSlice(node, m.gpus)
	cp.createDeviceClass(draClass, "")
	ext.waitLeader()

	// A volume no provisioner ever binds: VolumeBinding's PreBind waits out its timeout.
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Provisioner: "example.com/never", VolumeBindingMode: &wffc}
	if _, err := cp.admin.StorageV1().StorageClasses().Create(cp.ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := "late"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: testNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := cp.admin.CoreV1().PersistentVolumeClaims(testNamespace).Create(cp.ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "dra", Namespace: testNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}}},
		}},
	}
	if _, err := cp.admin.ResourceV1().ResourceClaims(testNamespace).Create(cp.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := cp.pod(podSpec{name: "dra", limits: map[string]string{"cpu": "1", "memory": "1Gi"}})
	claimName := "dra"
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
	if _, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The claim's allocation reaches the API server ...
	err := wait.PollUntilContextTimeout(cp.ctx, 100*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		c, err := cp.admin.ResourceV1().ResourceClaims(testNamespace).Get(ctx, "dra", metav1.GetOptions{})
		return err == nil && c.Status.Allocation != nil, nil
	})
	if err != nil {
		t.Fatalf("the claim was never written: %v", err)
	}
	// ... while VolumeBinding's PreBind is still waiting: the node selected on the volume, the
	// volume unbound, the pod not bound.
	v, err := cp.admin.CoreV1().PersistentVolumeClaims(testNamespace).Get(cp.ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Annotations["volume.kubernetes.io/selected-node"] != node || v.Spec.VolumeName != "" {
		t.Fatalf("the volume is not waiting in PreBind (selected-node %q, volume %q): the ordering this test pins did not occur", v.Annotations["volume.kubernetes.io/selected-node"], v.Spec.VolumeName)
	}
	p, err := cp.admin.CoreV1().Pods(testNamespace).Get(cp.ctx, "dra", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Fatalf("the pod is bound already (%s): its volume was not waiting", p.Spec.NodeName)
	}
}
