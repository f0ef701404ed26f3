package e2e

// Waiting on the API server's objects. Every wait has a generous hang guard and asserts an
// outcome, never a duration.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
)

func (cp *controlPlane) getPod(name string) *corev1.Pod {
	pod, err := cp.admin.CoreV1().Pods(testNamespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		cp.t.Fatalf("pod %s: %v", name, err)
	}
	return pod
}

// waitBound waits until every named pod has a node and returns them by name.
func (cp *controlPlane) waitBound(names ...string) map[string]*corev1.Pod {
	cp.t.Helper()
	out := map[string]*corev1.Pod{}
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			if _, done := out[name]; done {
				continue
			}
			pod, err := cp.admin.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if pod.Spec.NodeName == "" {
				return false, nil
			}
			out[name] = pod
		}
		return true, nil
	})
	if err != nil {
		var missing []string
		for _, name := range names {
			if _, ok := out[name]; !ok {
				missing = append(missing, fmt.Sprintf("%s (%s)", name, strings.Join(cp.schedulingEvents(name), " | ")))
			}
		}
		cp.t.Fatalf("pods never bound: %s", strings.Join(missing, "; "))
	}
	return out
}

// boundPods lists the pods of the test namespace that have a node.
func (cp *controlPlane) boundPods() []corev1.Pod {
	out, err := cp.listBoundPods()
	if err != nil {
		cp.t.Fatal(err)
	}
	return out
}

// listBoundPods is boundPods for goroutines other than the test's own, which must not call
// t.Fatal: the error is theirs to report.
func (cp *controlPlane) listBoundPods() ([]corev1.Pod, error) {
	pods, err := cp.admin.CoreV1().Pods(testNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			out = append(out, p)
		}
	}
	return out, nil
}

// schedulingEvents are the messages of the pod's FailedScheduling events.
func (cp *controlPlane) schedulingEvents(name string) []string {
	sel := fields.Set{"involvedObject.name": name, "reason": "FailedScheduling"}.AsSelector().String()
	events, err := cp.admin.CoreV1().Events(testNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range events.Items {
		out = append(out, e.Message)
	}
	sort.Strings(out)
	return out
}

// waitEvent waits until a FailedScheduling event of the pod contains want.
func (cp *controlPlane) waitEvent(name, want string) string {
	cp.t.Helper()
	var found string
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		for _, m := range cp.schedulingEvents(name) {
			if strings.Contains(m, want) {
				found = m
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		cp.t.Fatalf("pod %s: no FailedScheduling event containing %q; events: %v", name, want, cp.schedulingEvents(name))
	}
	return found
}

// deletePodNow deletes a pod with grace period 0: the test plays the kubelet, which would
// confirm the containers stopped.
func (cp *controlPlane) deletePodNow(name string) {
	zero := int64(0)
	err := cp.admin.CoreV1().Pods(testNamespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		cp.t.Fatal(err)
	}
}

// waitGone waits until the pod no longer exists.
func (cp *controlPlane) waitGone(name string) {
	err := wait.PollUntilContextTimeout(cp.ctx, 100*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		_, err := cp.admin.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		cp.t.Fatalf("pod %s never went away", name)
	}
}
