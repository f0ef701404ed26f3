package e2e

// The control plane of one test: embedded etcd, a real kube-apiserver (Node,RBAC), the CRDs
// users install, the chart's RBAC and ServiceAccount, a stock kube-scheduler configured by the
// chart, and the extender's release binary as a child process whose only credentials are the
// chart ServiceAccount's token. Nothing here plays the API server or the scheduler.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"sigs.k8s.io/yaml"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Flags every apiserver of the harness runs with. ServiceAccount admission is off because no
// controller-manager creates the `default` ServiceAccount pods would reference (scheduler_perf
// does the same); Priority stays on for the preemption scenarios.
var apiserverFlags = []string{
	"--authorization-mode=Node,RBAC",
	"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
	"--endpoint-reconciler-type=none",
}

type controlPlane struct {
	t        *testing.T
	ctx      context.Context
	dir      string
	chart    *renderedChart
	etcd     *clientv3.Client
	storage  *storagebackend.Config
	api      *kubeapiservertesting.TestServer
	admin    *kubernetes.Clientset
	dyn      dynamic.Interface
	adminCfg *rest.Config
	loopback *rest.Config // the current apiserver's own loopback credentials (bootstrap only)
	proxy    *apiProxy
	// servingCA is the apiserver's serving certificate bundle (the same across restarts).
	servingCA []byte

	adminKubeconfig    string
	extenderKubeconfig string

	sched    *childProc
	extender *extenderProc

	// apiserverFlags and schedulerArgs follow the harness's own (planOptions).
	apiserverFlags []string
	schedulerArgs  []string
}

type planOptions struct {
	// lateCRDs are CRD files of deploy/crds (by file name prefix) left out at start;
	// installCRDs adds them later.
	lateCRDs []string
	// chartValues are the chart values as JSON ("" = the chart's defaults).
	chartValues string
	// apiserverFlags are added to every kube-apiserver start (--runtime-config: a release
	// that serves some kind at another version).
	apiserverFlags []string
	// schedulerArgs are added to every kube-scheduler start (--feature-gates).
	schedulerArgs []string
}

// routeAllPods is the chart's routeAllPods: true, so cpuset-only pods reach the extender.
const routeAllPods = `{"extenderConfig":{"routeAllPods":true}}`

func startControlPlane(t *testing.T, opts planOptions) *controlPlane {
	t.Helper()
	chart, err := loadRenderedChart(opts.chartValues)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cp := &controlPlane{t: t, ctx: ctx, dir: t.TempDir(), chart: chart, proxy: newAPIProxy(t),
		apiserverFlags: opts.apiserverFlags, schedulerArgs: opts.schedulerArgs}

	cp.etcd = testserver.RunEtcd(t, nil).Client
	cp.storage = storagebackend.NewDefaultConfig(path.Join(randomName(), "registry"), nil)
	cp.storage.Transport.ServerList = cp.etcd.Endpoints()
	cp.startAPIServer()
	cp.bootstrapAdmin()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chart.Namespace}}
	if _, err := cp.admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cp.installChartRBAC()
	cp.installCRDs(func(file string) bool {
		for _, late := range opts.lateCRDs {
			if strings.HasPrefix(filepath.Base(file), late) {
				return false
			}
		}
		return true
	})
	return cp
}

func randomName() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startAPIServer starts (or restarts, on the same etcd data) kube-apiserver behind the proxy.
// Its serving certificate is the test server's fixture (the same on every start) and
// ServiceAccount tokens are signed with its fixed key, so every client keeps working across a
// restart, as clients of a real control plane do.
func (cp *controlPlane) startAPIServer() {
	t := cp.t
	opts := kubeapiservertesting.NewDefaultTestServerOptions()
	opts.DisableInvariantChecks = true
	flags := append(append([]string{}, apiserverFlags...), cp.apiserverFlags...)
	server, err := kubeapiservertesting.StartTestServer(t, opts, flags, cp.storage)
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	cp.api = &server
	t.Cleanup(func() {
		if cp.api == &server {
			server.TearDownFn()
			cp.api = nil
		}
	})
	ca, err := os.ReadFile(filepath.Join(server.TmpDir, "apiserver.crt"))
	if err != nil {
		t.Fatalf("kube-apiserver serving certificate: %v", err)
	}
	if cp.servingCA != nil && string(cp.servingCA) != string(ca) {
		t.Fatal("kube-apiserver's serving certificate changed across a restart (no fixture?)")
	}
	cp.servingCA = ca
	host := strings.TrimPrefix(server.ClientConfig.Host, "https://")
	cp.proxy.retarget(host)
	cp.loopback = rest.CopyConfig(server.ClientConfig)
}

// bootstrapAdmin creates a cluster-admin ServiceAccount whose token reaches the apiserver
// through the proxy: the harness's and kube-scheduler's credentials.
func (cp *controlPlane) bootstrapAdmin() {
	t, ctx := cp.t, cp.ctx
	boot := kubernetes.NewForConfigOrDie(cp.loopback)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "e2e-admin", Namespace: metav1.NamespaceSystem}}
	if _, err := boot.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}
	if _, err := boot.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := cp.token(boot, sa.Namespace, sa.Name)
	cp.adminCfg = &rest.Config{
		Host:            "https://" + cp.proxy.addr(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.servingCA},
		QPS:             1000,
		Burst:           10000,
	}
	cp.admin = kubernetes.NewForConfigOrDie(cp.adminCfg)
	cp.dyn = dynamic.NewForConfigOrDie(cp.adminCfg)
	cp.adminKubeconfig = cp.writeKubeconfig("admin", token)
	// The RBAC authorizer reads bindings from an informer: a request right after the binding
	// was created can still be forbidden (seen once: the next namespace create answered 403).
	// Wait, as an ordering, until the apiserver itself says the binding is in effect.
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "*", Group: "*", Resource: "*"},
	}}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
		got, err := cp.admin.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return false, nil
		}
		return got.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("the e2e-admin binding never took effect: %v", err)
	}
}

// stopAPIServer stops kube-apiserver; etcd keeps every object and the proxy refuses
// connections until the next start.
func (cp *controlPlane) stopAPIServer() {
	if cp.api != nil {
		api := cp.api
		cp.api = nil
		cp.proxy.retarget("")
		api.TearDownFn()
	}
}

// writeKubeconfig writes a kubeconfig for the apiserver (through the proxy) with a token.
func (cp *controlPlane) writeKubeconfig(name, token string) string {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{
		Server:                   "https://" + cp.proxy.addr(),
		CertificateAuthorityData: cp.servingCA,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: name}
	kc.CurrentContext = "e2e"
	file := filepath.Join(cp.dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, file); err != nil {
		cp.t.Fatal(err)
	}
	return file
}

func (cp *controlPlane) token(client kubernetes.Interface, namespace, name string) string {
	expiry := int64(24 * 3600)
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(cp.ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}},
		metav1.CreateOptions{})
	if err != nil {
		cp.t.Fatalf("token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// installChartRBAC creates the chart's ServiceAccount, ClusterRoles, Roles and bindings, and a
// kubeconfig holding a token of that ServiceAccount: the extender can do exactly what the chart
// grants it, so a missing rule fails a scenario as it would fail in a cluster. In scheduler mode
// the chart also binds kube-scheduler's roles to the same ServiceAccount (both containers share
// the pod's); those bindings are left out here and kube-scheduler runs with its own
// credentials, so the extender is held to its own ClusterRole alone, as in standalone mode.
func (cp *controlPlane) installChartRBAC() {
	t, ctx, c := cp.t, cp.ctx, cp.chart
	sa := c.ServiceAccount.DeepCopy()
	if _, err := cp.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, r := range c.ClusterRoles {
		if _, err := cp.admin.RbacV1().ClusterRoles().Create(ctx, r.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, b := range c.ClusterBindings {
		if schedulerRoles[b.RoleRef.Name] {
			continue
		}
		if _, err := cp.admin.RbacV1().ClusterRoleBindings().Create(ctx, b.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, r := range c.Roles {
		if _, err := cp.admin.RbacV1().Roles(r.Namespace).Create(ctx, r.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range c.RoleBindings {
		if schedulerRoles[b.RoleRef.Name] || strings.HasSuffix(b.RoleRef.Name, "-scheduler-leases") {
			continue
		}
		if _, err := cp.admin.RbacV1().RoleBindings(b.Namespace).Create(ctx, b.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The chart's ValidatingAdmissionPolicy on the extender's Node writes, as the chart installs it.
	for _, p := range c.Policies {
		if _, err := cp.admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range c.PolicyBindings {
		if _, err := cp.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cp.extenderKubeconfig = cp.writeKubeconfig("extender", cp.token(cp.admin, sa.Namespace, sa.Name))
}

// schedulerRoles are the roles the chart binds for its kube-scheduler container.
var schedulerRoles = map[string]bool{
	"system:kube-scheduler": true, "system:volume-scheduler": true,
	"extension-apiserver-authentication-reader": true,
}

// installCRDs applies the files of deploy/crds users install (those `want` accepts) and waits
// for Established.
func (cp *controlPlane) installCRDs(want func(file string) bool) {
	t := cp.t
	client := apiextensionsclient.NewForConfigOrDie(cp.adminCfg)
	files, err := filepath.Glob(filepath.Join(repoRoot(), "deploy", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs under deploy/crds: %v", err)
	}
	var names []string
	for _, f := range files {
		if !want(f) {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(raw, crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(cp.ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(cp.ctx, 100*time.Millisecond, hangGuard, true, func(ctx context.Context) (bool, error) {
			crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s never Established: %v", name, err)
		}
	}
}

// startScheduler runs a stock kube-scheduler process (built from this module's Kubernetes, see
// TestMain) with the chart's configuration, only the kubeconfig path and urlPrefix substituted.
// A process, not the in-process test server: kube-scheduler exits the process when it stops
// leading, and leader election is on in the chart's configuration.
func (cp *controlPlane) startScheduler(urlPrefix string) {
	cp.startSchedulerWithConfig(cp.chart, urlPrefix, nil)
}

// startSchedulerWithConfig starts kube-scheduler with the chart's configuration after edit.
// extraArgs follow the chart's (the throughput bench's metrics port).
func (cp *controlPlane) startSchedulerWithConfig(chart *renderedChart, urlPrefix string, edit func(string) (string, error), extraArgs ...string) *childProc {
	t := cp.t
	cfg, err := chart.schedulerConfigFor(cp.adminKubeconfig, urlPrefix)
	if err == nil && edit != nil {
		cfg, err = edit(cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(cp.dir, fmt.Sprintf("scheduler-config-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// --secure-port=0: no health endpoint (and no port to collide); the test watches the pods.
	// A later --secure-port in extraArgs wins.
	args := append([]string{"--config=" + file, "--secure-port=0", "--v=2"}, cp.schedulerArgs...)
	args = append(args, extraArgs...)
	cmd := exec.Command(schedulerBinary, args...)
	s := startChild(t, "kube-scheduler", cmd, strings.TrimSuffix(file, ".yaml")+".log", 40)
	cp.sched = s
	return s
}

func (cp *controlPlane) stopScheduler() {
	if cp.sched != nil {
		cp.sched.kill()
		cp.sched = nil
	}
}

// compactEtcd compacts etcd at its current revision: every watch older than that relists (410).
func (cp *controlPlane) compactEtcd() {
	resp, err := cp.etcd.Get(cp.ctx, "compact-probe")
	if err != nil {
		cp.t.Fatal(err)
	}
	if _, err := cp.etcd.Compact(cp.ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		cp.t.Fatal(err)
	}
}

// hangGuard bounds every wait: a generous guard against hangs, never a timing assertion.
const hangGuard = 3 * time.Minute

func (cp *controlPlane) String() string { return fmt.Sprintf("controlPlane(%s)", cp.dir) }
