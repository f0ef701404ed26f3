package e2e

// The admission webhook against the real kube-apiserver (issue 25): the chart's
// MutatingWebhookConfiguration (rules, namespaceSelector, matchConditions in CEL, failurePolicy
// Fail) pointed at the extender's webhook listener on loopback, with a CA the test makes.
// kube-apiserver evaluates the CEL, calls the listener over TLS and applies the JSON patch; the
// stock kube-scheduler then schedules the routed pod through the extender.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

const webhookValues = `{"webhook":{"enabled":true},"networkPolicy":{"webhookFrom":[{"ipBlock":{"cidr":"127.0.0.1/32"}}]}}`

func TestWebhookRoutesDevicePodsAndFailsClosedForThemOnly(t *testing.T) {
	cp := startControlPlane(t, planOptions{chartValues: webhookValues})
	if cp.chart.Webhook == nil || len(cp.chart.Webhook.Webhooks) != 1 {
		t.Fatalf("the chart rendered with %s has no MutatingWebhookConfiguration with one webhook", webhookValues)
	}
	caPEM, certFile, keyFile := writeServingCertificate(t, cp.dir)
	webhookAddr := freeLoopbackAddr()
	// The chart's flags, with the listener and its certificate moved to the test's (a repeated
	// flag overrides the earlier one).
	ext := cp.startExtender("", "--webhook-listen="+webhookAddr,
		"--webhook-tls-cert-file="+certFile, "--webhook-tls-key-file="+keyFile)
	cp.startScheduler(ext.urlPrefix())
	cp.addNodes("gpu", 1, gpuMachine)
	ext.waitReady()

	mwc := cp.chart.Webhook.DeepCopy()
	url := "https://" + webhookAddr + "/mutate-pods"
	mwc.Webhooks[0].ClientConfig.Service = nil
	mwc.Webhooks[0].ClientConfig.URL = &url
	mwc.Webhooks[0].ClientConfig.CABundle = caPEM
	if _, err := cp.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(cp.ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the chart's MutatingWebhookConfiguration: %v", err)
	}
	sched := schedulerName(cp.chart)
	gpu := map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
	// kube-apiserver picks the configuration up asynchronously: wait until a dry-run GPU pod
	// comes back routed (the ordering point "the webhook is active").
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		p, err := cp.admin.CoreV1().Pods(testNamespace).Create(ctx, newPod(podSpec{name: "probe", limits: gpu}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && p.Spec.SchedulerName == sched, nil
	})
	if err != nil {
		t.Fatalf("a GPU pod never came back routed to %s: %v", sched, err)
	}

	// A GPU pod that names no scheduler is routed, scheduled by the extender's scheduler, and
	// gets its device-allocated annotation.
	created := createIn(t, cp, testNamespace, podSpec{name: "routed", limits: gpu})
	if created.Spec.SchedulerName != sched {
		t.Fatalf("routed pod has schedulerName %q, want %q", created.Spec.SchedulerName, sched)
	}
	bound := cp.waitBound("routed")["routed"]
	if _, err := parseDeviceAllocated(bound); err != nil {
		t.Fatalf("routed pod bound without a device allocation: %v", err)
	}

	// A pod that asks for nothing the extender manages, and a GPU pod in an excluded namespace
	// (the control plane's own), are left alone.
	plain := createIn(t, cp, testNamespace, podSpec{name: "plain", limits: map[string]string{"cpu": "1"}})
	if plain.Spec.SchedulerName != "default-scheduler" {
		t.Fatalf("plain pod was routed to %q", plain.Spec.SchedulerName)
	}
	waitNamespace(t, cp, "kube-system")
	system := createIn(t, cp, "kube-system", podSpec{name: "system-gpu", limits: gpu})
	if system.Spec.SchedulerName != "default-scheduler" {
		t.Fatalf("a GPU pod in kube-system was routed to %q", system.Spec.SchedulerName)
	}

	// Issue 36 §3: every name of the chart's managedResources, deprecated ones included, passes
	// the API server's CEL condition and is routed; a deprecated name comes back renamed to its
	// current one (kube-scheduler's extender stanza cannot name it). Dry runs: nothing is stored.
	for i, name := range managedResourceNames(t, cp) {
		p := newPod(podSpec{name: fmt.Sprintf("name-%d", i), limits: map[string]string{"cpu": "1", name: "50"}})
		got, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("a pod asking for %s: %v", name, err)
		}
		if got.Spec.SchedulerName != sched {
			t.Fatalf("a pod asking for %s was not routed (schedulerName %q)", name, got.Spec.SchedulerName)
		}
		limits := got.Spec.Containers[0].Resources.Limits
		if current, deprecated := strings.CutPrefix(name, "kubernetes.io/"); deprecated {
			if _, kept := limits[corev1.ResourceName(name)]; kept {
				t.Fatalf("%s was not renamed: %v", name, limits)
			}
			if _, renamed := limits[corev1.ResourceName("koordinator.sh/"+current)]; !renamed {
				t.Fatalf("%s was not renamed to koordinator.sh/%s: %v", name, current, limits)
			}
		} else if _, kept := limits[corev1.ResourceName(name)]; !kept {
			t.Fatalf("%s was changed: %v", name, limits)
		}
	}

	// Issue 36 §4: a GPU pod that presets spec.nodeName, of the default scheduler or of the
	// extender's, is refused with the reason; a plain pod that does is left alone. Trust IV §10:
	// so is one naming another scheduler (it reaches none either; before, the chart's CEL
	// condition never sent it to the webhook).
	for _, scheduler := range []string{"", sched, "volcano"} {
		p := newPod(podSpec{name: "preset", scheduler: scheduler, limits: gpu})
		p.Spec.NodeName = "gpu-0"
		_, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), "spec.nodeName") {
			t.Fatalf("a GPU pod of scheduler %q presetting spec.nodeName was not refused: %v", scheduler, err)
		}
	}
	plainPreset := newPod(podSpec{name: "plain-preset", limits: map[string]string{"cpu": "1"}})
	plainPreset.Spec.NodeName = "gpu-0"
	if _, err := cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, plainPreset, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("a plain pod presetting spec.nodeName was refused: %v", err)
	}

	// The webhook down (every replica gone): failurePolicy Fail refuses the GPU pod, so none
	// slips past to the default scheduler; the plain pod never waits on the webhook (the CEL
	// matchCondition) and is created.
	ext.kill()
	_, err = cp.admin.CoreV1().Pods(testNamespace).Create(cp.ctx, newPod(podSpec{name: "refused", limits: gpu}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "pods.device-numa-extender.io") {
		t.Fatalf("with the webhook down a GPU pod was not refused by it: %v", err)
	}
	if apierrors.IsAlreadyExists(err) {
		t.Fatalf("unexpected: %v", err)
	}
	createIn(t, cp, testNamespace, podSpec{name: "plain-while-down", limits: map[string]string{"cpu": "1"}})
	t.Logf("webhook down: GPU pod refused (%v); plain pod created", err)
}

// managedResourceNames are the chart's extenderConfig.managedResources, as the webhook flag
// rendered from them lists them.
func managedResourceNames(t *testing.T, cp *controlPlane) []string {
	t.Helper()
	for _, a := range cp.chart.ExtenderArgs {
		if v, ok := strings.CutPrefix(a, "--webhook-managed-resources="); ok {
			return strings.Split(v, ",")
		}
	}
	t.Fatal("the chart rendered no --webhook-managed-resources")
	return nil
}

// createIn creates the pod in ns with no schedulerName (the API server defaults it, the webhook
// may route it) and returns what the API server stored.
func createIn(t *testing.T, cp *controlPlane, ns string, p podSpec) *corev1.Pod {
	t.Helper()
	pod := newPod(p)
	pod.Namespace = ns
	created, err := cp.admin.CoreV1().Pods(ns).Create(cp.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod %s/%s: %v", ns, p.name, err)
	}
	return created
}

// waitNamespace waits until the API server's system namespace controller has made ns.
func waitNamespace(t *testing.T, cp *controlPlane, ns string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(cp.ctx, 200*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		_, err := cp.admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s never appeared: %v", ns, err)
	}
}

// writeServingCertificate makes a CA and a serving certificate for 127.0.0.1 signed by it,
// writes the certificate and key, and returns the CA's PEM (the webhook's caBundle).
func writeServingCertificate(t *testing.T, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e webhook CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "webhook.crt"), filepath.Join(dir, "webhook.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), certFile, keyFile
}
