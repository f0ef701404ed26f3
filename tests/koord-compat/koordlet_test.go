// Package koordcompat holds the extender to koordinator's own code (issue 23): what the extender
// writes is read back by koordinator's koordlet-side parsers, what koordinator writes (the
// CPU amplification ratio) reads here as koordinator reads it, and the annotation and label names
// it reads and writes are koordinator's constants. Pinned to koordinator v1.7.0, the newest
// release the Go module proxy serves here (its version list is refused; exact versions are
// served), built against the same Kubernetes v1.37.2 modules as tests/e2e so the build shares
// their cache (koordinator's apis/extension compiles against them unchanged).
//
// Not here: koordinator's scheduler plugins (the cpuset accumulator, deviceshare) import
// kube-scheduler's framework of Kubernetes 1.28 (k8s.io/kube-scheduler/config/v1beta3 and
// more), which does not build against 1.37: they run from their own module with koordinator's
// Kubernetes 1.28 pins (accumulator/).
package koordcompat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/koordinator-sh/koordinator/apis/extension"
	schedulingv1alpha1 "github.com/koordinator-sh/koordinator/apis/scheduling/v1alpha1"
	koordcpuset "github.com/koordinator-sh/koordinator/pkg/util/cpuset"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// binary is the release binary (scripts/test.sh builds it), or DNE_KOORD_COMPAT_BINARY.
func binary(t *testing.T) string {
	bin := os.Getenv("DNE_KOORD_COMPAT_BINARY")
	if bin == "" {
		bin = filepath.Join(repoRoot(t), "target", "release", "device-numa-extender")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("extender binary %s: %v (cargo build --release --locked)", bin, err)
	}
	return bin
}

// placement is one entry of `simulate -o json`: what the extender decided, in its own report.
type placement struct {
	Pod     string                    `json:"pod"`
	Node    *string                   `json:"node"`
	Devices map[string][]deviceReport `json:"devices"`
	CPUSet  *string                   `json:"cpuset"`
	NUMA    []int                     `json:"numa"`
	Message *string                   `json:"message"`
}

type deviceReport struct {
	Minor     int32            `json:"minor"`
	Resources map[string]int64 `json:"resources"`
}

// simulate runs `simulate` on the example cluster with `pods` and returns the report and the
// resulting pods (bound, annotated) by namespace/name.
func simulate(t *testing.T, pods ...string) ([]placement, map[string]*corev1.Pod) {
	t.Helper()
	root := repoRoot(t)
	out := filepath.Join(t.TempDir(), "cluster.yaml")
	var placements []placement
	cluster := filepath.Join(root, "examples", "cluster.yaml")
	for _, p := range pods {
		cmd := exec.Command(binary(t), "simulate", "--cluster-file", cluster, "--pods", p, "-o", "json", "--output-cluster", out)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("simulate %s: %v\n%s", p, err, stderr.String())
		}
		var report struct {
			Placements []placement `json:"placements"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
			t.Fatalf("simulate %s: report: %v", p, err)
		}
		placements = append(placements, report.Placements...)
		// The next file is scheduled on what this one left.
		cluster = filepath.Join(t.TempDir(), "chained.yaml")
		raw, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cluster, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	result := map[string]*corev1.Pod{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil || head.Kind != "Pod" {
			continue
		}
		pod := &corev1.Pod{}
		if err := yaml.Unmarshal([]byte(doc), pod); err != nil {
			t.Fatalf("output cluster pod: %v", err)
		}
		result[pod.Namespace+"/"+pod.Name] = pod
	}
	return placements, result
}

// TestKoordletReadsWhatTheExtenderWrites: every pod the extender placed, its annotations parsed
// by koordinator's own functions (extension.GetDeviceAllocations, GetResourceStatus,
// GetResourceSpec; koordinator's cpuset parser), must say exactly what the extender's report
// says it allocated: the node, each device type's minors and resources, the cpuset, the NUMA
// nodes.
func TestKoordletReadsWhatTheExtenderWrites(t *testing.T) {
	root := repoRoot(t)
	placements, pods := simulate(t,
		filepath.Join(root, "examples", "pending-pods.yaml"),
		filepath.Join(root, "tests", "koord-compat", "pods.yaml"))
	placed, devicePods, cpusetPods, numaPods := 0, 0, 0, 0
	kinds := map[string]bool{}
	for _, p := range placements {
		if p.Node == nil {
			continue
		}
		placed++
		pod := pods[p.Pod]
		if pod == nil {
			t.Fatalf("%s: placed on %s but not in the output cluster", p.Pod, *p.Node)
		}
		if pod.Spec.NodeName != *p.Node {
			t.Errorf("%s: report says %s, pod is bound to %q", p.Pod, *p.Node, pod.Spec.NodeName)
		}

		allocs, err := extension.GetDeviceAllocations(pod.Annotations)
		if err != nil {
			t.Errorf("%s: koordinator cannot parse %s: %v", p.Pod, extension.AnnotationDeviceAllocated, err)
			continue
		}
		if len(p.Devices) > 0 {
			devicePods++
		}
		if len(allocs) != len(p.Devices) {
			t.Errorf("%s: koordinator reads device types %v, the extender allocated %v", p.Pod, typesOf(allocs), keys(p.Devices))
		}
		for typ, want := range p.Devices {
			kinds["device:"+typ] = true
			got := allocs[schedulingv1alpha1.DeviceType(typ)]
			if len(got) != len(want) {
				t.Errorf("%s: %s: koordinator reads %d devices, the extender allocated %d", p.Pod, typ, len(got), len(want))
				continue
			}
			for i, w := range want {
				g := got[i]
				if g.Minor != w.Minor {
					t.Errorf("%s: %s[%d]: koordinator reads minor %d, the extender allocated %d", p.Pod, typ, i, g.Minor, w.Minor)
				}
				if len(g.Resources) != len(w.Resources) {
					t.Errorf("%s: %s minor %d: koordinator reads resources %v, the extender allocated %v", p.Pod, typ, w.Minor, g.Resources, w.Resources)
				}
				for name, value := range w.Resources {
					q, ok := g.Resources[corev1.ResourceName(name)]
					if !ok || q.Value() != value {
						t.Errorf("%s: %s minor %d: koordinator reads %s=%v, the extender allocated %d", p.Pod, typ, w.Minor, name, q.String(), value)
					}
				}
			}
		}

		status, err := extension.GetResourceStatus(pod.Annotations)
		if err != nil {
			t.Errorf("%s: koordinator cannot parse %s: %v", p.Pod, extension.AnnotationResourceStatus, err)
			continue
		}
		if p.CPUSet != nil {
			cpusetPods++
			kinds["cpuset"] = true
			want, err := koordcpuset.Parse(*p.CPUSet)
			if err != nil {
				t.Fatalf("%s: the report's cpuset %q: %v", p.Pod, *p.CPUSet, err)
			}
			got, err := koordcpuset.Parse(status.CPUSet)
			if err != nil || !got.Equals(want) {
				t.Errorf("%s: koordinator reads cpuset %q (%v), the extender allocated %s", p.Pod, status.CPUSet, err, want)
			}
		} else if status.CPUSet != "" {
			t.Errorf("%s: koordinator reads cpuset %q, the extender allocated none", p.Pod, status.CPUSet)
		}
		// Both directions: NUMA nodes the extender placed on and the annotation leaves out
		// are as wrong as ones it names that the extender did not place on.
		if len(status.NUMANodeResources) > 0 || len(p.NUMA) > 0 {
			numaPods++
			kinds["numa"] = true
			var got []int
			for _, r := range status.NUMANodeResources {
				got = append(got, int(r.Node))
			}
			sort.Ints(got)
			want := append([]int(nil), p.NUMA...)
			sort.Ints(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: koordinator reads NUMA nodes %v, the extender placed on %v", p.Pod, got, want)
			}
		}
		if _, err := extension.GetResourceSpec(pod.Annotations); err != nil {
			t.Errorf("%s: koordinator cannot parse %s: %v", p.Pod, extension.AnnotationResourceSpec, err)
		}
	}
	t.Logf("%d pods placed and read back by koordinator's parsers: %d with devices, %d cpusets, %d with NUMA resources; kinds %v",
		placed, devicePods, cpusetPods, numaPods, keys(kinds))
	// Something must have been checked for every kind, or the test proves nothing.
	for _, want := range []string{"device:gpu", "device:rdma", "cpuset", "numa"} {
		if !kinds[want] {
			t.Errorf("no placement of kind %s was checked", want)
		}
	}
	if placed < 12 {
		t.Errorf("only %d pods placed: the fixtures no longer exercise the placement kinds", placed)
	}
}

// TestAnnotationAndLabelNamesAreKoordinators: every koordinator annotation, label and resource
// name the extender reads or writes is spelled as koordinator's constant, as a string literal
// in the extender's source (src/).
func TestAnnotationAndLabelNamesAreKoordinators(t *testing.T) {
	names := map[string]string{
		"AnnotationDeviceAllocated":                extension.AnnotationDeviceAllocated,
		"AnnotationDeviceJointAllocate":            extension.AnnotationDeviceJointAllocate,
		"AnnotationResourceSpec":                   extension.AnnotationResourceSpec,
		"AnnotationResourceStatus":                 extension.AnnotationResourceStatus,
		"AnnotationNUMATopologySpec":               extension.AnnotationNUMATopologySpec,
		"AnnotationNodeCPUTopology":                extension.AnnotationNodeCPUTopology,
		"AnnotationKubeletCPUManagerPolicy":        extension.AnnotationKubeletCPUManagerPolicy,
		"AnnotationNodeSystemQOSResource":          extension.AnnotationNodeSystemQOSResource,
		"AnnotationNodeResourceAmplificationRatio": extension.AnnotationNodeResourceAmplificationRatio,
		"LabelPodQoS":                              extension.LabelPodQoS,
		"LabelNodeCPUBindPolicy":                   extension.LabelNodeCPUBindPolicy,
		"LabelNodeNUMAAllocateStrategy":            extension.LabelNodeNUMAAllocateStrategy,
		"LabelNUMATopologyPolicy":                  extension.LabelNUMATopologyPolicy,
		"ResourceNvidiaGPU":                        string(extension.ResourceNvidiaGPU),
		"ResourceGPU":                              string(extension.ResourceGPU),
		"ResourceGPUCore":                          string(extension.ResourceGPUCore),
		"ResourceGPUMemory":                        string(extension.ResourceGPUMemory),
		"ResourceGPUMemoryRatio":                   string(extension.ResourceGPUMemoryRatio),
		"ResourceGPUShared":                        string(extension.ResourceGPUShared),
		"ResourceRDMA":                             string(extension.ResourceRDMA),
		"ResourceFPGA":                             string(extension.ResourceFPGA),
	}
	var src strings.Builder
	err := filepath.Walk(filepath.Join(repoRoot(t), "src"), func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".rs") {
			return err
		}
		b, err := os.ReadFile(path)
		src.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	text := src.String()
	for constant, name := range names {
		if !strings.Contains(text, `"`+name+`"`) {
			t.Errorf("koordinator's %s is %q; src/ has no string literal spelled so", constant, name)
		}
	}
}

func typesOf(m map[schedulingv1alpha1.DeviceType][]*extension.DeviceAllocation) []string {
	var out []string
	for k := range m {
		out = append(out, string(k))
	}
	sort.Strings(out)
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
