package e2e

// What the Helm chart renders. Default values: deploy/device-numa-extender.yaml, the chart
// rendered by the chart tests' Helm SDK (they fail while that file is stale), so the harness
// installs exactly what `kubectl apply -f deploy/device-numa-extender.yaml` installs. Other
// values: `tests/chart/run.sh --render`, the same Helm SDK (helm-python-sdk wraps Helm's Go
// SDK). Why not Go's helm.sh/helm/v3 in this module: it pins its own Kubernetes modules, which
// would fight the v0.37.2 staging pins this module needs for the control plane.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes/scheme"
)

// renderedChart is the chart's objects that the harness installs or reads.
type renderedChart struct {
	Namespace       string
	SchedulerConfig string // the ConfigMap's config.yaml, verbatim
	ServiceAccount  *corev1.ServiceAccount
	ClusterRoles    []*rbacv1.ClusterRole
	ClusterBindings []*rbacv1.ClusterRoleBinding
	Roles           []*rbacv1.Role
	RoleBindings    []*rbacv1.RoleBinding
	ExtenderArgs    []string // the extender container's args
	// Webhook is the admission webhook configuration (with webhook.enabled).
	Webhook *admissionregistrationv1.MutatingWebhookConfiguration
	// The policy that narrows the extender's Node patches to its own annotation (issue 36 §8).
	Policies       []*admissionregistrationv1.ValidatingAdmissionPolicy
	PolicyBindings []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// repoRoot is the repository root (tests/e2e is two levels down).
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

var docSplit = regexp.MustCompile(`(?m)^---[ \t]*$`)

// loadRenderedChart renders the chart with valuesJSON ("" = default values).
func loadRenderedChart(valuesJSON string) (*renderedChart, error) {
	path := filepath.Join(repoRoot(), "deploy", "device-numa-extender.yaml")
	var raw []byte
	var err error
	if valuesJSON == "" {
		raw, err = os.ReadFile(path)
	} else {
		path = "tests/chart/run.sh --render " + valuesJSON
		cmd := exec.Command(filepath.Join(repoRoot(), "tests", "chart", "run.sh"), "--render", valuesJSON)
		cmd.Stderr = os.Stderr
		raw, err = cmd.Output()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := &renderedChart{}
	decode := scheme.Codecs.UniversalDeserializer().Decode
	for _, doc := range docSplit.Split(string(raw), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		obj, _, err := decode([]byte(doc), nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			if cfg, ok := o.Data["config.yaml"]; ok {
				out.SchedulerConfig = cfg
				out.Namespace = o.Namespace
			}
		case *corev1.ServiceAccount:
			out.ServiceAccount = o
		case *rbacv1.ClusterRole:
			out.ClusterRoles = append(out.ClusterRoles, o)
		case *rbacv1.ClusterRoleBinding:
			out.ClusterBindings = append(out.ClusterBindings, o)
		case *rbacv1.Role:
			out.Roles = append(out.Roles, o)
		case *rbacv1.RoleBinding:
			out.RoleBindings = append(out.RoleBindings, o)
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			out.Webhook = o
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			out.Policies = append(out.Policies, o)
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			out.PolicyBindings = append(out.PolicyBindings, o)
		case *appsv1.Deployment:
			for _, c := range o.Spec.Template.Spec.Containers {
				if c.Name == "extender" {
					out.ExtenderArgs = c.Args
				}
			}
		}
	}
	if out.ServiceAccount == nil || out.ExtenderArgs == nil {
		return nil, fmt.Errorf("%s: no ServiceAccount or extender container", path)
	}
	if out.Namespace == "" {
		out.Namespace = out.ServiceAccount.Namespace
	}
	return out, nil
}

func stripComments(doc string) string {
	var b bytes.Buffer
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// schedulerConfigFor substitutes exactly two things in the chart's KubeSchedulerConfiguration:
// the kubeconfig path and the extender's urlPrefix.
func (c *renderedChart) schedulerConfigFor(kubeconfig, urlPrefix string) (string, error) {
	cfg := c.SchedulerConfig
	if cfg == "" {
		return "", fmt.Errorf("this render has no scheduler ConfigMap (standalone mode?)")
	}
	kubeRe := regexp.MustCompile(`(?m)^(\s*kubeconfig:\s*)"[^"]*"\s*$`)
	urlRe := regexp.MustCompile(`(?m)^(\s*-?\s*urlPrefix:\s*)"[^"]*"\s*$`)
	if len(kubeRe.FindAllString(cfg, -1)) != 1 || len(urlRe.FindAllString(cfg, -1)) != 1 {
		return "", fmt.Errorf("the chart's scheduler config no longer has exactly one kubeconfig and one urlPrefix line:\n%s", cfg)
	}
	cfg = kubeRe.ReplaceAllString(cfg, fmt.Sprintf(`${1}%q`, kubeconfig))
	cfg = urlRe.ReplaceAllString(cfg, fmt.Sprintf(`${1}%q`, urlPrefix))
	return cfg, nil
}

// extenderArgsFor is the chart's extender args with the two listen addresses moved to free
// loopback ports (the pod's fixed ports would collide between tests).
func (c *renderedChart) extenderArgsFor(listen, probe string) []string {
	var args []string
	for _, a := range c.ExtenderArgs {
		switch {
		case strings.HasPrefix(a, "--listen="):
			args = append(args, "--listen="+listen)
		case strings.HasPrefix(a, "--probe-address="):
			args = append(args, "--probe-address="+probe)
		case strings.HasPrefix(a, "--log-format="):
			args = append(args, "--log-format=text")
		default:
			args = append(args, a)
		}
	}
	return args
}
