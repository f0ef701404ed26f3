package koordcompat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/koordinator-sh/koordinator/apis/extension"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestAmplificationRatioReadsAsKoordinatorReadsIt: the Node annotation
// node.koordinator.sh/resource-amplification-ratio, as koord-manager writes it
// (extension.SetNodeResourceAmplificationRatios) and in hand-written variants, read by
// koordinator's extension.GetNodeResourceAmplificationRatio and by the extender (its `inspect`
// report of each node): an error there is an invalid ratio here, a CPU ratio above 1 is the
// same ratio here, anything else is no amplification here.
func TestAmplificationRatioReadsAsKoordinatorReadsIt(t *testing.T) {
	var annotations []string
	for _, r := range []extension.Ratio{1.5, 2, 1, 1.234, 0.5, 3.999} {
		n := &corev1.Node{}
		extension.SetNodeResourceAmplificationRatios(n, map[corev1.ResourceName]extension.Ratio{
			corev1.ResourceCPU: r, corev1.ResourceMemory: 1.2,
		})
		annotations = append(annotations, n.Annotations[extension.AnnotationNodeResourceAmplificationRatio])
	}
	annotations = append(annotations,
		`{"cpu":1.5}`, `{"cpu":"1.5"}`, `{}`, `null`, `{"memory":2}`, `{"cpu":null}`,
		`{"cpu":1e400}`, `{"cpu":-1}`, `{"cpu":1.5,"cpu":3}`, ``, ` {"cpu": 2} `, `{"CPU":2}`,
		`[1.5]`, `{"cpu":1.5`, `{"cpu":1.0000001}`, `{"cpu":2e0}`,
	)

	var docs []string
	for i, a := range annotations {
		name := fmt.Sprintf("amp-%d", i)
		node := corev1.Node{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
				extension.AnnotationNodeResourceAmplificationRatio: a,
			}},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("6"), corev1.ResourceMemory: resource.MustParse("8Gi"),
			}},
		}
		raw, err := yaml.Marshal(node)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(raw), nrt(name))
	}
	cluster := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(cluster, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "inspect", "--cluster-file", cluster, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("inspect: %v\n%s", err, stderr.String())
	}
	var report struct {
		Nodes []struct {
			Name string `json:"name"`
			CPUs *struct {
				Amplification *struct {
					Ratio            *string `json:"ratio"`
					Invalid          *string `json:"invalid"`
					AllocatableMilli int64   `json:"allocatable_milli"`
					FreeMilli        *int64  `json:"free_milli"`
				} `json:"amplification"`
			} `json:"cpus"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatalf("inspect report: %v", err)
	}
	seen := 0
	for _, n := range report.Nodes {
		var i int
		if _, err := fmt.Sscanf(n.Name, "amp-%d", &i); err != nil {
			continue
		}
		seen++
		a := annotations[i]
		if n.CPUs == nil {
			t.Errorf("%s (%q): no CPU report", n.Name, a)
			continue
		}
		got := n.CPUs.Amplification
		ratio, err := extension.GetNodeResourceAmplificationRatio(map[string]string{
			extension.AnnotationNodeResourceAmplificationRatio: a,
		}, corev1.ResourceCPU)
		switch {
		case err != nil:
			if got == nil || got.Invalid == nil || got.Ratio != nil || got.FreeMilli != nil {
				t.Errorf("%q: koordinator refuses it (%v); the extender reports %+v", a, err, got)
			}
		case ratio > 1:
			if got == nil || got.Ratio == nil || got.Invalid != nil || got.FreeMilli == nil {
				t.Errorf("%q: koordinator reads ratio %v; the extender reports %+v", a, ratio, got)
				continue
			}
			ours, perr := strconv.ParseFloat(*got.Ratio, 64)
			if perr != nil || ours != float64(ratio) {
				t.Errorf("%q: koordinator reads ratio %v; the extender %q", a, ratio, *got.Ratio)
			}
			// No pods: everything allocatable is left.
			if got.AllocatableMilli != 6000 || *got.FreeMilli != 6000 {
				t.Errorf("%q: allocatable %d, free %d; want 6000 each", a, got.AllocatableMilli, *got.FreeMilli)
			}
		default:
			if got != nil {
				t.Errorf("%q: koordinator reads %v (no amplification); the extender reports %+v", a, ratio, got)
			}
		}
	}
	if seen != len(annotations) {
		t.Fatalf("inspect reported %d of %d nodes", seen, len(annotations))
	}
	t.Logf("%d annotation values read alike", seen)
}

// nrt is a NodeResourceTopology of 4 CPUs on one NUMA node.
func nrt(name string) string {
	var detail []string
	for id := 0; id < 4; id++ {
		detail = append(detail, fmt.Sprintf(`{"id":%d,"core":%d,"socket":0,"node":0}`, id, id/2))
	}
	topology := `{"detail":[` + strings.Join(detail, ",") + `]}`
	return fmt.Sprintf(`apiVersion: topology.node.k8s.io/v1alpha2
kind: NodeResourceTopology
metadata:
  name: %s
  annotations:
    node.koordinator.sh/cpu-topology: '%s'
topologyPolicies: ["None"]
zones:
- name: node-0
  type: Node
  resources:
  - {name: cpu, capacity: "4", allocatable: "4", available: "4"}
  - {name: memory, capacity: 8Gi, allocatable: 8Gi, available: 8Gi}
`, name, topology)
}
